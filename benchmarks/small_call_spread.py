"""What moves the timed median of a call of microseconds from one process to the next (needs a CUDA GPU).

The CUDA-L1 pool's smallest kernels were timed at very different figures in runs of the same code on one H200
(2026-11-29): KernelBench level2/18's kernel, one ``addmm`` of 128x10 by 10x1, at 17.4, 7.3 and 34.2 us; level2/73's,
a CUDA-graph replay of a small convolution, at 8.2, 31.6 and 9.5 us. Each figure is the fastest of its windows and
each window is tight (IQR about 1%), so the slowness lasted for the whole of one process's timing: a state of that
process or of its neighbours, not a moment of the host. This script times calls of that kind with the harness's own
timer (``kernelcast.kernels.harness.timing.time_call``: an L2 flush, events, repetitions until the median is pinned down), each
condition in a fresh process pinned to the last core, and prints each window's median:

- ``quiet``: nothing else runs (three times, at the start, middle and end: the control);
- ``after-profiler``: CUDA activity tracing started and stopped once first, as every measuring child does before
  the lock (``verify.warm_profiler``); ``after-trace``: a call traced first, as the verification does
  (``verify.profile_window``); ``teardown``: ``after-profiler`` with ``TEARDOWN_CUPTI=1`` (the profiler library's
  switch that finalises CUPTI when tracing stops);
- neighbours, one process per other core: ``cpu`` (each spinning, as compiling children do), ``contexts`` (each
  holding a CUDA context and sleeping), ``gpu`` (each issuing a tiny kernel every few milliseconds, as children
  warming their libraries outside the lock do), ``churn`` (each starting processes that import torch, create a
  context, run one kernel and exit, as a pool's children come and go);
- ``pairs``: ``addmm`` and ``graph`` each timed beside ``chain`` as the harness pairs a candidate with a host-bound
  reference (``timing.time_pair``), in rounds of two repetitions (20 a side) and of ten (``pair_repetitions``), against
  their windows alone: what a pair does to each side's figure and to their ratio.

The calls: ``addmm`` (level2/18's kernel), ``graph`` (a CUDA-graph replay of a 3-to-16-channel 3x3 convolution of
128x3x32x32, as level2/73's kernel), ``chain`` (level2/18's reference: a 10-to-5 linear layer, then sum, max, mean
and two logsumexps: host-bound). Also each process's pure-Python speed (20,000 additions).

    python benchmarks/small_call_spread.py [--windows 3] [--neighbours N] [--only NAME,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ("quiet", "after-profiler", "after-trace", "teardown", "cpu", "contexts", "gpu", "churn", "quiet",
              "quiet", "pairs")
NEIGHBOURS = {
    "cpu": "while True:\n    pass\n",
    "contexts": "import time, torch\ntorch.ones(1, device='cuda')\ntorch.cuda.synchronize()\ntime.sleep(3600)\n",
    "gpu": ("import time, torch\na = torch.ones(16, 16, device='cuda')\nwhile True:\n    torch.mm(a, a)\n"
            "    torch.cuda.synchronize()\n    time.sleep(0.004)\n"),
    "churn": ("import subprocess, sys\nwhile True:\n    subprocess.run([sys.executable, '-c', 'import torch; "
              "a = torch.ones(16, 16, device=\"cuda\"); torch.mm(a, a); torch.cuda.synchronize()'])\n"),
}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=3, help="timing windows per call and condition")
    p.add_argument("--neighbours", type=int, default=None, help="neighbour processes (default: one per other core)")
    p.add_argument("--only", default="", help="comma-separated conditions to run (default: all)")
    p.add_argument("--json", default=None, help="write every window here as well")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the measuring child's condition
    return p.parse_args(argv)


def python_us() -> float:
    t, s = time.perf_counter(), 0
    for k in range(20000):
        s += k
    return (time.perf_counter() - t) * 1e6


def make_calls() -> dict:
    """The three calls, on four input sets each where the call takes inputs (rotated as the harness does)."""
    import torch

    xs = [torch.randn(128, 10, device="cuda") for _ in range(4)]
    w, b = torch.randn(10, 1, device="cuda"), torch.randn(1, device="cuda")
    out = torch.empty(128, 1, device="cuda")
    linear = torch.nn.Linear(10, 5).cuda()
    conv = torch.nn.Conv2d(3, 16, 3).cuda().eval()
    static = torch.randn(128, 3, 32, 32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            conv(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        graphed = conv(static) * 2.0

    def addmm(i):
        return torch.addmm(b, xs[i % 4], w, out=out)

    def replay(i):
        graph.replay()
        return graphed

    @torch.no_grad()
    def chain(i):
        y = linear(xs[i % 4]).sum(1, keepdim=True)
        y = y.max(1, keepdim=True)[0].mean(1, keepdim=True)
        return torch.logsumexp(torch.logsumexp(y, 1, keepdim=True), 1, keepdim=True)

    return {"addmm": addmm, "graph": replay, "chain": chain}


def measure(condition: str, windows: int) -> dict:
    """In a fresh process: the condition's in-process part, then every call timed in ``windows`` windows."""
    import torch

    from kernelcast.kernels.harness import verify
    from kernelcast.kernels.harness.timing import flush_us, l2_flush_buffer, time_call

    calls = make_calls()
    flush = l2_flush_buffer()
    if condition in ("after-profiler", "teardown"):
        verify.warm_profiler()
    if condition == "after-trace":
        verify.profile_window(lambda: calls["addmm"](0))
    torch.cuda.synchronize()
    row = {"condition": condition, "flush_us": flush_us(flush), "python_us": [], "calls": {}}
    if condition == "pairs":
        row["python_us"].append(python_us())
        row["pairs"] = pairs(calls, flush, windows)
        return row
    for _ in range(windows):
        row["python_us"].append(python_us())
        for name, call in calls.items():
            t = time_call(call, flush)
            row["calls"].setdefault(name, []).append(
                {"median_us": t.runtime_us_median, "iqr_us": t.runtime_us_iqr, "reps": t.repetitions,
                 "host_us": t.host_us_median})
    return row


def pairs(calls: dict, flush, windows: int) -> dict:
    """Each GPU-bound call alone and beside ``chain`` (the reference), rounds opened by an untimed call or not."""
    from kernelcast.kernels.harness.timing import time_call, time_pair

    out = {}
    for name in ("addmm", "graph"):
        alone = {n: [time_call(calls[n], flush).runtime_us_median for _ in range(windows)] for n in (name, "chain")}
        row = {"alone_us": alone[name], "reference_alone_us": alone["chain"]}
        for long_rounds, key in ((False, "min_reps=20"), (True, "min_reps=80")):  # rounds of two, of ten
            for _ in range(windows):
                mine, theirs = time_pair(calls[name], calls["chain"], flush, long_rounds=long_rounds)
                row.setdefault(key, []).append(
                    {"us": mine.runtime_us_median, "iqr_us": mine.runtime_us_iqr, "reps": mine.repetitions,
                     "reference_us": theirs.runtime_us_median, "reference_iqr_us": theirs.runtime_us_iqr,
                     "ratio": mine.paired_ratio})
        out[name] = row
    return out


def start_neighbours(kind: str, cores: list[int]) -> list[subprocess.Popen]:
    """One neighbour process per core in ``cores``, each pinned there."""
    procs = []
    for core in cores:
        procs.append(subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", NEIGHBOURS[kind]],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run_condition(condition: str, args, timer_core: int, others: list[int]) -> dict:
    """One condition: its neighbours (started 5 s ahead, so they are running), then the measuring child."""
    neighbours = start_neighbours(condition, others) if condition in NEIGHBOURS else []
    try:
        if neighbours:
            time.sleep(5.0)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        if condition == "teardown":
            env["TEARDOWN_CUPTI"] = "1"
        done = subprocess.run(["taskset", "-c", str(timer_core), sys.executable, __file__, "--measure", condition,
                               "--windows", str(args.windows)], env=env, capture_output=True, text=True,
                              timeout=300)
    finally:
        stop(neighbours)
    if done.returncode != 0:
        return {"condition": condition, "error": done.stderr[-2000:]}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["neighbours"] = len(neighbours)
    row["load_average"] = open("/proc/loadavg").read().split()[0]
    return row


def line(row: dict) -> str:
    if "error" in row:
        return f"{row['condition']:>15}: failed: {row['error'][-300:]}"
    if "pairs" in row:
        parts = []
        for name, r in row["pairs"].items():
            parts.append(f"{name} alone {[round(v, 1) for v in r['alone_us']]}, chain alone "
                         f"{[round(v, 1) for v in r['reference_alone_us']]}")
            for key in sorted((k for k in r if k.startswith("min_reps=")), key=lambda k: int(k.split("=")[1])):
                parts.append(f"  paired {key}: " + "; ".join(
                    f"{p['us']:.1f} (iqr {p['iqr_us']:.1f}) / chain {p['reference_us']:.1f} (iqr "
                    f"{p['reference_iqr_us']:.1f}), ratio {p['ratio']:.3f}" for p in r[key]))
        return f"{row['condition']:>15}:\n" + "\n".join(parts)
    parts = [f"{row['condition']:>15} ({row['neighbours']:2d} nb, python {statistics.median(row['python_us']):6.0f} us,"
             f" flush {row['flush_us']:5.1f} us)"]
    for name, windows in row["calls"].items():
        medians = " ".join(f"{w['median_us']:7.1f}" for w in windows)
        parts.append(f"{name} [{medians}] host {statistics.median(w['host_us'] for w in windows):5.1f}")
    return " | ".join(parts)


def main(argv=None) -> None:
    args = parse(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.windows)), flush=True)
        return
    cores = sorted(os.sched_getaffinity(0))
    timer_core, others = cores[-1], cores[:-1]
    if args.neighbours is not None:
        others = others[:args.neighbours]
    only = [c for c in args.only.split(",") if c]
    unknown = sorted(set(only) - set(CONDITIONS))
    if unknown:
        raise SystemExit(f"error: unknown condition(s) {unknown}; known: {sorted(set(CONDITIONS))}")
    import torch

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {len(cores)} cores; timer on core "
          f"{timer_core}, neighbours on {len(others)}; median of each window (us)", flush=True)
    rows = []
    for condition in CONDITIONS:
        if only and condition not in only:
            continue
        rows.append(run_condition(condition, args, timer_core, others))
        print(line(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
