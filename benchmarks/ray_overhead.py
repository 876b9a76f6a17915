"""What routing through the Ray measure pool costs per candidate, against the single-machine pool.

Both pools replay the committed measured pool, so the measurement itself costs next to nothing
and what remains is the routing: for Ray, shipping candidates to the actors and streaming each
measurement back. The figure to compare it with is a real GPU measurement (seconds per
candidate: compile, correctness on several inputs, timing).

    python benchmarks/ray_overhead.py [--candidates 500] [--repeats 7]

With ``--live`` (a machine with a GPU) both pools measure for real on this GPU instead:
``LocalMeasurer`` in this process against the same measurer inside a Ray actor.

    python benchmarks/ray_overhead.py --live --candidates 32 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kernelcast.infra.measure import LocalMeasurePool, ReplayMeasurer
from kernelcast.infra.ray_pools import RayMeasurePool
from kernelcast.storage.dataset import DataRoot
from kernelcast.storage.schema import candidates_from_frame

POOL = str(Path(__file__).resolve().parents[1] / "data" / "pools")
GPU_TYPE = "h100"


def candidates_of(pool: str, n: int):
    """``n`` candidates measured on ``GPU_TYPE``, spread over the operations."""
    root = DataRoot(pool)
    measured = set(root.read_measurements(gpu_type=GPU_TYPE)["candidate_id"])
    by_op: dict[str, list] = {}
    for c in sorted(candidates_from_frame(root.read_candidates()), key=lambda c: c.candidate_id):
        if c.candidate_id in measured:
            by_op.setdefault(c.op, []).append(c)
    picked = [c for i in range(max(map(len, by_op.values()))) for cs in by_op.values() if i < len(cs) for c in [cs[i]]]
    return picked[:n]


def seconds_per_batch(pool, candidates, repeats: int, gpu_type: str = GPU_TYPE) -> float:
    """Median wall seconds to measure the whole batch (every result consumed), after one warm-up batch."""
    for op in sorted({c.op for c in candidates}):
        pool.prepare(op, gpu_type)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        got = {m.candidate_id: m for m in pool.measure(candidates, gpu_type)}  # a live GPU adds the reference
        times.append(time.perf_counter() - t0)
        missing = [c.candidate_id for c in candidates if c.candidate_id not in got]
        assert not missing, f"{len(missing)} candidates came back without a measurement"
        assert all(got[c.candidate_id].status != "crashed" for c in candidates), "a measurement crashed"
    return statistics.median(times[1:])


def live(args) -> None:
    """Both pools on this machine's GPU: LocalMeasurer here, and the same measurer inside a Ray actor."""
    from kernelcast.infra.measure import LocalMeasurer

    candidates = [c for c in candidates_of(args.pool, 10 * args.candidates) if c.op == "softmax"][:args.candidates]
    measurer = LocalMeasurer()
    gpu_type, n = measurer.gpu_type, len(candidates)
    print(f"{n} softmax candidates measured live on {measurer.hardware.device_name} ({gpu_type}); "
          f"median of {args.repeats} batches")
    local = seconds_per_batch(LocalMeasurePool([measurer]), candidates, args.repeats, gpu_type)
    measurer.close()
    pool = RayMeasurePool.connect(None)  # a local Ray with one gpu_type:<this GPU> unit per GPU
    print(f"Ray actors: {pool.actors}")
    rows = [("LocalMeasurePool (live)", local)]
    try:
        for chunk in (16, n):  # the default, and the whole batch in one call (no tail between chunks)
            pool.chunk_size = chunk
            rows.append((f"RayMeasurePool, chunk {chunk} (live)", seconds_per_batch(pool, candidates, args.repeats,
                                                                                   gpu_type)))
    finally:
        pool.close()
    print(f"\n{'pool':<34} {'batch s':>8} {'ms/candidate':>13} {'overhead ms/candidate':>22}")
    for name, seconds in rows:
        print(f"{name:<34} {seconds:8.2f} {1e3 * seconds / n:13.1f} {1e3 * (seconds - local) / n:22.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--pool", default=POOL)
    parser.add_argument("--live", action="store_true", help="measure on this machine's GPU instead of replaying")
    args = parser.parse_args()
    if args.live:
        return live(args)
    candidates = candidates_of(args.pool, args.candidates)
    n = len(candidates)
    print(f"{n} candidates over {len({c.op for c in candidates})} operations, replayed on {GPU_TYPE}; "
          f"median of {args.repeats} batches")

    local = seconds_per_batch(LocalMeasurePool([ReplayMeasurer(args.pool, GPU_TYPE)]), candidates, args.repeats)
    rows = [("LocalMeasurePool (replay)", local)]
    for actors in (1, 2):
        t0 = time.perf_counter()
        pool = RayMeasurePool.connect(None, replay_pool=args.pool, local_resources={f"gpu_type:{GPU_TYPE}": actors})
        print(f"local Ray with {actors} {GPU_TYPE} actor(s) up in {time.perf_counter() - t0:.1f} s")
        try:
            for chunk in (1, 16, 64):
                pool.chunk_size = chunk
                rows.append((f"RayMeasurePool, {actors} actor(s), chunk {chunk}",
                             seconds_per_batch(pool, candidates, args.repeats)))
        finally:
            pool.close()

    print(f"\n{'pool':<42} {'batch s':>8} {'us/candidate':>13} {'overhead us/candidate':>22}")
    for name, seconds in rows:
        print(f"{name:<42} {seconds:8.3f} {1e6 * seconds / n:13.1f} {1e6 * (seconds - local) / n:22.1f}")


if __name__ == "__main__":
    main()
