# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	# torch first and pinned: pip then takes the local CPU build and never a CUDA one
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[torch,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m devplace.demo

test: $(STAMP)
	$(PY) -m pytest tests

clean:
	rm -rf .venv
