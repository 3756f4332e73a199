"""Graph families: deterministic members and splits, a cache that captures once and heals itself."""

import json
import subprocess
import sys

import pytest

from devplace.errors import DevplaceError
from devplace.zoo import families

# a tiny transformer (two layers, width 32): captured in about a second
TINY = families.Member("transformer", "transformer", tuple(sorted(dict(
    layers=2, hidden=32, heads=4, ffn_units=64, vocab=100, seq_len=16, batch=2).items())))


@pytest.mark.parametrize("family", families.family_names())
def test_members_are_deterministic_by_seed_and_at_least_32(family):
    first, again, other = families.members(family, 0), families.members(family, 0), families.members(family, 1)
    assert first == again
    assert len(first) >= 32 and len({m.key for m in first}) == len(first)
    assert first != other
    assert all(m.family == family for m in first)


def test_recurrent_mixes_language_and_translation_models():
    models = [m.model for m in families.members("recurrent")]
    assert models.count("rnnlm") == models.count("gnmt") == len(models) // 2


def test_members_build_valid_zoo_configurations():
    from devplace import zoo

    for family in families.family_names():
        for member in families.members(family):
            name, config = zoo.parse_target(member.target)
            assert name == member.model and config == dict(member.config)
            zoo.resolve_config(name, **config)  # raises on a key or value the zoo refuses


def test_grids_respect_their_size_limits():
    for member in families.members("nasnet", seed=3):
        c = dict(member.config)
        assert 3 <= 2 + c["stages"] * c["cells_per_stage"] + c["stages"] - 1 <= 7
    for member in families.members("recurrent", seed=3):
        c = dict(member.config)
        assert c["layers"] * c["seq_len"] <= (60 if member.model == "rnnlm" else 24)


@pytest.mark.parametrize("family", families.family_names())
def test_split_is_80_20_disjoint_and_deterministic(family):
    train, held_out = families.split(family, seed=5)
    assert (train, held_out) == families.split(family, seed=5)
    assert len(held_out) == round(0.2 * (len(train) + len(held_out)))
    assert not {m.key for m in train} & {m.key for m in held_out}
    assert sorted(train + held_out, key=lambda m: m.key) == sorted(families.members(family, 5), key=lambda m: m.key)


def test_member_keys_are_stable_strings():
    # the key names the cache file: it must not change between runs or Python processes
    assert TINY.key == "transformer-" + __import__("hashlib").sha256(TINY.target.encode()).hexdigest()[:12]
    assert TINY.target.startswith("zoo:transformer:batch=2,")


def test_unknown_family_names_the_valid_ones():
    for call in (families.members, families.split, families.default_cluster):
        with pytest.raises(DevplaceError, match="nasnet, recurrent, transformer"):
            call("nosuch")


def test_default_cluster_has_four_devices_with_memory_cut():
    from devplace.cluster import load_cluster

    full = load_cluster(families.CAPTURE_CLUSTER).devices[0].memory_bytes
    for family in families.family_names():
        cluster = families.default_cluster(family)
        assert cluster.n_devices == 4 and cluster.devices[0].memory_bytes < full


def test_default_cluster_cut_to_two_devices_keeps_the_memory_in_all():
    for family in families.family_names():
        four, two = families.default_cluster(family), families.default_cluster(family, 2)
        assert two.n_devices == 2 and two.memory_bytes.sum() == pytest.approx(four.memory_bytes.sum())
        assert (two.bandwidth_bytes_per_us[0, 1], two.latency_us[0, 1]) == (four.bandwidth_bytes_per_us[0, 1],
                                                                           four.latency_us[0, 1])


@pytest.fixture(scope="module")
def tiny_graph():
    return families.capture(TINY)


@pytest.fixture
def counted_captures(monkeypatch, tiny_graph):
    """Every capture ``load`` asks for, answered by the one real capture of TINY."""
    calls = []

    def counting(member):
        calls.append(member.key)
        return tiny_graph

    monkeypatch.setattr(families, "capture", counting)
    return calls


def test_load_caches_and_second_load_does_not_capture(tmp_path, counted_captures):
    graph = families.load(TINY, tmp_path)
    path = families.cache_path(TINY, tmp_path)
    assert path.is_file() and counted_captures == [TINY.key]
    assert graph.meta["family_member"]["target"] == TINY.target
    assert graph.meta["cost_model"] == "roofline" and graph.role_counts()["update"] > 0
    again = families.load(TINY, tmp_path)
    assert counted_captures == [TINY.key]  # from the file
    assert again.n_ops == graph.n_ops and (again.compute_us == graph.compute_us).all()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_corrupt_or_foreign_cache_file_is_captured_again(tmp_path, counted_captures):
    path = families.cache_path(TINY, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "devplace-graph", "ver')  # truncated
    graph = families.load(TINY, tmp_path)
    assert counted_captures == [TINY.key] and graph.n_ops > 0
    json.loads(path.read_text())  # rewritten whole
    data = json.loads(path.read_text())
    data["meta"]["family_member"]["target"] = "zoo:transformer:layers=9"  # a file of another member
    path.write_text(json.dumps(data))
    families.load(TINY, tmp_path)
    assert counted_captures == [TINY.key, TINY.key]


def test_cache_dir_follows_devplace_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DEVPLACE_CACHE", str(tmp_path))
    assert families.cache_path(TINY).parent.parent.parent == tmp_path / "families"
    monkeypatch.delenv("DEVPLACE_CACHE")
    assert families.default_cache_dir().parts[-3:] == (".cache", "devplace", "families")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "devplace.cli", "families", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_lists_families_as_json(tmp_path):
    proc = run_cli("--json", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [r["family"] for r in data["families"]] == families.family_names()
    for row in data["families"]:
        assert row["members"] >= 32 and row["train"] + row["held_out"] == row["members"] and row["cached"] == 0


def test_cli_bad_family_is_one_line_exit_2():
    proc = run_cli("--build", "nosuch")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nasnet, recurrent, transformer" in proc.stderr
