"""Declared placer options: every placer lists its options, and a bad one is refused by name."""

import dataclasses

import pytest

from devplace.cluster import uniform_cluster
from devplace.errors import PlacementError
from devplace.graph import chain_graph
from devplace.portfolio import available, place
from devplace.placers.options import describe_options


def test_every_placer_declares_a_frozen_options_class_with_help():
    for name, info in available().items():
        assert dataclasses.is_dataclass(info.options), name
        assert info.options.__dataclass_params__.frozen, name
        for described in describe_options(info.options):
            assert described["help"], f"{name}.{described['name']} has no help"
            assert described["type"], f"{name}.{described['name']} has no type"


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(PlacementError, match=r"no option 'nonsense'.*insertion \(bool\).*contention \(bool\)"):
        place(chain_graph([1.0, 2.0]), uniform_cluster(2), algo="heft", nonsense=1)
    with pytest.raises(PlacementError, match="takes no options"):
        place(chain_graph([1.0, 2.0]), uniform_cluster(2), algo="m-etf", nonsense=1)


@pytest.mark.parametrize("algo, key, value", [
    ("heft", "insertion", "yes"), ("metis", "imbalance", "a lot"), ("m-sct", "threshold", True),
    ("sim-search", "max_evals", 1.5), ("pipeline-partition", "method", "layers"),
])
def test_mistyped_option_is_refused_by_name(algo, key, value):
    with pytest.raises(PlacementError, match=f"'{key}' of placer '{algo}'"):
        place(chain_graph([1.0, 2.0]), uniform_cluster(2), algo=algo, **{key: value})


def test_given_options_reach_the_placer_and_are_recorded():
    p = place(chain_graph([1.0, 2.0]), uniform_cluster(2), algo="sim-search", max_evals=7,
              seeds=["single", "m-etf"])
    assert p.options["max_evals"] == 7 and p.options["seeds"] == ("single", "m-etf")
    assert set(p.options["seed_results"]) == {"single", "m-etf"}
