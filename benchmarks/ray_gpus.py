"""The Ray measurement pool on every GPU of this machine against one of its GPUs: throughput and verdicts.

    PYTHONPATH=$PWD python benchmarks/ray_gpus.py --candidates 96 --tasks ../shared/tasks --limit 24 --out DIR

The same candidates are measured twice through ``RayMeasurePool`` on a local Ray: once with one
measurement actor (one GPU, its share of the host's cores: the cores divided by the GPUs), once
with one actor per GPU (each on its own share). The candidates are template kernels of the
committed pools (``--candidates``, spread over the operations) and, with ``--tasks``, imported
public tasks: each task's reference and its null candidate (kernels/harness/sweep.py imports
them the same way). Each run starts its own workers, so both compile from a cold Triton cache.

Prints and writes (``DIR/ray_gpus.json``) each run's wall seconds and candidates per minute, the
ratio (goal >= 1.8x on two GPUs), and the verdicts compared candidate by candidate: the status of
each in both runs, and for those measured ok in both, how far their speedups differ.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def template_candidates(pool: str, n: int) -> list:
    """``n`` measured template candidates, taken in turn from each operation (the pool's own order)."""
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame

    root = DataRoot(pool)
    measured = set(root.read_measurements()["candidate_id"])
    by_op: dict[str, list] = {}
    for c in sorted(candidates_from_frame(root.read_candidates()), key=lambda c: c.candidate_id):
        if c.candidate_id in measured and c.origin != "llm":
            by_op.setdefault(c.op, []).append(c)
    turns = max(map(len, by_op.values()), default=0)
    picked = [cs[i] for i in range(turns) for _, cs in sorted(by_op.items()) if i < len(cs)]
    return picked[:n]


def task_candidates(folder: Path, match: str | None, limit: int | None) -> list:
    """The null candidates of the public tasks under ``folder`` (their references are measured with them)."""
    import re

    from kernelcast.kernels.harness.sweep import _import, discover
    from kernelcast.kernels.null import null_candidate

    tasks = [t for t in discover(folder) if not match or re.search(match, t.key)][:limit]
    cands = []
    for task in tasks:
        op, _, error = _import(task)
        if op is None:
            print(f"{task.key}: not imported ({error[:120]})", flush=True)
            continue
        cands.append(null_candidate(op))
    return cands


def run(candidates: list, gpus: int, gpu_type: str, chunk_size: int = 16) -> dict:
    """Measure ``candidates`` through a local Ray pool of ``gpus`` actors; wall time and every verdict."""
    from kernelcast.infra.ray_pools import RayMeasurePool

    t0 = time.perf_counter()
    pool = RayMeasurePool.connect(None, local_resources={f"gpu_type:{gpu_type}": float(gpus)}, chunk_size=chunk_size)
    up = time.perf_counter() - t0
    try:
        actors = [a.__dict__ for a in pool.actors]
        for op in sorted({c.op for c in candidates}):
            pool.prepare(op, gpu_type)
        t0 = time.perf_counter()
        got = {}
        for m in pool.measure(candidates, gpu_type):
            got[m.candidate_id] = m
        wall = time.perf_counter() - t0
    finally:
        pool.close()
    missing = [c.candidate_id for c in candidates if c.candidate_id not in got]
    if missing:
        raise RuntimeError(f"{len(missing)} candidates came back without a measurement, e.g. {missing[:3]}")
    return {"gpus": gpus, "actors": actors, "startup_s": round(up, 1), "wall_s": round(wall, 2),
            "measured": len(got), "per_minute": round(60 * len(got) / wall, 1),
            "gpu_seconds": round(sum(m.gpu_seconds for m in got.values()), 1),
            "verdicts": {cid: {"status": m.status, "speedup": m.speedup, "error": m.error[:200]}
                         for cid, m in got.items()}}


def compare(one: dict, many: dict) -> dict:
    """Candidate by candidate: statuses that differ, and the spread of speedups measured ok in both."""
    a, b = one["verdicts"], many["verdicts"]
    common = sorted(set(a) & set(b))
    differ = {cid: (a[cid]["status"], b[cid]["status"]) for cid in common if a[cid]["status"] != b[cid]["status"]}
    devs = [abs(math.log(b[c]["speedup"] / a[c]["speedup"])) for c in common
            if a[c]["status"] == b[c]["status"] == "ok" and a[c]["speedup"] and b[c]["speedup"]]
    return {"candidates": len(common), "status_differs": len(differ), "differing": differ,
            "ok_in_both": len(devs), "speedup_abs_log_ratio_median": statistics.median(devs) if devs else None,
            "speedup_within_2pct_share": (sum(d <= math.log(1.02) for d in devs) / len(devs)) if devs else None,
            "throughput_ratio": round(many["per_minute"] / one["per_minute"], 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--candidates", type=int, default=96, help="template candidates from the pools (default 96)")
    p.add_argument("--pool", default=str(REPO / "data" / "pools"))
    p.add_argument("--tasks", default=None, help="also every public task's reference and null candidate here")
    p.add_argument("--match", default=None, help="only tasks whose path matches this regular expression")
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    p.add_argument("--chunk", type=int, default=16, help="candidates sent to an actor at once (the pool's default 16)")
    p.add_argument("--out", required=True, help="folder for ray_gpus.json (and the imported tasks)")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Before Ray starts: its workers (and their harness's children) find the imported tasks here.
    os.environ["KERNELCAST_TASKS"] = str(out / "tasks")
    import torch

    from kernelcast.kernels.hardware import detect

    gpus = torch.cuda.device_count()
    if gpus < 2:
        print(f"this machine has {gpus} GPU(s); the comparison needs two or more", file=sys.stderr)
        return 2
    gpu_type = detect(0).gpu_type
    candidates = template_candidates(args.pool, args.candidates)
    if args.tasks:
        candidates += task_candidates(Path(args.tasks), args.match, args.limit)
    print(f"{len(candidates)} candidates over {len({c.op for c in candidates})} operations on "
          f"{gpus} x {detect(0).device_name}", flush=True)
    runs = []
    for n in (1, gpus):
        r = run(candidates, n, gpu_type, args.chunk)
        print(f"{n} GPU(s): {r['measured']} measured in {r['wall_s']:.1f} s ({r['per_minute']:.1f} a minute), "
              f"{r['gpu_seconds']:.0f} device-seconds, actors up in {r['startup_s']:.1f} s", flush=True)
        runs.append(r)
    summary = compare(*runs)
    summary["goal: throughput >= 1.8x"] = summary["throughput_ratio"] >= 1.8
    summary["goal: verdicts identical"] = summary["status_differs"] == 0
    print(json.dumps({k: v for k, v in summary.items() if k != "differing"}, indent=1))
    for cid, (s1, s2) in summary["differing"].items():
        print(f"  {cid}: {s1} on one GPU, {s2} on {gpus}")
    (out / "ray_gpus.json").write_text(json.dumps({"device": detect(0).device_name, "gpus": gpus, "chunk": args.chunk, "runs": runs,
                                                   "summary": summary}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
