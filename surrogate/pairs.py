"""Training pairs for LLM surrogates: (anchor, candidate, true bin), drawn from the measurements table.

A pair asks what an LLM forecaster is asked in a search: how fast does this candidate run
relative to that anchor on this case and GPU? The anchor is the op's eager reference, or a
measured parent (another measured variant of the same op, case and GPU type, as a search's
archive would hold); the true bin comes from the ratio of their measured runtimes.

The measured pool is lopsided (most variants of an op land in two or three bins), so pairs
are sampled round-robin over bins within each operation and anchor kind, with the same
number of pairs per operation: a model trained on them cannot score well by always
answering the common bin. Whole operations are held out for evaluation, as in
``kernelcast evaluate --split operation``.

Each pair carries every input of the forecaster's prompt (both kernels, launch parameters,
case, anchor runtime, hardware), so training renders exactly the prompt that
``surrogate.llm.build_messages`` renders in a search.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from kernels.records import Candidate
from surrogate.bins import speedup_bin
from surrogate.dataset import HARDWARE_FIELDS, hardware_of
from surrogate.forecast import ForecastRequest

ANCHOR_KINDS = ("reference", "parent")
SPLITS = ("train", "eval")
_KERNEL_FIELDS = (("backend", pa.string()), ("source", pa.string()), ("params", pa.string()),
                  ("template", pa.string()), ("origin", pa.string()))
PAIR_SCHEMA = pa.schema([
    ("op", pa.string()), ("gpu_type", pa.string()), ("case_name", pa.string()), ("case_index", pa.int32()),
    ("split", pa.string()), ("anchor_kind", pa.string()),
    ("anchor_id", pa.string()), *[(f"anchor_{k}", t) for k, t in _KERNEL_FIELDS],
    ("candidate_id", pa.string()), *[(f"candidate_{k}", t) for k, t in _KERNEL_FIELDS],
    ("anchor_runtime_us", pa.float64()), ("runtime_us", pa.float64()),
    ("speedup", pa.float64()),  # anchor runtime / candidate runtime on this case
    ("true_bin", pa.int32()),
    ("device_name", pa.string()), ("compute_capability", pa.string()), ("sm_count", pa.int32()),
    ("sm_clock_mhz", pa.int32()), ("mem_clock_mhz", pa.int32()), ("bus_width_bits", pa.int32()),
    ("memory_gib", pa.float64()), ("l2_mib", pa.float64()), ("threads_per_sm", pa.int32()),
    ("driver_version", pa.string()), ("cuda_version", pa.string()), ("torch_version", pa.string()),
    ("triton_version", pa.string()),
])


@dataclass(frozen=True)
class PairSettings:
    """How pairs are drawn: how many per operation, from which anchors, which operations held out."""

    per_op: int = 256
    parent_fraction: float = 0.5  # share of an operation's pairs anchored at a measured parent
    eval_ops: tuple[str, ...] = ()  # held-out operations; empty: ``n_eval_ops`` drawn with ``seed``
    n_eval_ops: int = 2
    gpu_type: str | None = None  # only this GPU type's measurements; None: every type
    seed: int = 0

    def __post_init__(self) -> None:
        if self.per_op < 1:
            raise ValueError(f"per_op must be at least 1, got {self.per_op}")
        if not 0.0 <= self.parent_fraction <= 1.0:
            raise ValueError(f"parent_fraction must lie in [0, 1], got {self.parent_fraction}")
        if self.n_eval_ops < 0:
            raise ValueError(f"n_eval_ops must not be negative, got {self.n_eval_ops}")
        object.__setattr__(self, "eval_ops", tuple(self.eval_ops))


def measured_cases(root, gpu_type: str | None = None) -> pd.DataFrame:
    """One row per (measured-ok candidate, case, GPU type): its runtime, kernel and hardware."""
    m = root.read_measurements(gpu_type=gpu_type)
    if m.empty:
        return pd.DataFrame()
    c = root.read_candidates()[["candidate_id", "backend", "source", "params", "template", "origin"]]
    m = m[m["status"] == "ok"].merge(c, on="candidate_id")
    m = m.assign(case_name=m["case_names"].map(list), runtime_us=m["runtime_us_median"].map(list))
    m = m[m["case_name"].map(len) == m["runtime_us"].map(len)]
    rows = m.explode(["case_name", "runtime_us"])
    rows["case_index"] = rows.groupby(level=0).cumcount()
    rows["runtime_us"] = rows["runtime_us"].astype(float)
    rows = rows[np.isfinite(rows["runtime_us"]) & (rows["runtime_us"] > 0)]
    keep = ["op", "gpu_type", "case_name", "case_index", "candidate_id", "backend", "source", "params", "template",
            "origin", "runtime_us", *HARDWARE_FIELDS]
    return rows[keep].reset_index(drop=True)


def _join(anchors: pd.DataFrame, candidates: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Pair rows from aligned anchor and candidate case rows."""
    a = anchors.reset_index(drop=True)
    c = candidates.reset_index(drop=True)
    out = c[["op", "gpu_type", "case_name", "case_index", *HARDWARE_FIELDS]].copy()
    out["anchor_kind"] = kind
    for side, frame in (("anchor", a), ("candidate", c)):
        out[f"{side}_id"] = frame["candidate_id"]
        for k, _ in _KERNEL_FIELDS:
            out[f"{side}_{k}"] = frame[k]
    out["anchor_runtime_us"] = a["runtime_us"]
    out["runtime_us"] = c["runtime_us"]
    out["speedup"] = out["anchor_runtime_us"] / out["runtime_us"]
    out["true_bin"] = out["speedup"].map(speedup_bin).astype("int32")
    return out


def candidate_pairs(cases: pd.DataFrame, parent_draws: int, rng: np.random.Generator) -> pd.DataFrame:
    """Every reference-anchored pair, and up to ``parent_draws`` random parent-anchored pairs per
    (op, case, GPU type), of the measured case rows."""
    seeds = cases["origin"] == "seed"
    group = ["op", "gpu_type", "case_name"]
    variants = cases[~seeds]
    reference = variants.merge(cases[seeds][group + ["candidate_id"]].rename(columns={"candidate_id": "_seed"}),
                               on=group)
    by_id = cases.set_index(group + ["candidate_id"])
    anchors = by_id.loc[list(zip(*(reference[g] for g in group), reference["_seed"]))].reset_index()
    frames = [_join(anchors, reference, "reference")]
    for _, g in variants.groupby(group, sort=True):
        n = len(g)
        if n < 2 or parent_draws < 1:
            continue
        a = rng.integers(0, n, parent_draws)
        b = (a + rng.integers(1, n, parent_draws)) % n  # never the anchor itself
        drawn = pd.DataFrame({"a": a, "b": b}).drop_duplicates()
        frames.append(_join(g.iloc[drawn["a"]], g.iloc[drawn["b"]], "parent"))
    return pd.concat(frames, ignore_index=True)


def balanced(pairs: pd.DataFrame, n: int, rng: np.random.Generator) -> pd.DataFrame:
    """``n`` rows (all when fewer) drawn round-robin over ``true_bin``: every bin gives one row in
    turn, a bin that runs out drops out, so rare bins are kept whole and common ones thinned."""
    if len(pairs) <= n:
        return pairs
    shuffled = pairs.iloc[rng.permutation(len(pairs))]
    turn = shuffled.groupby("true_bin").cumcount().to_numpy()
    return shuffled.iloc[np.argsort(turn, kind="stable")[:n]]


def held_out_ops(ops: list[str], settings: PairSettings) -> tuple[str, ...]:
    """The operations kept for evaluation: the named ones, or ``n_eval_ops`` drawn with the seed."""
    unknown = sorted(set(settings.eval_ops) - set(ops))
    if unknown:
        raise ValueError(f"eval operation(s) {', '.join(unknown)} have no measured pairs; measured: {', '.join(ops)}")
    if settings.eval_ops:
        return settings.eval_ops
    if settings.n_eval_ops >= len(ops):
        raise ValueError(f"holding out {settings.n_eval_ops} of {len(ops)} operations leaves none to train on")
    return tuple(sorted(np.random.default_rng(settings.seed).choice(ops, settings.n_eval_ops, replace=False)))


def build_pairs(root, settings: PairSettings = PairSettings()) -> pd.DataFrame:
    """Balanced (anchor, candidate, true bin) pairs from the measurements under ``root``, columns of
    ``PAIR_SCHEMA``, with ``split`` 'eval' on the held-out operations and 'train' elsewhere."""
    cases = measured_cases(root, settings.gpu_type)
    if cases.empty:
        raise ValueError(f"no successful measurements under {root.uri}"
                         + (f" on {settings.gpu_type}" if settings.gpu_type else ""))
    ops = sorted(cases["op"].unique())
    eval_ops = set(held_out_ops(ops, settings))
    rng = np.random.default_rng(settings.seed)
    n_parent = round(settings.per_op * settings.parent_fraction)
    quota = {"reference": settings.per_op - n_parent, "parent": n_parent}
    chosen = []
    for op in ops:
        of_op = cases[cases["op"] == op]
        groups = of_op.groupby(["gpu_type", "case_name"]).ngroups
        # Four times the quota to choose from, so that rare bins have something to give.
        pool = candidate_pairs(of_op, math.ceil(4 * max(1, n_parent) / groups), rng)
        for kind, n in quota.items():
            if n:
                chosen.append(balanced(pool[pool["anchor_kind"] == kind], n, rng))
    pairs = pd.concat(chosen, ignore_index=True)
    pairs["split"] = np.where(pairs["op"].isin(eval_ops), "eval", "train")
    return pairs[PAIR_SCHEMA.names].reset_index(drop=True)


def _kernel(row, side: str) -> Candidate:
    params = row[f"{side}_params"]
    return Candidate(op=row["op"], backend=row[f"{side}_backend"], source=row[f"{side}_source"],
                     params=json.loads(params) if isinstance(params, str) else dict(params or {}),
                     template=row[f"{side}_template"] or None, origin=row[f"{side}_origin"])


def request_of(row) -> ForecastRequest:
    """The forecaster's request for one pair row (a mapping of ``PAIR_SCHEMA`` columns)."""
    anchor, candidate = _kernel(row, "anchor"), _kernel(row, "candidate")
    for side, kernel in (("anchor", anchor), ("candidate", candidate)):
        if kernel.candidate_id != row[f"{side}_id"]:
            raise ValueError(f"pair {row['anchor_id']} -> {row['candidate_id']} on {row['op']}/{row['case_name']}: "
                             f"the {side}'s source and params hash to {kernel.candidate_id}, not {row[f'{side}_id']}")
    return ForecastRequest(anchor=anchor, candidate=candidate, op=row["op"], hardware=hardware_of(row),
                           case_names=(row["case_name"],), anchor_runtime_us=(float(row["anchor_runtime_us"]),))


def requests_of(pairs: pd.DataFrame) -> list[ForecastRequest]:
    return [request_of(r) for r in pairs.to_dict("records")]


def write_pairs(pairs: pd.DataFrame, path: str, storage_options: dict | None = None) -> None:
    """The pairs as one Parquet file (local path or URL) with ``PAIR_SCHEMA``'s column types."""
    table = pa.Table.from_pandas(pairs[PAIR_SCHEMA.names], schema=PAIR_SCHEMA, preserve_index=False)
    import fsspec
    import pyarrow.parquet as pq

    with fsspec.open(path, "wb", **(storage_options or {})) as f:
        pq.write_table(table, f)


def read_pairs(path: str, storage_options: dict | None = None) -> pd.DataFrame:
    """Pairs written by ``write_pairs``; a file missing a pair column is refused by name."""
    import fsspec
    import pyarrow.parquet as pq

    with fsspec.open(path, "rb", **(storage_options or {})) as f:
        table = pq.read_table(f)
    missing = [c for c in PAIR_SCHEMA.names if c not in table.column_names]
    if missing:
        raise ValueError(f"{path} is not a pairs file: it lacks the column(s) {', '.join(missing)}")
    return table.select(PAIR_SCHEMA.names).to_pandas()
