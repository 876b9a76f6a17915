"""The one place for table schemas: pyarrow columns, keys and partitions, and record <-> row conversion.

Every table is one ``TableSpec``; ``storage/dataset.py`` reads and writes any of
them the same way, so a new table (forecasts, decisions, generations) is one
spec here plus its two converters.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Iterable

import pandas as pd
import pyarrow as pa

from kernelcast.kernels.records import (Candidate, Decision, GenerationSummary, HardwareSpec, Measurement, Provenance,
                             SearchRun, canonical_params)
from kernelcast.kernels.screen import SCREEN_REASONS
from kernelcast.surrogate.forecast import Forecast

TIMESTAMP = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class TableSpec:
    """A table: its full schema, the columns that identify a row, the Hive partition columns, and the Parquet
    compression its files are written with."""

    name: str
    schema: pa.Schema
    key: tuple[str, ...]
    partition_by: tuple[str, ...]
    compression: str = "snappy"

    def __post_init__(self) -> None:
        missing = [c for c in (*self.key, *self.partition_by) if c not in self.schema.names]
        if missing:
            raise ValueError(f"table {self.name!r}: key or partition columns {missing} are not in its schema")

    @property
    def file_schema(self) -> pa.Schema:
        """Columns stored inside each Parquet file; partition values live in the path instead."""
        return pa.schema([f for f in self.schema if f.name not in self.partition_by])

    @property
    def partition_schema(self) -> pa.Schema:
        return pa.schema([self.schema.field(name) for name in self.partition_by])


CANDIDATES = TableSpec(
    name="candidates",
    schema=pa.schema([
        ("candidate_id", pa.string()),
        ("op", pa.string()),
        ("backend", pa.string()),
        ("template", pa.string()),
        ("source", pa.string()),
        ("params", pa.string()),  # canonical JSON, see kernelcast.kernels.records.canonical_params
        ("parent_id", pa.string()),
        ("origin", pa.string()),
        ("created_at", TIMESTAMP),
        # Set where the source was moved into the sources table (storage/sources.py): ``source`` is then null on
        # disk and DataRoot.read_table puts it back. Null where the source is inline (every row a search writes).
        ("source_sha256", pa.string()),
    ]),
    key=("candidate_id",),
    partition_by=("op",),
)

# Contents stored once, by SHA-256: imported tasks' files and moved candidate sources (storage/sources.py).
SOURCES = TableSpec(
    name="sources",
    schema=pa.schema([
        ("sha256", pa.string()),
        ("op", pa.string()),  # the task the content was stored for, or the candidate's operation
        ("content", pa.binary()),
    ]),
    key=("sha256",),
    partition_by=("op",),
    compression="zstd",  # source text: a third of snappy's size
)

# HardwareSpec is flattened under its own field names; its gpu_type is the measurement's.
_HARDWARE_COLUMNS = [
    ("device_name", pa.string()),
    ("compute_capability", pa.string()),
    ("sm_count", pa.int32()),
    ("sm_clock_mhz", pa.int32()),
    ("mem_clock_mhz", pa.int32()),
    ("bus_width_bits", pa.int32()),
    ("memory_gib", pa.float64()),
    ("l2_mib", pa.float64()),
    ("threads_per_sm", pa.int32()),
    ("driver_version", pa.string()),
    ("cuda_version", pa.string()),
    ("torch_version", pa.string()),
    ("triton_version", pa.string()),
]
HARDWARE_FIELDS = tuple(name for name, _ in _HARDWARE_COLUMNS)

MEASUREMENTS = TableSpec(
    name="measurements",
    schema=pa.schema([
        ("candidate_id", pa.string()),
        ("op", pa.string()),
        ("gpu_type", pa.string()),
        ("status", pa.string()),
        ("mode", pa.string()),
        ("error", pa.string()),
        ("case_names", pa.list_(pa.string())),
        ("runtime_us_median", pa.list_(pa.float64())),
        ("runtime_us_iqr", pa.list_(pa.float64())),
        ("repetitions", pa.list_(pa.int32())),
        ("reference_us_median", pa.list_(pa.float64())),
        ("speedup", pa.float64()),
        ("compile_seconds", pa.float64()),
        ("gpu_seconds", pa.float64()),
        ("wall_seconds", pa.float64()),
        *_HARDWARE_COLUMNS,
        ("peak_bandwidth_gbps", pa.float64()),  # derived from the spec; stored for queries, not read back
        ("replayed", pa.bool_()),
        ("measured_at", TIMESTAMP),
        ("precision", pa.string()),
        ("error_rel", pa.list_(pa.float64())),
        ("reference_error_rel", pa.list_(pa.float64())),
        ("checks", pa.string()),
        ("protocol", pa.string()),
    ]),
    key=("candidate_id", "gpu_type"),
    partition_by=("op", "gpu_type"),
)

# The search's journal, partitioned by operation and run: a run's writes and reads touch its own files only.
FORECASTS = TableSpec(
    name="forecasts",
    schema=pa.schema([
        ("run_id", pa.string()),
        ("generation", pa.int32()),
        ("op", pa.string()),
        ("gpu_type", pa.string()),
        ("candidate_id", pa.string()),
        ("anchor_id", pa.string()),
        ("surrogate", pa.string()),
        ("surrogate_version", pa.string()),
        ("probabilities", pa.list_(pa.float64())),  # the 8 speedup bins, renormalised
        ("predicted_bin", pa.int32()),
        ("expected_speedup", pa.float64()),
        ("confidence", pa.float64()),  # max probability
        ("parsed", pa.bool_()),
        ("raw_sum", pa.float64()),
        ("latency_s", pa.float64()),
        ("raw_response", pa.string()),
        ("failure_probability", pa.float64()),  # P(fails); null where not forecast (and in older stores)
        ("extra", pa.string()),  # JSON of the forecaster's named numbers (e.g. the log-speedup mean and sigma)
    ]),
    key=("run_id", "generation", "candidate_id", "surrogate"),
    partition_by=("op", "run_id"),
)

DECISIONS = TableSpec(
    name="decisions",
    schema=pa.schema([
        ("run_id", pa.string()),
        ("generation", pa.int32()),
        ("candidate_id", pa.string()),
        ("op", pa.string()),
        ("gpu_type", pa.string()),
        ("decision", pa.string()),
        ("policy", pa.string()),
        ("parent_id", pa.string()),
        ("predicted_bin", pa.int32()),
        ("expected_speedup", pa.float64()),
        ("confidence", pa.float64()),
        ("decided_at", TIMESTAMP),
    ]),
    key=("run_id", "generation", "candidate_id"),
    partition_by=("op", "run_id"),
)

GENERATIONS = TableSpec(
    name="generations",
    schema=pa.schema([
        ("run_id", pa.string()),
        ("generation", pa.int32()),
        ("op", pa.string()),
        ("gpu_type", pa.string()),
        ("surrogate", pa.string()),
        ("policy", pa.string()),
        *[(name, pa.int32()) for name in ("generated", "forecast", "measured", "reused", "trusted", "dropped",
                                           "failed", "budget_used", "budget_left")],
        ("gpu_seconds", pa.float64()),
        ("gpu_seconds_total", pa.float64()),
        ("best_candidate_id", pa.string()),
        ("best_speedup", pa.float64()),
        ("surrogate_bin_accuracy", pa.float64()),
        ("surrogate_within_one", pa.float64()),
        ("wall_seconds", pa.float64()),
        ("overhead_seconds", pa.float64()),
        # Journals written before these columns existed read them as nulls.
        ("generator_asked", pa.int32()),
        ("generator_children", pa.int32()),
        *[(f"screened_{reason}", pa.int32()) for reason in SCREEN_REASONS],
        ("budget_kind", pa.string()),
        ("budget_spent", pa.float64()),
        ("budget_remaining", pa.float64()),
        ("compile_seconds", pa.float64()),
        ("compile_seconds_total", pa.float64()),
        ("finished_at", TIMESTAMP),
    ]),
    key=("run_id", "generation"),
    partition_by=("op", "run_id"),
)

RUNS = TableSpec(
    name="runs",
    schema=pa.schema([
        ("run_id", pa.string()),
        ("op", pa.string()),
        ("gpu_type", pa.string()),
        ("config", pa.string()),
        ("created_at", TIMESTAMP),
    ]),
    key=("run_id",),
    partition_by=("op",),
)

PROVENANCE = TableSpec(
    name="provenance",
    schema=pa.schema([
        ("run_id", pa.string()),
        ("candidate_id", pa.string()),
        ("op", pa.string()),
        ("parent_id", pa.string()),
        ("generator", pa.string()),
        ("model", pa.string()),
        ("model_sha256", pa.string()),
        ("prompt_version", pa.string()),
        ("temperature", pa.float64()),
        ("seed", pa.int64()),
        ("generation", pa.int32()),
        ("answer_chars", pa.int32()),
        ("seconds", pa.float64()),
        ("created_at", TIMESTAMP),
    ]),
    key=("run_id", "candidate_id"),
    partition_by=("op",),
)

TABLES: dict[str, TableSpec] = {t.name: t for t in (CANDIDATES, MEASUREMENTS, FORECASTS, DECISIONS,
                                                    GENERATIONS, RUNS, PROVENANCE, SOURCES)}
# Flat records stored one field per column, under the table named here.
RECORD_TABLES = {Decision: DECISIONS, GenerationSummary: GENERATIONS, SearchRun: RUNS, Provenance: PROVENANCE}


def table_spec(name: str) -> TableSpec:
    """The spec of table ``name``, with the known names in the error."""
    try:
        return TABLES[name]
    except KeyError:
        raise ValueError(f"unknown table {name!r}; known: {', '.join(TABLES)}") from None


def _rows(df: pd.DataFrame, spec: TableSpec) -> list[dict]:
    """DataFrame rows as plain Python values (None for nulls, lists for list columns).

    Going back through Arrow with the spec's schema undoes pandas' conversions:
    NaN for missing numbers and strings, floats for nullable ints, numpy arrays for lists.
    """
    missing = [c for c in spec.schema.names if c not in df.columns]
    if missing:
        raise ValueError(f"{spec.name} rows lack columns {missing}")
    table = pa.Table.from_pandas(df[spec.schema.names], schema=spec.schema, preserve_index=False)
    return table.to_pylist()


def candidates_to_table(candidates: Iterable[Candidate]) -> pa.Table:
    rows = [{
        "candidate_id": c.candidate_id,
        "op": c.op,
        "backend": c.backend,
        "template": c.template,
        "source": c.source,
        "params": canonical_params(c.params),
        "parent_id": c.parent_id,
        "origin": c.origin,
        "created_at": c.created_at,
    } for c in candidates]
    return pa.Table.from_pylist(rows, schema=CANDIDATES.schema)


def candidates_from_frame(df: pd.DataFrame) -> list[Candidate]:
    """Rows of the candidates table back to records; a row whose content no longer hashes to its id is an error."""
    out = []
    for row in _rows(df, CANDIDATES):
        c = Candidate(op=row["op"], backend=row["backend"], source=row["source"],
                      params=json.loads(row["params"]), template=row["template"],
                      parent_id=row["parent_id"], origin=row["origin"], created_at=row["created_at"])
        if c.candidate_id != row["candidate_id"]:
            raise ValueError(f"candidate {row['candidate_id']!r}: stored content hashes to {c.candidate_id!r}")
        out.append(c)
    return out


def measurements_to_table(measurements: Iterable[Measurement]) -> pa.Table:
    rows = []
    for m in measurements:
        hw = m.hardware
        if hw is not None and hw.gpu_type != m.gpu_type:
            raise ValueError(f"measurement of {m.candidate_id!r}: gpu_type {m.gpu_type!r} but hardware "
                             f"says {hw.gpu_type!r}; the table stores gpu_type once")
        row = {f.name: getattr(m, f.name) for f in dataclasses.fields(Measurement) if f.name != "hardware"}
        for name in HARDWARE_FIELDS:
            row[name] = None if hw is None else getattr(hw, name)
        row["peak_bandwidth_gbps"] = None if hw is None else hw.peak_bandwidth_gbps
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=MEASUREMENTS.schema)


def measurements_from_frame(df: pd.DataFrame) -> list[Measurement]:
    """Rows of the measurements table back to records; null hardware columns mean ``hardware=None``."""
    out = []
    for row in _rows(df, MEASUREMENTS):
        hardware = None
        if row["device_name"] is not None:
            hardware = HardwareSpec(gpu_type=row["gpu_type"], **{name: row[name] for name in HARDWARE_FIELDS})
        fields = {f.name: row[f.name] for f in dataclasses.fields(Measurement) if f.name != "hardware"}
        for name in ("case_names", "runtime_us_median", "runtime_us_iqr", "repetitions", "reference_us_median",
                     "error_rel", "reference_error_rel"):
            fields[name] = tuple(fields[name] or ())
        for name in ("precision", "checks"):  # rows written before these columns existed read as null
            fields[name] = fields[name] or ""
        fields["protocol"] = fields["protocol"] or "kernelcast"
        out.append(Measurement(**fields, hardware=hardware))
    return out


def records_to_table(records: list) -> pa.Table:
    """Flat records (``Decision``, ``GenerationSummary``, ``SearchRun``) as rows of their table."""
    if not records:
        raise ValueError("records_to_table needs at least one record")
    spec = RECORD_TABLES[type(records[0])]
    return pa.Table.from_pylist([dataclasses.asdict(r) for r in records], schema=spec.schema)


def records_from_frame(record_type: type, df: pd.DataFrame) -> list:
    """Rows of a flat record's table back to records."""
    return [record_type(**row) for row in _rows(df, RECORD_TABLES[record_type])]


def forecasts_to_table(forecasts: Iterable[Forecast], run_id: str, generation: int, op: str,
                       gpu_type: str) -> pa.Table:
    rows = [{
        "run_id": run_id, "generation": generation, "op": op, "gpu_type": gpu_type,
        "candidate_id": f.candidate_id, "anchor_id": f.anchor_id, "surrogate": f.surrogate,
        "surrogate_version": f.surrogate_version, "probabilities": list(f.probabilities),
        "predicted_bin": f.predicted_bin, "expected_speedup": f.expected_speedup,
        "confidence": f.max_probability, "parsed": f.parsed, "raw_sum": f.raw_sum, "latency_s": f.latency_s,
        "raw_response": f.raw_response, "extra": json.dumps(dict(f.extra), sort_keys=True),
        "failure_probability": None if math.isnan(f.failure_probability) else f.failure_probability,
    } for f in forecasts]
    return pa.Table.from_pylist(rows, schema=FORECASTS.schema)


def forecasts_from_frame(df: pd.DataFrame) -> list[Forecast]:
    return [Forecast(r["candidate_id"], r["anchor_id"], r["surrogate"], r["surrogate_version"],
                     tuple(r["probabilities"]), parsed=r["parsed"], raw_sum=r["raw_sum"],
                     latency_s=r["latency_s"], raw_response=r["raw_response"] or "",
                     extra=json.loads(r["extra"] or "{}"),
                     failure_probability=math.nan if r["failure_probability"] is None else r["failure_probability"])
            for r in _rows(df, FORECASTS)]
