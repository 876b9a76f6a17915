"""Measure the zero-shot set (benchmarks/zeroshot, written by benchmarks/zeroshot_tasks.py) on a GPU.

    python benchmarks/zeroshot_measure.py --out $OUT/zeroshot [--max-seconds 420] [--concurrency 8]

Each problem is imported as a KernelBench task, and its reference and every kernel are measured by the
harness's worker (isolated children, correctness against the reference on seeded inputs, CUDA-event timing
with the L2 flushed). Problems are measured in the manifest's order until ``--max-seconds`` have passed; the
rest are listed as not measured. Writes OUT/measurements.parquet (one row per kernel: problem, kernel, its
character, sealed flag, status, error, runtime per case, the reference's, speedup, compile and GPU seconds)
and OUT/summary.json. Needs torch, triton, pandas and pyarrow; kernelcast runs from the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SET = REPO / "benchmarks" / "zeroshot"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--set", default=str(SET), help="the folder zeroshot_tasks.py wrote")
    p.add_argument("--max-seconds", type=float, default=420.0, help="stop starting problems after this long")
    p.add_argument("--concurrency", type=int, default=8, help="children loading and compiling at once")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="problems measured together")
    p.add_argument("--dry-run", action="store_true", help="import every problem and kernel, measure nothing (CPU)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["KERNELCAST_TASKS"] = str((out / "tasks").resolve())  # before the worker's fork server starts

    import pandas as pd
    import torch

    from kernelcast.kernels.formats import import_task
    from kernelcast.kernels.hardware import detect
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig

    t0 = time.perf_counter()
    folder = Path(args.set)
    manifest = json.loads((folder / "manifest.json").read_text())
    imported = {}  # every task installed before the worker's fork server starts, as its children must find them
    for problem in manifest["problems"]:
        where = folder / problem["name"]
        imported[problem["name"]] = import_task("kernelbench", str(where / "reference.py"),
                                                [str(where / f"{k}.py") for k in problem["kernels"]],
                                                name=problem["name"])
    if args.dry_run:
        n = sum(len(kernels) for _, kernels in imported.values())
        print(f"{len(imported)} problems and {n} kernels import ({time.perf_counter() - t0:.0f} s)")
        return 0
    if not torch.cuda.is_available():
        print("no GPU: nothing measured", file=sys.stderr)
        return 2
    hardware = detect()
    print(f"measuring on {hardware.device_name} ({hardware.gpu_type})", flush=True)
    wanted = dict(mode="gpu", concurrency=args.concurrency, seeds=args.seeds, max_seconds_per_case=0.5,
                  memcheck="off", verify=False, fresh_calls=1)
    known = {f.name for f in dataclasses.fields(WorkerConfig)}  # the harness's settings of the day
    config = WorkerConfig(**{k: v for k, v in wanted.items() if k in known})
    rows, skipped = [], []
    with MeasureWorker(hardware, config) as worker:
        problems = list(manifest["problems"])
        # a few problems a batch, so that the children of one overlap the others' (a batch a problem left the
        # device idle while each problem's last child finished)
        for at in range(0, len(problems), args.batch):
            batch = problems[at:at + args.batch]
            if time.perf_counter() - t0 > args.max_seconds:
                skipped += [problem["name"] for problem in batch]
                continue
            t = time.perf_counter()
            wanted_here = []
            for problem in batch:
                op, kernels = imported[problem["name"]]
                wanted_here += [op.seed_candidates()[0], *kernels]
            found = {m.candidate_id: m for m in worker.measure(wanted_here)}
            for problem in batch:
                names = list(problem["kernels"])
                op, kernels = imported[problem["name"]]
                reference = op.seed_candidates()[0]
                for kernel, candidate in (("reference", reference), *zip(names, kernels)):
                    m = found.get(candidate.candidate_id)
                    rows.append({"problem": problem["name"], "op": op.name, "kernel": kernel,
                                 "character": problem["kernels"].get(kernel, "the task's reference"),
                                 "sealed": bool(problem["sealed"]), "candidate_id": candidate.candidate_id,
                                 "status": m.status if m else "not_measured", "error": (m.error if m else "")[:500],
                                 "case_names": list(m.case_names) if m else [],
                                 "runtime_us_median": list(m.runtime_us_median) if m else [],
                                 "reference_us_median": list(m.reference_us_median) if m else [],
                                 "speedup": float(m.speedup) if m and m.speedup else float("nan"),
                                 "compile_seconds": m.compile_seconds if m else 0.0,
                                 "gpu_seconds": m.gpu_seconds if m else 0.0,
                                 "wall_seconds": m.wall_seconds if m else 0.0,
                                 "gpu_type": hardware.gpu_type, "device": hardware.device_name})
                line = ", ".join(f"{r['kernel']} {r['status']}" + (f" {r['speedup']:.2f}x"
                                                                     if r['speedup'] == r['speedup'] else "")
                                 for r in rows[-len(names) - 1:])
                print(f"{problem['name']}: {line}", flush=True)
            print(f"  ({len(batch)} problems in {time.perf_counter() - t:.0f} s)", flush=True)
            pd.DataFrame(rows).to_parquet(out / "measurements.parquet")  # what is done so far survives a kill
    table = pd.DataFrame(rows)
    table.to_parquet(out / "measurements.parquet")
    summary = {"device": hardware.device_name, "gpu_type": hardware.gpu_type, "torch": torch.__version__,
               "problems_measured": int(table["problem"].nunique()) if len(table) else 0,
               "kernels_measured": int((table["status"] != "not_measured").sum()) if len(table) else 0,
               "status_counts": table["status"].value_counts().to_dict() if len(table) else {},
               "not_measured": skipped, "seconds": round(time.perf_counter() - t0, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
