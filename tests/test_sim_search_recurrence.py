"""sim-search's recurrence track: a recurrent weight's readers stay with their layer, an input
weight's readers, each weight's gradient chain and its own ops are pieces apart; the track lays
the step out piece by piece, anneals from there, repeats by seed and never makes the result slower."""

import numpy as np

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder, Role
from devplace.portfolio.sim_search.grad_blocks import gradient_blocks
from devplace.portfolio.sim_search.recurrence import HOW, is_recurrent, recurrence_pieces, weight_readers

# a few hundred evals a phase; target_gap 0 so the track runs whatever the gap
SMALL = {"max_evals": 150, "max_rounds": 1, "small_graph_op_evals": 0, "virtual_caps": (), "canonical_caps": (),
         "layer_descent_evals": 0, "layer_search_evals": 0, "coarse_mip_groups": 0, "grad_block_evals": 300,
         "grad_block_rounds": 1, "recurrence_evals": 2000, "recurrence_rounds": 1, "target_gap": 0.0}


def _recurrent_layer(steps: int = 4):
    """One unrolled layer: an input weight ``wx`` projects each step's input (its products depend
    only on the input), a hidden weight ``wh`` is read by each step's cell, which depends on the cell
    before (the recurrence); each weight's gradient is a product per step summed in a chain."""
    b = GraphBuilder(["gpu"])

    def op(name, us, inputs=(), nbytes=1e4, **kw):
        b.add_op(name, compute_us=us, **kw)
        for src in inputs:
            b.add_edge(src, name, bytes=nbytes)
        return name

    wx = op("wx", 0.0, persistent_bytes=1e6, colocation="wx", role=Role.OTHER)
    wh = op("wh", 0.0, persistent_bytes=1e6, colocation="wh", role=Role.OTHER)
    h, states, inputs = op("h0", 1.0), [], []
    for t in range(steps):
        x = op(f"x{t}", 1.0)
        wx_t = op(f"wx_view{t}", 0.0, [wx])              # a transpose: takes no time
        proj = op(f"proj{t}", 20.0, [x, wx_t])
        h = op(f"cell{t}", 30.0, [h, wh, proj])
        states.append(h)
        inputs.append(x)
    grad = op("loss_grad", 5.0, [h], role=Role.BACKWARD)
    sums = {"wx": None, "wh": None}
    for t in reversed(range(steps)):
        grad = op(f"gate_grad{t}", 10.0, [grad, states[t]], role=Role.BACKWARD)
        op(f"x_grad{t}", 20.0, [grad, f"wx_view{t}"], role=Role.BACKWARD)
        for w, source in (("wx", inputs[t]), ("wh", states[t])):
            product = op(f"{w}_grad{t}", 40.0, [grad, source], role=Role.BACKWARD)
            sums[w] = product if sums[w] is None else op(f"{w}_sum{t}", 20.0, [sums[w], product], 1e6,
                                                         role=Role.BACKWARD)
    op("wx_update", 10.0, ["wx", sums["wx"]], 1e6, colocation="wx", role=Role.UPDATE)
    op("wh_update", 10.0, ["wh", sums["wh"]], 1e6, colocation="wh", role=Role.UPDATE)
    return b.build()


def test_an_input_weights_readers_are_a_piece_and_a_hidden_weights_stay_with_the_recurrence():
    g = _recurrent_layer()
    index = {name: k for k, name in enumerate(g.names)}
    wx_readers, wh_readers = weight_readers(g, index["wx"]), weight_readers(g, index["wh"])
    # through the views that take no time; the update is not a reader
    assert {g.names[v] for v in wx_readers} >= {"wx_view0", "proj0", "x_grad0", "proj3"}
    assert "wx_update" not in {g.names[v] for v in wx_readers}
    assert is_recurrent(g, wh_readers) and not is_recurrent(g, wx_readers)
    piece, recurrent = recurrence_pieces(g, uniform_cluster(2), 0.02)
    assert recurrent == 1
    name = dict(zip(g.names, piece.tolist()))
    assert name["proj0"] == name["proj3"] == name["x_grad1"] != name["x0"]       # the input weight's readers
    # the hidden weight's readers (the cells) stay in their layers' pieces: grouped as in the gradient blocks
    block, _ = gradient_blocks(g, uniform_cluster(2), 0.02)
    kept = [index[op] for op in ("cell0", "cell1", "cell2", "cell3", "gate_grad2", "h0")]
    assert all((block[a] == block[b]) == (piece[a] == piece[b]) for a in kept for b in kept)
    assert name["cell0"] != name["proj0"]
    assert name["wh_grad0"] == name["wh_sum1"] != name["wh"] == name["wh_update"]   # chain apart from own ops
    assert name["wx_grad2"] == name["wx_sum0"] not in (name["wx"], name["proj0"], name["wh_grad0"])


def test_the_track_starts_from_whole_pieces_repeats_by_seed_and_never_slows(offered_starts):
    g, c = _recurrent_layer(), uniform_cluster(3)
    offered = offered_starts(HOW)
    runs = [dp.place(g, c, "sim-search", seed=1, **SMALL) for _ in range(2)]
    report = runs[0].options["recurrence"]
    assert report["recurrent_weights"] == 1 and report["rounds"] == 1 and len(report["descent_ends_us"]) >= 2
    piece, _ = recurrence_pieces(g, c, 0.02)
    assert offered, "the track offered no start"
    for devices in offered:     # every piece the track starts from is whole on one device
        assert all(len(np.unique(devices[piece == p])) == 1 for p in range(int(piece.max()) + 1))
    assert np.array_equal(runs[0].devices, runs[1].devices) and np.array_equal(runs[0].priority, runs[1].priority)
    assert runs[0].options["recurrence"] == runs[1].options["recurrence"]
    assert dp.simulate(g, c, runs[0]).step_time_us == runs[0].options["step_us"]
    without = dp.place(g, c, "sim-search", seed=1, **(SMALL | {"recurrence_evals": 0}))
    assert without.options["recurrence"] == {}
    assert runs[0].options["step_us"] <= without.options["step_us"]
    # the track runs last: without it the search is the one before it
    assert runs[0].options["recurrence"]["before_us"] == without.options["step_us"]
