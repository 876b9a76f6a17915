"""Training pairs for LLM surrogates: (anchor, candidate, true bin), drawn from the measurements table.

A pair asks what an LLM forecaster is asked in a search: how fast does this candidate run
relative to that anchor on these cases and GPU? Two sources:

- ``build_pairs`` (template pools): one case per pair. The anchor is the op's eager reference,
  or a measured parent (another measured variant of the same op, case and GPU type, as a
  search's archive would hold); the true bin comes from the ratio of their measured runtimes.
- ``corpus_pairs`` (the LLM corpus): each child a language model wrote, anchored at the parent
  it rewrote, on all the cases it was measured on; the true bin is 0 when the child failed
  (did not compile, crashed, was incorrect), else the bin of its speedup over the parent.

The measured pool is lopsided (most variants of an op land in two or three bins), so pairs
are sampled round-robin over bins within each operation and anchor kind, with the same
number of pairs per operation: a model trained on them cannot score well by always
answering the common bin. Whole operations are held out for evaluation, as in
``kernelcast evaluate --split operation``.

Each pair carries every input of the forecaster's prompt (both kernels, launch parameters,
case, anchor runtime, hardware), so training renders exactly the prompt that
``kernelcast.surrogate.llm.build_messages`` renders in a search.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from kernelcast.kernels.records import Candidate
from kernelcast.surrogate.bins import speedup_bin
from kernelcast.surrogate.dataset import HARDWARE_FIELDS, hardware_of
from kernelcast.surrogate.forecast import ForecastRequest

ANCHOR_KINDS = ("reference", "parent")
SPLITS = ("train", "eval")
JSONL_SUFFIX = ".jsonl"
_KERNEL_FIELDS = (("backend", pa.string()), ("source", pa.string()), ("params", pa.string()),
                  ("template", pa.string()), ("origin", pa.string()))
PAIR_SCHEMA = pa.schema([
    ("op", pa.string()), ("gpu_type", pa.string()), ("case_names", pa.list_(pa.string())),
    ("split", pa.string()), ("anchor_kind", pa.string()),
    ("anchor_id", pa.string()), *[(f"anchor_{k}", t) for k, t in _KERNEL_FIELDS],
    ("candidate_id", pa.string()), *[(f"candidate_{k}", t) for k, t in _KERNEL_FIELDS],
    # Per case, in case_names' order; the candidate's runtimes are NaN where it failed.
    ("anchor_runtime_us", pa.list_(pa.float64())), ("runtime_us", pa.list_(pa.float64())),
    ("speedup", pa.float64()),  # anchor over candidate runtime, geometric mean over the cases; NaN if it failed
    ("status", pa.string()),  # the candidate's measurement status: ok, compile_error, ...
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


def held_out_ops(ops: list[str], eval_ops: tuple[str, ...] = (), n_eval_ops: int = 2, seed: int = 0) -> tuple[str, ...]:
    """The operations kept for evaluation: ``eval_ops``, or ``n_eval_ops`` of ``ops`` drawn with ``seed``."""
    unknown = sorted(set(eval_ops) - set(ops))
    if unknown:
        raise ValueError(f"eval operation(s) {', '.join(unknown)} have no measured pairs; measured: {', '.join(ops)}")
    if eval_ops:
        return tuple(eval_ops)
    if n_eval_ops >= len(ops):
        raise ValueError(f"holding out {n_eval_ops} of {len(ops)} operations leaves none to train on")
    return tuple(sorted(np.random.default_rng(seed).choice(ops, n_eval_ops, replace=False)))


def _measured_cases_of(roots, gpu_type: str | None) -> pd.DataFrame:
    """``measured_cases`` of several roots: a kernel's case measured in two counts once (the first root's),
    and so does an operation's reference per case and GPU type."""
    frames = [f for f in (measured_cases(r, gpu_type) for r in roots) if not f.empty]
    if not frames:
        return pd.DataFrame()
    cases = pd.concat(frames, ignore_index=True).drop_duplicates(["candidate_id", "gpu_type", "case_name"])
    seeds = cases["origin"] == "seed"
    return pd.concat([cases[~seeds], cases[seeds].drop_duplicates(["op", "gpu_type", "case_name"])],
                     ignore_index=True)


def build_pairs(root, settings: PairSettings = PairSettings(), also: Sequence = ()) -> pd.DataFrame:
    """Balanced (anchor, candidate, true bin) pairs from the measurements under ``root`` and the roots
    ``also``, columns of ``PAIR_SCHEMA``, one case each, with ``split`` 'eval' on the held-out operations
    and 'train' elsewhere."""
    roots = [root, *also]
    cases = _measured_cases_of(roots, settings.gpu_type)
    if cases.empty:
        raise ValueError(f"no successful measurements under {', '.join(r.uri for r in roots)}"
                         + (f" on {settings.gpu_type}" if settings.gpu_type else ""))
    ops = sorted(cases["op"].unique())
    eval_ops = set(held_out_ops(ops, settings.eval_ops, settings.n_eval_ops, settings.seed))
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
    one_case = {k: pairs[k].map(lambda v: [v]) for k in ("anchor_runtime_us", "runtime_us")}
    pairs = pairs.assign(case_names=pairs["case_name"].map(lambda v: [v]), status="ok", **one_case)
    return pairs[PAIR_SCHEMA.names].reset_index(drop=True)


@dataclass(frozen=True)
class CorpusSettings:
    """How pairs are drawn from an LLM corpus: which GPU type, which operations held out, and how
    much of the training set may be failures."""

    gpu_type: str = "h100"
    eval_ops: tuple[str, ...] = ()  # held-out operations; empty: ``n_eval_ops`` drawn with ``seed``
    n_eval_ops: int = 2
    # Most of a language model's children fail: left alone, "always bin 0" would score well in
    # training. Failures beyond this share of the training pairs are dropped (seeded); the
    # held-out pairs keep the corpus's own mix, which is what a search meets. 1: no cap.
    max_failure_share: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.max_failure_share <= 1.0:
            raise ValueError(f"max_failure_share must lie in (0, 1], got {self.max_failure_share}")
        if self.n_eval_ops < 0:
            raise ValueError(f"n_eval_ops must not be negative, got {self.n_eval_ops}")
        object.__setattr__(self, "eval_ops", tuple(self.eval_ops))


def _written_parents(*roots) -> pd.Series:
    """candidate_id -> the parent it was written from (provenance, else the candidate's parent_id), the
    first root's word where several know the candidate."""
    out = pd.Series(dtype=object)
    for root in roots:
        parents = root.read_candidates()[["candidate_id", "parent_id"]].set_index("candidate_id")["parent_id"]
        provenance = root.read("provenance")
        if not provenance.empty:
            written = provenance.drop_duplicates("candidate_id", keep="last").set_index("candidate_id")["parent_id"]
            parents = written.combine_first(parents)
        parents = parents[~parents.index.duplicated(keep="last")]
        out = out.combine_first(parents) if len(out) else parents
    return out


def cap_failures(pairs: pd.DataFrame, share: float, rng: np.random.Generator) -> pd.DataFrame:
    """``pairs`` with failures (true bin 0) thinned at random to at most ``share`` of the rows kept."""
    failed = pairs["true_bin"] == 0
    ran = int((~failed).sum())
    keep = int(failed.sum()) if share >= 1.0 else min(int(failed.sum()), math.floor(share * ran / (1.0 - share)))
    kept = rng.choice(np.flatnonzero(failed.to_numpy()), keep, replace=False)
    return pairs[~failed | pairs.index.isin(pairs.index[kept])]


def corpus_pairs(root, settings: CorpusSettings = CorpusSettings(), also: Sequence = ()) -> pd.DataFrame:
    """(parent, child, true bin) pairs of the language model's children measured under ``root`` and the
    roots ``also`` (LLM corpora), columns of ``PAIR_SCHEMA``: every child whose parent ran on
    ``settings.gpu_type``, on all its cases, with true bin 0 when it failed. ``split`` is 'eval' on
    the held-out operations; failures are capped to ``max_failure_share`` of the training pairs."""
    from kernelcast.surrogate.dataset import source_pairs

    roots = [root, *also]
    where = ", ".join(r.uri for r in roots)
    rows = source_pairs(*roots, gpu_type=settings.gpu_type, anchor="parent")
    if rows.empty:
        raise ValueError(f"no measured children under {where} on {settings.gpu_type}")
    # source_pairs falls back to the reference when a parent did not run; such a child is no pair here.
    rows = rows[rows["origin"] == "llm"]
    rows = rows[rows["anchor_id"] == rows["candidate_id"].map(_written_parents(*roots))]
    if rows.empty:
        raise ValueError(f"no child under {where} was written from a parent that ran on {settings.gpu_type}")
    ops = sorted(rows["op"].unique())
    eval_ops = set(held_out_ops(ops, settings.eval_ops, settings.n_eval_ops, settings.seed))
    pairs = pd.DataFrame({
        "op": rows["op"], "gpu_type": rows["gpu_type"], "case_names": rows["case_names"].map(list),
        "split": np.where(rows["op"].isin(eval_ops), "eval", "train"), "anchor_kind": "parent",
        "anchor_id": rows["anchor_id"], "candidate_id": rows["candidate_id"],
        "anchor_runtime_us": rows["anchor_runtime_us"].map(list), "runtime_us": rows["runtime_us"].map(list),
        "speedup": rows["speedup"], "status": rows["status"], "true_bin": rows["true_bin"].astype("int32"),
        **{f: rows[f] for f in HARDWARE_FIELDS}})
    for side, prefix in (("anchor", "anchor_"), ("candidate", "")):
        for k, _ in _KERNEL_FIELDS:
            value = rows[prefix + k]
            pairs[f"{side}_{k}"] = value.map(lambda v: json.dumps(v, sort_keys=True)) if k == "params" else value
    pairs = pairs.sort_values(["op", "candidate_id"]).reset_index(drop=True)
    train = pairs["split"] == "train"
    kept = cap_failures(pairs[train], settings.max_failure_share, np.random.default_rng(settings.seed))
    return pd.concat([kept, pairs[~train]])[PAIR_SCHEMA.names].reset_index(drop=True)


def _kernel(row, side: str) -> Candidate:
    params, template = row[f"{side}_params"], row[f"{side}_template"]
    return Candidate(op=row["op"], backend=row[f"{side}_backend"], source=row[f"{side}_source"],
                     params=json.loads(params) if isinstance(params, str) else dict(params or {}),
                     template=template if isinstance(template, str) and template else None,
                     origin=row[f"{side}_origin"])


def request_of(row) -> ForecastRequest:
    """The forecaster's request for one pair row (a mapping of ``PAIR_SCHEMA`` columns)."""
    anchor, candidate = _kernel(row, "anchor"), _kernel(row, "candidate")
    for side, kernel in (("anchor", anchor), ("candidate", candidate)):
        if kernel.candidate_id != row[f"{side}_id"]:
            raise ValueError(f"pair {row['anchor_id']} -> {row['candidate_id']} on {row['op']}: the {side}'s "
                             f"source and params hash to {kernel.candidate_id}, not {row[f'{side}_id']}")
    return ForecastRequest(anchor=anchor, candidate=candidate, op=row["op"], hardware=hardware_of(row),
                           case_names=tuple(row["case_names"]),
                           anchor_runtime_us=tuple(float(t) for t in row["anchor_runtime_us"]))


def requests_of(pairs: pd.DataFrame) -> list[ForecastRequest]:
    return [request_of(r) for r in pairs.to_dict("records")]


def _json_value(value):
    """NaN (a failed child's runtimes and speedup) as null: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def write_pairs(pairs: pd.DataFrame, path: str, storage_options: dict | None = None) -> None:
    """The pairs as one file (local path or URL) with ``PAIR_SCHEMA``'s column types: JSON lines
    when ``path`` ends in .jsonl (one pair an object, readable by any RL trainer), else Parquet."""
    import fsspec
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(pairs[PAIR_SCHEMA.names], schema=PAIR_SCHEMA, preserve_index=False)
    if path.endswith(JSONL_SUFFIX):
        with fsspec.open(path, "w", **(storage_options or {})) as f:
            for row in table.to_pylist():
                f.write(json.dumps({k: _json_value(v) for k, v in row.items()}, allow_nan=False) + "\n")
        return
    with fsspec.open(path, "wb", **(storage_options or {})) as f:
        pq.write_table(table, f)


def read_pairs(path: str, storage_options: dict | None = None,
               columns: Sequence[str] = tuple(PAIR_SCHEMA.names)) -> pd.DataFrame:
    """Pairs written by ``write_pairs`` (Parquet, or JSON lines when ``path`` ends in .jsonl), with
    ``columns`` (default: every pair column); a file missing one of them is refused by name."""
    import fsspec
    import pyarrow.parquet as pq

    columns = list(columns)
    if path.endswith(JSONL_SUFFIX):
        with fsspec.open(path, "r", **(storage_options or {})) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        names = set().union(*rows) if rows else set()
        missing = [c for c in columns if c not in names]
        if missing:
            raise ValueError(f"{path} is not a pairs file: it lacks the key(s) {', '.join(missing)}")
        schema = pa.schema([PAIR_SCHEMA.field(c) if c in PAIR_SCHEMA.names else (c, pa.string()) for c in columns])
        table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows], schema=schema)
    else:
        with fsspec.open(path, "rb", **(storage_options or {})) as f:
            table = pq.read_table(f)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(f"{path} is not a pairs file: it lacks the column(s) {', '.join(missing)}")
    pairs = table.select(columns).to_pandas()
    for k in ("anchor_runtime_us", "runtime_us"):  # null (a runtime never measured) back to NaN
        if k in pairs.columns:
            pairs[k] = pairs[k].map(lambda ts: [math.nan if t is None else float(t) for t in ts])
    if "speedup" in pairs.columns:
        pairs["speedup"] = pairs["speedup"].astype(float)
    return pairs
