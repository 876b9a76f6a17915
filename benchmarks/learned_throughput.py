"""Learned-forecaster throughput on one CPU core: ForecastRequest in, Forecast out.

    python benchmarks/learned_throughput.py --data data/pools [--repeats 5] [--json out.json]

The process pins itself to one core and caps BLAS/OpenMP at one thread before numpy
loads, fits the learned forecaster on the whole pool, then times ``forecast`` over every
per-case pair of the pool (features, the three boosted models, the bin integral and the
Forecast records, all counted). Two regimes: a cold batch (fresh requests whose feature
caches are empty) and warm batches (the same candidates forecast again, as in a search that
re-ranks its archive each generation). The median of ``--repeats`` batches is reported, as
forecasts per second of wall time and per CPU-second of the one thread (the same on an idle
core; on a shared machine the CPU-second rate is what one core of our own would give).
"""

from __future__ import annotations

import os

# One core, one thread: set before numpy, scipy and scikit-learn load their thread pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

GOAL_PER_S = 10_000


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main() -> int:
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs, requests_from
    from kernelcast.surrogate.features import clear_feature_caches
    from kernelcast.surrogate.learned import LearnedForecaster

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/pools")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    pairs = case_pairs(DataRoot(args.data))
    t0 = time.perf_counter()
    forecaster = LearnedForecaster().fit(pairs)
    fit_s = time.perf_counter() - t0

    rates = {"cold": {"wall": [], "cpu": []}, "warm": {"wall": [], "cpu": []}}

    def timed(regime, requests):
        wall, cpu = time.perf_counter(), time.process_time()
        n = len(forecaster.forecast(requests))
        rates[regime]["wall"].append(n / (time.perf_counter() - wall))
        rates[regime]["cpu"].append(n / (time.process_time() - cpu))

    for _ in range(args.repeats):
        clear_feature_caches()
        requests = requests_from(pairs)  # fresh request objects each time
        timed("cold", requests)
        timed("warm", requests)
    median = {f"{regime}_forecasts_per_{clock}_s": round(statistics.median(v))
              for regime, clocks in rates.items() for clock, v in clocks.items()}
    load1, _, _ = os.getloadavg()
    result = {
        "forecasts_per_batch": len(pairs), "fit_seconds": round(fit_s, 2), "threads": 1, **median,
        "goal_forecasts_per_s": GOAL_PER_S, "cpu": _cpu_name(), "load_average_1min": load1,
        "logical_cpus": os.cpu_count(),
    }
    print(f"learned forecaster, one thread pinned to one core of {result['cpu']} "
          f"(load average {load1:.1f} on {os.cpu_count()} CPUs); batches of {len(pairs)} requests, "
          f"median of {args.repeats}:")
    for regime, what in (("cold", "empty feature caches"), ("warm", "candidates seen before")):
        cpu_rate = median[f"{regime}_forecasts_per_cpu_s"]
        print(f"  {regime} ({what}): {cpu_rate:>8,} forecasts per CPU-second, "
              f"{median[f'{regime}_forecasts_per_wall_s']:>8,} per wall second -> goal {GOAL_PER_S:,}: "
              f"{'met' if cpu_rate >= GOAL_PER_S else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
