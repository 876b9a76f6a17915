"""Measured pairs for training and evaluating surrogates, built from the Parquet pool.

``case_pairs``: one row per (candidate, op case, GPU type): the candidate's runtime on that
case, the anchor's runtime (the eager reference, or a measured parent) and the true speedup
and bin. ``source_pairs``: one row per measured candidate, failed ones included, with its
source and its anchor's (a language model's child against the parent it rewrote), for
forecasters that read source. Splits hold out whole operations, whole GPU types, or a
random fraction.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Callable

import numpy as np
import pandas as pd

from kernelcast.kernels.records import Candidate, HardwareSpec
from kernelcast.surrogate.bins import speedup_bin
from kernelcast.surrogate.forecast import ForecastRequest

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
                "algorithm": (r.template if isinstance(r.template, str) else "/").split("/", 1)[1], "params": json.loads(r.params),
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
    from kernelcast.kernels.ops import get_operation

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


ANCHORS = ("parent", "reference")


def source_pairs(*roots, gpu_type: str = "h100", anchor: str = "parent", ops=None) -> pd.DataFrame:
    """One row per candidate measured on ``gpu_type`` under ``roots`` (data roots), with its anchor.

    The anchor is the op's eager reference (its seed candidate), or with ``anchor="parent"`` the
    parent a child was written from (``provenance``, else the candidate's ``parent_id``) where
    that parent ran on ``gpu_type``. A candidate in several roots counts once, from the first
    root; an anchor is looked up in the candidate's own root first (a parent measured beside its
    children), then in the others. Columns: op, gpu_type, candidate_id, source, params, template,
    origin, backend, status, failed, the anchor's (anchor_id, anchor_source, anchor_params,
    anchor_template, anchor_origin, anchor_backend), case_names, runtime_us and anchor_runtime_us
    (per case), speedup (anchor / candidate runtime, geometric mean over their shared cases; NaN
    unless both ran), anchor_speedup (the anchor's over the reference), true_bin (0 if failed),
    bytes_moved and flops (summed over the cases), and the hardware fields. A candidate whose op
    has no measured reference (nor, with ``anchor="parent"``, a parent that ran) is left out, and
    so is one that ran on no case its anchor ran on (no speedup to learn). ``ops``: only these operations
    (None: every one).
    """
    if anchor not in ANCHORS:
        raise ValueError(f"unknown anchor {anchor!r}; known: {', '.join(ANCHORS)}")
    if not roots:
        raise ValueError("source_pairs needs at least one data root")
    tables = [_measured_kernels(root, gpu_type) for root in roots]
    loads = _loadable()
    references = [{k["op"]: k for k in t[(t["origin"] == "seed") & (t["status"] == "ok")].to_dict("records")}
                  for t in tables]
    rows, seen = [], set()
    for i, kernels in enumerate(tables):
        order = [i] + [j for j in range(len(tables)) if j != i]
        for r in kernels.itertuples(index=False):
            if r.origin == "seed" or r.candidate_id in seen or (ops is not None and r.op not in ops) or \
                    not loads(r.op):
                continue
            base = _anchor_of(r, [tables[j] for j in order], [references[j] for j in order], anchor)
            row = None if base is None else _source_row(r, base)
            if row is not None:
                seen.add(r.candidate_id)
                rows.append(row)
    return pd.DataFrame(rows)


def loadable_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` (an ``op`` column) whose operation loads here, as ``source_pairs`` keeps them: a task
    whose reference needs what this machine lacks (a package, say) is left out with a warning naming it, rather
    than ending a fit that would ask it for its anchor."""
    if frame.empty:
        return frame
    loads = _loadable()
    return frame[frame["op"].isin([op for op in frame["op"].unique() if loads(op)])]


def _loadable() -> Callable[[str], bool]:
    """Whether an operation loads here, asked once per op: a task whose reference needs a package this machine
    lacks (einops, say) is left out of the pairs, with a warning naming it, rather than ending the fit."""
    from kernelcast.kernels.ops import get_operation

    known: dict[str, bool] = {}

    def loads(op: str) -> bool:
        if op not in known:
            try:
                get_operation(op)
                known[op] = True
            except Exception as exc:  # noqa: BLE001 - an imported task's reference failing to import, say
                warnings.warn(f"{op} left out of the source pairs: it does not load here "
                              f"({type(exc).__name__}: {str(exc)[-160:]})", stacklevel=3)
                known[op] = False
        return known[op]

    return loads


def _measured_kernels(root, gpu_type: str) -> pd.DataFrame:
    """Measurements on ``gpu_type`` joined with their candidates and, where written, provenance."""
    m = root.read_measurements(gpu_type=gpu_type)
    if m.empty:
        return pd.DataFrame(columns=["candidate_id", "op", "origin", "status", "parent_id"])
    m = m.sort_values("measured_at").drop_duplicates("candidate_id", keep="last")
    c = root.read_candidates()[["candidate_id", "source", "params", "template", "origin", "backend", "parent_id"]]
    m = m.merge(c, on="candidate_id")
    provenance = root.read("provenance")  # empty in template pools: parents come from candidates
    if not provenance.empty:
        written = provenance.drop_duplicates("candidate_id", keep="last").set_index("candidate_id")["parent_id"]
        m["parent_id"] = m["candidate_id"].map(written).fillna(m["parent_id"])
    return m.set_index("candidate_id", drop=False)


def _anchor_of(r, tables: list[pd.DataFrame], references: list[dict], anchor: str):
    """The measured row of ``r``'s anchor, searched in ``tables`` in order; None if none ran."""
    if anchor == "parent" and isinstance(r.parent_id, str) and r.parent_id:
        for kernels in tables:
            if r.parent_id in kernels.index:
                parent = kernels.loc[r.parent_id]
                if parent["status"] == "ok":
                    return parent
    return next((refs[r.op] for refs in references if r.op in refs), None)


def _source_row(r, base) -> dict | None:
    """The ``source_pairs`` row of measured kernel ``r`` against its anchor's measured row ``base``;
    None when it ran but shares no timed case with the anchor."""
    from kernelcast.kernels.ops import get_operation

    names = tuple(r.case_names)
    runtimes = dict(zip(names, r.runtime_us_median)) if r.status == "ok" else {}
    row = {"op": r.op, "gpu_type": r.gpu_type, "candidate_id": r.candidate_id, "source": r.source,
           "params": json.loads(r.params), "template": r.template, "origin": r.origin, "backend": r.backend,
           "status": r.status, "failed": r.status != "ok", "case_names": names,
           "runtime_us": tuple(runtimes.get(n, math.nan) for n in names),
           **{f: getattr(r, f) for f in HARDWARE_FIELDS}}
    theirs = dict(zip(base["case_names"], base["runtime_us_median"]))
    names = names or tuple(base["case_names"])  # a failed candidate may have no case names of its own
    ratios = [theirs[n] / runtimes[n] for n in names if n in theirs and runtimes.get(n, 0) > 0]
    row.update({"case_names": names, "anchor_runtime_us": tuple(float(theirs.get(n, math.nan)) for n in names),
                "anchor_id": base["candidate_id"], "anchor_source": base["source"],
                "anchor_params": json.loads(base["params"]), "anchor_template": base["template"],
                "anchor_origin": base["origin"], "anchor_backend": base["backend"],
                "anchor_speedup": 1.0 if base["origin"] == "seed" else float(base["speedup"] or math.nan)})
    if r.status == "ok" and not ratios:
        return None
    speedup = math.exp(np.mean(np.log(ratios))) if ratios else math.nan
    op = get_operation(r.op)
    cases = [c for c in op.cases if c.name in set(row["case_names"])]
    row.update({"speedup": speedup,
                "true_bin": speedup_bin(speedup if r.status == "ok" else None),
                "bytes_moved": float(sum(op.bytes_moved(c) for c in cases)),
                "flops": float(sum(op.flops(c) for c in cases))})
    return row


def by_candidate(pairs: pd.DataFrame) -> pd.DataFrame:
    """``case_pairs`` rows as ``source_pairs`` rows: one per (candidate, GPU type), its cases' speedups
    over the eager reference (its anchor) combined as their geometric mean."""
    from kernelcast.kernels.ops import get_operation

    if pairs.empty:
        return pd.DataFrame()
    # Plain rows and arrays, indexed per group: pandas indexing per group took seconds on a pool.
    records = pairs.to_dict("records")
    speedups = pairs["speedup"].to_numpy(dtype=float)
    groups = sorted(pairs.groupby(["candidate_id", "gpu_type"], sort=False).indices.values(), key=lambda ix: ix[0])
    rows, seeds = [], {}
    for ix in groups:
        first = records[ix[0]]
        if first["op"] not in seeds:
            seeds[first["op"]] = get_operation(first["op"]).seed_candidates()[0]
        seed = seeds[first["op"]]
        ran = speedups[ix][~np.isnan(speedups[ix]) & (speedups[ix] > 0)]
        speedup = float(np.exp(np.log(ran).mean())) if first["status"] == "ok" and len(ran) else math.nan
        rows.append({**{k: first[k] for k in ("op", "gpu_type", "candidate_id", "source", "params", "template",
                                              "status", *HARDWARE_FIELDS)},
                     "origin": "template", "backend": "triton", "failed": first["status"] != "ok",
                     "case_names": tuple(records[i]["case_name"] for i in ix),
                     "runtime_us": tuple(records[i]["runtime_us"] for i in ix),
                     "anchor_runtime_us": tuple(records[i]["anchor_runtime_us"] for i in ix),
                     "anchor_id": first["anchor_id"],
                     "anchor_source": seed.source, "anchor_params": dict(seed.params), "anchor_template": None,
                     "anchor_origin": seed.origin, "anchor_backend": seed.backend, "anchor_speedup": 1.0,
                     "speedup": speedup, "true_bin": speedup_bin(speedup if first["status"] == "ok" else None)})
    return pd.DataFrame(rows)


def source_requests(rows: pd.DataFrame) -> list[ForecastRequest]:
    """One ForecastRequest per ``source_pairs`` row: the candidate against its own anchor, on all its cases."""
    missing = [c for c in ("anchor_source", "case_names", "anchor_speedup") if c not in rows.columns]
    if missing:
        raise ValueError(f"source rows lack columns {missing}: build them with source_pairs (or by_candidate "
                         "from case_pairs)")
    kernels: dict[tuple, Candidate] = {}

    def kernel(op, backend, source, params, template, origin) -> Candidate:
        key = (op, backend, source, json.dumps(params, sort_keys=True), template, origin)
        if key not in kernels:
            kernels[key] = Candidate(op=op, backend=backend or "triton", source=source, params=params,
                                     template=template if isinstance(template, str) else None, origin=origin)
        return kernels[key]

    out = []
    for r in rows.to_dict("records"):
        cand = kernel(r["op"], r["backend"], r["source"], r["params"], r["template"], r["origin"])
        anchor = kernel(r["op"], r["anchor_backend"], r["anchor_source"], r["anchor_params"], r["anchor_template"],
                        r["anchor_origin"])
        out.append(ForecastRequest(anchor=anchor, candidate=cand, op=r["op"], hardware=hardware_of(r),
                                   case_names=tuple(r["case_names"]),
                                   anchor_runtime_us=tuple(r["anchor_runtime_us"]),
                                   anchor_speedup=float(r["anchor_speedup"])))
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
