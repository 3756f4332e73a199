"""Reproduce the placement papers' step-time tables in simulation (BENCHMARKS.md, "Reproducing the papers").

Every model is captured with roofline costs for the RTX 2080 devices of ``baechi-4x2080`` and every
placement simulated there (2- and 8-GPU settings use ``Cluster.with_devices(n)`` of that preset).
Our numbers are set beside the published ones as ratios to the single-GPU step time: we simulate,
so absolute times differ from the papers' measurements.

    .venv/bin/python benchmarks/reproduce_papers.py                  # everything (resumes)
    .venv/bin/python benchmarks/reproduce_papers.py --only baechi    # one suite: baechi, hp, colocrl, dnn
    .venv/bin/python benchmarks/reproduce_papers.py --force          # recompute finished cases
    .venv/bin/python benchmarks/reproduce_papers.py --tables         # only rewrite the tables

A finished case that lacks some of its algorithms (one added since) runs only those.

Captured graphs are cached in ``benchmarks/.cache/`` (git-ignored), keyed by target, cluster,
devplace version and a digest of the capture and zoo code; each capture runs in its own process
(one at a time: up to 3 GiB, 15-70 s).
Results go to ``benchmarks/results/reproduce_<suite>.json``, one entry per finished case, so an
interrupted run picks up where it stopped.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import devplace as dp
from devplace.cluster import load_cluster
from devplace.compare import compare
from devplace.fileio import write_text_atomic

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
PRESET = "baechi-4x2080"
# Our ATen graphs hold about twice the activation memory of the papers' TensorFlow graphs (Inception-V3
# batch 64 needs 10.5 GiB on one device, GNMT batch 256 8.4 GiB), so 8 GiB cards are not "ample" for
# them: AMPLE gives each GPU 4 x 8 GiB, where memory binds no placer and step-time shapes compare.
AMPLE = 4.0
# HP and ColocRL ran on 12 GB GPUs (K40/K80 class): 1.5 x the preset's 8 GiB.
PAPER_GPU_FRACTION = 1.5
BAECHI_ALGOS = ["single", "expert", "m-topo", "m-etf", "m-sct", "m-topo+opt", "m-etf+opt", "m-sct+opt"]
# our own placer, where memory is tight (Baechi's 30% rows); evaluation-count budget only, so the
# step times do not depend on the machine (its default: no wall-clock cap)
OWN = "sim-search"
OWN_FRACTIONS = (0.3,)
PARTITION_ALGOS = ["single", "expert", "metis", "m-etf+opt", "m-sct+opt"]
DNN_ALGOS = ["single", "round-robin", "random", "metis", "heft", "m-topo", "m-etf", "m-sct",
             "m-topo+opt", "m-etf+opt", "m-sct+opt"]


# ------------------------------------------------------------------------- the cases
def _baechi_cases() -> list[dict]:
    models = [
        ("Inception-V3", 32, "zoo:inception_v3"),
        ("Inception-V3", 64, "zoo:inception_v3:batch=64"),
        ("GNMT len 40", 128, "zoo:gnmt"),
        ("GNMT len 40", 256, "zoo:gnmt:batch=256"),
        ("GNMT len 50", 128, "zoo:gnmt:seq_len=50"),
        ("GNMT len 50", 256, "zoo:gnmt:seq_len=50,batch=256"),
    ]
    cases = []
    for fraction in (None, AMPLE, 0.3):
        for model, batch, target in models:
            algos = BAECHI_ALGOS + ([OWN] if fraction in OWN_FRACTIONS else [])
            cases.append(dict(id=f"{target}|4|{fraction}", model=model, batch=batch, target=target, devices=4,
                              memory_fraction=fraction, algos=algos))
    return cases


def _hp_cases() -> list[dict]:
    models = [("Inception-V3", "zoo:inception_v3", 2), ("ResNet", "zoo:resnet50", 2), ("RNNLM", "zoo:rnnlm", 2),
              ("NMT 2-layer", "zoo:gnmt:layers=2", 2), ("NMT 4-layer", "zoo:gnmt", 4),
              ("NMT 8-layer", "zoo:gnmt:layers=8", 8)]
    return [dict(id=f"{t}|{n}|{PAPER_GPU_FRACTION}", model=m, target=t, devices=n, memory_fraction=PAPER_GPU_FRACTION,
                 algos=PARTITION_ALGOS) for m, t, n in models]


def _colocrl_cases() -> list[dict]:
    models = [("RNNLM batch 64", "zoo:rnnlm"), ("NMT batch 64", "zoo:gnmt:layers=2,batch=64"),
              ("Inception-V3 batch 32", "zoo:inception_v3")]
    return [dict(id=f"{t}|{n}|{PAPER_GPU_FRACTION}", model=m, target=t, devices=n, memory_fraction=PAPER_GPU_FRACTION,
                 algos=PARTITION_ALGOS) for m, t in models for n in (2, 4)]


def _dnn_cases() -> list[dict]:
    files = sorted(p.name for p in dp.example_path("gnmt_layers_training.json").parent.glob("*.json"))
    return [dict(id=name, model=name.removesuffix(".json"), target=name, devices=None, memory_fraction=None,
                 algos=DNN_ALGOS) for name in files]


SUITES = {"baechi": _baechi_cases, "hp": _hp_cases, "colocrl": _colocrl_cases, "dnn": _dnn_cases}


# --------------------------------------------------------------------- graph cache
@functools.cache
def _capture_code_digest() -> str:
    """Digest of the capture and zoo sources: a graph captured by older code is captured again.
    Taken once per run, so edits made while it runs do not recapture half the models."""
    package = Path(dp.__file__).parent
    digest = hashlib.sha1()
    for path in sorted([*package.glob("torchcapture/*.py"), *package.glob("zoo/*.py")]):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_path(target: str) -> Path:
    """Cache file of ``target``: keyed by target, cluster, cost model, devplace version and capture code."""
    key = hashlib.sha1(
        f"{target}|{PRESET}|roofline|{dp.__version__}|{_capture_code_digest()}".encode()).hexdigest()[:16]
    return CACHE / f"{target.replace(':', '_').replace(',', '_').replace('=', '-')}.{key}.json"


def cached_graph(target: str):
    """The roofline graph of ``target`` for ``PRESET``, captured in a child process on first use."""
    path = cache_path(target)
    if not path.exists():
        print(f"  capturing {target} (one process, 15-70 s) ...", flush=True)
        began = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--capture", target, str(path)], check=True)
        print(f"  captured {target} in {time.perf_counter() - began:.0f} s", flush=True)
    return dp.load_graph(path)


def _capture_child(target: str, path: str) -> None:
    from devplace.torchcapture import profile_target

    graph = profile_target(target, cost="roofline", cluster=load_cluster(PRESET))
    dp.save_graph(graph, path)


# ------------------------------------------------------------------------- running
def run_case(case: dict, algos: list[str] | None = None) -> dict:
    if case["devices"] is None:
        from devplace.io.dnn_partitioning import cluster_for

        graph = dp.load_graph(dp.example_path(case["target"]))
        cluster = cluster_for(graph)
    else:
        graph = cached_graph(case["target"])
        cluster = load_cluster(PRESET)
        if case["devices"] != cluster.n_devices:
            cluster = cluster.with_devices(case["devices"])
    if case["memory_fraction"] is not None:
        cluster = cluster.with_memory_fraction(case["memory_fraction"])

    def progress(row):
        what = f"{row.step_time_us / 1e3:9.2f} ms" if row.step_time_us is not None else f"no placement ({row.error})"
        took = f" placed in {row.placement_time_s:.1f} s" if row.placement_time_s is not None else ""
        print(f"    {row.algorithm:12s} {what}{took}", flush=True)

    comparison = compare(graph, cluster, algos or case["algos"], on_row=progress)
    return {"case": case, "cluster": cluster.name, "cluster_devices": cluster.n_devices, "ops": graph.n_ops,
            "rows": [row.to_dict() for row in comparison.rows]}


def load_results(suite: str) -> dict:
    path = RESULTS / f"reproduce_{suite}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", choices=list(SUITES), help="run only these suites (repeatable)")
    parser.add_argument("--force", action="store_true", help="recompute cases already in the results")
    parser.add_argument("--tables", action="store_true", help="only rewrite BENCHMARKS.md from the results")
    parser.add_argument("--capture", nargs=2, metavar=("TARGET", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.capture:
        _capture_child(*args.capture)
        return 0
    suites = args.only or list(SUITES)
    if not args.tables:
        for suite in suites:
            cases = SUITES[suite]()
            wanted = {case["id"] for case in cases}
            results = {k: v for k, v in load_results(suite).items() if k in wanted}  # drop retired cases
            for k, case in enumerate(cases, 1):
                done = results.get(case["id"]) if not args.force else None
                missing = [a for a in case["algos"] if a not in {r["algorithm"] for r in (done or {}).get("rows", [])}]
                if not missing:
                    continue
                fraction = f", memory x{case['memory_fraction']}" if case["memory_fraction"] else ""
                only = f" (only {', '.join(missing)})" if done else ""
                print(f"[{suite} {k}/{len(cases)}] {case['target']} on {case['devices'] or 'its'} devices{fraction}{only}",
                      flush=True)
                began = time.perf_counter()
                entry = run_case(case, missing if done else None)
                seconds = round(time.perf_counter() - began, 1)
                if done and entry["ops"] != done["ops"]:
                    raise SystemExit(f"{case['id']}: the graph has changed since its other rows ran; use --force")
                if done:   # keep the finished rows, add the new ones
                    entry = done | {"rows": done["rows"] + entry["rows"], "seconds": round(done["seconds"] + seconds, 1)}
                results[case["id"]] = entry | ({} if done else {"seconds": seconds})
                write_text_atomic(RESULTS / f"reproduce_{suite}.json", json.dumps(results, indent=1))
    write_tables({suite: load_results(suite) for suite in SUITES})
    return 0


# ---------------------------------------------------------------- published figures
# Step times in seconds from the papers' step-time tables (Baechi, Jeon et al., SoCC 2020; the Hierarchical
# Planner, Mirhoseini et al., ICLR 2018; ColocRL, Mirhoseini et al., ICML 2017; None = out of memory).
PAPER_BAECHI = {  # (model, batch): single GPU, expert, m-TOPO, m-ETF, m-SCT (all with Baechi's optimizations)
    ("Inception-V3", 32): (0.269, 0.269, 0.286, 0.269, 0.269),
    ("Inception-V3", 64): (0.491, 0.491, 0.521, 0.491, 0.491),
    ("GNMT len 40", 128): (0.251, 0.214, 0.265, 0.224, 0.212),
    ("GNMT len 40", 256): (0.474, 0.376, 0.481, 0.354, 0.369),
    ("GNMT len 50", 128): (0.319, 0.259, 0.348, 0.264, 0.267),
    ("GNMT len 50", 256): (0.618, 0.484, 0.609, 0.502, 0.516),
}
PAPER_BAECHI_30 = {  # 30% memory: the paper gives Inception-V3 and GNMT (batch 32 / length 40 batch 128 assumed)
    ("Inception-V3", 32): (None, None, 0.690, 0.312, 0.292),
    ("GNMT len 40", 128): ("?", 0.221, 0.272, 0.230, 0.212),
}
PAPER_HP = {  # model: (GPU only, expert, Scotch, MinCut, HP)
    "Inception-V3": (0.15, 0.15, 0.93, 0.82, 0.13),
    "ResNet": (1.18, 1.18, 6.27, 2.92, 1.18),
    "RNNLM": (1.57, 1.57, 5.62, 5.21, 1.57),
    "NMT 2-layer": (None, 2.13, 3.21, 5.34, 0.84),
    "NMT 4-layer": (None, 3.64, 11.18, 11.63, 1.69),
    "NMT 8-layer": (None, 3.88, 17.85, 19.01, 4.07),
}
PAPER_COLOCRL = {  # (model, GPUs): (single GPU, Scotch, MinCut, expert, RL)
    ("RNNLM batch 64", 2): (1.57, 13.43, 11.94, 3.81, 1.57),
    ("RNNLM batch 64", 4): (1.57, 11.52, 10.44, 4.46, 1.57),
    ("NMT batch 64", 2): (None, 14.19, 11.54, 4.99, 4.04),
    ("NMT batch 64", 4): (None, 11.23, 11.78, 4.73, 3.92),
    ("Inception-V3 batch 32", 2): (4.60, 25.24, 22.88, 11.22, 4.60),
    ("Inception-V3 batch 32", 4): (4.60, 23.41, 24.52, 10.65, 3.85),
}
BAECHI_CODE_DNN = {  # Baechi's own code on the shared graphs, ms: one device, m-TOPO, m-ETF, m-SCT
    "bert_l-3_training": "123.3 / 1168 / 422 (fusion), 495 / same",
    "gnmt_layers_training": "520.6 / 520 / 357 / 369",
    "resnet50_inference": "325.6 (no fit) / over memory / 563 (fusion), 1558 / same",
    "bert_l-3_inference": "49.5 (no fit) / over memory / 226 (fusion) / same",
}


# -------------------------------------------------------------------------- tables
def _times(entry: dict) -> dict:
    """algorithm -> step time in seconds, or 'OOM' / 'fail' for a row without a placement."""
    out = {}
    for row in entry["rows"]:
        if row["step_time_us"] is not None and not row["oom"]:
            out[row["algorithm"]] = row["step_time_us"] / 1e6
        else:
            out[row["algorithm"]] = "OOM" if row["oom"] else "fail"
    return out


def _ratio(value, base) -> str:
    if value is None:
        return "OOM"
    if isinstance(value, str):
        return value
    if not isinstance(base, float) and not isinstance(base, int):
        return "-"
    return f"{value / base:.2f}"


def _cell(ours, ours_base, paper=..., paper_base=None) -> str:
    text = _ratio(ours, ours_base)
    if paper is not ...:
        text += f" ({_ratio(paper, paper_base)})"
    return text


def baechi_table(results: dict) -> str:
    head = ("| model | batch | memory per GPU | ops | single GPU: ours ms (paper s) | expert | m-TOPO | m-ETF | m-SCT "
            f"| unoptimized m-TOPO / m-ETF / m-SCT (ours) | {OWN} (ours) "
            f"| placement s, m-SCT+opt / m-SCT / {OWN} |\n" + "|---" * 12 + "|\n")
    lines = []
    for case in _baechi_cases():
        entry = results.get(case["id"])
        if entry is None:
            continue
        key = (case["model"], case["batch"])
        t = _times(entry)
        ample = results.get(case["id"].rsplit("|", 1)[0] + f"|{AMPLE}")
        base = _times(ample).get("single") if ample else None  # one GPU without a memory limit
        fraction = case["memory_fraction"]
        if fraction == 0.3:
            paper, memory = PAPER_BAECHI_30.get(key), "2.4 GiB (30%)"
        else:
            paper, memory = PAPER_BAECHI.get(key), "8 GiB" if fraction is None else f"{8 * fraction:g} GiB"
        paper_base = PAPER_BAECHI.get(key, (None,))[0]
        p = paper if paper else (...,) * 5
        single = t.get("single")
        single_text = (f"{single * 1e3:.1f}" if isinstance(single, float) else single) + (
            f" ({'OOM' if p[0] is None else p[0]})" if paper else "")
        place_s = {r["algorithm"]: r["placement_time_s"] for r in entry["rows"]}
        fmt_s = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        lines.append(
            f"| {case['model']} | {case['batch']} | {memory} | {entry['ops']:,} | {single_text} "
            f"| {_cell(t.get('expert'), base, p[1], paper_base)} | {_cell(t.get('m-topo+opt'), base, p[2], paper_base)} "
            f"| {_cell(t.get('m-etf+opt'), base, p[3], paper_base)} | {_cell(t.get('m-sct+opt'), base, p[4], paper_base)} "
            f"| {' / '.join(_ratio(t.get(a), base) for a in ('m-topo', 'm-etf', 'm-sct'))} "
            f"| {(f'**{_ratio(t[OWN], base)}**' if isinstance(t[OWN], float) else t[OWN]) if OWN in t else '-'} "
            f"| {fmt_s(place_s.get('m-sct+opt'))} / {fmt_s(place_s.get('m-sct'))} / {fmt_s(place_s.get(OWN))} |"
        )
    return head + "\n".join(lines)


def _partition_table(results: dict, cases: list[dict], paper_for, learned: str) -> str:
    """HP's and ColocRL's layout: ratios to the single GPU (to the expert where the paper's GPU
    run was out of memory), metis beside the papers' graph partitioners, the learned placer's
    published ratio in parentheses."""
    head = (f"| model | GPUs | ops | baseline | single GPU: ours ms (paper s) | expert | metis (paper: Scotch / MinCut) "
            f"| m-ETF+opt | m-SCT+opt | {learned} (paper) |\n" + "|---" * 10 + "|\n")
    lines = []
    for case in cases:
        entry = results.get(case["id"])
        if entry is None:
            continue
        t = _times(entry)
        gpu, expert, scotch, mincut, learned_s = paper_for(case)
        by_expert = gpu is None
        base, paper_base = (t.get("expert"), expert) if by_expert else (t.get("single"), gpu)
        single = t.get("single")
        lines.append(
            f"| {case['model']} | {case['devices']} | {entry['ops']:,} | {'expert' if by_expert else 'single GPU'} "
            f"| {f'{single * 1e3:.1f}' if isinstance(single, float) else single}"
            f"{f' = {_ratio(single, base)}' if by_expert else ''} ({'OOM' if gpu is None else gpu}) "
            f"| {_cell(t.get('expert'), base, expert, paper_base)} "
            f"| {_ratio(t.get('metis'), base)} ({_ratio(scotch, paper_base)} / {_ratio(mincut, paper_base)}) "
            f"| {_ratio(t.get('m-etf+opt'), base)} | {_ratio(t.get('m-sct+opt'), base)} | ({_ratio(learned_s, paper_base)}) |"
        )
    return head + "\n".join(lines)


def hp_table(results: dict) -> str:
    return _partition_table(results, _hp_cases(), lambda case: PAPER_HP[case["model"]], "HP")


def colocrl_table(results: dict) -> str:
    def paper(case):
        single, scotch, mincut, expert, rl = PAPER_COLOCRL[(case["model"], case["devices"])]
        return single, expert, scotch, mincut, rl

    return _partition_table(results, _colocrl_cases(), paper, "RL")


def dnn_table(results: dict) -> str:
    head = ("| graph (devices) | ops | " + " | ".join(DNN_ALGOS) + " | Baechi code: one / m-TOPO / m-ETF / m-SCT |\n"
            + "|---" * (len(DNN_ALGOS) + 3) + "|\n")
    lines = []
    for case in _dnn_cases():
        entry = results.get(case["id"])
        if entry is None:
            continue
        t = _times(entry)
        cells = [f"{t[a] * 1e3:.0f}" if isinstance(t.get(a), float) else t.get(a, "-") for a in DNN_ALGOS]
        devices = entry["cluster_devices"] if "cluster_devices" in entry else "?"
        lines.append(f"| {case['model']} ({devices}) | {entry['ops']:,} | " + " | ".join(cells)
                     + f" | {BAECHI_CODE_DNN.get(case['model'], '-')} |")
    return head + "\n".join(lines)


TABLES = {"baechi": baechi_table, "hp": hp_table, "colocrl": colocrl_table, "dnn": dnn_table}


def write_tables(results: dict) -> None:
    """Replace the text between ``<!-- reproduce:SUITE -->`` and ``<!-- /reproduce:SUITE -->`` markers."""
    text = BENCHMARKS_MD.read_text()
    for suite, make in TABLES.items():
        begin, end = f"<!-- reproduce:{suite} -->", f"<!-- /reproduce:{suite} -->"
        if begin not in text or end not in text or not results.get(suite):
            continue
        before, rest = text.split(begin, 1)
        after = rest.split(end, 1)[1]
        text = before + begin + "\n" + make(results[suite]) + "\n" + end + after
    write_text_atomic(BENCHMARKS_MD, text)


if __name__ == "__main__":
    sys.exit(main())
