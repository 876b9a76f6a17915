"""Backfill: measure on one GPU type the candidates already measured on another.

The plan reads the candidates measured on the source type and leaves out what the
target already has, so a backfill can be stopped and rerun at will; measurements are
written as they come (``kernelcast.tasks.search.measure_and_store``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kernelcast.kernels.records import Candidate


@dataclass(frozen=True)
class BackfillPlan:
    source_gpu_type: str
    target_gpu_type: str
    data: str
    storage_options: Mapping[str, Any]
    candidates: tuple[Candidate, ...]
    already: int  # measured on the target before this backfill


def backfill_ops(source_gpu_type: str, target_gpu_type: str, op: str = "all", limit: int = 0) -> list[str]:
    """The operations a backfill covers, or a ValueError naming the bad argument; the GPU types and
    the limit are checked before the operation registry (torch) loads, so those fail at once."""
    from kernelcast.kernels.hardware import KNOWN_GPU_TYPES

    for name, value in (("source GPU type", source_gpu_type), ("target GPU type", target_gpu_type)):
        if value not in KNOWN_GPU_TYPES:
            raise ValueError(f"unknown {name} {value!r}; known: {', '.join(KNOWN_GPU_TYPES)}")
    if source_gpu_type == target_gpu_type:
        raise ValueError(f"backfill needs two different GPU types, got {source_gpu_type} twice")
    if limit < 0:
        raise ValueError(f"limit must be zero (no limit) or positive, got {limit}")
    from kernelcast.kernels.ops import OPERATIONS, get_operation

    ops = list(OPERATIONS) if op == "all" else [o.strip() for o in op.split(",")]
    for name in ops:
        get_operation(name)
    return ops


def backfill_plan(source_gpu_type: str, target_gpu_type: str, op: str = "all", data: str = "kernelcast-data",
                  limit: int = 0, only_ok: bool = True, options: Mapping[str, Any] | None = None) -> BackfillPlan:
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame

    ops = backfill_ops(source_gpu_type, target_gpu_type, op, limit)
    options = dict(options or {})
    root = DataRoot(data, storage_options=options.get("storage_options"))
    todo: list[Candidate] = []
    already = 0
    for name in ops:
        source = root.read_measurements(op=name, gpu_type=source_gpu_type)
        if source.empty:
            continue
        if only_ok:
            source = source[source["status"] == "ok"]
        done = root.measured_ids(name, target_gpu_type)
        wanted = set(source["candidate_id"]) - done
        already += len(set(source["candidate_id"]) & done)
        candidates = root.read_candidates(op=name)
        todo += candidates_from_frame(candidates[candidates["candidate_id"].isin(wanted)])
    todo.sort(key=lambda c: (c.op, c.candidate_id))
    if limit:
        todo = todo[:limit]
    return BackfillPlan(source_gpu_type, target_gpu_type, data, options.get("storage_options") or {},
                        tuple(todo), already)


def run_backfill(plan: BackfillPlan, backend: str = "replay", options: Mapping[str, Any] | None = None) -> dict:
    """Measure the plan's candidates on its target type; returns counts by status."""
    from collections import Counter

    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.config import SearchConfig
    from kernelcast.tasks.search import measure_and_store
    from kernelcast.tasks.setup import measure_pool

    root = DataRoot(plan.data, storage_options=dict(plan.storage_options))
    statuses: Counter = Counter()
    if plan.candidates:
        # The pool is built per op (replay answers per op); one config describes where to measure.
        config = SearchConfig(op=plan.candidates[0].op, gpu_type=plan.target_gpu_type, backend=backend,
                              **{k: v for k, v in dict(options or {}).items() if k in ("replay_pool", "ray_address")})
        pool = measure_pool(config)
        try:
            root.write_candidates(list(plan.candidates))
            found, _ = measure_and_store(root, pool, plan.candidates, plan.target_gpu_type)
            statuses.update(m.status for m in found.values())
        finally:
            pool.close()
    return {"source_gpu_type": plan.source_gpu_type, "target_gpu_type": plan.target_gpu_type,
            "planned": len(plan.candidates), "already_measured": plan.already, **dict(statuses)}
