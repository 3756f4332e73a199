"""What users do today, as placers: Accelerate's device_map="auto", DeepSpeed's pipeline stages,
torch.fx's size-based partition (issue 15, point 7)."""

import numpy as np
import pytest

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.errors import OutOfMemoryError, PlacementError
from devplace.graph import GraphBuilder

MIB = 2.0**20
USER_BASELINES = ["accelerate-auto", "pipeline-partition", "fx-size-partition"]


def model_graph(params_mib: dict[str, float], *, tied: tuple[str, str] | None = None) -> dp.OpGraph:
    """A training step of a chain of modules: per module scope a parameter, a forward op, its backward
    op and its update (colocated with the parameter); ``tied`` modules share one parameter group."""
    b = GraphBuilder(["gpu"])
    scopes = []

    def op(name, scope, **kw):
        b.add_op(name, compute_us=10.0, **kw)
        scopes.append(scope)

    def group(s):
        return "w:" + (tied[0] if tied and s in tied else s)

    op("input", "", output_bytes=1024)
    previous = "input"
    for s, mib in params_mib.items():
        op(f"p:{s}", s, persistent_bytes=mib * MIB, role="other", colocation=group(s))
        op(f"f:{s}", s, output_bytes=1024)
        b.add_edge(previous, f"f:{s}", bytes=1024)
        b.add_edge(f"p:{s}", f"f:{s}", bytes=1024)
        previous = f"f:{s}"
    op("loss", "", output_bytes=4)
    b.add_edge(previous, "loss", bytes=4)
    previous = "loss"
    for s in reversed(params_mib):
        op(f"b:{s}", s, output_bytes=1024, role="backward", mirror=f"f:{s}")
        b.add_edge(previous, f"b:{s}", bytes=1024)
        op(f"u:{s}", s, role="update", colocation=group(s))
        b.add_edge(f"b:{s}", f"u:{s}", bytes=1024)
        b.add_edge(f"p:{s}", f"u:{s}", bytes=1024)
        previous = f"b:{s}"
    return b.build().with_meta(op_scope=scopes)


def forward_devices(graph, placement) -> dict[str, int]:
    """Device per module scope (its forward op), after checking its other ops went with it."""
    out = {}
    for name in graph.names:
        if name.startswith("f:"):
            scope = name[2:]
            ops = [f"{k}:{scope}" for k in "pfbu"]
            devices = {int(placement.devices[graph.index(o)]) for o in ops}
            assert len(devices) == 1, f"{scope}: parameter, forward, backward and update split over {devices}"
            out[scope] = devices.pop()
    return out


LAYERED = {"embed": 1, "layers.0.attn": 0.5, "layers.0.mlp": 0.5, "layers.1.attn": 0.5, "layers.1.mlp": 0.5,
           "layers.2.attn": 0.5, "layers.2.mlp": 0.5, "head.dense": 4, "head.decoder": 4}


def test_accelerate_splits_a_module_into_children_but_never_a_layer():
    g = model_graph(LAYERED)
    # 10 MiB devices: embed and the layers (4 MiB) and head.dense (4) fit device 0, head.decoder does not
    p = dp.place(g, uniform_cluster(2, memory_bytes=10 * MIB), "accelerate-auto")
    assert forward_devices(g, p) == {s: int(s == "head.decoder") for s in LAYERED}
    # caps of 2.25 MiB: layer 1 would fit half on device 0, but a layer moves whole
    small = model_graph({k: v for k, v in LAYERED.items() if not k.startswith("head")} | {"head": 0.25})
    p = dp.place(small, uniform_cluster(3, memory_bytes=9 * MIB), "accelerate-auto", max_memory_fraction=0.25)
    assert forward_devices(small, p) == {"embed": 0, "layers.0.attn": 0, "layers.0.mlp": 0,
                                         "layers.1.attn": 1, "layers.1.mlp": 1, "layers.2.attn": 1,
                                         "layers.2.mlp": 1, "head": 2}


def test_accelerate_caps_every_device_but_the_last_at_a_balanced_share():
    # ample memory: 16 equal modules of 1 MiB on 4 devices; share 16/4 + 1.25 * 1 = 5.25 MiB
    g = model_graph({f"m{i}": 1.0 for i in range(16)})
    p = dp.place(g, uniform_cluster(4), "accelerate-auto")
    devices = list(forward_devices(g, p).values())
    assert devices == [0] * 5 + [1] * 5 + [2] * 5 + [3]


def test_pipeline_partition_balances_parameters_or_layers():
    g = model_graph({"embed": 1, "layers.0.attn": 0.5, "layers.0.mlp": 0.5, "layers.1": 1, "layers.2": 1,
                     "head": 8})
    # layers: embed 1, layers.0 1, layers.1 1, layers.2 1, head 8 (MiB of parameters)
    by_params = forward_devices(g, dp.place(g, uniform_cluster(2), "pipeline-partition"))
    assert by_params == {"embed": 0, "layers.0.attn": 0, "layers.0.mlp": 0, "layers.1": 0, "layers.2": 0, "head": 1}
    uniform = forward_devices(g, dp.place(g, uniform_cluster(2), "pipeline-partition", method="uniform"))
    assert uniform == {"embed": 0, "layers.0.attn": 0, "layers.0.mlp": 0, "layers.1": 0, "layers.2": 1, "head": 1}


def test_partition_balanced_is_the_lightest_bottleneck():
    from itertools import combinations

    from devplace.placers.pipeline_partition import partition_balanced

    rng = np.random.default_rng(0)
    for _ in range(30):
        weights = rng.integers(0, 10, size=int(rng.integers(4, 9))).astype(float)
        stages = int(rng.integers(2, 4))
        bounds = partition_balanced(weights, stages)
        assert bounds[0] == 0 and bounds[-1] == len(weights) and np.all(np.diff(bounds) >= 0)
        got = max(weights[a:b].sum() for a, b in zip(bounds, bounds[1:]))
        best = min(max(weights[a:b].sum() for a, b in zip((0, *cut), (*cut, len(weights))))
                   for cut in combinations(range(len(weights) + 1), stages - 1) if list(cut) == sorted(cut))
        assert got == pytest.approx(best)


def test_fx_fills_each_device_to_its_memory_in_op_order_even_inside_a_layer():
    g = model_graph({k: v for k, v in LAYERED.items() if not k.startswith("head")})
    # 2.7 MiB devices: embed, layer 0 and layer 1's attention fill device 0; layer 1's mlp opens device 1
    p = dp.place(g, uniform_cluster(3, memory_bytes=2.7 * MIB), "fx-size-partition")
    assert forward_devices(g, p) == {"embed": 0, "layers.0.attn": 0, "layers.0.mlp": 0, "layers.1.attn": 0,
                                     "layers.1.mlp": 1, "layers.2.attn": 1, "layers.2.mlp": 1}


@pytest.mark.parametrize("algo", USER_BASELINES)
def test_graph_without_scopes_is_cut_in_op_order(algo):
    g = model_graph({f"m{i}": 1.0 for i in range(8)}).with_meta(op_scope=None)
    devices = list(forward_devices(g, dp.place(g, uniform_cluster(2, memory_bytes=6 * MIB), algo)).values())
    assert devices == sorted(devices) and devices[0] == 0 and devices[-1] == 1


@pytest.mark.parametrize("algo", USER_BASELINES)
def test_colocation_groups_stay_whole(algo):
    g = model_graph({"embed": 2, "layers.0": 2, "layers.1": 2, "layers.2": 2, "head": 1}, tied=("embed", "head"))
    p = dp.place(g, uniform_cluster(3, memory_bytes=5 * MIB), algo)
    assert p.colocation_violations(g) == []
    assert p.devices[g.index("p:embed")] == p.devices[g.index("u:head")] == p.devices[g.index("f:embed")]
    assert len(set(p.devices.tolist())) > 1


@pytest.mark.parametrize("algo", USER_BASELINES)
def test_a_split_that_cannot_fit_is_refused_by_name(algo):
    g = model_graph({"embed": 1, "head.dense": 4, "head.decoder": 4})
    # the step (9 MiB and a few KiB) is too big for two devices of 4.5 MiB: refused before placing
    with pytest.raises(OutOfMemoryError, match=f"{algo} cannot fit the step.*give the devices more memory"):
        dp.place(g, uniform_cluster(2, memory_bytes=4.5 * MIB), algo)
    # with 5 MiB it fits in total, not as these placers cut it (head.dense goes beside embed or alone)
    expected = {"accelerate-auto": "accelerate-auto found no device with room for op 'p:head.decoder'.*another placer",
                "fx-size-partition": "fx-size-partition found no device with room for op 'p:head.decoder'.*another placer",
                "pipeline-partition": "placement by 'pipeline-partition' does not fit: device 'gpu0' needs"}
    with pytest.raises(OutOfMemoryError, match=expected[algo]):
        dp.place(g, uniform_cluster(2, memory_bytes=5 * MIB), algo)


def test_bad_options_are_named():
    g = model_graph({"a": 1})
    with pytest.raises(PlacementError, match="method.*parameters, uniform"):
        dp.place(g, uniform_cluster(2), "pipeline-partition", method="type:Block")
    with pytest.raises(PlacementError, match="max_memory_fraction"):
        dp.place(g, uniform_cluster(2), "accelerate-auto", max_memory_fraction=1.5)


@pytest.fixture(scope="module", params=["gnmt", "transformer"])
def zoo_step(request):
    from devplace.torchcapture import profile_target

    cluster = dp.load_cluster("baechi-4x2080")
    return profile_target(f"zoo:{request.param}:preset=small", cost="roofline", cluster=cluster), cluster


@pytest.mark.parametrize("algo", ["accelerate-auto", "pipeline-partition", "pipeline-partition:uniform",
                                  "fx-size-partition"])
def test_each_fits_a_captured_zoo_model(zoo_step, algo):
    graph, cluster = zoo_step
    name, _, method = algo.partition(":")
    # and a tight one, so every baseline has to spread the step: devices of twice its even share. fx's
    # greedy fill, counting every received copy (a weight's too) and never freeing, is not monotone in
    # memory: it refuses GNMT at 2.5x and 3x and the Transformer at 2x and 3.5x, so it gets the first of
    # 2x and 3x at which it places
    kw = {"method": method} if method else {}
    assert not dp.simulate(graph, cluster, dp.place(graph, cluster, name, **kw)).oom_devices  # place() simulates too
    need = float((graph.persistent_bytes + graph.output_bytes).sum())
    factors = (2, 3) if name == "fx-size-partition" else (2,)
    for factor in factors:
        tight = cluster.with_memory_fraction(factor * need / cluster.n_devices / float(cluster.memory_bytes.min()))
        try:
            p = dp.place(graph, tight, name, **kw)
        except OutOfMemoryError:
            assert factor != factors[-1], f"{name} places at none of {factors} x the even share"
            continue
        assert not dp.simulate(graph, tight, p).oom_devices and len(set(p.devices.tolist())) > 1
        break
