"""How well Mars's pre-trained encoders read graphs they never saw: DGI discriminator accuracy on held-out graphs.

Deep Graph Infomax trains a discriminator to tell a node's embedding in the real graph from one in
the graph with its feature rows shuffled; on graphs outside the pre-training corpus, its accuracy
says whether the encoder learned structure that carries over (0.5 is chance). Measured on the
held-out 20% of every graph family (``devplace families``; the shipped encoder pre-trains on the
training 80% only) and on the two zoo graphs ``tests/test_mars.py`` holds out, for each encoder file
given and for a random encoder of the same width (its GCN at random, its discriminator at random).

    .venv/bin/python benchmarks/mars_encoder.py devplace/data/mars-encoder.pt OTHER.pt
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import devplace as dp
from devplace.learn.encoder import corpus_graphs, dgi_model, discriminator_accuracy, load_encoder, unit_graph
from devplace.learn.mars import mars_units
from devplace.learn.train import seeded
from devplace.zoo import families

HELD_OUT_ZOO = ("zoo:transformer:preset=small,layers=3", "zoo:rnnlm:preset=small,layers=2")


def held_out_graphs(max_units: int) -> dict:
    """Per group (each family's held-out split, and the test's zoo graphs) the unit graphs."""
    cluster = dp.load_cluster(families.CAPTURE_CLUSTER)
    groups = {f"family:{name} (held out)": [families.load(m) for m in families.split(name)[1]]
              for name in families.family_names()}
    groups["zoo (tests' held out)"] = [corpus_graphs(t, cluster)[0][1] for t in HELD_OUT_ZOO]
    return {name: [unit_graph(g, mars_units(g, max_units).unit_of) for g in graphs] for name, graphs in groups.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("encoders", nargs="+", help="encoder files (devplace train mars-encoder)")
    args = parser.parse_args(argv)
    models = {path: load_encoder(path) for path in args.encoders}
    meta = next(iter(models.values()))[1]
    with seeded(0):
        models["random"] = (dgi_model(meta["hidden"], torch.Generator().manual_seed(0)), meta)
    groups = held_out_graphs(meta["max_units"])
    table = {name: {group: round(discriminator_accuracy(model, graphs), 3) for group, graphs in groups.items()}
             | {"corpus graphs": len(m.get("graphs", {})) if name != "random" else 0}
             for name, (model, m) in models.items()}
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
