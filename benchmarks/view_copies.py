"""Round 53: how many bytes the zoo graphs' weights cross as views, against the weights' own bytes.

A weight reached by its computing readers through ops that take no time (``t``, ``view``, ``expand``: views) is
sent once per view to a device that holds a reader but not the view, since the simulator (and the runtime) sends
each op's output at most once per device and a view is an op of its own (round 42 measured 24 views of one 64 MiB
weight crossing on RNNLM). A runtime that sent the weight once and remade the view on the receiver would pay the
weight's bytes once. This counts, per zoo graph, the weights read through views, the most views of one weight, and
the bytes of all those views' largest out-edges against the weights' persistent bytes: the ceiling of what
separating every weight from all its readers could cost in view copies. Run from the checkout's root:
    PYTHONPATH=$PWD python benchmarks/view_copies.py [MODEL ...]"""
import json
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from reproduce_papers import RESULTS, cached_graph  # noqa: E402

from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.graph import Role  # noqa: E402

MODELS = ("rnnlm", "gnmt", "transformer", "inception_v3", "resnet50", "nasnet")


def view_copies(graph) -> dict:
    """The weights (ops with persistent bytes) whose computing readers read them through views, and the bytes of
    those views' largest out-edges."""
    free = graph.compute_us.min(axis=1) <= 0
    role = np.asarray(graph.role)
    n_weights = most_views = 0
    weight_bytes = view_bytes = 0.0
    for weight in np.flatnonzero(graph.persistent_bytes > 0).tolist():
        views, frontier, seen = [], [weight], {weight}
        while frontier:
            op = frontier.pop()
            for reader in graph.successors(op).tolist():
                if reader in seen or role[reader] == Role.UPDATE:
                    continue
                seen.add(reader)
                if free[reader]:
                    frontier.append(reader)
                    if any(not free[c] and role[c] != Role.UPDATE for c in graph.successors(reader).tolist()):
                        views.append(reader)
        if views:
            n_weights += 1
            most_views = max(most_views, len(views))
            weight_bytes += float(graph.persistent_bytes[weight])
            view_bytes += float(sum(graph.edge_bytes[graph.out_edges(v)].max() for v in views))
    return {"weights_read_through_views": n_weights, "most_views_of_one_weight": most_views,
            "weights_MiB": weight_bytes / 2**20, "view_edges_MiB": view_bytes / 2**20,
            "ratio": view_bytes / weight_bytes if weight_bytes else None}


if __name__ == "__main__":
    rows = {}
    for model in sys.argv[1:] or MODELS:
        rows[model] = view_copies(cached_graph(f"zoo:{model}"))
        print(model, rows[model], flush=True)
    write_text_atomic(RESULTS / "view_copies.json", json.dumps(rows, indent=1) + "\n")
