"""GNMT laid out by hand (round 41): which side of its gap is weak, the placement or the bound.

GNMT (``zoo:gnmt``, roofline costs for ``baechi-4x2080``, as ``reproduce_papers.py`` captures it) is cut
into *blocks* a person would place by hand: its module layers (``placers._layers``), with the
bidirectional encoder layer 0 split into its two directions (``forward_cell``, ``backward_cell``).
A layout maps each block to a GPU; it is simulated in the three schedule orders sim-search judges a
start in (topological, upward rank, updates first) and the fastest is kept. First sim-search's own
placements at 30% (2.4 GiB) and 8 GiB are broken down (``tight_memory.breakdown``, the critical path's
compute per block, each GPU's busy time in three phases: up to the classifier, its chain, the
backward). Then the layouts a person would try: (a) the wavefront, encoder layer l and decoder layer l
on GPU l, every map of the other blocks (attention, classifier, the bidirectional layer's second
direction, glue); (b) the classifier spread (it is one product over all 40 steps and its gradients:
only whole ops can move, each reading a 586 MiB tensor); (c) block-move descents from the 8 GiB best and
the wavefront's best, and the 8 GiB best with the classifier's weights (``cls_w``) on another GPU,
against 30% (round 41: that frees the 586 MiB logits their zero-byte edges to the updates pin).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/gnmt_wavefront.py [--placements AT_30PCT.npz AT_8GIB.npz]

Rows go to ``benchmarks/results/gnmt_wavefront.json`` (written atomically).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402
from tight_memory import breakdown  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.graph import Role  # noqa: E402
from devplace.placement import Placement  # noqa: E402
from devplace.placers._layers import UnitLayers, layer_key  # noqa: E402
from devplace.placers._moves import upward_rank_us  # noqa: E402
from devplace.sim import Simulator  # noqa: E402

OUT = RESULTS / "gnmt_wavefront.json"
GIB = 2**30
MEMORY_FRACTIONS = (0.3, 1.0)
# the blocks a person places by hand, in step order; "enc0f"/"enc0b" are the bidirectional layer's directions
SHORT = {"encoder.embedding": "enc_emb", "encoder": "enc_glue", "encoder.layers.0": "enc0x",
         "encoder.layers.1": "enc1", "encoder.layers.2": "enc2", "encoder.layers.3": "enc3",
         "attention.memory_layer": "mem", "decoder.embedding": "dec_emb", "decoder.layers.0": "dec0",
         "attention.query_layer": "query", "attention": "attn", "decoder.layers.1": "dec1",
         "decoder.layers.2": "dec2", "decoder.layers.3": "dec3", "classifier": "cls"}


def blocks(graph) -> tuple[list[str], np.ndarray]:
    """The block names and, per op, its block: each module layer, the bidirectional layer's two
    directions apart (their units' paths end in ``forward_cell`` / ``backward_cell``)."""
    layers = UnitLayers.of(graph)
    labels = []
    for path in layers.paths:
        key = SHORT.get(layer_key(path), layer_key(path))
        if key == "enc0x" and path[-1] in ("forward_cell", "backward_cell"):
            key = "enc0f" if path[-1] == "forward_cell" else "enc0b"
        labels.append(key)
    block_of = np.array(labels, dtype=object)[layers.unit_of]
    # the classifier's weight and bias with their Adam state and updates: 176 MiB held all step, which
    # the classifier's GPU cannot hold at 30% memory beside its 586 MiB activations
    block_of[(block_of == "cls") & (graph.colocation >= 0)] = "cls_w"
    names = list(dict.fromkeys(block_of))
    number = {name: k for k, name in enumerate(names)}
    return names, np.array([number[label] for label in block_of], dtype=np.int64)


class Layouts:
    """Simulates block layouts of one graph on one cluster; with ``cap_bytes``, a layout must fit it per GPU."""

    def __init__(self, graph, cluster, cap_bytes: float | None = None):
        self.graph, self.cluster, self.cap_bytes = graph, cluster, cap_bytes
        self.sim = Simulator(graph, cluster)
        self.names, self.block_of = blocks(graph)
        update = graph.role == Role.UPDATE
        self.updates_first = np.where(update, -1.0, 0.0) * graph.n_ops + graph.topo_rank
        self.evals = 0
        self.classifier = self.block_of == self.names.index("cls")

    def devices(self, layout: dict[str, int]) -> np.ndarray:
        block_device = np.array([layout[name] for name in self.names], dtype=np.int64)
        return block_device[self.block_of]

    def orders(self, devices: np.ndarray) -> list[tuple[str, np.ndarray | None]]:
        rank = upward_rank_us(self.graph, self.cluster, devices, self.sim.op_time_us)
        return [("topological", None), ("upward rank", -rank), ("updates first", self.updates_first)]

    def step_us(self, layout: dict[str, int]) -> tuple[float, str, np.ndarray | None]:
        """The fastest of the three orders whose peaks fit ``cap_bytes``: (step us, order name, priority);
        (inf, "", None) when none fits."""
        devices = self.devices(layout)
        best = (np.inf, "", None)
        for name, priority in self.orders(devices):
            self.evals += 1
            if self.cap_bytes is None:
                step = self.sim.step_time_us(devices, priority)
            else:
                result = self.sim.run(Placement(devices=devices, priority=priority))
                fits = bool((result.peak_memory_bytes <= self.cap_bytes).all())
                step = result.step_time_us if fits else np.inf
            if step < best[0]:
                best = (step, name, priority)
        return best

    def where_the_step_goes(self, devices: np.ndarray, priority: np.ndarray | None) -> dict:
        """``tight_memory.breakdown`` (per GPU busy and peak, the critical path's compute, transfer
        waits and device-order links), plus the path's compute per block, each block's GPU, and the
        three phases' ends: the classifier's forward product starts, its input gradient ends."""
        placement = Placement(devices=devices, priority=priority)
        row = breakdown(self.graph, self.cluster, placement)
        result = self.sim.run(placement)
        path_block_ms = np.bincount(self.block_of[result.critical_path], minlength=len(self.names),
                                    weights=result.op_time_us[result.critical_path]) / 1e3
        row["path_compute_by_block_ms"] = {self.names[k]: round(float(path_block_ms[k]), 1)
                                           for k in np.argsort(-path_block_ms) if path_block_ms[k] > 0.05}
        row["block_gpu"] = self.layout_of(devices)
        products = np.flatnonzero(self.classifier & (self.graph.role == Role.FORWARD)
                                  & (self.graph.compute_us[:, 0] > 1e4))
        input_gradient = np.flatnonzero(self.classifier & (self.graph.role == Role.BACKWARD)
                                        & (self.graph.compute_us[:, 0] > 1e4) & (self.graph.output_bytes < 2**24))
        row["classifier_starts_ms"] = round(float(result.start_us[products].min()) / 1e3, 1)
        row["classifier_input_gradient_ends_ms"] = round(float(result.finish_us[input_gradient].min()) / 1e3, 1)
        row.pop("path_hops")
        return row

    def layout_of(self, devices: np.ndarray) -> dict[str, int]:
        """Each block's GPU: the one holding most of its ops."""
        return {name: int(np.bincount(devices[self.block_of == k], minlength=self.cluster.n_devices).argmax())
                for k, name in enumerate(self.names)}

    def descent(self, layout: dict[str, int], pairs: bool = True,
                tied: dict[str, str] | None = None) -> tuple[float, dict[str, int], int]:
        """Greedy descent over block moves (one block to another GPU; with ``pairs``, also two blocks
        swapping GPUs) until none is faster: (step us, layout, moves taken). A block in ``tied`` (follower:
        leader) moves with its leader only."""
        tied = tied or {}
        movable = [name for name in self.names if name not in tied]

        def follow(candidate: dict[str, int]) -> dict[str, int]:
            return {**candidate, **{follower: candidate[leader] for follower, leader in tied.items()}}

        step, moves = self.step_us(follow(layout))[0], 0
        while True:
            candidates = [follow({**layout, name: d}) for name in movable for d in range(self.cluster.n_devices)
                          if d != layout[name]]
            if pairs:
                candidates += [follow({**layout, a: layout[b], b: layout[a]})
                               for a, b in itertools.combinations(movable, 2) if layout[a] != layout[b]]
            scored = min(((self.step_us(c)[0], k) for k, c in enumerate(candidates)), default=(np.inf, -1))
            if scored[0] >= step:
                return step, layout, moves
            step, layout, moves = scored[0], candidates[scored[1]], moves + 1

    def phase_busy(self, devices: np.ndarray, priority: np.ndarray | None) -> dict:
        """Per phase (forward up to the classifier's product, the classifier's chain up to its input
        gradient, the backward after it), its length and each GPU's busy time per block (ms)."""
        result = self.sim.run(Placement(devices=devices, priority=priority))
        row = self.where_the_step_goes(devices, priority)
        ends = [0.0, row["classifier_starts_ms"] * 1e3, row["classifier_input_gradient_ends_ms"] * 1e3,
                result.step_time_us]
        phases = {}
        for name, (a, b) in zip(("forward", "classifier", "backward"), zip(ends[:-1], ends[1:])):
            inside = np.clip(np.minimum(result.finish_us, b) - np.maximum(result.start_us, a), 0.0, None)
            per_gpu = {}
            for d in range(self.cluster.n_devices):
                on = result.devices == d
                busy = np.bincount(self.block_of[on], weights=inside[on], minlength=len(self.names)) / 1e3
                per_gpu[d] = {"busy": round(float(busy.sum()), 1),
                              **{self.names[k]: round(float(busy[k]), 1) for k in np.argsort(-busy) if busy[k] > 0.5}}
            phases[name] = {"ms": round((b - a) / 1e3, 1), "gpus": per_gpu}
        return phases


WAVEFRONT = {"enc_emb": 0, "enc0f": 0, "enc0x": 0, "enc1": 1, "enc2": 2, "enc3": 3,
             "dec_emb": 0, "dec0": 0, "dec1": 1, "dec2": 2, "dec3": 3}
WAVEFRONT_FREE = ("enc0b", "mem", "query", "attn", "cls", "cls_w", "enc_glue")


def wavefront(layouts: Layouts) -> dict:
    """(a) Encoder layer l and decoder layer l on GPU l, the bidirectional layer's forward direction on
    GPU 0; every map of the other blocks (its backward direction, the attention, the classifier, its
    weights, the encoder's glue) to the four GPUs, the classifier's weights kept with it (4^6 maps)."""
    rows = []
    free = [name for name in WAVEFRONT_FREE if name != "cls_w"]
    for devices in itertools.product(range(layouts.cluster.n_devices), repeat=len(free)):
        layout = {**WAVEFRONT, **dict(zip(free, devices))}
        layout["cls_w"] = layout["cls"]
        step, order, _ = layouts.step_us(layout)
        rows.append((step, order, layout))
    rows.sort(key=lambda row: row[0])
    step, order, layout = rows[0]
    return {"maps": len(rows), "best_ms": step / 1e3, "order": order, "layout": layout,
            "median_ms": float(np.median([row[0] for row in rows])) / 1e3}


def classifier_spread(layouts: Layouts, devices: np.ndarray, priority) -> list[dict]:
    """(b) The classifier's ops split over GPUs, from ``devices``: its weight gradient (and the bias
    gradient) on each other GPU; its backward on each other GPU; the fastest order each."""
    graph, rows = layouts.graph, []
    named = {name: k for k, name in enumerate(graph.names)}
    splits = {"weight and bias gradients (mm_2, sum_1)": ["mm_2", "t_763", "sum_1"],
              "backward (nll_loss_backward .. mm_1, mm_2)": ["ones_like", "nll_loss_backward",
                                                              "_log_softmax_backward_data", "view_44", "view_45",
                                                              "mm_1", "mm_2", "t_763", "sum_1"]}
    home = int(np.bincount(devices[layouts.classifier]).argmax())
    for what, names in splits.items():
        ops = [named[n] for n in names]
        for device in range(layouts.cluster.n_devices):
            if device == home:
                continue
            moved = devices.copy()
            moved[ops] = device
            steps = [layouts.sim.step_time_us(moved, p) for p in [priority] + [p for _, p in layouts.orders(moved)]]
            rows.append({"moved": what, "to_gpu": device, "step_ms": min(steps) / 1e3})
    return rows


def unpinned_by_hand(layouts: Layouts, devices: np.ndarray, priority, cap_bytes: float) -> list[dict]:
    """The 8 GiB best with the classifier's weights and bias (their Adam state and updates: ``cls_w``)
    on each GPU, in its own order and the three: step and peaks against ``cap_bytes``."""
    rows = []
    for device in range(layouts.cluster.n_devices):
        moved = devices.copy()
        moved[layouts.block_of == layouts.names.index("cls_w")] = device
        for order, p in [("the 8 GiB best's", priority)] + layouts.orders(moved):
            result = layouts.sim.run(Placement(devices=moved, priority=p))
            rows.append({"cls_w_gpu": device, "order": order, "step_ms": result.step_time_us / 1e3,
                         "peak_gib": np.round(result.peak_memory_bytes / GIB, 3).tolist(),
                         "fits_30pct": bool((result.peak_memory_bytes <= cap_bytes).all())})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="sim-search's seed for the placements broken down")
    parser.add_argument("--placements", nargs=2, type=Path, metavar=("AT_30PCT.npz", "AT_8GIB.npz"),
                        help="sim-search's placements saved earlier (devices, priority) instead of running it")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    graph, cluster = cached_graph("zoo:gnmt"), dp.load_cluster(PRESET)
    layouts = Layouts(graph, cluster)
    out = {"graph": "zoo:gnmt", "cluster": PRESET, "ops": graph.n_ops, "blocks": layouts.names}
    best = {}
    for k, fraction in enumerate(MEMORY_FRACTIONS):
        began = time.perf_counter()
        if args.placements:     # saved by an earlier run (np.savez: devices, priority)
            saved = np.load(args.placements[k])
            placement = Placement(devices=saved["devices"], priority=saved["priority"],
                                  options={"evals": None, "found_by": f"loaded from {args.placements[k]}"})
        else:
            placement = dp.place(graph, cluster.with_memory_fraction(fraction), algo="sim-search", seed=args.seed)
        best[fraction] = placement
        row = layouts.where_the_step_goes(placement.devices, placement.priority)
        row["phases"] = layouts.phase_busy(placement.devices, placement.priority)
        out[f"sim_search_{fraction:g}"] = {"evals": placement.options["evals"], "found_by": placement.options["found_by"],
                                           "seconds": round(time.perf_counter() - began, 1), **row}
        print(f"sim-search at {fraction:.0%}: {row['step_ms']:.3f} ms", flush=True)
    out["wavefront"] = wavefront(layouts)
    print(f"(a) wavefront: {out['wavefront']['best_ms']:.3f} ms of {out['wavefront']['maps']} maps", flush=True)
    eight = best[1.0]
    out["classifier_spread"] = classifier_spread(layouts, eight.devices, eight.priority)
    print("(b) classifier spread:", min(r["step_ms"] for r in out["classifier_spread"]), flush=True)
    descents = {}
    for name, start in (("the 8 GiB best by block", layouts.layout_of(eight.devices)),
                        ("the wavefront's best", out["wavefront"]["layout"])):
        for tied in ({"cls_w": "cls"}, {}):     # the classifier's weights with it (one layer), or apart
            step, layout, moves = layouts.descent(dict(start), tied=tied)
            key = f"{name}, {'classifier weights tied' if tied else 'every block apart'}"
            descents[key] = {"step_ms": step / 1e3, "moves": moves, "layout": layout}
            print(f"(c) descent from {key}: {step / 1e3:.3f} ms, {moves} moves", flush=True)
    out["block_descents"] = descents
    cap_bytes = float(cluster.with_memory_fraction(0.3).memory_bytes.min())
    out["unpinned_by_hand"] = unpinned_by_hand(layouts, eight.devices, eight.priority, cap_bytes)
    fitting = [r for r in out["unpinned_by_hand"] if r["fits_30pct"]]
    print("(c) the 8 GiB best, classifier weights moved:", min(r["step_ms"] for r in fitting), flush=True)
    out["evals"] = layouts.evals
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(out, indent=1, default=lambda o: o.tolist()) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
