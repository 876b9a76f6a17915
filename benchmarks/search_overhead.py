"""Orchestration overhead of one search generation, excluding GPU (measurement) and surrogate time.

Runs the search core on the replay backend (answers from the committed pool, so no GPU
time is in the way) with many children per generation, and prints, per generation, the
wall time, the measuring and forecasting time, and the rest: generating, selecting,
updating the archive and writing the journal to the data root.

    python benchmarks/search_overhead.py --children 256 --generations 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from kernelcast.tasks.config import SearchConfig
from kernelcast.tasks.setup import data_root, fit_prior, open_search, resolve


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--op", default="softmax")
    p.add_argument("--children", type=int, default=256)
    p.add_argument("--generations", type=int, default=5)
    p.add_argument("--budget", type=int, default=40)
    p.add_argument("--surrogate", default="learned")
    p.add_argument("--data", default="", help="data root (default: a fresh temporary folder)")
    p.add_argument("--models", default="/tmp/kernelcast-search-bench",
                   help="data root whose fitted priors are reused, so fitting is not timed")
    args = p.parse_args(argv)
    data = args.data or tempfile.mkdtemp(prefix="kernelcast-overhead-")
    cfg = resolve(SearchConfig(op=args.op, gpu_type="h100", budget=args.budget, generations=args.generations,
                               children=args.children, surrogate=args.surrogate, data=data, backend="replay",
                               run_id=f"overhead-{int(time.time())}"))
    if args.surrogate == "learned":
        model_root = resolve(cfg.replace(data=args.models))
        model = fit_prior(model_root, data_root(model_root))  # fitted once, outside the timing
        import pickle

        from kernelcast.tasks.setup import model_path

        data_root(cfg).put_object(model_path(cfg), pickle.dumps(model))
    search = open_search(cfg, track=False)
    print(f"{'gen':>3} {'children':>8} {'wall s':>7} {'measure s':>9} {'forecast s':>10} {'overhead s':>10}")
    overheads = []
    for g in range(cfg.generations):
        gen = search.plan(g)
        t0 = time.perf_counter()
        for step in (search.generate, search.forecast, search.select, search.measure):
            step(gen)
        s = search.update(gen)
        wall = time.perf_counter() - t0
        overheads.append(s.overhead_seconds)
        print(f"{g:>3} {s.generated:>8} {wall:>7.3f} {gen.measure_seconds:>9.3f} {gen.forecast_seconds:>10.3f} "
              f"{s.overhead_seconds:>10.3f}")
    search.pool.close()
    print(f"median orchestration overhead per generation: {statistics.median(overheads):.3f} s "
          f"({args.children} children, data root {data})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
