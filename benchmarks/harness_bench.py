"""Measurement-harness benchmark (needs a CUDA GPU): throughput, repeatability, agreement with do_bench.

    python benchmarks/harness_bench.py [--batch 200] [--repeat-candidates 20] [--repeats 5]

Prints:
  1. the GPU's two ceilings measured here: device-to-device copy bandwidth and bf16 matmul rate;
  2. throughput over a batch of template candidates of elementwise/reduction operations,
     in candidates per GPU-minute, and the fraction of wall time the GPU stage was busy;
  3. repeatability: candidates measured several times each in separate runs ->
     coefficient of variation of the per-case medians;
  4. agreement of the harness's medians with triton.testing.do_bench on the same kernels.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

from kernelcast.kernels.harness.correctness import load_launch, poisoned_outputs
from kernelcast.kernels.harness.sweep_report import held_seconds, lock_breakdown, repeat_spread
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import detect
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.spaces import get_space

MEMORY_OPS = ("softmax", "layernorm", "rmsnorm", "bias_gelu", "row_sum", "cross_entropy", "fp8_quant", "transpose")


def ceilings() -> dict:
    """Copy bandwidth (bytes read + written) and dense bf16 matmul rate, both measured here."""
    n = 1 << 30
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="median")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=500, return_mode="median")
    return {"copy_gbps": 2 * n / copy_ms / 1e6, "matmul_bf16_tflops": 2 * 8192**3 / mm_ms / 1e9}


def spread_batch(total: int, ops=MEMORY_OPS) -> list:
    per_op = total // len(ops)
    out = []
    for op in ops:
        out += get_space(op).spread_subset(per_op)
    return out


def do_bench_medians(cand) -> list[float]:
    """The same kernel timed by triton.testing.do_bench (median, its own L2 flush), per case, in us."""
    op = get_operation(cand.op)
    launch = load_launch(cand.source)
    medians = []
    for case in op.cases:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1000)
        inputs = op.make_inputs(case, gen, "cuda")
        outputs = poisoned_outputs(op, case, "cuda")
        fn = lambda: launch(*inputs, *outputs, **cand.params)  # noqa: E731
        medians.append(1e3 * triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
    return medians


_WINDOW = re.compile(r"(\?|[0-9.]+)-([0-9.]+) s, calls ([0-9.]+) s(?: \(explains ([0-9.]+) s\))?")


def window_fill(results) -> dict:
    """How much of each timed window of the ok rows their calls fill (the calls' count times median over the fewest
    seconds the worker saw the window take, where it could tell): what a refutation of understated figures could
    ask of an honest kernel's window."""
    fills, uses, untold = [], [], 0
    for m in results:
        if m.status != "ok":
            continue
        for low, _, calls, explained in _WINDOW.findall(m.checks or ""):
            if low == "?" or float(low) <= 0:
                untold += 1
            else:
                fills.append(float(calls) / float(low))
                if explained:  # how much of what the calls' figures explain the window took: refused above 1
                    uses.append(float(low) / float(explained))
    if not fills:
        return {"windows": 0, "untold": untold}
    fills.sort()
    out = {"windows": len(fills), "untold": untold, "fill_min": round(fills[0], 3),
           "fill_p05": round(fills[int(0.05 * (len(fills) - 1))], 3),
           "fill_median": round(statistics.median(fills), 3), "fill_max": round(fills[-1], 3)}
    if uses:
        uses.sort()
        out.update(explained_use_median=round(statistics.median(uses), 3),
                   explained_use_p95=round(uses[int(0.95 * (len(uses) - 1))], 3), explained_use_max=round(uses[-1], 3))
    return out


def _p90(values) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--ops", default=",".join(MEMORY_OPS),
                   help="the template operations the batch spreads over (comma-separated; default: every memory-bound "
                        "one), say one whose verdict is to be measured again")
    p.add_argument("--repeat-candidates", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--no-reserve", action="store_true", help="no core kept for the child holding the GPU lock")
    p.add_argument("--timing-windows", type=int, default=5, help="timing windows at most for a host-bound case")
    p.add_argument("--anchor", choices=("host-bound", "all", "off"), default="host-bound",
                   help="which cases are timed beside the reference in one process (the worker's setting)")
    p.add_argument("--warm-checks", action="store_true",
                   help="children warm the checks' comparisons before the GPU lock (WorkerConfig.warm_checks)")
    p.add_argument("--no-shared-checks", action="store_true",
                   help="every child holds the GPU lock alone from its first allocation (WorkerConfig.shared_checks "
                        "off): checks no longer run beside other children's checks")
    p.add_argument("--keep-reference", action="store_true",
                   help="the repeatability runs adopt each op's reference as the throughput batch measured it "
                        "(MeasureWorker.adopt_reference) instead of measuring it again each run: its runtime and "
                        "its paired cases then stay the same from run to run")
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="stop the throughput batch after this long and report what was measured (0: the whole batch)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--timeline", default=None, help="write the worker's timeline of the throughput batch here "
                   "(JSON lines: candidate, attempt, phase, seconds, detail) to see where a child's time went")
    p.add_argument("--no-verify", action="store_true", help="without the verification of each timed case "
                   "(kernelcast.kernels.harness.verify): its cost, measured against the same batch with it")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    hw = detect()
    report: dict = {"device": hw.device_name, "driver": hw.driver_version, "torch": hw.torch_version,
                    "triton": hw.triton_version}
    report.update(ceilings())
    print(f"device {hw.device_name}, driver {hw.driver_version}, torch {hw.torch_version}, triton {hw.triton_version}")
    print(f"copy bandwidth {report['copy_gbps']:.0f} GB/s, bf16 matmul {report['matmul_bf16_tflops']:.0f} TFLOP/s")
    config = WorkerConfig(mode="gpu", concurrency=args.concurrency,
                          reserve_timing_core=False if args.no_reserve else None,
                          host_bound_windows=args.timing_windows, verify=not args.no_verify, anchor=args.anchor,
                          warm_checks=args.warm_checks, shared_checks=not args.no_shared_checks)
    report.update(verify=not args.no_verify, anchor=args.anchor, warm_checks=args.warm_checks,
                  shared_checks=not args.no_shared_checks)

    # 2. throughput over a fresh batch (the eager reference of each op is measured too and counted)
    ops = tuple(o for o in args.ops.split(",") if o)
    unknown = sorted(set(ops) - set(MEMORY_OPS))
    if unknown or not ops:
        raise SystemExit(f"--ops {args.ops!r}: unknown {', '.join(unknown) or 'none given'}; "
                         f"choose among {', '.join(MEMORY_OPS)}")
    batch = spread_batch(args.batch, ops)
    with MeasureWorker(hw, config) as worker:
        t0 = time.monotonic()
        results = []
        for m in worker.measure(batch):
            results.append(m)
            if args.max_seconds and time.monotonic() - t0 > args.max_seconds:
                print(f"stopped after --max-seconds {args.max_seconds}: {len(results)} of the batch measured")
                break
        wall = time.monotonic() - t0
        held = held_seconds(worker.holds)  # overlapping shared holds counted once
        busy = held["held"]
        breakdown = lock_breakdown(worker.timeline)
        shared_children = worker.stats.shared_checks
        if args.timeline:
            with open(args.timeline, "w") as f:
                for cid, attempt, phase, t, detail in worker.timeline:
                    f.write(json.dumps({"candidate": cid, "attempt": attempt, "phase": phase, "t": round(t, 6),
                                        "detail": detail}, default=str) + "\n")
    statuses = {s: sum(m.status == s for m in results) for s in {m.status for m in results}}
    report.update(batch_candidates=len(results), batch_wall_s=wall, candidates_per_gpu_minute=len(results) / (wall / 60),
                  gpu_busy_fraction=busy / wall, gpu_alone_fraction=held["alone"] / wall,
                  gpu_shared_fraction=held["shared"] / wall, children_sharing_checks=shared_children,
                  batch_statuses=statuses)
    print(f"throughput: {len(results)} candidates in {wall:.1f} s = {report['candidates_per_gpu_minute']:.0f} "
          f"per GPU-minute; GPU lock held {100 * busy / wall:.0f}% of wall time ({100 * held['alone'] / wall:.0f}% "
          f"alone, {100 * held['shared'] / wall:.0f}% shared by checks; {shared_children} children shared); "
          f"statuses {statuses}")
    report["lock_breakdown"] = breakdown
    report["windows"] = window_fill(results)
    # every ok row's windows as the worker saw them (fewest seconds, or None; the calls' count times median)
    report["window_pairs"] = [[None if low == "?" else float(low), float(calls), float(explained or "nan")]
                              for m in results if m.status == "ok"
                              for low, _, calls, explained in _WINDOW.findall(m.checks or "")]
    print(f"timed windows: {report['windows']}")
    not_ok = [f"{m.op} {m.status}: {m.error[:200]}" for m in results if m.status != "ok"]
    report["not_ok"] = not_ok
    for line in not_ok:
        print(f"  not ok: {line}")
    if args.json:  # written now too: the figures so far survive a run cut short
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    for name, b in breakdown.items():
        print(f"  {name:<14} median {1e3 * b['median_s']:8.1f} ms, total {b['total_s']:7.1f} s over {b['children']} "
              f"children")

    # 3. repeatability: the same candidates, separate runs (fresh worker, fresh children)
    ok = [m for m in results if m.status == "ok"]
    by_id = {c.candidate_id: c for c in batch}
    step = max(1, len(ok) // args.repeat_candidates)
    chosen = [by_id[m.candidate_id] for m in ok[::step] if m.candidate_id in by_id][: args.repeat_candidates]
    series: dict[str, dict] = {c.candidate_id: {"op": c.op, "runtime_us": [], "checks": []} for c in chosen}
    references = {get_operation(op).seed_candidates()[0].candidate_id for op in ops}
    kept = [m for m in results if m.candidate_id in references] if args.keep_reference else []
    report["keep_reference"] = args.keep_reference
    for _ in range(args.repeats):
        with MeasureWorker(hw, config) as worker:
            for m in kept:
                refused = worker.adopt_reference(m)
                if refused:
                    print(refused)
            for m in worker.measure(chosen):
                if m.candidate_id in series and m.status == "ok":
                    # which cases were timed beside the reference (anchored), as the row says: a run's figure moves with
                    # the reference's own measurement in that run
                    series[m.candidate_id]["runtime_us"].append(list(m.runtime_us_median))
                    series[m.candidate_id]["checks"].append(m.checks)
    report["repeat_series"] = series
    split = repeat_spread(series, {c.op: [case.name for case in get_operation(c.op).cases] for c in chosen})
    cvs = split["own"] + split["anchored"]
    report.update(repeat_candidates=len(chosen), repeats=args.repeats,
                  median_cv=statistics.median(cvs) if cvs else None,
                  p90_cv=_p90(cvs) if cvs else None)
    for kind, values in split.items():  # a case timed beside the reference moves with the reference's run
        report[f"{kind}_series"] = len(values)
        report[f"median_cv_{kind}"] = statistics.median(values) if values else None
        report[f"p90_cv_{kind}"] = _p90(values) if values else None
    if cvs:
        print(f"repeatability: {len(chosen)} candidates x {args.repeats} runs, {len(cvs)} case series: "
              f"median CV {100 * report['median_cv']:.2f}%, 90th percentile {100 * report['p90_cv']:.2f}%")
        for kind, values in split.items():
            if values:
                print(f"  {kind} ({'timed in their own windows' if kind == 'own' else 'beside the reference in a run'}):"
                      f" {len(values)} series, median CV {100 * report[f'median_cv_{kind}']:.2f}%, 90th percentile "
                      f"{100 * report[f'p90_cv_{kind}']:.2f}%")
    else:  # --repeats 1: one run of each, no spread to give
        print(f"repeatability: not measured ({args.repeats} run of each candidate; it needs two)")

    # 4. agreement with do_bench on the same kernels (first run's medians)
    ratios = []
    for c in chosen:
        if not series[c.candidate_id]["runtime_us"]:
            continue
        ours = series[c.candidate_id]["runtime_us"][0]
        theirs = do_bench_medians(c)
        ratios += [o / t for o, t in zip(ours, theirs)]
    devs = [abs(r - 1) for r in ratios]
    if ratios:
        report.update(do_bench_pairs=len(ratios), do_bench_median_ratio=statistics.median(ratios),
                      do_bench_median_abs_dev=statistics.median(devs),
                      do_bench_within_3pct=sum(d <= 0.03 for d in devs) / len(devs))
        print(f"do_bench agreement: {len(ratios)} (kernel, case) pairs, median ratio harness/do_bench "
              f"{report['do_bench_median_ratio']:.3f}, median |deviation| "
              f"{100 * report['do_bench_median_abs_dev']:.1f}%, {100 * report['do_bench_within_3pct']:.0f}% within 3%")
    else:  # --repeats 0: the throughput batch alone
        print("do_bench agreement: not measured (no repeated run)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
