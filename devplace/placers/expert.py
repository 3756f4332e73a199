"""Baseline: the hand placements of the papers, recognised from the module paths of zoo graphs.

Rules are regular expressions searched in each op's module path when the graph records one
(``meta["op_scope"]``, which ``devplace.capture`` writes, e.g. ``encoder.layers.1.cell``; ops with an
empty scope fall back to their name), else in op names (parts may be joined by ``.`` as in module paths or
by ``_`` as in captured fx names, so ``encoder.layers.1`` matches ``encoder.layers.1.cell.mm`` and
``param_encoder_layers_1_cell_weight_ih`` but not ``encoder.layers.10``):

========================  ===========================================================================
seq2seq (GNMT, NMT)       ``encoder.layers.{i}`` and ``decoder.layers.{i}``: layer i of each side on
                          device ``i * D // L`` (L layers, D devices): each layer on its own GPU when
                          D >= L, as GNMT (Wu et al. 2016) and ColocRL's expert; encoder and decoder
                          layer i share a device. ``encoder.embedding`` with encoder layer 0,
                          ``decoder.embedding`` and ``attention`` with decoder layer 0 (GNMT computes
                          attention from the bottom decoder layer), ``classifier`` (or a module
                          ``softmax.``) with the top decoder layer.
RNNLM                     ``rnnlm.layers.{i}`` on device ``i * D // L``; ``embedding`` with layer 0,
                          ``classifier``/``softmax`` with the top layer.
CNNs and other zoo nets   (``conv`` in names, or ``layers.{i}`` without the patterns above) all ops on
                          the fastest single device that fits, as the papers' experts did.
anything else             PlacementError: there is no expert rule for the graph.
========================  ===========================================================================

Ops no rule names (backward ops, glue, the loss) take, in topological order, the device of their
mirror (forward op), else of their latest rule-named predecessor (a parameter says where its layer
runs), else of their latest placed predecessor; sources take their first successor's.
A colocation group then goes where its first rule-named member went (else its most common device).

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

import numpy as np

from devplace.errors import PlacementError
from devplace.placers import NO_OPTIONS, register

_B = r"(?:^|[^a-zA-Z0-9])"  # start of a module path part ('.' in module paths, '_' in fx names)
_S = r"[._]"                 # separator between parts
_N = r"(\d+)(?![0-9])"       # a layer number, whole
_E = r"(?![a-zA-Z0-9])"      # end of a part
ENCODER_LAYER = re.compile(_B + r"encoder" + _S + "layers" + _S + _N)
DECODER_LAYER = re.compile(_B + r"decoder" + _S + "layers" + _S + _N)
RNNLM_LAYER = re.compile(_B + r"rnnlm" + _S + "layers" + _S + _N)
ENCODER_EMBEDDING = re.compile(_B + r"encoder" + _S + "embedding" + _E)
DECODER_EMBEDDING = re.compile(_B + r"decoder" + _S + "embedding" + _E)
EMBEDDING = re.compile(_B + r"embedding" + _E)
ATTENTION = re.compile(_B + r"attention" + _E)
HEAD = re.compile(_B + r"classifier" + _E + r"|(?:^|\.)softmax\.")
CONV = re.compile(r"conv", re.IGNORECASE)
ANY_LAYER = re.compile(_B + r"layers" + _S + _N)


def _layer_numbers(names: list[str], pattern: re.Pattern) -> np.ndarray:
    out = np.full(len(names), -1, dtype=np.int64)
    for i, name in enumerate(names):
        m = pattern.search(name)
        if m:
            out[i] = int(m.group(1))
    return out


def rule_labels(graph) -> list[str]:
    """The text the rules read per op: its module scope when the graph records one, else its name.

    A graph derived from a captured one (coarsened, fused) may keep the original ``meta``: scopes
    are used only when there is one per op.
    """
    scopes = graph.meta.get("op_scope")
    if not isinstance(scopes, list) or len(scopes) != graph.n_ops:
        return list(graph.names)
    return [scope or name for scope, name in zip(scopes, graph.names)]


def rule_devices(graph, n_devices: int) -> np.ndarray | None:
    """Device per op named by a layer rule (-1: no rule), or None when no layer rule applies."""
    names = rule_labels(graph)
    enc = _layer_numbers(names, ENCODER_LAYER)
    dec = _layer_numbers(names, DECODER_LAYER)
    lm = _layer_numbers(names, RNNLM_LAYER)
    devices = np.full(graph.n_ops, -1, dtype=np.int64)
    if (enc >= 0).any() and (dec >= 0).any():
        n_layers = int(max(enc.max(), dec.max())) + 1
        layer_device = lambda i: i * n_devices // n_layers  # noqa: E731
        for i, name in enumerate(names):
            if enc[i] >= 0:
                devices[i] = layer_device(enc[i])
            elif dec[i] >= 0:
                devices[i] = layer_device(dec[i])
            elif ENCODER_EMBEDDING.search(name):
                devices[i] = layer_device(0)
            elif DECODER_EMBEDDING.search(name) or ATTENTION.search(name):
                devices[i] = layer_device(0)
            elif HEAD.search(name):
                devices[i] = layer_device(n_layers - 1)
        return devices
    if (lm >= 0).any():
        n_layers = int(lm.max()) + 1
        for i, name in enumerate(names):
            if lm[i] >= 0:
                devices[i] = lm[i] * n_devices // n_layers
            elif EMBEDDING.search(name):
                devices[i] = 0
            elif HEAD.search(name):
                devices[i] = (n_layers - 1) * n_devices // n_layers
        return devices
    return None


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


@register("expert", "the papers' hand placements (a layer per GPU for GNMT/RNNLM, CNNs on one device)")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> np.ndarray:
    devices = rule_devices(graph, cluster.n_devices)
    if devices is None:
        labels = rule_labels(graph)
        names_conv = any(CONV.search(n) or CONV.search(k) for n, k in zip(labels, graph.kinds))
        if names_conv or any(ANY_LAYER.search(n) for n in labels):
            from devplace.placers.single import place as single

            return single(graph, cluster, seed=seed)
        example = graph.names[0] if graph.n_ops else ""
        raise PlacementError(
            f"the expert placer has no rule for this graph (op names like {example!r}): it knows zoo "
            f"GNMT/NMT (encoder.layers.N, decoder.layers.N), RNNLM (rnnlm.layers.N) and CNNs; "
            f"use another placer such as 'm-sct' or 'single'"
        )
    named = devices >= 0
    return _keep_groups(graph, _propagate(graph, devices), named)
