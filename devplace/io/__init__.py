"""Reading and writing operator graphs: devplace's native JSON and other tools' formats."""

from __future__ import annotations

from pathlib import Path

from devplace.errors import GraphError
from devplace.fileio import read_json_object
from devplace.graph import OpGraph
from devplace.io import dnn_partitioning, native


def load_graph(path: "str | Path") -> OpGraph:
    """Load a graph file, detecting its format (native JSON or dnn-partitioning JSON)."""
    data = read_json_object(path, "graph file", GraphError, give="a .json graph file or a model target")
    source = f"graph file {str(path)!r}"
    if native.is_native(data):
        graph = native.from_dict(data, source=source)
    elif dnn_partitioning.is_dnn_partitioning(data):
        graph = dnn_partitioning.from_dict(data, source=source)
    else:
        raise GraphError(
            f"{source} is neither a devplace graph (\"format\": \"{native.FORMAT}\") nor a "
            f"dnn-partitioning graph (\"nodes\" and \"edges\" with \"fpgaLatency\"); see docs/graph-format.md"
        )
    return graph


def save_graph(graph: OpGraph, path: "str | Path") -> None:
    """Save in devplace's native format (written to a temporary file, then renamed)."""
    native.save(graph, path)


__all__ = ["load_graph", "save_graph"]
