"""Survey the template spaces on a GPU: statuses, errors and the speedup spread of a sample per operation.

    python benchmarks/space_survey.py [--per-op 20] [--ops softmax,matmul]

Or, without measuring, summarise a data root already measured (e.g. the committed pool):

    python benchmarks/space_survey.py --data data/pools

Prints per operation: how many variants ran and their statuses, the first errors,
and min / median / best speedup over eager PyTorch with the best-to-median ratio
(the spread a search has to exploit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter


def summarise(rows) -> None:
    """rows: (op, gpu_type, status, error, speedup) tuples."""
    by_key: dict = {}
    for op, gpu, status, error, speedup in rows:
        by_key.setdefault((op, gpu), []).append((status, error, speedup))
    for (op, gpu), items in sorted(by_key.items()):
        statuses = Counter(s for s, _, _ in items)
        sp = sorted(x for s, _, x in items if s == "ok" and x)
        line = f"{op:<14} {gpu:<8} n={len(items):<4} " + " ".join(f"{k}={v}" for k, v in statuses.most_common())
        if sp:
            med = statistics.median(sp)
            line += f"  speedup min {sp[0]:.2f} median {med:.2f} best {sp[-1]:.2f}  best/median {sp[-1] / med:.2f}"
        print(line)
        for s, e, _ in [i for i in items if i[0] != "ok"][:2]:
            print(f"    {s}: {e[:300]}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--per-op", type=int, default=20)
    p.add_argument("--ops", default="all")
    p.add_argument("--concurrency", type=int, default=15)
    p.add_argument("--data", default=None, help="summarise this data root instead of measuring")
    args = p.parse_args()
    if args.data:
        from kernelcast.storage.dataset import DataRoot

        root = DataRoot(args.data)
        m = root.read_measurements()
        seeds = root.read_candidates().query("origin == 'seed'")["candidate_id"]
        m = m[~m["candidate_id"].isin(set(seeds))]  # the spread is over template variants only
        for gpu, g in m.groupby("gpu_type"):
            print(f"{gpu}: {len(g)} measurements on {', '.join(sorted(set(g['device_name'])))}, driver "
                  f"{', '.join(sorted(set(g['driver_version'])))}, torch {', '.join(sorted(set(g['torch_version'])))}, "
                  f"triton {', '.join(sorted(set(g['triton_version'])))}, measured "
                  f"{g['measured_at'].min():%Y-%m-%d %H:%M} to {g['measured_at'].max():%Y-%m-%d %H:%M} UTC")
        summarise(zip(m["op"], m["gpu_type"], m["status"], m["error"], m["speedup"]))
        return 0
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.hardware import detect
    from kernelcast.kernels.ops import OPERATIONS
    from kernelcast.kernels.spaces import get_space

    ops = list(OPERATIONS) if args.ops == "all" else args.ops.split(",")
    todo = [c for op in ops for c in get_space(op).spread_subset(args.per_op)]
    with MeasureWorker(detect(), WorkerConfig(mode="gpu", concurrency=args.concurrency)) as worker:
        results = list(worker.measure(todo))
    summarise((m.op, m.gpu_type, m.status, m.error, m.speedup) for m in results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
