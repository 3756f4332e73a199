"""Importer for the graphs of msr-fiddle/dnn-partitioning (Tarnawski et al., NeurIPS 2020).

Their latencies and edge costs are milliseconds; devplace keeps microseconds. ``fpgaLatency`` (any
accelerator) becomes the ``gpu`` device kind and ``cpuLatency`` the ``cpu`` kind; ``size`` is memory
the node holds for the whole step, so it becomes persistent bytes; an edge's ``cost`` becomes a
fixed transfer time (it already includes the link) and its ``size`` the bytes moved. Color classes
become colocation groups, and a backward node mirrors the single forward node of its color class
where there is one. The file's device count and memory are kept in ``meta['dnn_partitioning']``;
``cluster_for`` turns them into a cluster.
"""

from __future__ import annotations


from devplace.cluster import Cluster, uniform_cluster
from devplace.errors import GraphError
from devplace.graph import GraphBuilder, OpGraph, Role

MS_TO_US = 1000.0
ACCELERATOR_KIND = "gpu"


def is_dnn_partitioning(data) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("nodes"), list)
        and isinstance(data.get("edges"), list)
        and "maxSizePerFPGA" in data
    )


def _field(record: dict, key: str, where: str, default=None):
    if key not in record:
        if default is None:
            raise GraphError(f"{where} is missing the field {key!r}")
        return default
    value = record[key]
    if not isinstance(value, (int, float)):  # bools pass: they are flags here
        raise GraphError(f"{where} field {key!r} must be a number, not {value!r}")
    return value


def from_dict(data: dict, source: str = "graph") -> OpGraph:
    nodes = data["nodes"]
    by_id: dict[int, dict] = {}
    for k, node in enumerate(nodes):
        if not isinstance(node, dict) or "id" not in node:
            raise GraphError(f"{source} node {k} is missing the field 'id'")
        if not isinstance(node["id"], (int, str)) or isinstance(node["id"], bool):
            raise GraphError(f"{source} node {k} field 'id' must be a number, not {node['id']!r}")
        if node["id"] in by_id:
            raise GraphError(f"{source} has two nodes with id {node['id']}: ids must be unique")
        by_id[node["id"]] = node

    def op_name(node: dict) -> str:
        return f"{node['id']}:{node.get('name', '')}"

    classes: dict[int, list[dict]] = {}
    for node in nodes:
        if node.get("colorClass") is not None:
            classes.setdefault(node["colorClass"], []).append(node)
    forward_of_class = {}
    for color, members in classes.items():
        forward = [m for m in members if not m.get("isBackwardNode")]
        if len(forward) == 1:
            forward_of_class[color] = op_name(forward[0])

    builder = GraphBuilder(device_kinds=[ACCELERATOR_KIND, "cpu"])
    cpu_only = []
    for node in nodes:
        where = f"{source} node {node['id']} ({node.get('name', '')!r})"
        name = op_name(node)
        backward = bool(_field(node, "isBackwardNode", where, 0))
        color = node.get("colorClass")
        accel_ms = float(_field(node, "fpgaLatency", where))
        cpu_ms = float(_field(node, "cpuLatency", where))
        if not _field(node, "supportedOnFpga", where, 1):
            cpu_only.append(name)
        builder.add_op(
            name,
            kind=str(node.get("name", "")).rstrip("0123456789") or "node",
            compute_us={ACCELERATOR_KIND: accel_ms * MS_TO_US, "cpu": cpu_ms * MS_TO_US},
            persistent_bytes=float(_field(node, "size", where, 0.0)),
            colocation=None if color is None else f"color{color}",
            role=Role.BACKWARD if backward else Role.FORWARD,
            mirror=forward_of_class.get(color) if backward and color is not None else None,
        )
    for k, edge in enumerate(data["edges"]):
        where = f"{source} edge {k}"
        if not isinstance(edge, dict):
            raise GraphError(f"{where} must be an object with 'sourceId', 'destId' and 'cost'")
        for end in ("sourceId", "destId"):
            ref = _field(edge, end, where)
            if ref not in by_id:
                raise GraphError(f"{where} field {end!r} names node {ref}, which does not exist")
        builder.add_edge(
            op_name(by_id[edge["sourceId"]]),
            op_name(by_id[edge["destId"]]),
            bytes=float(_field(edge, "size", where, 0.0)),
            fixed_us=float(_field(edge, "cost", where)) * MS_TO_US,
        )
    max_fpgas = _field(data, "maxFPGAs", source, 1)
    if not (isinstance(max_fpgas, int) and max_fpgas >= 1):
        raise GraphError(f"{source} field 'maxFPGAs' must be a whole number >= 1, not {max_fpgas!r}")
    builder.meta = {
        "source": "dnn-partitioning",
        "dnn_partitioning": {
            "max_size_per_fpga_bytes": float(_field(data, "maxSizePerFPGA", source)),
            "max_fpgas": max_fpgas,
            "max_cpus": int(_field(data, "maxCPUs", source, 0)),
            "cpu_only_ops": cpu_only,
        },
    }
    return builder.build()


def cluster_for(graph: OpGraph, comm_model: str = "sequential") -> Cluster:
    """The accelerators a dnn-partitioning file declares: ``maxFPGAs`` devices of ``maxSizePerFPGA``.

    Edge costs are fixed times, so the link figures only matter for edges without one.
    """
    spec = graph.meta.get("dnn_partitioning")
    if not spec:
        raise GraphError("this graph was not imported from a dnn-partitioning file: it names no devices")
    return uniform_cluster(
        spec["max_fpgas"],
        kind=ACCELERATOR_KIND,
        memory_bytes=spec["max_size_per_fpga_bytes"],
        comm_model=comm_model,
        name=f"dnn-partitioning-{spec['max_fpgas']}x",
    )


__all__ = ["from_dict", "is_dnn_partitioning", "cluster_for"]
