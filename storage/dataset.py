"""Parquet tables under one data root: a local folder or ``s3://bucket/prefix``.

Layout is Hive-partitioned, ``{root}/{table}/op=softmax/gpu_type=h100/part-<hash>.parquet``,
so ``pandas.read_parquet`` and ``pyarrow.dataset`` read it directly (all but a candidate source
moved into the sources table, ``storage/sources.py``, which only ``read_table`` puts back). Writes are
idempotent and atomic:

- a row whose key is already in its partition (or earlier in the batch) is not
  written again, and a file is named by a hash of its keys, so two writers racing
  with the same batch produce one file;
- a file becomes visible whole or not at all: locally it is written to a
  dot-prefixed temp file and renamed; on S3 an object appears only once its PUT
  completes. Readers skip names starting with '.' or '_', and drop duplicate keys
  as a last defence (two writers racing with overlapping batches both write the
  keys neither saw stored; compaction then keeps one row per key).

Every filesystem call is idempotent, so a transient failure (an S3 endpoint that
restarts, a dropped connection, a throttled request) is retried with exponential
backoff within a time budget (``RetryPolicy``) before it becomes a ``StorageError``;
an overnight search rides out an outage shorter than the budget and loses nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import posixpath
import random
import re
import time
import uuid
from typing import Callable, TypeVar

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from kernelcast.kernels.records import Candidate, Measurement
from kernelcast.storage import sources
from kernelcast.storage.retry import RetryPolicy, StorageError, is_transient
from kernelcast.storage.schema import (TableSpec, candidates_to_table, forecasts_to_table, measurements_to_table,
                            records_to_table, table_spec)

_PARTITION_VALUE = re.compile(r"[a-z0-9_.-]+")
_log = logging.getLogger(__name__)
T = TypeVar("T")


def _caused_by_missing_file(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, FileNotFoundError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def check_partition_value(column: str, value: object) -> str:
    """``value`` if it is safe as a path segment: lowercase letters, digits, '_', '-', '.'."""
    if not isinstance(value, str) or not _PARTITION_VALUE.fullmatch(value):
        raise ValueError(f"bad partition value {value!r} for {column!r}: "
                         "use lowercase letters, digits, '_', '-' or '.'")
    return value


def _keys_digest(keys: list[tuple]) -> str:
    h = hashlib.sha256()
    for key in sorted(keys):
        h.update("\0".join(map(str, key)).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def _first_of_each_key(table: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """Rows of ``table`` keeping only the first occurrence of each key."""
    if table.num_rows == 0:
        return table
    indexed = table.select(list(key)).append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    first = indexed.group_by(list(key), use_threads=False).aggregate([("_row", "min")])["_row_min"]
    return table.take(pc.take(first, pc.sort_indices(first)))  # those row numbers, in table order


def parquet_bytes(spec: TableSpec, rows: pa.Table) -> bytes:
    """``rows`` as one Parquet file of ``spec``: its file columns (partition values live in the path)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(rows.select(spec.file_schema.names).cast(spec.file_schema), buffer, compression=spec.compression)
    return buffer.getvalue().to_pybytes()


class DataRoot:
    """All tables under one URI; ``storage_options`` go to fsspec (e.g. an S3 ``endpoint_url``).

    ``retried`` and ``retry_wait_s`` count the transient failures ridden out so far.
    """

    def __init__(self, uri: str, storage_options: dict | None = None, retry: RetryPolicy | None = None) -> None:
        self.uri = str(uri)
        self.storage_options = dict(storage_options or {})
        self.fs, self.path = fsspec.core.url_to_fs(self.uri, **self.storage_options)
        self.path = self.path.rstrip("/")
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.retry = retry if retry is not None else RetryPolicy()
        self.retried = 0
        self.retry_wait_s = 0.0
        self._sources_root: DataRoot | None = None

    def __repr__(self) -> str:
        return f"DataRoot({self.uri!r})"

    def _call(self, action: str, path: str, fn: Callable[[], T], retry: bool = True) -> T:
        """``fn()``, retried through transient failures within the retry budget; any failure that
        remains becomes one StorageError naming the URI, what was being done, and the retries spent."""
        first_failure = None
        for attempt in itertools.count():
            try:
                return fn()
            except Exception as exc:
                first_failure = first_failure if first_failure is not None else time.monotonic()
                spent = time.monotonic() - first_failure
                left = self.retry.budget_s - spent
                where = self.uri.rstrip("/") + path[len(self.path):]
                if not (retry and left > 0 and is_transient(exc)):
                    tried = (f" (still failing after {attempt + 1} attempts over {spent:.1f} s; retry budget "
                             f"{self.retry.budget_s:g} s)") if retry and attempt else ""
                    raise StorageError(f"cannot {action} {where}: {type(exc).__name__}: {exc}{tried}") from exc
                wait = min(self.retry.delay(attempt), left)
                _log.warning("cannot %s %s (%s); retrying in %.1f s, %.1f s of the %g s retry budget left",
                             action, where, type(exc).__name__, wait, left, self.retry.budget_s)
                self.retried += 1
                self.retry_wait_s += wait
                time.sleep(wait)
        raise AssertionError("unreachable")

    # ---- generic layer: any TableSpec ------------------------------------------------------

    def _table_path(self, spec: TableSpec) -> str:
        return posixpath.join(self.path, spec.name)

    def _files(self, spec: TableSpec, where: dict[str, str]) -> list[str]:
        """Visible data files of ``spec`` whose partition matches ``where``, in a stable order."""
        base = self._table_path(spec)

        def find() -> list[str]:
            # Other writers may have added files since we last looked. The whole cache, not just
            # ``base``: s3fs drops only a path and its parents, and a stale listing of a partition
            # left below would make a file another client wrote since then look missing when read.
            self.fs.invalidate_cache()
            return self.fs.find(base)

        found = self._call("list", base, find)
        files = []
        for path in sorted(found):
            parts = path[len(base):].strip("/").split("/")
            if not parts[-1].endswith(".parquet") or any(p[:1] in (".", "_") for p in parts):
                continue
            partition = dict(p.split("=", 1) for p in parts[:-1] if "=" in p)
            if all(partition.get(col) == value for col, value in where.items()):
                files.append(path)
        return files

    def _read_files(self, spec: TableSpec, files: list[str], columns: list[str] | None = None) -> pa.Table:
        schema = spec.schema if columns is None else pa.schema([spec.schema.field(c) for c in columns])
        if not files:
            return schema.empty_table()

        def read() -> pa.Table:
            dataset = ds.dataset(files, schema=spec.schema, format="parquet", filesystem=self.fs,
                                 partitioning=ds.partitioning(spec.partition_schema, flavor="hive"),
                                 partition_base_dir=self._table_path(spec))
            return dataset.to_table(columns=list(schema.names))

        return self._call("read", self._table_path(spec), read)

    def _read_where(self, spec: TableSpec, where: dict[str, str], columns: list[str] | None = None,
                    attempts: int = 10) -> pa.Table:
        """List, then read, the files of ``spec`` matching ``where``, listing again if one vanished in between:
        a compaction removes files only after writing their rows into a merged file, which a new listing finds.
        Between attempts a short, growing, jittered pause, so that a reader does not keep losing the same
        race against a compactor that runs back to back."""
        jitter = random.Random()
        for attempt in range(attempts):
            try:
                return self._read_files(spec, self._files(spec, where), columns)
            except StorageError as exc:
                if attempt == attempts - 1 or not _caused_by_missing_file(exc):
                    raise
                time.sleep(jitter.uniform(0.0, 0.005 * 2 ** min(attempt, 6)))
        raise AssertionError("unreachable")

    def _put(self, path: str, data: bytes, retry: bool = True) -> None:
        """Make ``path`` hold ``data``, visible whole or not at all."""
        if not self.is_local:  # an S3 object is visible only once its upload completes
            self._call("write", path, lambda: self.fs.pipe_file(path, data), retry=retry)
        else:
            self._call("write", path, lambda: self._put_local(path, data), retry=retry)

    @staticmethod
    def _put_local(path: str, data: bytes) -> None:
        """Write a dot-prefixed temp file (which readers skip), then rename it into place."""
        folder, name = posixpath.split(path)
        os.makedirs(folder, exist_ok=True)
        temp = posixpath.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temp)
            raise

    def _write_partition(self, spec: TableSpec, partition: dict[str, str], rows: pa.Table) -> str:
        keys = list(zip(*(rows[c].to_pylist() for c in spec.key)))
        folder = posixpath.join(self._table_path(spec), *(f"{c}={v}" for c, v in partition.items()))
        path = posixpath.join(folder, f"part-{_keys_digest(keys)}.parquet")
        self._put(path, parquet_bytes(spec, rows))
        return path

    def write(self, table: str, rows: pa.Table) -> int:
        """Append ``rows`` to ``table``, skipping keys already stored; returns the rows newly written."""
        spec = table_spec(table)
        rows = rows.select(spec.schema.names).cast(spec.schema)
        for column in (*spec.key, *spec.partition_by):
            if rows[column].null_count:
                raise ValueError(f"{table}: column {column!r} must not be null")
        partition_values = list(zip(*(rows[c].to_pylist() for c in spec.partition_by)))
        for values in set(partition_values):
            for column, value in zip(spec.partition_by, values):
                check_partition_value(column, value)
        written = 0
        for values in sorted(set(partition_values)):
            mask = [v == values for v in partition_values]
            batch = _first_of_each_key(rows.filter(pa.array(mask)), spec.key)
            partition = dict(zip(spec.partition_by, values))
            stored = self._read_where(spec, partition, list(spec.key))
            stored_keys = set(zip(*(stored[c].to_pylist() for c in spec.key)))
            batch_keys = list(zip(*(batch[c].to_pylist() for c in spec.key)))
            new = batch.filter(pa.array([k not in stored_keys for k in batch_keys]))
            if new.num_rows:
                self._write_partition(spec, partition, new)
                written += new.num_rows
        return written

    def read_table(self, table: str, columns: list[str] | None = None, **where: str) -> pa.Table:
        """Rows of ``table`` in the partitions matching ``where`` (e.g. ``op="softmax"``), one per key."""
        spec = table_spec(table)
        for column, value in where.items():
            if column not in spec.partition_by:
                raise ValueError(f"{table} is partitioned by {', '.join(spec.partition_by)}, not {column!r}")
            check_partition_value(column, value)
        wanted = None if columns is None else list(dict.fromkeys([*spec.key, *columns]))
        moved = spec.name == "candidates" and (columns is None or "source" in columns)
        if moved and wanted is not None:
            wanted = list(dict.fromkeys([*wanted, "op", "source_sha256"]))
        rows = _first_of_each_key(self._read_where(spec, where, wanted), spec.key)
        if moved:  # sources moved into the sources table are put back: readers see the rows as written
            rows = sources.fill_candidate_sources(self, rows)
        return rows if columns is None else rows.select(columns)

    def read(self, table: str, **where: str) -> pd.DataFrame:
        return self.read_table(table, **where).to_pandas()

    def compact(self, table: str, stale_temp_s: float = 3600.0) -> int:
        """Merge each partition's files into one; returns the number of partitions merged.

        The merged file is written (atomically) before any old file is removed, so a
        crash in between leaves duplicates that readers drop, never a lost row. Files
        added by other writers meanwhile are not touched; a file that another compaction
        removed first is simply gone from the list (its rows are in that one's merged file).
        Hidden temp files that a killed local writer left, older than ``stale_temp_s``
        (no live write takes that long), are removed too.
        """
        spec = table_spec(table)
        base = self._table_path(spec)
        if self.is_local and os.path.isdir(base):
            self._sweep_temp_files(base, stale_temp_s)
        segments_of = lambda path: tuple(path[len(base):].strip("/").split("/")[:-1])  # noqa: E731
        partitions = sorted({segments_of(path) for path in self._files(spec, {})})
        return sum(self._compact_partition(spec, dict(s.split("=", 1) for s in segments))
                   for segments in partitions)

    def _compact_partition(self, spec: TableSpec, partition: dict[str, str], attempts: int = 5) -> bool:
        for _ in range(attempts):
            files = self._files(spec, partition)
            if len(files) < 2:
                return False
            try:
                rows = _first_of_each_key(self._read_files(spec, files), spec.key)
            except StorageError as exc:
                if _caused_by_missing_file(exc):  # a concurrent compaction merged it meanwhile: look again
                    continue
                raise
            new_path = self._write_partition(spec, partition, rows)
            for stale in files:
                if stale != new_path:
                    self._call("remove", stale, lambda: self._remove_if_present(stale))
            return True
        raise StorageError(f"cannot compact {self.uri}/{spec.name} {partition}: its files kept vanishing "
                           f"while being read ({attempts} attempts); is another compaction looping?")

    @staticmethod
    def _sweep_temp_files(base: str, older_than_s: float) -> int:
        removed, now = 0, time.time()
        for folder, _, names in os.walk(base):
            for name in names:
                path = os.path.join(folder, name)
                if name.startswith(".") and name.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        if now - os.path.getmtime(path) > older_than_s:
                            os.remove(path)
                            removed += 1
        return removed

    def _remove_if_present(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    # ---- typed tables ----------------------------------------------------------------------

    def write_candidates(self, candidates: list[Candidate]) -> int:
        return self.write("candidates", candidates_to_table(candidates))

    def write_measurements(self, measurements: list[Measurement]) -> int:
        return self.write("measurements", measurements_to_table(measurements))

    def read_candidates(self, op: str | None = None) -> pd.DataFrame:
        return self.read("candidates", **({} if op is None else {"op": op}))

    def read_measurements(self, op: str | None = None, gpu_type: str | None = None) -> pd.DataFrame:
        where = {k: v for k, v in (("op", op), ("gpu_type", gpu_type)) if v is not None}
        return self.read("measurements", **where)

    def measured_ids(self, op: str, gpu_type: str) -> set[str]:
        """Ids of candidates with a stored measurement (any status) on ``gpu_type``."""
        rows = self.read_table("measurements", columns=["candidate_id"], op=op, gpu_type=gpu_type)
        return set(rows["candidate_id"].to_pylist())

    def write_records(self, records: list) -> int:
        """Decisions, generation summaries or run records, each into its own table."""
        return self.write(table_spec_of(records), records_to_table(records)) if records else 0

    def write_forecasts(self, forecasts: list, run_id: str, generation: int, op: str, gpu_type: str) -> int:
        if not forecasts:
            return 0
        return self.write("forecasts", forecasts_to_table(forecasts, run_id, generation, op, gpu_type))

    def read_run_rows(self, table: str, run_id: str, op: str | None = None) -> pd.DataFrame:
        """Rows of a journal table (forecasts, decisions, generations, runs) belonging to one run."""
        where = {} if op is None else {"op": op}
        if "run_id" in table_spec(table).partition_by:
            where["run_id"] = run_id
        frame = self.read(table, **where)
        return frame[frame["run_id"] == run_id].reset_index(drop=True)

    def fingerprint(self, table: str) -> list[str]:
        """Names of a table's visible files: they are hashes of their keys, so they change when its content does."""
        return [posixpath.basename(f) for f in self._files(table_spec(table), {})]

    def put_object(self, relative: str, data: bytes) -> None:
        """Store bytes (a fitted model, say) at ``relative`` under the root, visible whole or not at all."""
        self._put(posixpath.join(self.path, relative), data)

    def list_objects(self, relative: str) -> list[str]:
        """Paths (relative to ``relative``) of the files under the folder ``relative``, sorted; [] if there is none."""
        base = posixpath.join(self.path, relative)

        def find() -> list[str]:
            self.fs.invalidate_cache()
            return self.fs.find(base)

        return sorted(posixpath.relpath(p, base) for p in self._call("list", base, find))

    def remove_objects(self, relative: str) -> None:
        """Remove the file or folder ``relative`` under the root, if it is there."""
        path = posixpath.join(self.path, relative)

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path, recursive=True)
            self.fs.invalidate_cache()

        self._call("remove", path, remove)

    # ---- sources stored once (storage/sources.py; the migration: storage/dedup.py) -------------

    def sources_root(self) -> DataRoot:
        """The root whose ``sources`` table keeps this root's sources: the one its ``sources.json`` names, else
        itself."""
        if self._sources_root is None:
            self._sources_root = sources.resolve_sources_root(self)
        return self._sources_root

    def put_sources(self, op: str, contents: list[bytes]) -> list[str]:
        """Store each content once, keyed by its SHA-256, in the sources table (under ``op``); returns the hashes."""
        return sources.put_sources(self, op, contents)

    def get_sources(self, hashes_by_op: dict[str, list[str]]) -> dict[str, bytes]:
        """The stored contents of these hashes (each op's under it); a missing one is a StorageError naming it."""
        return sources.get_sources(self, hashes_by_op)

    def get_object(self, relative: str) -> bytes | None:
        """The bytes at ``relative`` under the root, or None when there is nothing there."""
        path = posixpath.join(self.path, relative)

        def get() -> bytes | None:
            try:
                return self.fs.cat_file(path)
            except FileNotFoundError:
                return None

        return self._call("read", path, get)

    def probe(self) -> None:
        """Fail now, with a StorageError naming the URI, if the data root cannot be written.

        Not retried: at the start of a search an unreachable endpoint is a wrong setting far
        more often than an outage, and it should fail before any GPU time is spent.
        """
        marker = posixpath.join(self.path, "_probe", uuid.uuid4().hex)
        self._put(marker, b"", retry=False)
        self._call("clean up a probe at", marker, lambda: self.fs.rm(marker), retry=False)


def table_spec_of(records: list) -> str:
    from kernelcast.storage.schema import RECORD_TABLES

    return RECORD_TABLES[type(records[0])].name
