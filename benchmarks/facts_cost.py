"""What finding the physics facts costs on the CPU: cold (a fresh facts folder; give a fresh TRITON_CACHE_DIR too),
then read back from that folder by a process whose memory holds none.

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PWD python benchmarks/facts_cost.py --which cudal1|zeroshot \
        --cache $(mktemp -d) [--pool data/pools/cudal1]

``cudal1``: CUDA-L1's development kernels (the sealed fifth left out) against their references; ``zeroshot``: the
zero-shot set's development kernels against theirs. Prints one JSON line: requests, kernels and references, cold
and from-disk seconds (whole and a request), the CPUs and the load average at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def requests_of(which: str, pool: str) -> list:
    """The forecast requests whose facts are timed."""
    if which == "cudal1":
        from benchmarks.cudal1_forecast import _measured, development_split
        from kernelcast.surrogate.dataset import source_requests

        kernels, _ = _measured(argparse.Namespace(pool=pool, protocol="kernelcast", gpu_type="h100", spaces=[],
                                                  drop_verdicts=None))
        return source_requests(development_split(kernels)[0])
    from benchmarks import zeroshot_score
    from kernelcast.kernels.records import HardwareSpec
    from kernelcast.surrogate.forecast import ForecastRequest

    hardware, out = HardwareSpec(**zeroshot_score.H100), []
    for problem in zeroshot_score.problems_of(zeroshot_score.SET, "dev"):
        op, kernels = zeroshot_score.imported(zeroshot_score.SET, problem)
        reference = op.seed_candidates()[0]
        out += [ForecastRequest(reference, k, op.name, hardware, case_names=tuple(c.name for c in op.cases))
                for k in kernels.values()]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--which", choices=("cudal1", "zeroshot"), required=True)
    p.add_argument("--pool", default="data/pools/cudal1")
    p.add_argument("--cache", required=True, help="the facts folder: empty, for the cold figure")
    args = p.parse_args(argv)
    import numpy as np

    from kernelcast.kernels import facts
    from kernelcast.surrogate.physics import facts_matrix

    requests = requests_of(args.which, args.pool)
    jobs = len({(r.op, r.candidate.source) for r in requests} | {(r.op, r.anchor.source) for r in requests})
    t = time.perf_counter()
    cold = facts_matrix(requests, True, args.cache)
    cold_s = time.perf_counter() - t
    facts.clear_cache()
    t = time.perf_counter()
    again = facts_matrix(requests, True, args.cache)
    disk_s = time.perf_counter() - t
    if not np.array_equal(np.nan_to_num(cold, nan=-7.0), np.nan_to_num(again, nan=-7.0)):
        raise AssertionError("the facts read back from disk differ from those found")
    print(json.dumps({"which": args.which, "requests": len(requests), "kernels_and_references": jobs,
                      "cold_seconds": round(cold_s, 1), "cold_seconds_per_request": round(cold_s / len(requests), 3),
                      "from_disk_seconds": round(disk_s, 1),
                      "from_disk_seconds_per_request": round(disk_s / len(requests), 4),
                      "cpus": os.cpu_count(), "load_average": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    from kernelcast.kernels.formats import TASKS_ENV

    with tempfile.TemporaryDirectory(prefix="facts-cost-tasks-") as tasks:
        os.environ[TASKS_ENV] = tasks
        raise SystemExit(main())
