"""The CUDA-L1 pool: each problem imported as an operation, its variants built, measured under each protocol.

A pool root holds one data root per timing protocol (``<root>/kernelcast``, ``<root>/kernelbench``):
the measurements table is keyed by candidate and GPU type, so the same candidate timed two ways
needs two tables; each is a whole data root (candidates, measurements, the imported tasks) that
the search, the replay and the forecasters read like any other pool. Beside them, ``cudal1.parquet``
holds one row per problem and variant: the candidate (or why there is none), its provenance in
CUDA-L1's repository, how the problem compares with today's KernelBench file, and the speedups
CUDA-L1 published for it on every GPU (kernelcast.kernels.formats.cudal1).

Measuring is resumable: a candidate with a stored measurement on this GPU type under a protocol is
not measured again under it, and every measurement is written as soon as it arrives. Nothing here
needs more than torch, triton, pandas and pyarrow (no orchestration on the measuring machine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import math
import random
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kernelcast.kernels.formats import MANIFEST, install, load_operation, save_to_root, stored_task, task_files, tasks_dir
from kernelcast.kernels.formats import kernelbench
from kernelcast.kernels.harness.sweep import shard  # noqa: F401 - the pool's shards are the sweep's (benchmarks/cudal1_pool)
from kernelcast.kernels.formats.cudal1 import (COMMIT, GPUS, REPOSITORY, SCORES, SOURCE_GPU, VARIANTS, Built, KernelBenchMatch,
                                    Problem, build, compare_with_kernelbench, corpus_file)
from kernelcast.storage.dataset import DataRoot

PROTOCOLS = ("kernelcast", "kernelbench")
SIDE_TABLE = "cudal1.parquet"
_PROBLEM = re.compile(r"(?:kb\.)?(?:cudal1-)?l?([1-3])[-/_](\d{1,3})")


def protocols_named(spec: str) -> list[str]:
    names = list(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    unknown = [n for n in names if n not in PROTOCOLS]
    if unknown or not names:
        raise ValueError(f"unknown protocol {', '.join(unknown) or '(none given)'}; known: {', '.join(PROTOCOLS)}")
    return names


def protocol_root(uri: str, protocol: str) -> DataRoot:
    """The data root of one protocol's measurements under the pool root ``uri``."""
    return DataRoot(f"{str(uri).rstrip('/')}/{protocol}")


def worker_config(protocol: str, **settings):
    """A ``WorkerConfig`` timing the way ``protocol`` says; a clear error where this harness cannot."""
    from kernelcast.kernels.harness.worker import WorkerConfig

    if "protocol" in {f.name for f in dataclasses.fields(WorkerConfig)}:
        return WorkerConfig(protocol=protocol, **settings)
    if protocol != "kernelcast":
        raise ValueError(f"protocol {protocol!r} needs WorkerConfig.protocol, which this checkout's harness "
                         "(kernels/harness/worker.py) does not have yet; only 'kernelcast' can be measured here")
    return WorkerConfig(**settings)


def select(problems: Sequence[Problem], names: str = "", levels: str = "", sample: int | None = None,
           seed: int = 0) -> list[Problem]:
    """The problems named (``l2-017``, ``2/17``, ``kb.cudal1-l2-017``), of the levels given, then ``sample`` of them."""
    chosen = list(problems)
    if levels:
        wanted = {int(x) for x in re.findall(r"\d+", levels)}
        if not wanted or wanted - {1, 2, 3}:
            raise ValueError(f"bad --levels {levels!r}: give levels 1, 2 and/or 3, comma-separated")
        chosen = [p for p in chosen if p.level in wanted]
    if names:
        by_key = {(p.level, p.task_id): p for p in problems}
        keys = []
        for item in filter(None, (s.strip() for s in names.split(","))):
            m = _PROBLEM.fullmatch(item)
            if not m or (int(m.group(1)), int(m.group(2))) not in by_key:
                raise ValueError(f"unknown problem {item!r}: name one as l<level>-<task> (l2-017), <level>/<task> "
                                 f"or its op name (kb.cudal1-l2-017); the corpus has {len(problems)} problems")
            keys.append((int(m.group(1)), int(m.group(2))))
        chosen = [p for p in chosen if (p.level, p.task_id) in set(keys)]
    if sample is not None:
        if sample < 1:
            raise ValueError(f"--sample must be at least 1, got {sample}")
        chosen = sorted(random.Random(seed).sample(chosen, min(sample, len(chosen))),
                        key=lambda p: (p.level, p.task_id))
    return chosen


# ---- importing and building ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """A problem imported as an operation (or why it could not be), its variants, and its KernelBench comparison."""

    problem: Problem
    op: object | None
    import_error: str
    built: tuple[Built, ...]
    kernelbench: KernelBenchMatch

    def candidates(self) -> list:
        """Its built candidates, each once (two variants with the same code are one candidate)."""
        return list({b.candidate.candidate_id: b.candidate for b in self.built if b.candidate}.values())


def import_problem(problem: Problem, scratch: Path):
    """The problem's operation: the installed one where its reference is this ref_code, else imported anew."""
    installed = tasks_dir() / problem.op_name
    try:
        if (installed / "reference.py").read_text() == problem.ref_code and (installed / MANIFEST).is_file():
            return load_operation(problem.op_name)
    except OSError:
        pass
    path = scratch / f"{problem.task_name}.py"
    path.write_text(problem.ref_code)
    name, files = kernelbench.import_task(str(path), name=problem.task_name)
    install(name, files)
    return load_operation(name)


def prepare(problems: Sequence[Problem], variants: Sequence[str], kernelbench_folder: str | Path,
            roots: Sequence[DataRoot] = (), log: Callable[[str], None] = print) -> list[Prepared]:
    """Import each problem, store its task under each root, build its variants; failures become reasons."""
    out = []
    with tempfile.TemporaryDirectory(prefix="cudal1-") as scratch:
        for problem in problems:
            match = compare_with_kernelbench(problem, kernelbench_folder)
            try:
                op = import_problem(problem, Path(scratch))
            except Exception as exc:  # noqa: BLE001 - a problem the importer refuses is a row with the reason
                error = f"{type(exc).__name__}: {exc}"[:600]
                log(f"{problem.op_name}: not imported ({error[:200]})")
                skipped = tuple(Built(problem, v, None, f"the problem was not imported: {error}") for v in variants)
                out.append(Prepared(problem, None, error, skipped, match))
                continue
            files = task_files(op.name) if roots else None
            for root in roots:
                if stored_task(root, op.name) != files:
                    save_to_root(root, op.name, files)
            out.append(Prepared(problem, op, "", tuple(build(op, problem, variants)), match))
    return out


# ---- the side table: provenance and published speedups beside each candidate ---------------------------

def side_rows(prepared: Sequence[Prepared], corpus_sha256: str = "") -> list[dict]:
    """One row per problem and variant: candidate or reason, provenance, KernelBench comparison, published figures."""
    rows = []
    for p in prepared:
        pr = p.problem
        for b in p.built:
            v = VARIANTS[b.variant]
            c = b.candidate
            row = {"op": pr.op_name, "level": pr.level, "task_id": pr.task_id, "variant": b.variant,
                   "candidate_id": c.candidate_id if c else None, "backend": c.backend if c else None,
                   "skipped": b.skipped if not c else "", "import_error": p.import_error,
                   "written_by": "CUDA-L1" if v.field else "kernelcast", "repository": REPOSITORY, "commit": COMMIT,
                   "file": corpus_file(SOURCE_GPU), "field": v.field or "ref_code", "corpus_sha256": corpus_sha256,
                   "kernelbench_file": p.kernelbench.file, "kernelbench_status": p.kernelbench.status,
                   "kernelbench_diff": p.kernelbench.summary}
            row.update(published_columns(pr, b.variant))
            rows.append(row)
    return rows


def published_columns(problem: Problem, variant: str) -> dict:
    """CUDA-L1's figures for one problem and variant on every GPU: the implied speedup over eager, whether that
    GPU's file has this very code, and the raw scores."""
    v = VARIANTS[variant]
    cols = {}
    for gpu in GPUS:
        cols[f"published_speedup_{gpu}"] = v.published_speedup(problem, gpu)
        cols[f"same_code_{gpu}"] = problem.same_code[gpu].get(v.field) if v.field else True
    for gpu in GPUS:
        for score in SCORES:
            cols[f"{gpu}_{score}"] = problem.scores[gpu][score]
    return cols


def refresh_published(top: DataRoot, problems: Sequence[Problem]) -> pd.DataFrame:
    """The stored side table with its published columns read again from ``problems`` (a corpus folder with more
    GPUs' files than the one measured from, say); the candidates and measurements are untouched, and a figure the
    corpus lacks (a GPU whose file is not in it) keeps its stored value rather than being erased."""
    with _side_table_lock(top):
        table = read_side_table(top)
        if table.empty:
            return table
        by_key = {(p.level, p.task_id): p for p in problems}
        rows = []
        for row in table.to_dict("records"):
            problem = by_key.get((int(row["level"]), int(row["task_id"])))
            fresh = published_columns(problem, row["variant"]) if problem else {}
            rows.append({**row, **{k: v for k, v in fresh.items() if not pd.isna(v)}})
        return _merge_side_table(top, pd.DataFrame(rows))


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_side_table(top: DataRoot) -> pd.DataFrame:
    raw = top.get_object(SIDE_TABLE)
    return pd.DataFrame() if raw is None else pq.read_table(io.BytesIO(raw)).to_pandas()


def write_side_table(top: DataRoot, rows: Sequence[dict]) -> pd.DataFrame:
    """Merge ``rows`` into the stored side table (a row per op and variant; the new one wins); returns the table.

    On a local root the read and the write hold a file lock, so shards writing the same root at once
    lose none of each other's rows."""
    with _side_table_lock(top):
        return _merge_side_table(top, pd.DataFrame(list(rows)))


@contextlib.contextmanager
def _side_table_lock(top: DataRoot):
    if not top.is_local:
        yield
        return
    folder = Path(top.path)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{SIDE_TABLE}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _merge_side_table(top: DataRoot, new: pd.DataFrame) -> pd.DataFrame:
    old = read_side_table(top)
    if not old.empty and not new.empty:
        keep = ~old.set_index(["op", "variant"]).index.isin(new.set_index(["op", "variant"]).index)
        new = pd.concat([old[keep], new], ignore_index=True)
    elif new.empty:
        new = old
    new = new.sort_values(["level", "task_id", "variant"], key=_variant_order).reset_index(drop=True)
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(new, preserve_index=False), buffer)
    top.put_object(SIDE_TABLE, buffer.getvalue())
    return new


def _variant_order(column: pd.Series) -> pd.Series:
    order = {name: i for i, name in enumerate(VARIANTS)}
    return column.map(order) if column.name == "variant" else column


# ---- measuring ---------------------------------------------------------------------------------------------

def candidate_roles(prepared: Sequence[Prepared]) -> dict[str, tuple[str, list[str]]]:
    """{candidate id: (op, its roles)} of the imported problems: "reference" for each op's reference, else the
    variants built with that code (two variants with the same code are one candidate)."""
    roles: dict[str, tuple[str, list[str]]] = {}
    for p in prepared:
        if p.op is None:
            continue
        roles[p.op.seed_candidates()[0].candidate_id] = (p.problem.op_name, ["reference"])
        for b in p.built:
            if b.candidate:
                roles.setdefault(b.candidate.candidate_id, (p.problem.op_name, []))[1].append(b.variant)
    return roles


def measure(prepared: Sequence[Prepared], roots: Mapping[str, DataRoot], workers: Mapping[str, object], *,
            chunk: int, deadline: float | None = None, grace_s: float = 60.0,
            log: Callable[[str], None] = print) -> list:
    """Measure what each protocol's root lacks, chunk by chunk of problems, writing each row as it arrives.

    ``workers`` maps a protocol to its ``MeasureWorker``. Within a chunk the protocols take turns,
    so a call cut short leaves both with the same problems. No chunk starts after ``deadline``
    (``time.monotonic()``); one running more than ``grace_s`` past it is cut (its unfinished
    candidates are measured next time). Returns the measurements made.
    """
    ready = [p for p in prepared if p.op is not None]
    names = {cid: roles for cid, (_, roles) in candidate_roles(prepared).items()}
    published = {b.candidate.candidate_id: VARIANTS[b.variant].published_speedup(p.problem, SOURCE_GPU)
                 for p in ready for b in p.built if b.candidate}
    made = []
    for first in range(0, len(ready), max(1, chunk)):
        if deadline is not None and time.monotonic() > deadline:
            log("stopping at the time limit; run again to go on")
            return made
        group = ready[first:first + max(1, chunk)]
        for protocol, worker in workers.items():
            root, gpu_type = roots[protocol], worker.hardware.gpu_type
            todo = []
            for p in group:
                done = root.measured_ids(p.op.name, gpu_type)
                left = [c for c in p.candidates() if c.candidate_id not in done]
                if left:  # the reference too: stored, and in interpreter mode measured only when asked for
                    todo += [p.op.seed_candidates()[0], *left]
            if not todo:
                continue
            root.write_candidates(todo)
            with contextlib.closing(worker.measure(todo)) as results:
                for m in results:
                    root.write_measurements([m])
                    made.append((protocol, m))
                    log(_line(protocol, m, names.get(m.candidate_id, ["?"]), published.get(m.candidate_id)))
                    if deadline is not None and time.monotonic() > deadline + grace_s:
                        log("past the time limit inside a chunk; its unfinished candidates run next time")
                        return made
    return made


def _line(protocol: str, m, variants: list[str], published: float | None) -> str:
    speed = f"{m.speedup:.3f}x" if m.speedup else "-"
    theirs = f", published {published:.3f}x" if published else ""
    error = f" [{m.error[:160]}]" if m.status != "ok" else ""
    return (f"{protocol:<11} {m.op:<20} {'+'.join(variants):<24} {m.status:<13} {speed}{theirs}; "
            f"{m.gpu_seconds:.1f} device-s, {m.wall_seconds:.1f} s{error}")


def chunk_size(concurrency: int, variants: int) -> int:
    """Problems per chunk: enough candidates to keep every compiling child busy eight times over (a chunk
    waits for its slowest build, a minute or more for a CUDA extension, before the next starts)."""
    return max(1, math.ceil(8 * concurrency / max(1, variants + 1)))
