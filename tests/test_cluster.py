"""Cluster presets and the TOML layout: every preset loads, links are sane, bad fields are named."""

import dataclasses
import pickle

import numpy as np
import pytest

from devplace.cluster import Cluster, Device, load_cluster, preset_names, uniform_cluster
from devplace.errors import ClusterError, DevplaceError

PRESETS = ["8xh100-nvlink", "baechi-4x2080", "cpu+4gpu", "dgx1-8xv100", "placeto-k80"]


def test_the_issue_presets_exist():
    assert set(PRESETS) <= set(preset_names())


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_with_symmetric_links(name):
    c = load_cluster(name)
    assert c.name == name and c.n_devices >= 4
    assert np.array_equal(c.latency_us, c.latency_us.T)
    assert np.array_equal(c.bandwidth_bytes_per_us, c.bandwidth_bytes_per_us.T)
    off = ~np.eye(c.n_devices, dtype=bool)
    assert (c.bandwidth_bytes_per_us[off] > 0).all() and np.isfinite(c.bandwidth_bytes_per_us[off]).all()
    assert (c.latency_us[off] >= 0).all() and (np.diag(c.latency_us) == 0).all()
    assert np.isinf(np.diag(c.bandwidth_bytes_per_us)).all()
    assert (c.memory_bytes > 0).all()
    assert len(set(c.device_names)) == c.n_devices
    assert c.transfer_us(0, 0, 1e9) == 0.0


def test_baechi_preset_matches_baechi_code():
    c = load_cluster("baechi-4x2080")
    assert (c.n_devices, c.comm_model, c.op_gap_us) == (4, "sequential", 0.0)
    assert (c.memory_bytes == 8 * 2**30).all()
    assert c.transfer_us(1, 3, 0) == 0.0  # no bytes, no message: a pure ordering edge (as the simulator)
    for nbytes in (1, 10**6, 123456789):
        assert c.transfer_us(1, 3, nbytes) == pytest.approx(0.0001754 * nbytes + 134, rel=1e-12)


def test_placeto_preset_matches_placeto_constants():
    c = load_cluster("placeto-k80")
    assert c.op_gap_us == 5.7 and c.comm_model == "duplex"
    assert c.transfer_us(0, 2, 76_000) == pytest.approx(25 + 10)


def test_dgx1_is_a_hybrid_cube_mesh():
    c = load_cluster("dgx1-8xv100")
    bw = c.bandwidth_bytes_per_us
    nvlink = (bw >= 25_000) & ~np.eye(8, dtype=bool)
    # each V100 has six NVLink bricks of 25 GB/s spread over four neighbours
    assert (nvlink.sum(axis=1) == 4).all()
    assert (np.where(nvlink, bw, 0).sum(axis=1) == 6 * 25_000).all()
    for i in range(4):
        assert nvlink[i, i + 4]  # the cube's vertical edges
        assert all(nvlink[i, j] for j in range(4) if j != i)  # quads are fully connected
    assert not nvlink[0, 5] and c.latency_us[0, 5] > c.latency_us[0, 1]


def test_h100_and_heterogeneous_presets():
    h = load_cluster("8xh100-nvlink")
    assert (h.memory_bytes == 80 * 2**30).all() and h.comm_model == "duplex"
    het = load_cluster("cpu+4gpu")
    assert het.device_kinds == ["cpu", "gpu", "gpu", "gpu", "gpu"]
    assert het.memory_bytes[0] == 64 * 2**30 and (het.memory_bytes[1:] == 16 * 2**30).all()
    assert het.device_index("gpu2") == 3


def test_cluster_cannot_change_after_it_is_made():
    latency = np.full((2, 2), 3.0)
    c = Cluster("c", [Device("a", "gpu", 1e9), Device("b", "gpu", 1e9)], "parallel", latency,
                np.full((2, 2), 1e3), meta={"calibration": {"links": [{"latency_us": 3.0}]}})
    latency[0, 1] = 99.0  # the caller's array was copied
    assert c.latency_us[0, 1] == 3.0 and c.transfer_us(0, 1, 8.0) == 3.0 + 8e-3
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "renamed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.comm_model = "sequential"
    with pytest.raises(AttributeError):
        c.devices.append(Device("x", "gpu", 1e9))
    with pytest.raises(ValueError):
        c.send_overhead_us[0, 1] = 1.0
    with pytest.raises(TypeError, match="read-only"):
        c.meta["calibration"]["links"][0]["latency_us"] = 0.0
    assert not pickle.loads(pickle.dumps(c)).latency_us.flags.writeable  # pickling makes writeable arrays
    renamed = dataclasses.replace(c, name="renamed")  # a variant is a new cluster, validated again
    assert renamed.name == "renamed" and c.name == "c" and renamed.meta == c.meta
    with pytest.raises(ClusterError, match="comm_model 'nope'"):
        dataclasses.replace(c, comm_model="nope")


def test_memory_fraction_scales_memory_only():
    c = load_cluster("baechi-4x2080").with_memory_fraction(0.3)
    assert c.memory_bytes.tolist() == pytest.approx([0.3 * 8 * 2**30] * 4)
    assert c.comm_model == "sequential" and "mem0.3" in c.name
    with pytest.raises(ClusterError, match="memory fraction"):
        c.with_memory_fraction(0)


def write(tmp_path, text: str, name: str = "c.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
name = "mine"
comm_model = "parallel"
[[devices]]
kind = "gpu"
count = 2
memory_gib = 1
[links.default]
latency_us = 2
bandwidth_bytes_per_us = 100
"""


def test_custom_toml_file_with_pairs(tmp_path):
    path = write(tmp_path, GOOD + """
[[links.pairs]]
devices = ["gpu0", "gpu1"]
latency_us = 1
us_per_byte = 0.5
""")
    c = load_cluster(str(path))
    assert c.name == "mine" and c.device_names == ["gpu0", "gpu1"]
    assert c.transfer_us(1, 0, 10) == 1 + 5.0
    assert c.send_overhead_us.tolist() == [[0, 0], [0, 0]]  # left out: free


def test_message_overheads_load_per_link_and_survive_resizing(tmp_path):
    path = write(tmp_path, GOOD.replace("count = 2", "count = 3").replace(
        "bandwidth_bytes_per_us = 100", "bandwidth_bytes_per_us = 100\nsend_overhead_us = 4\nrecv_overhead_us = 9") + """
[[links.pairs]]
devices = ["gpu0", "gpu2"]
bandwidth_bytes_per_us = 5
recv_overhead_us = 1.5
""")
    c = load_cluster(path)
    assert c.send_overhead_us.tolist() == [[0, 4, 0], [4, 0, 4], [0, 4, 0]]  # a pair's table replaces the default
    assert c.recv_overhead_us.tolist() == [[0, 9, 1.5], [9, 0, 9], [1.5, 9, 0]]
    with pytest.raises(ClusterError, match="not uniform"):
        c.with_devices(2)
    two = load_cluster(write(tmp_path, GOOD.replace("latency_us = 2", "latency_us = 2\nrecv_overhead_us = 9"), "u.toml"))
    assert two.with_devices(4).recv_overhead_us[3, 0] == 9 and two.with_devices(4).recv_overhead_us[2, 2] == 0
    assert uniform_cluster(2, send_overhead_us=3).to_dict()["send_overhead_us"] == [[0, 3], [3, 0]]
    # placers plan a message as link latency + both overheads + bytes / bandwidth
    costly = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100, send_overhead_us=3, recv_overhead_us=4)
    assert costly.transfer_us(0, 1, 1000) == 5 + 3 + 4 + 10 and costly.transfer_us(1, 1, 1000) == 0


@pytest.mark.parametrize("edit,pattern", [
    (("count = 2", "count = 0"), "device entry 1 field 'count'"),
    (("count = 2", "count = 1.5"), "device entry 1 field 'count'"),
    (("count = 2", 'count = "two"'), "device entry 1 field 'count' must be a number"),
    (('kind = "gpu"', 'knd = "gpu"'), "device entry 1 has the unknown field 'knd'"),
    (("memory_gib = 1", "memory_gb = 1"), "unknown field 'memory_gb'"),
    (("memory_gib = 1", ""), "missing the field 'memory_gib'"),
    (("memory_gib = 1", "memory_gib = -1"), "device 'gpu0' has memory_bytes"),
    (('comm_model = "parallel"', 'comm_model = "mesh"'), "comm_model 'mesh'"),
    (('comm_model = "parallel"', 'comm-model = "duplex"'), "unknown field 'comm-model'"),
    (("latency_us = 2", "latency_us = -2"), r"\[links.default\] field 'latency_us'"),
    (("latency_us = 2", "send_overhead_us = -1"), r"\[links.default\] field 'send_overhead_us' must be >= 0"),
    (("latency_us = 2", "recv_overhead_us = nan"), r"field 'recv_overhead_us' must be >= 0"),
    (("latency_us = 2", "recv_overhead = 3"), "unknown field 'recv_overhead'"),
    (("bandwidth_bytes_per_us = 100", "bandwidth_bytes_per_us = 0"), "field 'bandwidth_bytes_per_us' must be > 0"),
    (("bandwidth_bytes_per_us = 100", "bandwith_bytes_per_us = 100"), "unknown field 'bandwith_bytes_per_us'"),
    (("bandwidth_bytes_per_us = 100", ""), "missing the field 'bandwidth_bytes_per_us'"),
    (("[links.default]", "[links.defaults]"), r"\[links\] has the unknown field 'defaults'"),
    (('name = "mine"', 'name = "mine"\nop_gap_us = -1'), "op_gap_us = -1"),
    (('name = "mine"', 'name = "mine"\nop_gap_us = "slow"'), "field 'op_gap_us' must be a number"),
])
def test_bad_toml_fields_are_named(tmp_path, edit, pattern):
    path = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(ClusterError, match=pattern):
        load_cluster(path)


@pytest.mark.parametrize("pair,pattern", [
    ('devices = ["gpu0", "gpu7"]', "entry 1 field 'devices' must name two different devices.*gpu7"),
    ('devices = ["gpu0", "gpu0"]', "two different devices"),
    ('devices = ["gpu0"]', "two different devices"),
])
def test_bad_link_pairs_are_named(tmp_path, pair, pattern):
    path = write(tmp_path, GOOD + f"\n[[links.pairs]]\n{pair}\nbandwidth_bytes_per_us = 5\n")
    with pytest.raises(ClusterError, match=pattern):
        load_cluster(path)


def test_malformed_tables_are_named():
    from devplace.cluster import cluster_from_dict

    one = [{"kind": "gpu", "memory_gib": 1, "count": 2}]
    for spec, pattern in (({"devices": {"kind": "gpu"}}, "field 'devices' must be a list"),
                          ({"devices": ["gpu"]}, "device entry 1 must be a table"),
                          ({"devices": one, "links": {"default": 5}}, r"\[links.default\] must be a table"),
                          ({"devices": one, "links": {"default": {"bandwidth_bytes_per_us": 5}, "pairs": {"a": 1}}},
                           "'links.pairs' must be a list")):
        with pytest.raises(ClusterError, match=pattern):
            cluster_from_dict(spec)


def test_missing_default_link_and_bad_files(tmp_path):
    no_links = GOOD.split("[links.default]")[0]
    with pytest.raises(ClusterError, match=r"missing \[links.default\]"):
        load_cluster(write(tmp_path, no_links))
    with pytest.raises(ClusterError, match="not valid TOML"):
        load_cluster(write(tmp_path, "name = [", "broken.toml"))
    with pytest.raises(ClusterError, match="does not exist"):
        load_cluster(tmp_path / "nothing.toml")
    with pytest.raises(ClusterError, match="no cluster preset named 'dgx9'.*baechi-4x2080"):
        load_cluster("dgx9")
    with pytest.raises(ClusterError, match="has no devices"):
        load_cluster(write(tmp_path, 'name = "empty"', "empty.toml"))


def test_constructor_checks_name_the_device_or_link():
    dev = [Device("a", "gpu", 1.0), Device("b", "gpu", 1.0)]
    lat = np.zeros((2, 2))
    bw = np.array([[np.inf, 5.0], [0.0, np.inf]])
    with pytest.raises(ClusterError, match="link 'b' -> 'a': bandwidth"):
        Cluster("x", dev, "parallel", lat, bw)
    with pytest.raises(ClusterError, match="names device 'a' twice"):
        Cluster("x", [dev[0], dev[0]], "parallel", lat, np.full((2, 2), 1.0))
    assert issubclass(ClusterError, DevplaceError)


def test_uniform_cluster():
    c = uniform_cluster(3, latency_us=4, bandwidth_bytes_per_us=2, memory_bytes=10, op_gap_us=1)
    assert c.n_devices == 3 and c.transfer_us(0, 2, 8) == 8.0
    assert c.to_dict()["latency_us"][1] == [4.0, 0.0, 4.0]


def test_the_documented_layout_loads(tmp_path):
    import re
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "cluster-format.md").read_text()
    layout = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    c = load_cluster(write(tmp_path, layout, "documented.toml"))
    assert c.n_devices == 8 and c.transfer_us(0, 1, 25_000) == 5 + 1
    assert c.transfer_us(0, 5, 10_000) == 15 + 1
