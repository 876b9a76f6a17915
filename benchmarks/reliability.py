"""Reliability report: every fault kind injected between good candidates on one measurement worker.

    PYTHONPATH=$PWD python benchmarks/reliability.py --out DIR              # on a GPU
    PYTHONPATH=$PWD python benchmarks/reliability.py --mode interpreter --out DIR   # on the CPU

Three phases on one worker: good candidates; every fault kind of the mode, each followed
by a good candidate; good candidates again. Prints and writes (DIR/reliability_<mode>.json):
  - the sandbox protections that took effect (in GPU mode, the probe's ladder first);
  - per fault kind: expected status, status got, whether the error names the cause;
  - worker restarts: children started, crashed, killed at a time or memory limit;
  - records lost (candidates sent less results returned; goal 0) and duplicates;
  - good candidates per minute before and after the faults, and whether every good one passed.
Needs only torch, triton and the project's own code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

import torch

from kernelcast.kernels.harness.faults import faults_for, good_candidates
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.records import HardwareSpec


def _hardware(mode: str) -> HardwareSpec:
    if mode == "interpreter":
        return HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter",
                            torch_version=torch.__version__)
    from kernelcast.kernels.hardware import detect

    return detect()


def _phase(worker: MeasureWorker, candidates: list) -> tuple[dict, dict]:
    """Measure ``candidates``; returns their results by id and the phase's figures."""
    started = time.monotonic()
    results: dict = {}
    duplicates = 0
    for m in worker.measure(candidates):
        duplicates += m.candidate_id in results
        results[m.candidate_id] = m
    wall = time.monotonic() - started
    sent = {c.candidate_id for c in candidates}
    figures = {"candidates": len(candidates), "results": len(results), "wall_s": round(wall, 2),
               "candidates_per_min": round(len(candidates) / wall * 60, 1),
               "records_lost": len(sent - set(results)), "duplicates": duplicates,
               "statuses": dict(Counter(m.status for m in results.values()))}
    return results, figures


def run(mode: str, good_per_phase: int, kinds: list[str] | None, config: WorkerConfig) -> dict:
    faults = [f for f in faults_for(mode) if not kinds or f.kind in kinds]
    unknown = set(kinds or ()) - {f.kind for f in faults_for(mode)}
    if unknown:
        raise SystemExit(f"fault kinds not known in {mode} mode: {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(f.kind for f in faults_for(mode))}")
    good = good_candidates(2 * good_per_phase + len(faults))
    before, between, after = good[:good_per_phase], good[good_per_phase:good_per_phase + len(faults)], \
        good[good_per_phase + len(faults):]
    interleaved = [c for f, g in zip(faults, between) for c in (f.candidate(), g)]
    report: dict = {"mode": mode, "config": {k: v for k, v in vars(config).items()}}
    with MeasureWorker(_hardware(mode), config) as worker:
        report["device"] = worker.hardware.device_name
        if mode == "gpu":
            worker.probe_sandbox()
            report["sandbox_probe"] = list(worker.probe_log)
        results_before, report["before"] = _phase(worker, before)
        results_faults, report["faults_phase"] = _phase(worker, interleaved)
        results_after, report["after"] = _phase(worker, after)
        report["worker"] = {"children": worker.stats.children, "crashed": worker.stats.crashed,
                            "killed": worker.stats.killed, "sandboxes": dict(worker.stats.sandboxes)}
    kinds_report = []
    for f in faults:
        m = results_faults.get(f.candidate().candidate_id)
        got = m.status if m else "lost"
        expected = f.expected_status(mode)
        named = bool(m) and f.words in m.error.lower()
        kinds_report.append({"kind": f.kind, "what": f.what, "expected": expected, "got": got,
                             "correct": got == expected and named, "cause_named": named,
                             "error": (m.error[:300] if m else "")})
    report["kinds"] = kinds_report
    good_results = [results_before.get(c.candidate_id) for c in before] + \
        [results_faults.get(c.candidate_id) for c in between] + [results_after.get(c.candidate_id) for c in after]
    report["summary"] = {
        "fault_kinds": len(faults),
        "classified_correctly": sum(k["correct"] for k in kinds_report),
        "good_ok": sum(1 for m in good_results if m is not None and m.status == "ok"),
        "good_total": len(good_results),
        "records_lost": sum(report[p]["records_lost"] for p in ("before", "faults_phase", "after")),
        "duplicates": sum(report[p]["duplicates"] for p in ("before", "faults_phase", "after")),
        "worker_restarts": report["worker"]["crashed"] + report["worker"]["killed"],
        "good_per_min_before": report["before"]["candidates_per_min"],
        "good_per_min_after": report["after"]["candidates_per_min"],
    }
    return report


def print_report(r: dict) -> None:
    s = r["summary"]
    print(f"reliability report — {r['mode']} mode on {r['device']}")
    for line in r.get("sandbox_probe", []):
        print(f"  sandbox probe: {line}")
    for summary, n in r["worker"]["sandboxes"].items():
        print(f"  sandbox: {summary}  ({n} children)")
    print(f"\n  {'fault kind':28s} {'expected':14s} {'got':14s} ok")
    for k in r["kinds"]:
        print(f"  {k['kind']:28s} {k['expected']:14s} {k['got']:14s} {'yes' if k['correct'] else 'NO: ' + k['error'][:80]}")
    print(f"\n  faults injected: {s['fault_kinds']} kinds, one each; classified correctly: "
          f"{s['classified_correctly']}/{s['fault_kinds']}")
    print(f"  worker restarts: {r['worker']['children']} children started, {r['worker']['crashed']} crashed, "
          f"{r['worker']['killed']} killed at a limit")
    print(f"  records lost: {s['records_lost']} (duplicates: {s['duplicates']})")
    print(f"  good candidates ok: {s['good_ok']}/{s['good_total']}")
    print(f"  good candidates per minute: before {s['good_per_min_before']}, after {s['good_per_min_after']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("gpu", "interpreter"), default="gpu" if torch.cuda.is_available() else None)
    p.add_argument("--out", required=True, help="folder for reliability_<mode>.json")
    p.add_argument("--good", type=int, default=8, help="good candidates per phase (before, after)")
    p.add_argument("--kinds", nargs="*", default=None, help="only these fault kinds")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=None, help="child time limit (gpu 120 s, interpreter 20 s)")
    p.add_argument("--gpu-timeout-s", type=float, default=20.0)
    args = p.parse_args()
    if args.mode is None:
        print("no CUDA GPU is visible: run with --mode interpreter (correctness only)", file=sys.stderr)
        return 2
    if args.mode == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"
        cfg = WorkerConfig(mode="interpreter", concurrency=args.concurrency, timeout_s=args.timeout_s or 20.0,
                           seeds=1, address_space_gib=1.5, host_memory_gib=4.0, file_size_mib=64)
    else:
        cfg = WorkerConfig(mode="gpu", concurrency=args.concurrency, timeout_s=args.timeout_s or 120.0,
                           gpu_timeout_s=args.gpu_timeout_s)
    report = run(args.mode, args.good, args.kinds, cfg)
    print_report(report)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"reliability_{args.mode}.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(f"\n  written: {path}")
    s = report["summary"]
    ok = s["classified_correctly"] == s["fault_kinds"] and s["records_lost"] == 0 and s["good_ok"] == s["good_total"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
