"""Reading and writing operator graphs: devplace's native JSON and other tools' formats."""

from __future__ import annotations

import json
from pathlib import Path

from devplace.errors import GraphError
from devplace.graph import OpGraph
from devplace.io import dnn_partitioning, native


def load_graph(path: "str | Path") -> OpGraph:
    """Load a graph file, detecting its format (native JSON or dnn-partitioning JSON)."""
    path = Path(path)
    if path.is_dir():
        raise GraphError(f"graph file {str(path)!r} is a directory: give a .json graph file or a model target")
    if not path.is_file():
        raise GraphError(f"graph file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GraphError(f"graph file {str(path)!r} is not valid JSON: {exc}") from None
    except RecursionError:
        raise GraphError(f"graph file {str(path)!r} nests lists or objects too deeply to read") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise GraphError(f"graph file {str(path)!r} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise GraphError(f"graph file {str(path)!r} holds a JSON {type(data).__name__}, not a graph object")
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
