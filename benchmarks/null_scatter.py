"""Where a problem's null scatters: between the reference's measurement and the null's, or within one process.

    PYTHONPATH=$PWD python benchmarks/null_scatter.py --root data/pools/cudal1/kernelcast \
        --problems kb.cudal1-l2-005,kb.cudal1-l2-052 [--repeats 4] [--mode gpu] [--json FILE]

The null is the reference's own code measured as a candidate: it must come out at 1.00. For each problem
and repeat, a fresh worker measures the reference and then its null, once with the host-bound cases timed
beside the reference (``--anchor host-bound``, kernelcast's default) and once with every case (``all``):
each candidate in a child process of its own. Printed per problem: the null's speedups under each setting,
their spread (largest over smallest), and, under ``all``, the ratios of the null to the reference timed
in alternating rounds in the null's own process. If those ratios scatter as much as the speedups do, the
two copies of the same code differ within one process (placement, inputs, the timer); if only the speedups
scatter, the reference's own measurement moves from process to process. The problems are installed into
this machine's tasks directory (as `kernelcast import` installs a task) from the data root that holds them
(a CUDA-L1 pool root, say), where the measuring children find them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = ("host-bound", "all")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="a data root holding the problems' tasks")
    p.add_argument("--problems", required=True, help="comma-separated operation names (kb.cudal1-l2-005,...)")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--mode", default="gpu", choices=("gpu", "interpreter"))
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    args.problems = [x for x in args.problems.split(",") if x]
    if args.repeats < 1 or not args.problems:
        p.error("give at least one problem and one repeat")
    return args


def measure_once(op, anchor: str, mode: str) -> dict:
    """The reference and its null in a fresh worker: the null's speedup and its within-process ratios."""
    from kernelcast.kernels.hardware import detect
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.null import null_candidate

    seed, null = op.seed_candidates()[0], null_candidate(op)
    with MeasureWorker(detect(), WorkerConfig(mode=mode, concurrency=1, anchor=anchor)) as worker:
        got = {m.candidate_id: m for m in worker.measure([seed, null])}
        ratios = {d["case"]: d["ratio"] for cid, _, phase, _, d in worker.timeline
                  if cid == null.candidate_id and phase == "anchored"}
    m = got[null.candidate_id]
    return {"status": m.status, "error": m.error[:300], "speedup": m.speedup,
            "reference_status": got[seed.candidate_id].status, "within_process_ratios": ratios}


def spread(values) -> float | None:
    values = [v for v in values if v]
    return max(values) / min(values) if len(values) > 1 else None


def _figures(values) -> str:
    return " ".join(f"{v:.3f}" for v in values) or "-"


def run(args) -> int:
    from kernelcast.kernels.formats import install_from_root
    from kernelcast.kernels.ops import get_operation
    from kernelcast.storage.dataset import DataRoot

    root = DataRoot(args.root)
    rows = []
    for name in args.problems:
        if not install_from_root(root, name):
            raise ValueError(f"{args.root} holds no task {name}")
        op = get_operation(name)
        runs = {a: [measure_once(op, a, args.mode) for _ in range(args.repeats)] for a in SETTINGS}
        row = {"op": name, "runs": runs}
        for a in SETTINGS:
            speedups = [r["speedup"] for r in runs[a] if r["status"] == "ok" and r["speedup"]]  # none timed in the interpreter
            row[f"{a}_speedups"] = speedups
            row[f"{a}_spread"] = spread(speedups)
        ratios = [1 / r for run in runs["all"] for r in run["within_process_ratios"].values() if r]
        row["within_process_spread"] = spread(ratios)
        rows.append(row)
        print(f"{name}: host-bound {_figures(row['host-bound_speedups'])} | all {_figures(row['all_speedups'])} | "
              f"within one process {_figures(ratios)}", flush=True)
        for a in SETTINGS:
            for r in runs[a]:
                if r["status"] != "ok":
                    print(f"  {a}: null {r['status']}: {r['error'][:160]}", flush=True)
    print()
    print("| problem | spread host-bound | spread all | spread within one process |")
    print("|---|---|---|---|")
    for r in rows:
        cells = [f"{r[k]:.3f}" if r[k] else "-" for k in ("host-bound_spread", "all_spread", "within_process_spread")]
        print(f"| {r['op']} | {' | '.join(cells)} |")
    median = [r["all_spread"] for r in rows if r["all_spread"]]
    if median:
        print(f"median spread under all: {statistics.median(median):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


def main(argv=None) -> int:
    return run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
