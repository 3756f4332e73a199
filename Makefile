# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY := .venv/bin/python
STAMP := .venv/.installed
# Optional package index for torch alone, e.g. https://download.pytorch.org/whl/cpu for the CPU-only
# build on Linux (PyPI's Linux wheel bundles CUDA, several GB); empty: torch comes from PyPI.
TORCH_INDEX_URL ?=

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	# torch first and pinned, so no other package can pull a different build
	$(PY) -m pip install --quiet $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[torch,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m devplace.demo

test: $(STAMP)
	$(PY) -m pytest   # pyproject.toml's testpaths: tests/ and the doctests in devplace/

clean:
	rm -rf .venv
