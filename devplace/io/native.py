"""devplace's native graph format: versioned JSON, one column per field (docs/graph-format.md).

Columns rather than one object per op keep a 100k-op file loading in a fraction of a second, and
Python's float formatting makes save/load round-trip exactly.
"""

from __future__ import annotations

import json
import math
from itertools import repeat
from pathlib import Path

import numpy as np

from devplace.errors import GraphError
from devplace.fileio import json_default, write_text_atomic
from devplace.graph import ROLE_NAMES, OpGraph, Role

FORMAT = "devplace-graph"
VERSION = 1


def is_native(data) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT


def _plain(values: np.ndarray) -> list:
    """Floats that are whole numbers written as integers, for readable files."""
    return [int(v) if v.is_integer() and abs(v) < 2**53 else v for v in values.tolist()]


def to_dict(g: OpGraph) -> dict:
    coloc = [g.colocation_names[c] if c >= 0 else None for c in g.colocation.tolist()]
    mirror = [g.names[m] if m >= 0 else None for m in g.mirror.tolist()]
    fixed = [None if math.isnan(v) else v for v in g.edge_fixed_us.tolist()]
    return {
        "format": FORMAT,
        "version": VERSION,
        "device_kinds": list(g.device_kinds),
        "meta": g.meta,
        "ops": {
            "name": list(g.names),
            "kind": list(g.kinds),
            "compute_us": {k: g.compute_us[:, i].tolist() for i, k in enumerate(g.device_kinds)},
            "persistent_bytes": _plain(g.persistent_bytes),
            "output_bytes": _plain(g.output_bytes),
            "temp_bytes": _plain(g.temp_bytes),
            "colocation": coloc,
            "role": [ROLE_NAMES[r] for r in g.role.tolist()],
            "mirror": mirror,
        },
        "edges": {
            "src": [g.names[s] for s in g.edge_src.tolist()],
            "dst": [g.names[d] for d in g.edge_dst.tolist()],
            "bytes": _plain(g.edge_bytes),
            "fixed_us": fixed,
            "order_only": g.edge_order_only.tolist(),
        },
    }


def save(g: OpGraph, path: "str | Path") -> None:
    write_text_atomic(path, json.dumps(to_dict(g), separators=(",", ":"), default=json_default))



def _column(table: dict, key: str, n: int, where: str, default=None, required: bool = False) -> list:
    if key not in table:
        if required:
            raise GraphError(f"{where} is missing the field {key!r}")
        return [default] * n
    column = table[key]
    if not isinstance(column, list) or len(column) != n:
        got = len(column) if isinstance(column, list) else type(column).__name__
        raise GraphError(f"{where} field {key!r} must be a list of {n} entries (got {got})")
    return column


# Largest figure a graph may give (us, bytes): sums over 100,000s of ops stay far from float64's limit.
MAX_FIGURE = 1e30


def _numbers(column: list, where: str, key: str, names, allow_none: bool = False) -> np.ndarray:
    """A column of JSON numbers as float64: strings, booleans, nulls (unless ``allow_none``) and
    finite values beyond ``MAX_FIGURE`` are refused, naming the entry (NaN and infinity are left to
    the graph's own check, which names the op)."""
    allowed = (int, float, type(None)) if allow_none else (int, float)
    values = None
    if set(map(type, column)) <= set(allowed):
        try:
            values = np.array([math.nan if v is None else v for v in column] if allow_none else column, dtype=np.float64)
        except OverflowError:  # an integer beyond float range: found below
            pass
    if values is None or (np.abs(values[np.isfinite(values)]) > MAX_FIGURE).any():
        for i, v in enumerate(column):
            if not isinstance(v, allowed) or isinstance(v, bool):
                raise GraphError(f"{where} field {key!r} entry for {names[i]!r} is {_short(v)}: it must be a number")
            if v is not None and (isinstance(v, int) or math.isfinite(v)) and abs(v) > MAX_FIGURE:
                raise GraphError(f"{where} field {key!r} entry for {names[i]!r} is {_short(v)}: it must be a finite "
                                 f"number up to {MAX_FIGURE:g}")
    return values


def _flags(column: list, where: str, key: str, names) -> np.ndarray:
    """A column of true/false; anything else is named."""
    if set(map(type, column)) <= {bool}:
        return np.asarray(column, dtype=np.bool_)
    for i, value in enumerate(column):
        if not isinstance(value, bool):
            raise GraphError(f"{where} field {key!r} entry for {names[i]!r} is {_short(value)}: it must be true or false")
    return np.asarray(column, dtype=np.bool_)


def _short(value) -> str:
    """``repr`` of a bad entry, cut short (a 4,000-digit integer stays readable)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 60 else text[:57] + "..."


def _check_text(strings, where: str) -> None:
    """Refuse lone surrogates (a JSON escape such as ``\\ud800``): no file or terminal can take them."""
    for text in strings:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise GraphError(f"{where} has the name {text.encode('utf-8', 'backslashreplace').decode()!r}, "
                                 f"which holds a lone surrogate (an unpaired \\ud800-\\udfff escape): fix the name") from None


def _meta(value, source: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GraphError(f"{source} field 'meta' must be a JSON object, not {type(value).__name__}")
    return dict(value)


ROLE_CODES = {name: code for code, name in enumerate(ROLE_NAMES)}


class _EdgeLabels:
    """``"src -> dst"`` for edge ``i``, made only when an error message needs it."""

    def __init__(self, src: list, dst: list):
        self.src, self.dst = src, dst

    def __getitem__(self, i: int) -> str:
        return f"{self.src[i]} -> {self.dst[i]}"


def from_dict(data: dict, source: str = "graph") -> OpGraph:
    version = data.get("version")
    if version != VERSION:
        raise GraphError(f"{source} has graph format version {version!r}; this devplace reads version {VERSION}")
    kinds = data.get("device_kinds")
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
        raise GraphError(f"{source} field 'device_kinds' must be a non-empty list of names")
    ops = data.get("ops")
    if not isinstance(ops, dict):
        raise GraphError(f"{source} is missing the object 'ops'")
    names = ops.get("name")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise GraphError(f"{source} field 'ops.name' must be a list of op names")
    n = len(names)
    where = f"{source} 'ops'"
    _check_text(names + kinds, f"{source} field 'ops.name'")
    compute = ops.get("compute_us")
    if not isinstance(compute, dict):
        raise GraphError(f"{where} is missing the field 'compute_us' (one list of times per device kind)")
    columns = []
    for kind in kinds:
        if kind not in compute:
            raise GraphError(f"{where} field 'compute_us' has no times for device kind {kind!r}")
        columns.append(_numbers(_column(compute, kind, n, f"{where} 'compute_us'"), where, f"compute_us.{kind}", names))
    index = {name: i for i, name in enumerate(names)}
    if len(index) != n:
        dup = next(x for x in names if names.count(x) > 1)
        raise GraphError(f"{source} has duplicate op name {dup!r}: op names must be unique")

    lookup: dict = dict(index)
    lookup[None] = -1

    def resolve(column: list, key: str, owner) -> np.ndarray:
        """Op names -> indices (None -> -1) at C speed; a bad entry is named afterwards."""
        try:
            out = np.fromiter(map(lookup.get, column, repeat(-2)), dtype=np.int64, count=len(column))
        except TypeError:  # an unhashable entry, such as a list
            out = np.array([lookup.get(r, -2) if r is None or isinstance(r, str) else -2 for r in column], dtype=np.int64)
        bad = np.flatnonzero(out == -2)
        if len(bad):
            i = int(bad[0])
            raise GraphError(f"{source} field {key!r} entry for {owner[i]!r} names op {column[i]!r}, which does not exist")
        return out

    coloc_column = _column(ops, "colocation", n, where)
    groups: dict[str, int] = {}
    coloc = np.array([-1 if c is None else groups.setdefault(str(c), len(groups)) for c in coloc_column], dtype=np.int64)
    role_column = _column(ops, "role", n, where, "forward")
    try:
        roles = np.fromiter(map(ROLE_CODES.get, role_column, repeat(-1)), dtype=np.int8, count=n)
    except TypeError:  # an unhashable entry: let Role.parse name it
        roles = np.full(n, -1, dtype=np.int8)
    for i in np.flatnonzero(roles < 0):  # not a lower-case name: parse it, or say why not
        roles[i] = Role.parse(role_column[i])

    edges = data.get("edges", {})
    if not isinstance(edges, dict):
        raise GraphError(f"{source} field 'edges' must be an object of columns")
    ewhere = f"{source} 'edges'"
    src_names = edges.get("src", [])
    if not isinstance(src_names, list):
        raise GraphError(f"{ewhere} field 'src' must be a list of op names")
    m = len(src_names)
    dst_names = _column(edges, "dst", m, ewhere, required=m > 0)
    edge_label = _EdgeLabels(src_names, dst_names)
    src = resolve(src_names, "edges.src", edge_label)
    dst = resolve(dst_names, "edges.dst", edge_label)
    return OpGraph(
        names=list(names),
        kinds=[str(k) for k in _column(ops, "kind", n, where, "")],
        device_kinds=list(kinds),
        compute_us=np.stack(columns, axis=1) if n else np.zeros((0, len(kinds))),
        persistent_bytes=_numbers(_column(ops, "persistent_bytes", n, where, 0), where, "persistent_bytes", names),
        output_bytes=_numbers(_column(ops, "output_bytes", n, where, 0), where, "output_bytes", names),
        temp_bytes=_numbers(_column(ops, "temp_bytes", n, where, 0), where, "temp_bytes", names),
        colocation=coloc,
        colocation_names=list(groups),
        role=roles,
        mirror=resolve(_column(ops, "mirror", n, where), "ops.mirror", names),
        edge_src=src,
        edge_dst=dst,
        edge_bytes=_numbers(_column(edges, "bytes", m, ewhere, 0), ewhere, "bytes", edge_label),
        edge_fixed_us=_numbers(_column(edges, "fixed_us", m, ewhere), ewhere, "fixed_us", edge_label, allow_none=True),
        edge_order_only=_flags(_column(edges, "order_only", m, ewhere, False), ewhere, "order_only", edge_label),
        meta=_meta(data.get("meta"), source),
    )

