import numpy as np

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.graph import chain_graph


def test_chain_on_one_device_is_sum_of_times():
    g = chain_graph([10.0, 20.0, 30.0], edge_bytes=1000)
    assert dp.simulate(g, uniform_cluster(2), [0, 0, 0]).step_time_us == 60.0


def test_split_chain_pays_latency_and_bandwidth():
    g = chain_graph([10.0, 20.0, 30.0], edge_bytes=1000)
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100)
    # 10 + (5 + 1000/100) + 20 + 15 + 30
    assert dp.simulate(g, c, np.array([0, 1, 0])).step_time_us == 90.0


def test_every_runtime_dependency_is_imported_by_devplace_and_test_tools_are_extras():
    """A runtime dependency that only the tests import (networkx was one) costs every user an install."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    source = "\n".join(p.read_text() for p in (root / "devplace").rglob("*.py"))
    for requirement in project["dependencies"]:
        module = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).replace("-", "_")
        assert re.search(rf"^\s*(import|from) {module}\b", source, re.M), f"{requirement} is not imported by devplace/"
    assert not re.search(r"^\s*(import|from) networkx\b", source, re.M)
    assert any(r.startswith("networkx") for r in project["optional-dependencies"]["test"])
