"""Measured pairs for training and evaluating surrogates, built from the Parquet pool.

One row per (candidate, op case, GPU type): the candidate's runtime on that case, the
anchor's runtime (the eager reference, or a measured parent) and the true speedup and
bin. Splits hold out whole operations, whole GPU types, or a random fraction.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from kernels.records import Candidate, HardwareSpec
from surrogate.bins import speedup_bin
from surrogate.forecast import ForecastRequest

HARDWARE_FIELDS = ("device_name", "compute_capability", "sm_count", "sm_clock_mhz", "mem_clock_mhz",
                   "bus_width_bits", "memory_gib", "l2_mib", "threads_per_sm", "driver_version",
                   "cuda_version", "torch_version", "triton_version")


def case_pairs(root, gpu_type: str | None = None, op: str | None = None) -> pd.DataFrame:
    """Per-case pairs anchored at each op's eager reference, from the measurements under ``root``.

    Columns: op, gpu_type, case_name, case_index, candidate_id, anchor_id, template, algorithm,
    params (dict), source, runtime_us, anchor_runtime_us, speedup, true_bin, status, and the
    hardware fields. Failed candidates get speedup NaN and bin 0.
    """
    m = root.read_measurements(op=op, gpu_type=gpu_type)
    c = root.read_candidates(op=op)
    if m.empty:
        return pd.DataFrame()
    m = m.merge(c[["candidate_id", "template", "params", "source", "origin", "backend"]], on="candidate_id")
    seeds = m[m["origin"] == "seed"].set_index(["op", "gpu_type"])
    rows = []
    for r in m[m["origin"] != "seed"].itertuples(index=False):
        if (r.op, r.gpu_type) not in seeds.index:
            continue
        seed = seeds.loc[(r.op, r.gpu_type)]
        names = list(r.case_names) if len(r.case_names) else list(seed["case_names"])
        base = {"op": r.op, "gpu_type": r.gpu_type, "candidate_id": r.candidate_id,
                "anchor_id": seed["candidate_id"], "template": r.template,
                "algorithm": (r.template or "/").split("/", 1)[1], "params": json.loads(r.params),
                "source": r.source, "status": r.status,
                **{f: getattr(r, f) for f in HARDWARE_FIELDS}}
        for i, name in enumerate(names):
            ref = seed["runtime_us_median"][i] if len(seed["runtime_us_median"]) > i else math.nan
            t = r.runtime_us_median[i] if r.status == "ok" and len(r.runtime_us_median) > i else math.nan
            s = ref / t if t and t > 0 and not math.isnan(t) else math.nan
            rows.append({**base, "case_name": name, "case_index": i, "runtime_us": t,
                         "anchor_runtime_us": ref, "speedup": s,
                         "true_bin": speedup_bin(None if math.isnan(s) else s)})
    return pd.DataFrame(rows)


def hardware_of(row) -> HardwareSpec:
    get = row.get if hasattr(row, "get") else lambda k, d=None: getattr(row, k, d)
    return HardwareSpec(gpu_type=get("gpu_type"), **{f: get(f) for f in HARDWARE_FIELDS})


def requests_from(pairs: pd.DataFrame, anchors: dict[str, Candidate] | None = None) -> list[ForecastRequest]:
    """One ForecastRequest per pair row (anchor = the op's eager reference unless given).

    The rows of one candidate (one per case) share one Candidate, and the rows of one op one
    anchor, as in a search: a forecaster then hashes each kernel's source once.
    """
    from kernels.ops import get_operation

    anchors = dict(anchors or {})
    candidates: dict[tuple[str, str], Candidate] = {}
    out = []
    for r in pairs.to_dict("records"):
        anchor = anchors.get(r["op"])
        if anchor is None:
            anchor = anchors[r["op"]] = get_operation(r["op"]).seed_candidates()[0]
        key = (r["candidate_id"], r["source"])
        cand = candidates.get(key)
        if cand is None:
            cand = candidates[key] = Candidate(
                op=r["op"], backend="triton", source=r["source"], params=r["params"], template=r["template"],
                origin="template")
        out.append(ForecastRequest(anchor=anchor, candidate=cand, op=r["op"], hardware=hardware_of(r),
                                   case_names=(r["case_name"],), anchor_runtime_us=(r["anchor_runtime_us"],)))
    return out


def split(pairs: pd.DataFrame, how: str, seed: int = 0):
    """Yield (name, train, test) folds: 'operation' (leave one op out), 'gpu' (leave one GPU type
    out) or 'random' (one 80/20 split by candidate)."""
    if how == "operation":
        for op in sorted(pairs["op"].unique()):
            yield op, pairs[pairs["op"] != op], pairs[pairs["op"] == op]
    elif how == "gpu":
        gpus = sorted(pairs["gpu_type"].unique())
        if len(gpus) < 2:
            raise ValueError(f"leave-one-GPU-out needs two GPU types; the data has {gpus}")
        for g in gpus:
            yield g, pairs[pairs["gpu_type"] != g], pairs[pairs["gpu_type"] == g]
    elif how == "random":
        ids = pairs["candidate_id"].unique()
        rng = np.random.default_rng(seed)
        test_ids = set(rng.choice(ids, size=max(1, len(ids) // 5), replace=False))
        held = pairs["candidate_id"].isin(test_ids)
        yield "random", pairs[~held], pairs[held]
    else:
        raise ValueError(f"unknown split {how!r}; known: operation, gpu, random")
