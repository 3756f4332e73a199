"""sim-search's gradient block track: a weight whose gradient is summed over time steps owns those
ops, the track lays the step out with each such block whole on one device, anneals from there,
repeats by seed, and never makes the result slower."""

import numpy as np
import pytest

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder, Role
from devplace.portfolio.sim_search.grad_blocks import HOW, gradient_blocks, gradient_owner

# the small RNNLM's weight-gradient chains hold 21% of its step; a few hundred evals a phase
SMALL = {"max_evals": 200, "max_rounds": 1, "small_graph_op_evals": 0, "virtual_caps": (),
         "layer_descent_evals": 0, "layer_search_evals": 0, "grad_block_share": 0.2, "grad_block_evals": 600,
         "grad_block_rounds": 1}


def _unrolled_weight(steps: int = 3):
    """A weight read at every step of a recurrence, its gradient summed over the steps in a chain; an
    embedding feeds every step, so each step's gate gradient also flows to the embedding's update."""
    b = GraphBuilder(["gpu"])

    def op(name, us, inputs=(), **kw):
        b.add_op(name, compute_us=us, **kw)
        for src in inputs:
            b.add_edge(src, name, bytes=1e3)
        return name

    w = op("w", 0.0, persistent_bytes=1e6, colocation="w", role=Role.OTHER)
    e = op("e", 0.0, persistent_bytes=1e6, colocation="e", role=Role.OTHER)
    h = op("h0", 1.0)
    states = [h]
    for t in range(steps):
        h = op(f"cell{t}", 10.0, [h, w, op(f"emb{t}", 1.0, [e])])
        states.append(h)
    g = op("loss_grad", 1.0, [h], role=Role.BACKWARD)
    total, inputs = None, []
    for t in reversed(range(steps)):
        gate = op(f"gate_grad{t}", 5.0, [g, states[t + 1]], role=Role.BACKWARD)
        grad = op(f"w_grad{t}", 8.0, [gate, states[t]], role=Role.BACKWARD)
        total = grad if total is None else op(f"sum{t}", 2.0, [total, grad], role=Role.BACKWARD)
        inputs.append(op(f"x_grad{t}", 1.0, [gate], role=Role.BACKWARD))
        g = gate
    op("w_update", 3.0, [w, total], colocation="w", role=Role.UPDATE)
    op("e_update", 1.0, [e] + inputs, colocation="e", role=Role.UPDATE)
    return b.build()


def test_a_weights_gradient_chain_is_owned_by_it_and_the_recurrence_is_not():
    g = _unrolled_weight()
    owner = gradient_owner(g)
    name = dict(zip(g.names, owner.tolist()))
    w = int(g.colocation[g.names.index("w_update")])
    for op in ("w_grad0", "w_grad1", "w_grad2", "sum0", "sum1", "w_update"):
        assert name[op] == w, op
    # the gate gradients feed the next step's gradient too; forward ops and the loss's feed the recurrence
    for op in ("gate_grad0", "gate_grad1", "gate_grad2", "loss_grad", "cell0", "h0"):
        assert name[op] == -1, op
    assert name["x_grad1"] == int(g.colocation[g.names.index("e_update")])
    block, share = gradient_blocks(g, uniform_cluster(2), 0.02)
    chain = [g.names.index(op) for op in ("w", "w_grad0", "sum0", "w_update")]
    assert len(set(block[chain].tolist())) == 1
    assert block[g.names.index("cell1")] != block[chain[0]]
    # w's block (3 products, 2 sums, its update: 31 us) and e's (3 input gradients, its update: 4 us) of 85 us
    assert share == pytest.approx((31 + 4) / 85)
    assert gradient_blocks(g, uniform_cluster(2), 0.05)[1] == pytest.approx(31 / 85)


@pytest.fixture(scope="module")
def rnnlm():
    pytest.importorskip("torch")
    from devplace.torchcapture import profile_target

    machine = dp.load_cluster("baechi-4x2080")
    return profile_target("zoo:rnnlm:preset=small", cost="roofline", cluster=machine), machine


def test_the_track_starts_from_whole_blocks_repeats_by_seed_and_never_slows(rnnlm, offered_starts):
    g, c = rnnlm
    offered = offered_starts(HOW)
    runs = [dp.place(g, c, "sim-search", seed=2, **SMALL) for _ in range(2)]
    report = runs[0].options["grad_blocks"]
    assert report["share"] >= 0.2 and report["rounds"] == 1 and len(report["descent_ends_us"]) >= 2
    block, _ = gradient_blocks(g, c, SMALL.get("grad_block_min_share", 0.02))
    assert offered, "the track offered no start"
    for devices in offered:     # every block the track starts from is whole on one device
        assert all(len(np.unique(devices[block == b])) == 1 for b in range(int(block.max()) + 1))
    assert np.array_equal(runs[0].devices, runs[1].devices) and np.array_equal(runs[0].priority, runs[1].priority)
    assert runs[0].options["grad_blocks"] == runs[1].options["grad_blocks"]
    assert dp.simulate(g, c, runs[0]).fits
    without = dp.place(g, c, "sim-search", seed=2, **(SMALL | {"grad_block_evals": 0}))
    assert without.options["grad_blocks"] == {}
    assert runs[0].options["step_us"] <= without.options["step_us"]
    # below the share the track does not run, and the search is the one without it
    gated = dp.place(g, c, "sim-search", seed=2, **(SMALL | {"grad_block_share": 0.5}))
    assert "rounds" not in gated.options["grad_blocks"] and np.array_equal(gated.devices, without.devices)
