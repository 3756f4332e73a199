"""The command line: JSON outputs carry the promised fields; bad input is one line, exit 2."""

import json
import subprocess
import sys

import pytest

import devplace as dp

GNMT = str(dp.example_path("gnmt_layers_training.json"))


def run_cli(*args, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "devplace.cli", *args], capture_output=True, text=True, timeout=120
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_info_json_has_the_promised_fields():
    data = json.loads(run_cli("info", GNMT, "--json").stdout)
    assert data["ops"] == 192 and data["edges"] == 244
    assert data["roles"]["forward"] == 96 and data["roles"]["backward"] == 96
    assert data["persistent_bytes"] == pytest.approx(4933015040.0)
    assert data["total_compute_us"]["gpu"] == pytest.approx(520453.0)
    assert data["order_only_edges"] == 0


def test_info_counts_order_only_edges(tmp_path):
    from devplace.graph import GraphBuilder

    b = GraphBuilder(["gpu"])
    for name in ("read", "write"):
        b.add_op(name, compute_us=1.0, output_bytes=8.0)
    b.add_edge("read", "write", order_only=True)
    path = tmp_path / "g.json"
    dp.save_graph(b.build(), path)
    assert "order-only edges" in run_cli("info", str(path)).stdout
    assert "order-only edges" not in run_cli("info", GNMT).stdout


def test_place_then_simulate_json_and_trace(tmp_path):
    placement = tmp_path / "p.json"
    trace = tmp_path / "trace.json"
    run_cli("place", GNMT, "--algo", "single", "--output", str(placement))
    data = json.loads(run_cli("simulate", GNMT, "-p", str(placement), "--json", "--trace", str(trace)).stdout)
    assert data["step_time_us"] == pytest.approx(520453.0)
    assert len(data["peak_memory_bytes"]) == 6 and data["oom_devices"] == []
    assert json.loads(trace.read_text())["traceEvents"]
    # one device: the critical path is compute alone, and the table says so
    assert data["critical_path_split_us"] == {"compute": pytest.approx(520453.0), "transfer": 0.0,
                                              "channel_wait": 0.0, "other": 0.0}
    assert "520.453 ms compute, 0.000 ms transfers" in run_cli("simulate", GNMT, "-p", str(placement)).stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["info", "/no/such/graph.json"], "does not exist"),
        (["simulate", GNMT, "-c", "no-such-cluster", "-p", "x.json"], "no cluster preset named 'no-such-cluster'"),
        (["place", GNMT, "--algo", "no-such-algo", "--output", "x.json"], "no placer named 'no-such-algo'"),
    ],
)
def test_bad_input_is_one_clear_line(args, needle, tmp_path):
    proc = run_cli(*args, check=False)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3


def test_cyclic_graph_names_the_cycle_and_writes_nothing(tmp_path):
    graph = {
        "format": "devplace-graph", "version": 1, "device_kinds": ["gpu"],
        "ops": {"name": ["a", "b", "c"], "compute_us": {"gpu": [1, 1, 1]}},
        "edges": {"src": ["a", "b", "c"], "dst": ["b", "c", "b"]},
    }
    path = tmp_path / "cyclic.json"
    path.write_text(json.dumps(graph))
    out = tmp_path / "placement.json"
    proc = run_cli("place", str(path), "-c", "baechi-4x2080", "--algo", "single", "--output", str(out), check=False)
    assert proc.returncode == 2 and "cycle" in proc.stderr and "'b'" in proc.stderr and "'c'" in proc.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [path]


def test_simulate_refuses_a_placement_for_another_graph(tmp_path):
    placement = tmp_path / "p.json"
    dp.Placement(devices=[0, 0, 0]).save(placement)
    proc = run_cli("simulate", GNMT, "-p", str(placement), check=False)
    assert proc.returncode == 2 and "3 entries but the graph has 192 ops" in proc.stderr


def test_simulate_warns_on_stderr_when_a_placement_splits_a_colocation_group(tmp_path):
    graph = dp.load_graph(GNMT)
    split = tmp_path / "split.json"
    dp.Placement(devices=[i % 2 for i in range(graph.n_ops)]).save(split, graph)
    proc = run_cli("simulate", GNMT, "-p", str(split), "--json")
    assert json.loads(proc.stdout)["step_time_us"] > 0  # still simulated, stdout still one JSON object
    warning = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert len(warning) == 1 and "splits colocation group" in warning[0] and "more" in warning[0]
    whole = tmp_path / "whole.json"
    dp.Placement(devices=[0] * graph.n_ops).save(whole, graph)
    assert "warning" not in run_cli("simulate", GNMT, "-p", str(whole), "--json").stderr


def test_compare_writes_report_and_json_rows(tmp_path):
    out = tmp_path / "report"
    rows = json.loads(run_cli("compare", GNMT, "--algos", "single", "--output", str(out), "--json").stdout)
    assert [r["algorithm"] for r in rows] == ["single"]
    assert {"algorithm", "step_time_us", "placement_time_s", "peak_memory_bytes", "oom", "error"} <= set(rows[0])
    assert rows[0]["step_time_us"] == pytest.approx(520453.0)
    for name in ("report.html", "comparison.csv", "comparison.json", "step_times.png", "best_timeline.png",
                 "best_memory.png", "best_placement.png", "best_trace.json"):
        assert (out / name).stat().st_size > 0, name
    assert "best_timeline.png" in (out / "report.html").read_text()


def test_compare_passes_scoped_options_to_their_rows_only():
    graph, cluster = dp.load_graph(GNMT), dp.load_cluster("baechi-4x2080")
    default = dp.simulate(graph, cluster, dp.place(graph, cluster, algo="heft")).step_time_us
    no_insertion = dp.simulate(graph, cluster, dp.place(graph, cluster, algo="heft", insertion=False)).step_time_us
    assert no_insertion != pytest.approx(default)  # else this test could not see the option arrive
    rows = json.loads(run_cli("compare", GNMT, "-c", "baechi-4x2080", "--algos", "heft,single",
                              "--option", "heft.insertion=false", "--json").stdout)
    assert rows[0]["step_time_us"] == pytest.approx(no_insertion) and rows[1]["error"] is None
    # a placer's name reaches each of its rows; a row's own spec reaches that row alone
    for scope, refused in (("m-sct", {"m-sct", "m-sct+opt"}), ("m-sct+opt", {"m-sct+opt"})):
        rows = json.loads(run_cli("compare", GNMT, "-c", "baechi-4x2080", "--algos", "single,m-sct,m-sct+opt",
                                  "--option", f"{scope}.nonsense=1", "--json").stdout)
        assert {r["algorithm"] for r in rows if r["error"] and "nonsense" in r["error"]} == refused


@pytest.mark.parametrize(
    "option, needle",
    [
        ("m-etf.threshold=1", "'m-etf', which is not in this run: use one of single, m-sct"),
        ("threshold=1", "must look like ALGO.key=value"),
        ("m-sct.threshold", "must look like ALGO.key=value"),
    ],
)
def test_compare_refuses_an_option_for_no_row(option, needle):
    proc = run_cli("compare", GNMT, "--algos", "single,m-sct", "--option", option, check=False)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_written_files_get_ordinary_permissions(tmp_path):
    from devplace.fileio import write_text_atomic

    path = tmp_path / "x.json"
    write_text_atomic(path, "{}")
    assert path.stat().st_mode & 0o777 == 0o666 & ~_current_umask()


def _current_umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------ one set of conventions
COMMANDS = ("info", "clusters", "algos", "place", "simulate", "compare", "profile", "run", "calibrate", "families",
            "train placeto", "train mars-encoder")


def command_options() -> dict[str, list[list[str]]]:
    """Each subcommand's options, as the flag spellings of each (``["--output", "-o"]``); a sub-app's
    commands are named with it (``train placeto``)."""
    from typer.main import get_command

    from devplace.cli import app

    commands = {}
    for name, command in get_command(app).commands.items():
        inner = getattr(command, "commands", None)
        commands |= {f"{name} {sub}": c for sub, c in inner.items()} if inner else {name: command}
    return {name: [param.opts + param.secondary_opts for param in command.params if param.param_type_name == "option"]
            for name, command in commands.items()}


def test_every_subcommand_takes_help_and_json_and_spells_shared_options_alike():
    from typer.testing import CliRunner

    from devplace.cli import app

    options = command_options()
    assert sorted(options) == sorted(COMMANDS), "a new subcommand: add it to COMMANDS and to the JSON walk"
    for name, params in options.items():
        flags = {flag for spellings in params for flag in spellings}
        assert "--json" in flags, f"{name} has no --json"
        for spellings in params:
            # one meaning per flag in every command: -o the output path, -c the cluster, --option a placer's
            for short, long in (("-o", "--output"), ("-c", "--cluster"), ("-p", "--placement")):
                assert (short in spellings) == (long in spellings), f"{name}: {spellings}"
            if "--option" in spellings:
                assert spellings == ["--option"], f"{name}: {spellings}"
        assert "--out" not in flags, f"{name} spells its output --out: use -o/--output"
        shown = CliRunner().invoke(app, [*name.split(), "--help"], terminal_width=200)
        assert shown.exit_code == 0 and "--json" in shown.output, name
    assert ["--option"] in options["place"] and ["--option"] in options["compare"]
    assert all(any("--output" in s for s in options[name]) for name in ("place", "compare", "profile", "calibrate"))


def test_every_subcommand_prints_json(tmp_path):
    """Each command's --json output parses and carries its main figure (calibrate: tests/test_execute.py,
    which replaces the slow measurement). In one process, so torch is imported once."""
    from typer.testing import CliRunner

    from devplace.cli import app

    def json_of(*args):
        result = CliRunner().invoke(app, [*args, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    cluster = tmp_path / "two.toml"
    cluster.write_text('name = "two"\n[[devices]]\nkind = "cpu"\ncount = 2\nmemory_gib = 4\npeak_tflops = 0.05\n'
                       'memory_bandwidth_gbps = 10\n'
                       "[links.default]\nlatency_us = 50\nbandwidth_bytes_per_us = 1000\n")
    assert json_of("info", GNMT)["ops"] == 192
    assert "baechi-4x2080" in [c["name"] for c in json_of("clusters")]
    assert {"single", "m-sct"} <= {a["name"] for a in json_of("algos")}
    assert json_of("families", "-o", str(tmp_path / "families"))["families"][0]["members"] >= 32
    placed = json_of("place", GNMT, "--algo", "m-etf", "-o", str(tmp_path / "p.json"))
    assert placed["step_time_us"] == pytest.approx(json_of("simulate", GNMT, "-p", str(tmp_path / "p.json"))["step_time_us"])
    assert json_of("compare", GNMT, "--algos", "single")[0]["step_time_us"] == pytest.approx(520453.0)
    mlp = "zoo:mlp:preset=small"
    graph = json_of("profile", mlp, "-o", str(tmp_path / "mlp.json"), "--cost", "roofline", "-c", str(cluster))
    assert graph["ops"] == dp.load_graph(tmp_path / "mlp.json").n_ops > 0
    json_of("place", str(tmp_path / "mlp.json"), "-c", str(cluster), "--algo", "round-robin", "-o", str(tmp_path / "rr.json"))
    ran = json_of("run", mlp, "-p", str(tmp_path / "rr.json"), "-c", str(cluster), "--steps", "1", "--warmup", "0")
    assert ran["measured_step_time_us"] > 0 and "one CPU thread" in ran["simulated_as"]


def test_run_without_a_cluster_says_it_calibrates_first(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    import devplace.execute as execute
    from typer.testing import CliRunner

    from devplace.cli import app

    seen = {}
    monkeypatch.setattr(execute, "prepare", lambda target, cost: None)
    monkeypatch.setattr(execute, "run", lambda *args, **kwargs: seen.update(kwargs))  # None: nothing to print
    dp.Placement(devices=[0]).save(tmp_path / "p.json")  # read before the capture, so it must exist
    result = CliRunner().invoke(app, ["run", "zoo:mlp", "-p", str(tmp_path / "p.json")])
    assert result.exit_code == 0 and seen["cluster"] is None
    assert len(result.stderr.strip().splitlines()) == 1
    assert "no --cluster: calibrating this machine's devices and links first (about 15 s" in result.stderr
    (tmp_path / "two.toml").write_text('name = "two"\n[[devices]]\nkind = "cpu"\ncount = 2\nmemory_gib = 1\n'
                                       '[links.default]\nlatency_us = 1\nbandwidth_bytes_per_us = 1\n')
    result = CliRunner().invoke(app, ["run", "zoo:mlp", "-p", str(tmp_path / "p.json"), "-c", str(tmp_path / "two.toml")])
    assert result.exit_code == 0 and result.stderr == ""


def test_bracketed_text_is_printed_verbatim_never_as_markup(tmp_path):
    """Exception text, file names and cluster names reach the terminal as they are: a "[/x]" must
    not crash the printer (rich's MarkupError) and "[links.default]" must not vanish."""
    odd = tmp_path / "lab[/x]" / "[bold]ghost.json"
    proc = run_cli("info", str(odd), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "[/x]" in proc.stderr and "[bold]ghost.json" in proc.stderr
    cluster = tmp_path / "odd.toml"
    cluster.write_text('name = "lab[/x] [bold]"\ncomm_model = "duplex"\n\n[[devices]]\nkind = "gpu"\n'
                       'memory_gib = 1000\ncount = 6\n\n[links.default]\nlatency_us = 5\n'
                       'bandwidth_bytes_per_us = 10000\n')
    placement = tmp_path / "p.json"
    run_cli("place", GNMT, "-c", str(cluster), "--algo", "single", "--output", str(placement))
    proc = run_cli("simulate", GNMT, "-c", str(cluster), "-p", str(placement))
    assert "lab[/x] [bold]" in proc.stdout and "MarkupError" not in proc.stderr
