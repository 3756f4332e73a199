"""sim-search's branch track: the branches of a many-branch cell, found from the forward pass, each
move whole with their backward ops and weights; the track starts from such maps, repeats by seed and
never makes the result slower."""

import numpy as np
import pytest

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder, Role
from devplace.portfolio.sim_search.branches import HOW, branch_pieces, fork_branches

# a few hundred evals a phase; target_gap 0 so the track runs on a graph whose gap is small
SMALL = {"max_evals": 200, "max_rounds": 1, "small_graph_op_evals": 0, "virtual_caps": (), "canonical_caps": (),
         "layer_descent_evals": 0, "layer_search_evals": 0, "target_gap": 0.0, "branch_evals": 400,
         "branch_rounds": 1, "branch_starts": 3}
BRANCHES = 4


def _cell_step(cells: int = 2):
    """A training step through ``cells`` cells, each forking its input into four branches of two
    weighted ops that a concat joins; every forward op has a mirrored backward op, every weight an
    update. The first op of each branch also writes statistics that only the backward reads (a
    batch norm's), a dead end of the forward pass."""
    b = GraphBuilder(["gpu"])
    readers: dict[str, list[str]] = {}

    def op(name, us, inputs=(), **kw):
        b.add_op(name, compute_us=us, output_bytes=1e3, **kw)
        for src in inputs:
            b.add_edge(src, name, bytes=1e3)
            readers.setdefault(src, []).append(name)
        return name

    def weighted(name, us, x):
        w = op(f"{name}.w", 0.0, persistent_bytes=1e5, colocation=name, role=Role.OTHER)
        return op(name, us, [x, w]), w

    forward, weights = [], []
    x = op("data", 0.0, role=Role.OTHER)
    x = op("stem", 5.0, [x])
    forward.append(x)
    for c in range(cells):
        ends = []
        for k in range(BRANCHES):
            a, wa = weighted(f"c{c}.b{k}.conv0", 10.0, x)
            op(f"c{c}.b{k}.stats", 0.5, [a])
            z, wz = weighted(f"c{c}.b{k}.conv1", 10.0, a)
            forward += [a, z, f"c{c}.b{k}.stats"]
            weights += [wa, wz]
            ends.append(z)
        x = op(f"c{c}.concat", 1.0, ends)
        forward.append(x)
    loss = op("loss", 1.0, [x])
    grad = {}
    for name in reversed(forward + [loss]):
        outs = [grad[r] for r in readers.get(name, []) if r in grad]
        grad[name] = op(f"{name}.grad", 2.0, outs + [name], role=Role.BACKWARD, mirror=name)
    for w in weights:
        reader = w[:-2]
        op(f"{w}.update", 1.0, [w, grad[reader]], colocation=reader, role=Role.UPDATE)
    return b.build()



def test_each_branch_is_one_piece_with_its_backward_ops_and_weights():
    g = _cell_step()
    assert len(fork_branches(g, 3)) == 2 * BRANCHES
    assert fork_branches(g, BRANCHES + 1) == []      # no cell has five branches
    piece, share = branch_pieces(g, uniform_cluster(2), 3)
    at = {name: int(piece[i]) for i, name in enumerate(g.names)}
    seen = set()
    for c in range(2):
        for k in range(BRANCHES):
            ops = [f"c{c}.b{k}.{part}" for part in ("conv0", "conv0.w", "conv0.w.update", "conv0.grad", "stats",
                                                    "stats.grad", "conv1", "conv1.w", "conv1.w.update", "conv1.grad")]
            assert len({at[name] for name in ops}) == 1, ops
            seen.add(at[ops[0]])
    assert len(seen) == 2 * BRANCHES                 # each branch a piece of its own
    assert not seen & {at["stem"], at["c0.concat"], at["c1.concat"], at["loss"]}
    branch_us = 2 * BRANCHES * (10 + 10 + 0.5 + 3 * 2 + 2 * 1)
    assert share == pytest.approx(branch_us / float(g.compute_us.min(axis=1).sum()))


def test_the_track_starts_from_whole_branches_repeats_by_seed_and_never_slows(offered_starts):
    g = _cell_step()
    c = uniform_cluster(2)
    offered = offered_starts(HOW)
    runs = [dp.place(g, c, "sim-search", seed=1, **SMALL) for _ in range(2)]
    report = runs[0].options["branches"]
    assert report["share"] >= 0.25 and report["rounds"] == 1 and len(report["descent_ends_us"]) >= 2
    assert np.array_equal(runs[0].devices, runs[1].devices) and np.array_equal(runs[0].priority, runs[1].priority)
    assert runs[0].options["branches"] == runs[1].options["branches"]
    assert dp.simulate(g, c, runs[0]).fits
    without = dp.place(g, c, "sim-search", seed=1, **(SMALL | {"branch_evals": 0}))
    assert without.options["branches"] == {} and report["before_us"] == without.options["step_us"]
    piece, _ = branch_pieces(g, c, 3)
    assert len(offered) >= 2, "the track offered no start"
    for devices in offered:     # a descent's end: each piece where the best before had it, or whole on one device
        for p in range(int(piece.max()) + 1):
            ops = piece == p
            assert np.array_equal(devices[ops], without.devices[ops]) or len(np.unique(devices[ops])) == 1
    assert runs[0].options["step_us"] <= without.options["step_us"]
    # below the share the track does not run, and the search is the one without it
    gated = dp.place(g, c, "sim-search", seed=1, **(SMALL | {"branch_share": 0.99}))
    assert "rounds" not in gated.options["branches"] and np.array_equal(gated.devices, without.devices)
