"""The portfolio layer as the command line and the Python API meet it: one list of placers with
their options, specs with variants, and progress shown only where the caller installs a reporter."""

import io
import json
import subprocess
import sys

import pytest
from rich.console import Console

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.errors import PlacementError
from devplace.graph import chain_graph
from devplace.portfolio import available, parse_algo
from devplace.progress import RichReporter, reporting

GNMT = str(dp.example_path("gnmt_layers_training.json"))


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "devplace.cli", *args], capture_output=True, text=True, timeout=120)


def test_algos_json_lists_every_placer_with_typed_options_defaults_and_help():
    proc = run_cli("algos", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = {p["name"]: p for p in json.loads(proc.stdout)}
    assert set(listed) == set(available()) and "sim-search" in listed and "expert" in listed
    for name, info in available().items():
        assert listed[name] == json.loads(json.dumps(info.describe()))
    search = {o["name"]: o for o in listed["sim-search"]["options"]}
    assert search["max_evals"]["type"] == "int" and search["max_evals"]["default"] == 2000 and search["max_evals"]["help"]
    assert search["time_budget_s"]["default"] is None and "quiet" not in search
    assert all(o["help"] for p in listed.values() for o in p["options"])


def test_algos_table_shows_each_placers_options():
    proc = run_cli("algos")
    assert proc.returncode == 0, proc.stderr
    for name in available():
        assert name in proc.stdout
    assert "max_evals" in proc.stdout and "insertion" in proc.stdout


@pytest.mark.parametrize("algo, named", [("m-etf", "takes no options"), ("metis", "imbalance")])
def test_place_refuses_an_unknown_option_naming_the_valid_ones(tmp_path, algo, named):
    out = tmp_path / "p.json"
    proc = run_cli("place", GNMT, "--algo", algo, "--option", "nonsense=1", "--output", str(out))
    assert proc.returncode == 2 and "'nonsense'" in proc.stderr and named in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_place_takes_a_spec_with_variants_and_records_them():
    g = dp.load_graph(GNMT)
    c = dp.io.dnn_partitioning.cluster_for(g)
    p = dp.place(g, c, "m-etf+opt")
    assert p.algorithm == "m-etf" and p.options["coplacement"] and p.options["fusion"]
    assert not p.options["forward_only"] and p.options["coarse_ops"] < g.n_ops
    with pytest.raises(PlacementError, match="unknown variant 'fast'"):
        dp.place(g, c, "m-etf+fast")
    with pytest.raises(PlacementError, match="no placer named 'm-eft'.*m-etf"):
        parse_algo("m-eft+opt")


def test_rich_reporter_shows_the_best_step_time_and_clears_its_bars():
    seen = []

    class Watched(RichReporter):
        def update(self, done, *, best_step_us=None, note=""):
            super().update(done, best_step_us=best_step_us, note=note)
            task = self.progress.tasks[-1]
            seen.append((task.description, task.completed, task.total, task.fields["best"]))

    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    g, c = chain_graph([5.0, 1.0, 3.0, 2.0], edge_bytes=1.0), uniform_cluster(2)
    with reporting(Watched(console)) as bar, bar:
        p = dp.place(g, c, "sim-search", max_evals=40, seeds=("single", "round-robin"),
                     closed_gap=0.0)   # a chain on one device meets its bound: no round would run
        assert bar.progress.tasks == []    # every task ended and its bar went
    assert ("sim-search: seeds", 2, 2) in [row[:3] for row in seen]
    assert seen[-1][0] == "sim-search" and seen[-1][1:3] == (40, 40)
    assert seen[-1][3] == f"best {p.options['step_us'] / 1e3:.3f} ms"
    assert "sim-search" in console.file.getvalue()


def test_expert_gives_a_row_on_a_captured_model_no_rule_names():
    import torch
    from torch import nn

    from devplace.placers.expert import matching_rule

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(6)], nn.Linear(32, 4))
    loss = lambda out, y: nn.functional.cross_entropy(out, y)  # noqa: E731
    c = dp.load_cluster("baechi-4x2080")
    g = dp.capture(model, (torch.randn(8, 32),), loss, targets=(torch.zeros(8, dtype=torch.long),),
                   cost="roofline", cluster=c)
    assert matching_rule(g, 4) is None
    p = dp.place(g, c, "expert")                     # checked: fits, keeps colocation groups
    scope = g.meta["op_scope"]
    blocks = {}
    for i, s in enumerate(scope):
        if s and g.role[i] == dp.Role.FORWARD:
            blocks.setdefault(s.split(".")[0], set()).add(int(p.devices[i]))
    assert all(len(devices) == 1 for devices in blocks.values())          # a block stays whole
    order = [min(blocks[str(k)]) for k in range(7)]
    assert order == sorted(order) and set(order) == {0, 1, 2, 3}            # contiguous, every device used
