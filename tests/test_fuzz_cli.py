"""The command line against hostile input: every case ends with exit 0 or 2, never a traceback or an
internal error (exit 1 or 3), never a hang; a refusal is one line on stderr naming what is at fault;
nothing is left half-written or stale where the command writes.

Two halves: a table of fixed cases (the ones reported in issue 16, each named) and hypothesis
strategies that mutate a valid graph, cluster, placement, options and zoo settings. The command line
runs in this process through typer's CliRunner (a subprocess costs ~1 s of imports per case).
"""

import json
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from devplace.cli import app

CASE_LIMIT_S = 30  # a case running longer than this counts as a hang
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

GRAPH = {
    "format": "devplace-graph", "version": 1, "device_kinds": ["gpu"],
    "ops": {"name": ["a", "b", "c"], "kind": ["x", "y", "z"], "compute_us": {"gpu": [1.0, 2.0, 3.0]},
            "persistent_bytes": [10, 10, 10], "output_bytes": [100, 100, 100], "temp_bytes": [0, 0, 0],
            "colocation": [None, None, None], "role": ["forward", "backward", "update"], "mirror": [None, None, None]},
    "edges": {"src": ["a", "b"], "dst": ["b", "c"], "bytes": [100, 100], "fixed_us": [None, None]},
}
CLUSTER = """name = "{name}"
comm_model = "{comm}"
[[devices]]
kind = "gpu"
count = {count}
memory_gib = {memory}
[links.default]
latency_us = {latency}
bandwidth_bytes_per_us = {bandwidth}
"""
CLUSTER_FIELDS = {"name": '"two"', "comm": '"duplex"', "count": "2", "memory": "1", "latency": "1", "bandwidth": "100"}


def cluster_text(**override) -> str:
    values = {**CLUSTER_FIELDS, **override}
    text = CLUSTER
    for key, value in values.items():  # values are TOML literals, so the quotes come with them
        text = text.replace(f'"{{{key}}}"', value).replace(f"{{{key}}}", value)
    return text


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "g.json").write_text(json.dumps(GRAPH))
    (tmp_path / "c.toml").write_text(cluster_text())
    result = invoke(["place", str(tmp_path / "g.json"), "-c", str(tmp_path / "c.toml"), "--algo", "single",
                     "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    return tmp_path


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {CASE_LIMIT_S} s")


def invoke(args: list[str]):
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_LIMIT_S)
    try:
        return CliRunner().invoke(app, args, catch_exceptions=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check(result, *names: str, output: Path | None = None) -> None:
    """Exit 0 or 2 without a traceback; on 2, one line on stderr naming one of ``names``; the output
    file whole or absent, and no temporary file beside it."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), (result.exit_code, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert not names or any(name in lines[0] for name in names), (names, lines[0])
    if output is not None:
        leftovers = [p.name for p in output.parent.iterdir() if p.name.startswith(".") and "tmp" in p.name]
        assert leftovers == [], leftovers
        if result.exit_code == 2:
            assert not output.exists(), f"{output} written by a failed command"
        elif output.suffix == ".json":
            json.loads(output.read_text())


def write(folder: Path, name: str, content) -> str:
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def graph_with(**ops) -> dict:
    return {**GRAPH, "ops": {**GRAPH["ops"], **ops}}


# ------------------------------------------------------------------ the issue's cases, one by one
def cases(f: Path):
    """(id, args, expected exit code, a text the error must hold); ``f`` is the case folder."""
    g, c, p, out = str(f / "g.json"), str(f / "c.toml"), str(f / "p.json"), str(f / "out.json")
    one_device = write(f, "one.toml", cluster_text(count="1"))
    target = write(f, "target.py", "import sys\n\ndef raises():\n    raise ValueError('bad config')\n\n"
                                   "def exits():\n    sys.exit(0)\n\ndef wrong():\n    return 3\n")
    placement = json.loads(Path(p).read_text())
    return [
        ("unknown option", ["place", g, "-c", c, "--algo", "m-sct", "--option", "bogus=1", "-o", out], 2, "'bogus'"),
        ("bad option value", ["place", g, "-c", c, "--algo", "metis", "--option", "imbalance=abc", "-o", out], 2,
         "imbalance"),
        ("negative seed", ["place", g, "-c", c, "--seed", "-1", "-o", out], 2, "--seed"),
        ("seed beyond 64 bits", ["place", g, "-c", c, "--seed", str(2**70), "-o", out], 2, "--seed"),
        ("--algos of commas", ["compare", g, "-c", c, "--algos", ","], 2, "--algos"),
        ("target that raises", ["info", f"{target}:raises", "-c", c], 2, "your function 'raises'"),
        ("target calling sys.exit(0)", ["info", f"{target}:exits", "-c", c], 2, "sys.exit(0)"),
        ("target returning a number", ["info", f"{target}:wrong", "-c", c], 2, "int"),
        ("negative zoo size", ["info", "zoo:mlp:layers=-1", "-c", c], 2, "layers=-1"),
        ("batch=0", ["info", "zoo:mlp:batch=0", "-c", c], 2, "batch=0"),
        ("huge zoo size", ["info", "zoo:mlp:hidden_units=99999999999", "-c", c], 2, "hidden_units"),
        ("integer beyond float range",
         ["info", write(f, "big.json", graph_with(persistent_bytes=[10**400, 1, 1]))], 2, "persistent_bytes"),
        ("integer of 5,000 digits",
         ["info", write(f, "digits.json", json.dumps(GRAPH).replace('"persistent_bytes": [10', '"persistent_bytes": [' + "9" * 5000))],
         2, "digits.json"),
        ("lone surrogate in an op name",
         ["place", write(f, "sur.json", json.dumps(GRAPH).replace('"a"', '"\\ud800"')), "-c", c, "-o", out], 2,
         "surrogate"),
        ("binary TOML", ["place", g, "-c", write(f, "bin.toml", b"\x00\xff\xfe\x80"), "-o", out], 2, "bin.toml"),
        ("100k-deep JSON", ["info", write(f, "deep.json", "[" * 100_000 + "]" * 100_000)], 2, "deep.json"),
        ("a million devices", ["place", g, "-c", write(f, "m.toml", cluster_text(count="1000000")), "-o", out], 2,
         "count"),
        ("output path under a file", ["place", g, "-c", c, "--algo", "single", "-o", str(f / "g.json" / "x.json")], 2,
         "is a file"),
        ("0-op graph, metis", ["place", write(f, "zero.json", {**GRAPH, "ops": {"name": [], "compute_us": {"gpu": []}},
                                                               "edges": {}}), "-c", c, "--algo", "metis", "-o", out],
         2, "no ops"),
        ("0-op graph, sim-search", ["place", str(f / "zero.json"), "-c", c, "--algo", "sim-search", "-o", out], 2,
         "no ops"),
        ("$\\cmd$ cluster name reaching matplotlib",
         ["compare", g, "-c", write(f, "dollar.toml", cluster_text(name='"$\\\\cmd$"')), "--algos", "single",
          "-o", str(f / "report")], 0, ""),
        ("rich markup in a cluster name", ["simulate", g, "-c", write(f, "markup.toml", cluster_text(name='"lab[/x]"')),
                                           "-p", p], 0, ""),
        ("info of a folder", ["info", str(f)], 2, "is a directory"),
        ("cluster with no devices", ["place", g, "-c", write(f, "nodev.toml", 'name = "n"\n'), "-o", out], 2,
         "[[devices]]"),
        ("negative bandwidth names its table",
         ["place", g, "-c", write(f, "neg.toml", cluster_text(bandwidth="-1")), "-o", out], 2, "[links.default]"),
        ("cost given as a string", ["info", write(f, "s.json", graph_with(compute_us={"gpu": ["1", 2, 3]}))], 2,
         "compute_us.gpu"),
        ("cost given as a boolean", ["info", write(f, "b.json", graph_with(compute_us={"gpu": [True, 2, 3]}))], 2,
         "compute_us.gpu"),
        ("values near 1e308", ["place", write(f, "max.json", graph_with(compute_us={"gpu": [1e308] * 3})), "-c", c,
                               "-o", out], 2, "compute_us.gpu"),
        ("cluster figure near 1e308", ["place", g, "-c", write(f, "lat.toml", cluster_text(latency="1e308")),
                                       "-o", out], 2, "latency_us"),
        ("--timeout 0", ["run", "zoo:mlp", "-p", p, "-c", c, "--timeout", "0"], 2, "--timeout"),
        ("--timeout -5", ["run", "zoo:mlp", "-p", p, "-c", c, "--timeout", "-5"], 2, "--timeout"),
        ("--backend checked before capture", ["run", "zoo:mlp", "-p", p, "-c", c, "--backend", "mpi"], 2, "--backend"),
        ("--steps checked before capture", ["run", "zoo:mlp", "-p", p, "-c", c, "--steps", "0"], 2, "--steps"),
        ("placement op count vs graph", ["simulate", write(f, "g4.json", graph_with(
            name=["a", "b", "c", "d"], kind=[""] * 4, compute_us={"gpu": [1, 2, 3, 4]}, persistent_bytes=[1] * 4,
            output_bytes=[1] * 4, temp_bytes=[0] * 4, colocation=[None] * 4, role=["forward"] * 4,
            mirror=[None] * 4)), "-c", c, "-p", p], 2, "4 ops"),
        ("placement's own n_ops edited", ["simulate", g, "-c", c, "-p", write(f, "n.json", {**placement, "n_ops": 7})],
         2, "n_ops"),
        ("placement for another cluster's devices",
         ["simulate", g, "-c", write(f, "cpu.toml", cluster_text().replace('kind = "gpu"', 'kind = "gpu"\nname = "x"')),
          "-p", write(f, "other.json", {**placement, "devices": [0, 1, 0]})], 2, "another cluster"),
        ("placement device beyond the cluster", ["simulate", g, "-c", one_device,
                                                 "-p", write(f, "far.json", {**placement, "devices": [1, 1, 1]})], 2,
         "device"),
    ]


@pytest.mark.parametrize("index", range(37))
def test_issue_case(folder, index):
    all_cases = cases(folder)
    name, args, code, text = all_cases[index]
    out = folder / "out.json"
    result = invoke(args)
    assert result.exit_code == code, (name, result.output)
    check(result, text, output=out if "-o" in args and args[args.index("-o") + 1] == str(out) else None)


def test_the_table_has_every_case(folder):
    assert len(cases(folder)) == 37


# ------------------------------------------------------------------ files: reproducible, never mixed
def test_place_writes_byte_identical_files_for_one_seed(folder):
    for algo in ("random", "m-sct", "sim-search"):
        texts = []
        for k in range(2):
            out = folder / f"{algo}-{k}.json"
            args = ["place", str(folder / "g.json"), "-c", str(folder / "c.toml"), "--algo", algo, "--seed", "3", "-o", str(out)]
            if algo == "sim-search":
                args += ["--option", "max_evals=20"]
            check(invoke(args), output=out)
            texts.append(out.read_bytes())
        assert texts[0] == texts[1], algo


def test_compare_into_a_used_folder_leaves_only_this_run(folder):
    report = folder / "report"
    args = ["compare", str(folder / "g.json"), "-c", str(folder / "c.toml"), "--algos", "single,m-etf", "-o", str(report)]
    check(invoke(args))
    assert (report / "best_placement.json").exists()
    (report / "notes.txt").write_text("mine")  # the user's own file: kept
    stale = report.parent / ".devplace-report-999999999-dead"  # a killed run's temporary folder
    stale.mkdir()
    (stale / "comparison.csv").write_text("half")
    nothing_fits = args[:-2] + ["--memory-fraction", "1e-9", "-o", str(report)]
    result = invoke(nothing_fits)
    check(result)
    assert not (report / "best_placement.json").exists(), "a best placement of the earlier run survived"
    assert not (report / "best_trace.json").exists()
    assert (report / "notes.txt").read_text() == "mine"
    assert json.loads((report / "comparison.json").read_text())[0]["step_time_us"] is None
    assert not stale.exists() and [p for p in folder.iterdir() if p.name.startswith(".devplace-report")] == []
    before = {p.name: p.read_bytes() for p in report.iterdir()}
    failed = invoke(args[:-2] + ["--algos", "nope", "-o", str(report)])
    check(failed, "nope")
    assert {p.name: p.read_bytes() for p in report.iterdir()} == before


# ------------------------------------------------------------------ hypothesis: mutated inputs
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
GRAPH_FIELDS = [("ops", key) for key in GRAPH["ops"]] + [("edges", key) for key in GRAPH["edges"]] + [
    (None, "version"), (None, "device_kinds"), (None, "ops"), (None, "edges"), (None, "meta")]


@FUZZ
@given(field=st.sampled_from(GRAPH_FIELDS), value=JSON_VALUES, entry=st.integers(min_value=-1, max_value=3))
def test_mutated_graphs(folder, field, value, entry):
    data = json.loads(json.dumps(GRAPH))
    table, key = field
    holder = data if table is None else data[table]
    if entry >= 0 and isinstance(holder.get(key), list) and entry < len(holder[key]):
        holder[key][entry] = value  # one entry of a column
    else:
        holder[key] = value
    path = write(folder, "m.json", data)
    out = folder / "m-out.json"
    out.unlink(missing_ok=True)
    result = invoke(["place", path, "-c", str(folder / "c.toml"), "--algo", "m-etf", "-o", str(out)])
    check(result, "m.json", key, "op", "colocation", "graph", output=out)


TOML_LITERALS = st.sampled_from(["0", "-1", "1e308", "-1e308", "inf", "nan", "1.5", '"x"', "true", "[]", "{}",
                                 str(10**30), str(2**64), '"$\\\\x$"', '"[/b]"', '""']) | st.integers().map(str) | \
    st.text(max_size=12)


@FUZZ
@given(field=st.sampled_from(list(CLUSTER_FIELDS)), literal=TOML_LITERALS)
def test_mutated_clusters(folder, field, literal):
    path = write(folder, "m.toml", cluster_text(**{field: literal}))
    out = folder / "m-out.json"
    out.unlink(missing_ok=True)
    result = invoke(["place", str(folder / "g.json"), "-c", path, "--algo", "m-sct", "-o", str(out)])
    check(result, "m.toml", "cluster", "device", "field", output=out)


@FUZZ
@given(key=st.sampled_from(["devices", "n_ops", "device_names", "format", "version", "priority", "options",
                            "graph_fingerprint", "algorithm"]), value=JSON_VALUES)
def test_mutated_placements(folder, key, value):
    data = json.loads((folder / "p.json").read_text())
    data[key] = value
    path = write(folder, "mp.json", data)
    result = invoke(["simulate", str(folder / "g.json"), "-c", str(folder / "c.toml"), "-p", path, "--json"])
    check(result, "mp.json", "placement", "device", "op")


ALGOS = ["single", "round-robin", "random", "m-topo", "m-etf", "m-sct", "metis", "expert", "heft", "sim-search"]


@FUZZ
@given(algo=st.sampled_from(ALGOS), key=st.sampled_from(["threshold", "imbalance", "max_evals", "seed", "x", ""])
       | st.text(max_size=6), value=st.text(max_size=10) | st.integers(min_value=-(10**20), max_value=10**20).map(str)
       | st.sampled_from(["nan", "inf", "-1", "0", "1e400", "true", "[]", "{}", "null"]),
       seed=st.integers(min_value=-5, max_value=2**64))
def test_placer_options_and_seeds(folder, algo, key, value, seed):
    out = folder / "o-out.json"
    out.unlink(missing_ok=True)
    result = invoke(["place", str(folder / "g.json"), "-c", str(folder / "c.toml"), "--algo", algo,
                     "--option", f"{key}={value}", "--seed", str(seed), "-o", str(out)])
    check(result, "option", key or "=", "--seed", algo, output=out)


@FUZZ
@given(model=st.sampled_from(["mlp", "gnmt", "transformer", "nope"]),
       key=st.sampled_from(["batch", "layers", "hidden_units", "seq_len", "preset", "dropout", "bogus"]),
       value=st.integers(max_value=-1).map(str) | st.integers(min_value=10**7 + 1).map(str)
       | st.text(alphabet=st.characters(blacklist_characters="0123456789,:=", blacklist_categories=("Cs",)), max_size=6)
       | st.sampled_from(["nan", "-inf", "1e999"]))
def test_zoo_settings(folder, model, key, value):
    result = invoke(["info", f"zoo:{model}:{key}={value}", "-c", str(folder / "c.toml")])
    assert result.exit_code == 2, result.output  # every one of these is wrong: none may start a capture
    check(result, model, key, "zoo")
