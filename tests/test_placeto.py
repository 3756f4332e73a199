"""Placeto: learns a family, places an unseen member zero-shot, ships a policy, refuses a wrong device count."""

import csv
import json

import numpy as np
import pytest

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.errors import DevplaceError
from devplace.graph import GraphBuilder
from devplace.learn.placeto import PlacetoOptions, shipped_policy_path, train_policy, unit_graph

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

CLUSTER = uniform_cluster(2, bandwidth_bytes_per_us=1e4, latency_us=5.0)


def ladder(seed: int):
    """A chain of random length and op costs whose every op also feeds the one after next, each tensor
    costing more to send than any op takes: the known good placement is one device (every split pays)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(["gpu"])
    n = int(rng.integers(5, 10))
    for i in range(n):
        b.add_op(f"op{i}", compute_us=float(rng.uniform(50.0, 150.0)), output_bytes=2e6)
        for back in (1, 2):
            if i >= back:
                b.add_edge(f"op{i - back}", f"op{i}", bytes=2e6)
    return b.build().with_meta(name=f"ladder_{seed}")


def one_device_us(graph) -> float:
    return dp.simulate(graph, CLUSTER, np.zeros(graph.n_ops, dtype=np.int64)).step_time_us


def step_us(graph, cluster, **options) -> float:
    return dp.simulate(graph, cluster, dp.place(graph, cluster, algo="placeto", **options)).step_time_us


@pytest.fixture(scope="module")
def family_policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("placeto") / "ladder.pt"
    # a test-sized budget, from the paper's random start (the default start, expert, is already one device here)
    fast = PlacetoOptions(learning_rate=0.01, final_learning_rate=0.001, start="random")
    figures = train_policy([ladder(seed) for seed in range(6)], CLUSTER, path, samples=800, seed=0, options=fast)
    return path, figures


def test_a_policy_trained_on_a_family_places_an_unseen_member_as_well_as_the_known_good_placement(family_policy):
    path, figures = family_policy
    assert figures["samples_simulated"] >= 800 and figures["graphs"] == 6
    for seed in (100, 101, 102):      # members it has never seen
        graph = ladder(seed)
        assert step_us(graph, CLUSTER, policy=str(path), start="random") <= 1.001 * one_device_us(graph)
        # not a placement found by chance: the random start the episode leaves from is much slower
        start = dp.place(graph, CLUSTER, algo="random", seed=0)
        assert dp.simulate(graph, CLUSTER, start).step_time_us > 1.2 * one_device_us(graph)


def test_ancestry_follows_the_edges_and_units_cap():
    b = GraphBuilder(["gpu"])
    for name in "sabt":
        b.add_op(name, compute_us=1.0)
    for src, dst in ("sa", "sb", "at", "bt"):
        b.add_edge(src, dst)
    ug = unit_graph(b.build(), CLUSTER)
    assert ug.n_units == 4
    descendants = np.unpackbits(ug.descendants, axis=1, count=4).astype(bool)
    ancestors = np.unpackbits(ug.ancestors, axis=1, count=4).astype(bool)
    assert descendants[0].tolist() == [False, True, True, True]
    assert (ancestors == descendants.T).all()
    assert not descendants[1, 2] and not descendants[2, 1]    # a and b are parallel
    assert unit_graph(ladder(0), CLUSTER, max_units=3).n_units == 3


def test_same_seed_same_policy_and_placement(tmp_path):
    graphs = [ladder(seed) for seed in range(2)]
    runs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        path = tmp_path / f"{name}.pt"
        train_policy(graphs, CLUSTER, path, samples=60, seed=seed)
        state = torch.load(path, weights_only=True)["state"]
        placement = dp.place(ladder(7), CLUSTER, algo="placeto", policy=str(path), finetune_samples=30, seed=seed)
        runs.append((state, placement.devices.tolist()))
    (a, pa), (b, pb), (c, _) = runs
    assert all(torch.equal(a[k], b[k]) for k in a) and pa == pb
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("memory_bytes", [8 * 2**30, 1.5e7])   # ample (step time only), and binding (memory too)
def test_incremental_episodes_train_the_same_policy_bit_for_bit(tmp_path, memory_bytes):
    """Training episodes re-simulate each move incrementally (above ``incremental_from_units``): the same seed
    gives the same parameters and the same log as whole simulations, and the incremental ones simulate fewer ops."""
    cluster = uniform_cluster(3, bandwidth_bytes_per_us=1e4, latency_us=5.0, memory_bytes=memory_bytes)
    graphs = [ladder(seed) for seed in range(3)]
    runs = {}
    for incremental in (True, False):
        path = tmp_path / f"{incremental}.pt"
        options = PlacetoOptions(start="random", incremental_from_units=0 if incremental else 10**9,
                                 log=str(tmp_path / f"{incremental}.csv"))
        train_policy(graphs, cluster, path, samples=300, seed=5, options=options)
        with open(tmp_path / f"{incremental}.csv") as log:
            rows = [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(log)]
        runs[incremental] = (torch.load(path, weights_only=True)["state"], rows)
    (fast, fast_log), (whole, whole_log) = runs[True], runs[False]
    assert all(torch.equal(fast[k], whole[k]) for k in fast) and fast_log == whole_log and len(fast_log) > 10
    from devplace.learn import placeto_policy as pp

    ug = unit_graph(graphs[0], cluster)
    episodes = [pp.run_episode(pp.PlacetoNet(3), ug, 1, PlacetoOptions(incremental_from_units=limit),
                               torch.Generator().manual_seed(0), pp.Start("random")) for limit in (0, 10**9)]
    assert episodes[0].costs_s == episodes[1].costs_s
    assert episodes[0].simulated_ops < episodes[1].simulated_ops == episodes[1].simulations * ug.env.graph.n_ops


def test_a_policy_for_another_device_count_is_refused(family_policy):
    path, _ = family_policy
    with pytest.raises(DevplaceError, match=r"places on 2 devices but cluster .* has 3: train a policy for 3"):
        dp.place(ladder(0), uniform_cluster(3), algo="placeto", policy=str(path))


def test_a_file_that_is_not_a_policy_is_refused(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_text("not a policy")
    with pytest.raises(DevplaceError, match="cannot read policy"):
        dp.place(ladder(0), CLUSTER, algo="placeto", policy=str(bad))


@pytest.mark.parametrize("n_devices", [4, 2])
def test_the_shipped_policy_for_the_clusters_device_count_loads_and_places_a_zoo_model(n_devices):
    from devplace.cluster import load_cluster
    from devplace.torchcapture import profile_target

    cluster = load_cluster("baechi-4x2080").with_devices(n_devices)
    assert shipped_policy_path(n_devices).stat().st_size < 4 * 2**20
    graph = profile_target("zoo:mlp:preset=small", cost="roofline", cluster=cluster)
    placement = dp.place(graph, cluster, algo="placeto")        # no policy option: the shipped one
    assert placement.options["policy"].endswith(f"placeto-{n_devices}dev.pt")
    assert dp.simulate(graph, cluster, placement).fits


def test_a_device_count_without_a_shipped_policy_is_refused_naming_the_counts_shipped():
    with pytest.raises(DevplaceError, match=r"no shipped policy for 3 devices \(policies are shipped for 2 and 4 "
                                            r"devices\); train one with `devplace train placeto"):
        dp.place(ladder(0), uniform_cluster(3), algo="placeto")


def test_train_and_place_from_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from devplace.cli import app

    graph_file = tmp_path / "g.json"
    dp.save_graph(ladder(1), graph_file)
    cluster_file = tmp_path / "two.toml"
    cluster_file.write_text('name = "two"\ncomm_model = "parallel"\n[[devices]]\nname = "gpu"\nkind = "gpu"\n'
                            'count = 2\nmemory_gib = 8\n[links.default]\nlatency_us = 5\nus_per_byte = 0.0001\n')
    policy = tmp_path / "p.pt"
    runner = CliRunner()
    trained = runner.invoke(app, ["train", "placeto", "--graph", str(graph_file), "-c", str(cluster_file),
                                  "--samples", "40", "-o", str(policy), "--json"])
    assert trained.exit_code == 0, trained.output
    assert json.loads(trained.stdout)["samples_simulated"] >= 40 and policy.exists()
    placed = runner.invoke(app, ["place", str(graph_file), "-c", str(cluster_file), "--algo", "placeto",
                                 "--option", f"policy={policy}", "-o", str(tmp_path / "p.json"), "--json"])
    assert placed.exit_code == 0, placed.output
    missing = runner.invoke(app, ["train", "placeto", "-c", str(cluster_file), "-o", str(policy)])
    assert missing.exit_code == 2 and "give --family" in missing.output

    no_cluster = runner.invoke(app, ["train", "placeto", "--graph", str(graph_file), "-o", str(policy)])
    assert no_cluster.exit_code == 2 and "give --cluster for --graph" in no_cluster.output


def test_family_training_uses_each_familys_cluster_and_skips_members_that_cannot_fit(monkeypatch):
    from devplace.learn.placeto import family_graphs
    from devplace.zoo import families

    big = GraphBuilder(["gpu"])
    big.add_op("huge", compute_us=1.0, output_bytes=5e9)     # one op bigger than a device of either cluster
    small, too_big = ladder(1), big.build()
    own = {"a": uniform_cluster(4, memory_bytes=1e9), "b": uniform_cluster(4, memory_bytes=2e9)}
    monkeypatch.setattr(families, "load", lambda member: too_big if member == "b:1" else small)
    monkeypatch.setattr(families, "default_cluster", lambda name: own[name])

    class Member(str):
        target = property(lambda self: str(self))

    monkeypatch.setattr(families, "split", lambda name: ([Member(f"{name}:0"), Member(f"{name}:1")], []))
    graphs, targets, clusters, skipped = family_graphs(["a", "b"])
    assert targets == ["a:0", "a:1", "b:0"] and skipped == ["b:1"]
    assert clusters == [own["a"], own["a"], own["b"]] and len(graphs) == 3
    fixed = uniform_cluster(4, memory_bytes=4e9)
    _, targets, clusters, skipped = family_graphs(["a", "b"], fixed)
    assert clusters == [fixed] * 3 and skipped == ["b:1"]


def test_options_are_declared_with_the_authors_defaults():
    options = PlacetoOptions()
    assert (options.learning_rate, options.final_learning_rate, options.grad_clip) == (1e-3, 1e-4, 1.25)
    with pytest.raises(DevplaceError, match="finetune_samples"):
        dp.place(ladder(0), CLUSTER, algo="placeto", policy="scratch", finetune_samples=-1)


@pytest.mark.parametrize("acyclic", [True, False])
def test_reach_bits_is_the_transitive_closure(acyclic):
    from devplace.learn.placeto import reach_bits

    n = 60
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, n, 150), rng.integers(0, n, 150)
    if acyclic:
        src, dst = np.minimum(src, dst), np.maximum(src, dst)
        src, dst = src[src != dst], dst[src != dst]
    closure = np.zeros((n, n), dtype=bool)
    closure[src, dst] = True
    for _ in range(n):
        closure |= (closure.astype(int) @ closure.astype(int)) > 0
    assert (np.unpackbits(reach_bits(n, src, dst), axis=1, count=n).astype(bool) == closure).all()


def test_an_episode_from_a_placement_never_returns_worse_than_its_start():
    """Start from round-robin (every edge crosses, so slow): whatever an untrained policy does, the placement
    returned is at least as fast as round-robin's own, and a sampled training episode's best state is at
    least as good as the state it started from."""
    from devplace.learn import placeto_policy as pp
    from devplace.learn.placeto import start_placement
    from devplace.learn.train import one_thread

    options = PlacetoOptions(start="round-robin")
    for seed in range(4):
        graph = ladder(seed)
        start_us = dp.simulate(graph, CLUSTER, dp.place(graph, CLUSTER, algo="round-robin", seed=seed)).step_time_us
        placed = dp.place(graph, CLUSTER, algo="placeto", policy="scratch", start="round-robin", seed=seed)
        assert placed.options["start"] == "round-robin" and placed.options["start_step_us"] == pytest.approx(start_us)
        assert dp.simulate(graph, CLUSTER, placed).step_time_us <= start_us
        ug = unit_graph(graph, CLUSTER)
        start = start_placement(ug, options, seed)
        assert start.unit_devices.tolist() == [i % 2 for i in range(ug.n_units)]
        with one_thread():
            episode = pp.run_episode(pp.PlacetoNet(2), ug, 1, options, torch.Generator().manual_seed(seed), start)
        assert episode.best_cost_s <= episode.costs_s[0]


def random_dag(seed: int, n: int = 14):
    rng = np.random.default_rng(seed)
    b = GraphBuilder(["gpu"])
    for i in range(n):
        b.add_op(f"op{i}", compute_us=float(rng.uniform(10, 200)), output_bytes=1e4)
        for j in range(i):
            if rng.random() < 0.25:
                b.add_edge(f"op{j}", f"op{i}", bytes=float(rng.uniform(1e3, 1e5)))
    return b.build()


def test_a_list_schedulers_start_keeps_its_op_order_so_placeto_is_never_slower_than_it():
    """m-ETF's placement runs in its schedule's order (its priorities); on these graphs the same devices
    in the default order are 1-23% slower, so returning the start's devices alone would lose to the start."""
    cluster = uniform_cluster(2, bandwidth_bytes_per_us=1e3, latency_us=5.0)
    returned = set()
    for seed in (1, 5, 7, 9):
        graph = random_dag(seed)
        placed = dp.place(graph, cluster, algo="placeto", policy="scratch", start="m-etf", seed=0)
        start = dp.place(graph, cluster, algo="m-etf", seed=0)
        assert placed.options["start_step_us"] == pytest.approx(dp.simulate(graph, cluster, start).step_time_us)
        assert dp.simulate(graph, cluster, placed).step_time_us <= placed.options["start_step_us"] * (1 + 1e-9)
        returned.add(placed.options["returned"])
    assert "start" in returned


def test_the_papers_random_start_is_an_option_and_a_bad_start_is_refused():
    placed = dp.place(ladder(0), CLUSTER, algo="placeto", policy="scratch", start="random")
    assert placed.options["start"] == "random" and placed.options["returned"] == "episode"
    with pytest.raises(DevplaceError, match="option start"):
        dp.place(ladder(0), CLUSTER, algo="placeto", policy="scratch", start="placeto,expert")
