"""Baseline: the hand placements of the papers, read from a rules table, or a scope split.

The rules are data: ``devplace/zoo/expert_rules.toml``, beside the models they describe (GNMT and
RNNLM: a layer per device; CNNs and the other zoo nets: one device), with the pattern syntax
explained at its top. They read each op's module path when the graph records one
(``meta["op_scope"]``, which ``devplace.capture`` writes), else its name.

A graph no rule applies to (a model of your own, a graph from a file) still gets an expert-style
placement, the **scope split**, so ``expert`` gives a row on any graph:

1. *anchors* are the forward ops that have an input, in step (topological) order; every other op
   joins the anchor it will follow (below), so an anchor stands for its forward op, the backward
   ops that mirror it, the parameters it reads first and the updates of those;
2. consecutive anchors in the same module (op scope; without scopes, the op name minus its last
   dotted part) form a *block*, which is never cut, at the coarsest module level (``encoder``,
   then ``encoder.layers``, ``encoder.layers.0``, ...) where no block holds more than one
   device's share of the compute (else at the innermost modules);
3. the blocks are cut into at most one contiguous stage per device, in device order: a stage
   closes at the block boundary nearest to its share of the total compute time (the mean over the
   cluster's devices of each op's time), or earlier when its next block would take it past the
   device's memory (persistent + output bytes of its ops, the never-freeing upper bound).

The split balances compute, not the step time: it ignores transfers and overlap, as a person
cutting a network into pipeline stages by its modules would.

Ops no rule (or anchor) names take, in topological order, the device of their mirror (forward op),
else of their latest named predecessor (a parameter says where its layer runs), else of their latest
placed predecessor; sources take their first successor's. A colocation group then goes where its
first named member went (else its most common device).

>>> from devplace.graph import GraphBuilder
>>> from devplace.cluster import uniform_cluster
>>> b = GraphBuilder(["gpu"])
>>> names = ["encoder.layers.0.mm", "encoder.layers.1.mm", "decoder.layers.0.mm", "decoder.layers.1.mm",
...          "classifier.mm"]
>>> for n in names:
...     _ = b.add_op(n, compute_us=1.0)
>>> for a, c in zip(names, names[1:]):
...     b.add_edge(a, c)
>>> place(b.build(), uniform_cluster(2)).tolist()
[0, 1, 0, 1, 1]
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from devplace.errors import DevplaceError
from devplace.graph import Role
from devplace.placers import NO_OPTIONS, register
from devplace.placers._listsched import op_times_us

RULES_FILE = "zoo/expert_rules.toml"   # under the devplace package; read as text, so no zoo import
_B = r"(?:^|[^a-zA-Z0-9])"  # start of a module path part ('.' in module paths, '_' in fx names)
_S = r"[._]"                 # separator between parts
_N = r"(\d+)(?![0-9])"       # a layer number, whole
_E = r"(?![a-zA-Z0-9])"      # end of a part


def path_pattern(path: str) -> re.Pattern:
    """``"encoder.layers.{i}"`` as a regular expression over whole parts; group 1 is the layer number."""
    parts = path.split(".")
    body = _S.join(_N if part == "{i}" else re.escape(part) for part in parts)
    return re.compile(_B + body + ("" if parts[-1] == "{i}" else _E))


@dataclass(frozen=True)
class Rule:
    """One row of the rules table (see ``expert_rules.toml`` for what each field means)."""

    name: str
    kind: str
    models: tuple[str, ...] = ()
    layers: tuple[re.Pattern, ...] = ()
    first: tuple[re.Pattern, ...] = ()
    last: tuple[re.Pattern, ...] = ()
    contains: tuple[str, ...] = ()
    paths: tuple[re.Pattern, ...] = ()

    @classmethod
    def from_table(cls, table: dict) -> "Rule":
        fields = {"name", "kind", "models", "why", "layers", "first", "last", "contains", "paths"}
        where = f"expert rule {table.get('name', '?')!r} in {RULES_FILE}"
        if set(table) - fields:
            raise DevplaceError(f"{where} has unknown field(s) {sorted(set(table) - fields)}: use {sorted(fields)}")
        if table.get("kind") not in ("layers", "one-device"):
            raise DevplaceError(f"{where}: kind must be 'layers' or 'one-device', not {table.get('kind')!r}")
        if table["kind"] == "layers" and not table.get("layers"):
            raise DevplaceError(f"{where}: a 'layers' rule needs layer patterns such as 'encoder.layers.{{i}}'")
        compiled = {key: tuple(map(path_pattern, table.get(key, ()))) for key in ("layers", "first", "last", "paths")}
        return cls(name=table["name"], kind=table["kind"], models=tuple(table.get("models", ())),
                   contains=tuple(text.lower() for text in table.get("contains", ())), **compiled)

    def devices(self, labels: list[str], kinds: list[str], n_devices: int) -> np.ndarray | None:
        """Device per op named by this rule (-1: not named), or None when the rule does not apply."""
        if self.kind == "one-device":
            texts = [label.lower() for label in labels] + [kind.lower() for kind in kinds]
            applies = any(t in text for t in self.contains for text in texts) or \
                any(p.search(label) for p in self.paths for label in labels)
            return np.full(len(labels), -2, dtype=np.int64) if applies else None
        numbers = [_layer_numbers(labels, pattern) for pattern in self.layers]
        if not all((n >= 0).any() for n in numbers):
            return None
        n_layers = int(max(n.max() for n in numbers)) + 1
        devices = np.full(len(labels), -1, dtype=np.int64)
        for i, label in enumerate(labels):
            layer = next((int(n[i]) for n in numbers if n[i] >= 0), None)
            if layer is None and any(p.search(label) for p in self.first):
                layer = 0
            elif layer is None and any(p.search(label) for p in self.last):
                layer = n_layers - 1
            if layer is not None:
                devices[i] = layer * n_devices // n_layers
        return devices


@lru_cache(maxsize=1)
def rules() -> tuple[Rule, ...]:
    """The rules table, in the order rules are tried."""
    text = resources.files("devplace").joinpath(*RULES_FILE.split("/")).read_text()
    return tuple(Rule.from_table(table) for table in tomllib.loads(text)["rule"])


def _layer_numbers(names: list[str], pattern: re.Pattern) -> np.ndarray:
    out = np.full(len(names), -1, dtype=np.int64)
    for i, name in enumerate(names):
        m = pattern.search(name)
        if m:
            out[i] = int(m.group(1))
    return out


def recorded_scopes(graph) -> list[str]:
    """Each op's module path as the capture recorded it ("" where none).

    A graph derived from a captured one (coarsened, fused) may keep the original ``meta``: scopes
    are used only when there is one per op.
    """
    scopes = graph.meta.get("op_scope")
    return list(scopes) if isinstance(scopes, list) and len(scopes) == graph.n_ops else [""] * graph.n_ops


def rule_labels(graph) -> list[str]:
    """The text the rules read per op: its module scope when the graph records one, else its name."""
    return [scope or name for scope, name in zip(recorded_scopes(graph), graph.names)]


def matching_rule(graph, n_devices: int) -> tuple[Rule, np.ndarray] | None:
    """The first rule that applies to ``graph`` and the devices it names (-1: none, -2: one device)."""
    labels = rule_labels(graph)
    for rule in rules():
        devices = rule.devices(labels, list(graph.kinds), n_devices)
        if devices is not None:
            return rule, devices
    return None


def module_scopes(graph) -> list[str]:
    """Each op's module: its recorded scope, else its name without the last dotted part."""
    return [scope or name.rpartition(".")[0] or name for scope, name in zip(recorded_scopes(graph), graph.names)]


def scope_split(graph, cluster) -> np.ndarray:
    """The documented fallback (module docstring): contiguous module blocks in step order, one stage
    per device, balanced by compute time and capped by each device's memory."""
    n_dev, order = cluster.n_devices, graph.topo_order
    has_input = np.diff(graph.pred_ptr) > 0
    anchors = [v for v in order if graph.role[v] == Role.FORWARD and has_input[v]] or \
        [v for v in order if has_input[v]] or list(order)
    if not anchors:
        return np.zeros(0, dtype=np.int64)
    label = np.full(graph.n_ops, -1, dtype=np.int64)
    label[anchors] = np.arange(len(anchors))
    anchor_of = _propagate(graph, label)
    compute = np.bincount(anchor_of, weights=op_times_us(graph, cluster).mean(axis=1), minlength=len(anchors))
    held = np.bincount(anchor_of, weights=graph.persistent_bytes + graph.output_bytes, minlength=len(anchors))
    module = module_scopes(graph)
    total = compute.sum()
    starts = _block_starts([module[v] for v in anchors], compute, total / n_dev)
    stage_of = np.zeros(len(anchors), dtype=np.int64)
    stage, done, stage_bytes = 0, 0.0, 0.0
    for first, end in zip(starts, starts[1:] + [len(anchors)]):
        work, size = compute[first:end].sum(), held[first:end].sum()
        target = (stage + 1) * total / n_dev
        # the stage (never empty here) closes before this block if the block would end farther past
        # the stage's share than the stage now falls short of it, or would overflow its device
        if first > 0 and stage < n_dev - 1 and (done + work - target > target - done
                                                or stage_bytes + size > cluster.memory_bytes[stage]):
            stage, stage_bytes = stage + 1, 0.0
        stage_of[first:end] = stage
        done, stage_bytes = done + work, stage_bytes + size
    return stage_of[anchor_of]


def _block_starts(scopes: list[str], compute: np.ndarray, share: float) -> list[int]:
    """Where each block begins: runs of consecutive anchors in the same module, at the coarsest
    module level (first k parts of the path) where no block holds more than ``share`` of compute."""
    parts = [scope.split(".") if scope else [] for scope in scopes]
    deepest = max((len(p) for p in parts), default=0)
    for depth in range(1, deepest + 1):
        keys = [".".join(p[:depth]) for p in parts]
        starts = [k for k in range(len(keys)) if k == 0 or keys[k] != keys[k - 1]]
        if depth == deepest or np.add.reduceat(compute, starts).max() <= share:
            return starts
    return [0]


def _propagate(graph, devices: np.ndarray) -> np.ndarray:
    """Give unnamed ops the device of their mirror or latest (named, else placed) predecessor."""
    named = devices >= 0
    devices = devices.copy()
    rank = graph.topo_rank
    for v in graph.topo_order:
        if devices[v] >= 0:
            continue
        m = graph.mirror[v]
        if m >= 0 and devices[m] >= 0:
            devices[v] = devices[m]
            continue
        preds = graph.predecessors(v)
        preds = preds[named[preds]] if named[preds].any() else preds[devices[preds] >= 0]
        if len(preds):
            devices[v] = devices[preds[np.argmax(rank[preds])]]
    for v in graph.topo_order[::-1]:
        if devices[v] < 0:
            succs = graph.successors(v)
            succs = succs[devices[succs] >= 0]
            devices[v] = devices[succs[np.argmin(rank[succs])]] if len(succs) else 0
    return devices


def _keep_groups(graph, devices: np.ndarray, named: np.ndarray) -> np.ndarray:
    devices = devices.copy()
    for members in graph.colocation_members:
        if len(members) < 2:
            continue
        by_rule = members[named[members]]
        target = devices[by_rule[0]] if len(by_rule) else np.bincount(devices[members]).argmax()
        devices[members] = target
    return devices


@register("expert", "the papers' hand placements (expert_rules.toml: a layer per GPU for GNMT/RNNLM, CNNs on "
                    "one device); other graphs: contiguous module blocks balanced by compute, memory-capped")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> np.ndarray:
    found = matching_rule(graph, cluster.n_devices)
    if found is not None and found[0].kind == "one-device":
        from devplace.placers.single import place as single

        return single(graph, cluster, seed=seed)
    if found is None:
        devices = scope_split(graph, cluster)
        named = np.zeros(graph.n_ops, dtype=bool)
        named[graph.role == Role.FORWARD] = True
        return _keep_groups(graph, devices, named)
    devices = found[1]
    named = devices >= 0
    return _keep_groups(graph, _propagate(graph, devices), named)
