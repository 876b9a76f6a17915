"""Parquet tables under one data root: a local folder or ``s3://bucket/prefix``.

Layout is Hive-partitioned, ``{root}/{table}/op=softmax/gpu_type=h100/part-<hash>.parquet``,
so ``pandas.read_parquet`` and ``pyarrow.dataset`` read it directly. Writes are
idempotent and atomic:

- a row whose key is already in its partition (or earlier in the batch) is not
  written again, and a file is named by a hash of its keys, so two writers racing
  with the same batch produce one file;
- a file becomes visible whole or not at all: locally it is written to a
  dot-prefixed temp file and renamed; on S3 an object appears only once its PUT
  completes. Readers skip names starting with '.' or '_', and drop duplicate keys
  as a last defence.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import uuid
from typing import Iterator

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from kernels.records import Candidate, Measurement
from storage.schema import (TableSpec, candidates_to_table, forecasts_to_table, measurements_to_table,
                            records_to_table, table_spec)

_PARTITION_VALUE = re.compile(r"[a-z0-9_.-]+")


class StorageError(OSError):
    """An I/O failure at the data root, naming the URI that failed."""


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


class DataRoot:
    """All tables under one URI; ``storage_options`` go to fsspec (e.g. an S3 ``endpoint_url``)."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self.uri = str(uri)
        self.fs, self.path = fsspec.core.url_to_fs(self.uri, **(storage_options or {}))
        self.path = self.path.rstrip("/")
        self.is_local = isinstance(self.fs, LocalFileSystem)

    def __repr__(self) -> str:
        return f"DataRoot({self.uri!r})"

    @contextlib.contextmanager
    def _io(self, action: str, path: str) -> Iterator[None]:
        """Turn any filesystem failure into one error naming the URI and what was being done."""
        try:
            yield
        except Exception as exc:
            where = self.uri.rstrip("/") + path[len(self.path):]
            raise StorageError(f"cannot {action} {where}: {type(exc).__name__}: {exc}") from exc

    # ---- generic layer: any TableSpec ------------------------------------------------------

    def _table_path(self, spec: TableSpec) -> str:
        return posixpath.join(self.path, spec.name)

    def _files(self, spec: TableSpec, where: dict[str, str]) -> list[str]:
        """Visible data files of ``spec`` whose partition matches ``where``, in a stable order."""
        base = self._table_path(spec)
        with self._io("list", base):
            self.fs.invalidate_cache(base)  # other writers may have added files since we last looked
            found = self.fs.find(base)
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
        with self._io("read", self._table_path(spec)):
            dataset = ds.dataset(files, schema=spec.schema, format="parquet", filesystem=self.fs,
                                 partitioning=ds.partitioning(spec.partition_schema, flavor="hive"),
                                 partition_base_dir=self._table_path(spec))
            return dataset.to_table(columns=list(schema.names))

    def _put(self, path: str, data: bytes) -> None:
        """Make ``path`` hold ``data``, visible whole or not at all."""
        with self._io("write", path):
            if not self.is_local:
                self.fs.pipe_file(path, data)  # an S3 object is visible only once its upload completes
                return
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
        buffer = pa.BufferOutputStream()
        pq.write_table(rows.select(spec.file_schema.names).cast(spec.file_schema), buffer)
        self._put(path, buffer.getvalue().to_pybytes())
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
            stored = self._read_files(spec, self._files(spec, partition), list(spec.key))
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
        rows = _first_of_each_key(self._read_files(spec, self._files(spec, where), wanted), spec.key)
        return rows if columns is None else rows.select(columns)

    def read(self, table: str, **where: str) -> pd.DataFrame:
        return self.read_table(table, **where).to_pandas()

    def compact(self, table: str) -> int:
        """Merge each partition's files into one; returns the number of partitions merged.

        The merged file is written (atomically) before any old file is removed, so a
        crash in between leaves duplicates that readers drop, never a lost row. Files
        added by other writers meanwhile are not touched.
        """
        spec = table_spec(table)
        by_partition: dict[tuple, list[str]] = {}
        base = self._table_path(spec)
        for path in self._files(spec, {}):
            by_partition.setdefault(tuple(path[len(base):].strip("/").split("/")[:-1]), []).append(path)
        merged = 0
        for segments, files in sorted(by_partition.items()):
            if len(files) < 2:
                continue
            partition = dict(s.split("=", 1) for s in segments)
            rows = _first_of_each_key(self._read_files(spec, files), spec.key)
            new_path = self._write_partition(spec, partition, rows)
            stale = [f for f in files if f != new_path]
            with self._io("remove old files in", posixpath.dirname(new_path)):
                self.fs.rm(stale)
            merged += 1
        return merged

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

    def get_object(self, relative: str) -> bytes | None:
        """The bytes at ``relative`` under the root, or None when there is nothing there."""
        path = posixpath.join(self.path, relative)
        with self._io("read", path):
            return self.fs.cat_file(path) if self.fs.exists(path) else None

    def probe(self) -> None:
        """Fail now, with a StorageError naming the URI, if the data root cannot be listed or written."""
        marker = posixpath.join(self.path, "_probe", uuid.uuid4().hex)
        self._put(marker, b"")
        with self._io("clean up a probe at", marker):
            self.fs.rm(marker)


def table_spec_of(records: list) -> str:
    from storage.schema import RECORD_TABLES

    return RECORD_TABLES[type(records[0])].name
