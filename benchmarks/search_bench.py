"""Surrogate-filtered search against the equal-budget baseline, replayed on the committed pool.

For each operation, seed and budget, two searches with the same GPU budget: the surrogate
(``--surrogate``, learned by default: fit on the other operations only, corrected online by the
run's own measurements) choosing what to measure among many children, and the baseline measuring
every child it breeds. Prints, per budget:

- the geometric mean over (op, seed) of best-measured-speedup(surrogate) / best(baseline);
- how many measurements the surrogate search needed to reach the baseline's final best,
  as a fraction of the baseline's budget (median, and how often it got there at all).

    python benchmarks/search_bench.py --ops all --seeds 3 --budgets 16 32 64
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time

from kernelcast.kernels.ops import OPERATIONS
from kernelcast.tasks.config import SearchConfig
from kernelcast.tasks.setup import open_search


def run_one(config: SearchConfig):
    search = open_search(config, track=False)
    t0 = time.perf_counter()
    result = search.run()
    search.pool.close()
    overhead = [s.overhead_seconds for s in result.generations]
    return result, search.trajectory, time.perf_counter() - t0, overhead


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", default="all")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--children", type=int, default=256)
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--backend", default="replay", help="replay (the committed pool) or local (this machine's GPU)")
    p.add_argument("--prior-scope", default="other-ops",
                   help="what the learned prior saw of the searched op: other-ops (nothing), other-gpus, all")
    p.add_argument("--surrogate", default="learned", help="the forecaster of the surrogate's searches (any registered "
                   "one: learned, physics, ...); the baseline's are the same either way")
    p.add_argument("--data", default="/tmp/kernelcast-search-bench")
    p.add_argument("--json", default="", help="write every run's numbers here")
    args = p.parse_args(argv)
    ops = list(OPERATIONS) if args.ops == "all" else args.ops.split(",")
    rows = []
    for op in ops:
        for budget in args.budgets:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                base = dict(op=op, gpu_type=args.gpu_type, budget=budget, generations=args.generations,
                            children=args.children, seed=seed, data=args.data, backend=args.backend)
                sur, sur_traj, sur_s, sur_over = run_one(SearchConfig(**base, surrogate=args.surrogate,
                                                                      prior_scope=args.prior_scope))
                bl, _, bl_s, _ = run_one(SearchConfig(**base, surrogate="none"))
                target = bl.best_speedup or 0.0
                reached = next((i + 1 for i, s in enumerate(itertools.accumulate(sur_traj, max)) if s >= target), None)
                row = {"op": op, "budget": budget, "seed": seed, "surrogate_best": sur.best_speedup,
                       "baseline_best": bl.best_speedup, "ratio": (sur.best_speedup or 0) / target if target else None,
                       "measurements_to_baseline_best": reached, "surrogate_seconds": sur_s,
                       "baseline_seconds": bl_s, "overhead_seconds_median": statistics.median(sur_over)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print()
    print(f"{'budget':>6} {'runs':>5} {'geomean best ratio':>19} {'wins':>5} {'ties':>5} {'losses':>6} "
          f"{'reached':>8} {'median measurements to baseline best / budget':>46}")
    for budget in args.budgets:
        mine = [r for r in rows if r["budget"] == budget and r["ratio"]]
        ratio = math.exp(statistics.mean(math.log(r["ratio"]) for r in mine))
        wins = sum(r["ratio"] > 1.0005 for r in mine)
        losses = sum(r["ratio"] < 0.9995 for r in mine)
        reached = [r["measurements_to_baseline_best"] for r in mine if r["measurements_to_baseline_best"]]
        # A run that never reached the baseline's best counts as needing more than the whole budget.
        fractions = sorted([(r["measurements_to_baseline_best"] or 2 * budget) / budget for r in mine])
        print(f"{budget:>6} {len(mine):>5} {ratio:>19.3f} {wins:>5} {len(mine) - wins - losses:>5} {losses:>6} "
              f"{len(reached):>4}/{len(mine):<3} {statistics.median(fractions):>46.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
