"""Parquet tables on a local folder and on a real S3-compatible server (moto in server mode)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

import kernelcast.storage.dataset
from kernelcast.kernels.records import Candidate, HardwareSpec, Measurement
from tests.conftest import free_port
from kernelcast.storage.dataset import DataRoot, RetryPolicy, StorageError
from kernelcast.storage.schema import CANDIDATES, MEASUREMENTS, candidates_from_frame, measurements_from_frame

REPO = Path(__file__).resolve().parents[1]

H100 = HardwareSpec(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0",
                    sm_count=132, sm_clock_mhz=1980, mem_clock_mhz=2619, bus_width_bits=5120,
                    memory_gib=79.1, l2_mib=50.0, threads_per_sm=2048, driver_version="550.54.15",
                    cuda_version="12.4", torch_version="2.5.1", triton_version="3.1.0")


def candidate(i: int, op: str = "softmax") -> Candidate:
    return Candidate(op=op, backend="triton", source=f"def launch(x, y, **params):\n    pass  # variant {i}\n",
                     params={"BLOCK": 64 * (i + 1), "num_warps": 4, "eps": 1e-5}, template=f"{op}/online",
                     parent_id=None if i == 0 else "0123456789abcdef", origin="template",
                     created_at=datetime(2026, 1, 2, 3, 4, 5, 123_456 + i, tzinfo=timezone.utc))


def measured(c: Candidate, gpu_type: str = "h100") -> Measurement:
    return Measurement(candidate_id=c.candidate_id, op=c.op, gpu_type=gpu_type, status="ok", mode="gpu",
                       case_names=("4096x4096-fp16", "1x32000-fp32"), runtime_us_median=(81.25, 9.5),
                       runtime_us_iqr=(0.75, 0.125), repetitions=(200, 1000), reference_us_median=(102.0, 12.0),
                       speedup=1.2597, compile_seconds=1.5, gpu_seconds=0.42, wall_seconds=3.0,
                       hardware=dataclasses.replace(H100, gpu_type=gpu_type), replayed=False,
                       measured_at=datetime(2026, 1, 2, 4, 0, 0, 7, tzinfo=timezone.utc))


def failed_without_hardware(c: Candidate) -> Measurement:
    return Measurement(candidate_id=c.candidate_id, op=c.op, gpu_type="interpreter", status="compile_error",
                       mode="interpreter", error="SyntaxError: invalid syntax (line 3)", speedup=None,
                       hardware=None, replayed=True,
                       measured_at=datetime(2026, 1, 2, 5, 0, 0, tzinfo=timezone.utc))


def visible_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.parquet") if not p.name.startswith((".", "_")))


@pytest.fixture
def root(tmp_path: Path) -> DataRoot:
    return DataRoot(str(tmp_path / "data"))


# ---- schema --------------------------------------------------------------------------------


def test_schema_columns_map_one_to_one_to_record_fields():
    # source_sha256: where a source moved into the sources table (storage/sources.py); read back as ``source``
    assert set(CANDIDATES.schema.names) == {f.name for f in dataclasses.fields(Candidate)} | {"candidate_id",
                                                                                           "source_sha256"}
    hardware = {f.name for f in dataclasses.fields(HardwareSpec)}
    measurement = {f.name for f in dataclasses.fields(Measurement)} - {"hardware"}
    assert set(MEASUREMENTS.schema.names) == measurement | hardware | {"peak_bandwidth_gbps"}
    assert len(MEASUREMENTS.schema.names) == len(set(MEASUREMENTS.schema.names))


# ---- local data root -----------------------------------------------------------------------


def test_candidates_round_trip_exactly(root: DataRoot):
    written = [candidate(i) for i in range(3)] + [candidate(0, op="layernorm")]
    assert root.write_candidates(written) == 4
    back = candidates_from_frame(root.read_candidates())
    key = lambda c: c.candidate_id  # noqa: E731
    assert sorted(back, key=key) == sorted(written, key=key)
    assert sorted((c.candidate_id, c.created_at) for c in back) == sorted((c.candidate_id, c.created_at) for c in written)


def test_measurements_round_trip_exactly_including_missing_hardware(root: DataRoot):
    cands = [candidate(i) for i in range(3)]
    written = [measured(cands[0]), measured(cands[1], gpu_type="h200"), failed_without_hardware(cands[2])]
    assert root.write_measurements(written) == 3
    back = measurements_from_frame(root.read_measurements())
    key = lambda m: (m.candidate_id, m.gpu_type)  # noqa: E731
    assert sorted(back, key=key) == sorted(written, key=key)
    assert root.read_measurements(gpu_type="interpreter")["peak_bandwidth_gbps"].isna().all()


def test_reads_filter_by_partition(root: DataRoot):
    root.write_candidates([candidate(0), candidate(1), candidate(0, op="layernorm")])
    root.write_measurements([measured(candidate(0)), measured(candidate(1), gpu_type="h200")])
    assert set(root.read_candidates(op="layernorm")["op"]) == {"layernorm"}
    assert len(root.read_candidates(op="softmax")) == 2
    assert list(root.read_measurements(op="softmax", gpu_type="h200")["candidate_id"]) == [candidate(1).candidate_id]
    assert root.read_measurements(op="layernorm").empty


def test_writing_the_same_batch_twice_stores_each_row_once(root: DataRoot, tmp_path: Path):
    cands = [candidate(i) for i in range(3)]
    for _ in range(2):
        root.write_candidates(cands)
        root.write_measurements([measured(c) for c in cands])
    assert len(root.read_candidates()) == 3
    assert len(root.read_measurements()) == 3
    assert len(visible_files(tmp_path / "data")) == 2  # one file per table partition, not per write
    assert root.write_candidates(cands) == 0
    assert root.write_measurements([measured(c) for c in cands]) == 0


def test_only_rows_not_yet_stored_are_written(root: DataRoot):
    root.write_candidates([candidate(0), candidate(1)])
    assert root.write_candidates([candidate(1), candidate(2), candidate(3)]) == 2
    assert sorted(root.read_candidates()["candidate_id"]) == sorted(candidate(i).candidate_id for i in range(4))


def test_duplicate_keys_within_one_batch_are_written_once(root: DataRoot):
    assert root.write_candidates([candidate(0), candidate(0), candidate(1)]) == 2
    assert len(pd.read_parquet(root.path + "/candidates")) == 2


def test_same_key_on_another_gpu_type_is_a_new_row(root: DataRoot):
    c = candidate(0)
    assert root.write_measurements([measured(c, "h100")]) == 1
    assert root.write_measurements([measured(c, "h100"), measured(c, "h200")]) == 1
    assert root.measured_ids("softmax", "h100") == root.measured_ids("softmax", "h200") == {c.candidate_id}
    assert root.measured_ids("softmax", "a100") == set()


def test_layout_is_hive_partitioned_and_readable_by_pandas_and_pyarrow(root: DataRoot, tmp_path: Path):
    root.write_candidates([candidate(0), candidate(0, op="layernorm")])
    root.write_measurements([measured(candidate(0)), measured(candidate(1), gpu_type="h200")])
    data = tmp_path / "data"
    layout = [str(p.relative_to(data).parent) for p in visible_files(data)]
    assert layout == ["candidates/op=layernorm", "candidates/op=softmax",
                      "measurements/op=softmax/gpu_type=h100", "measurements/op=softmax/gpu_type=h200"]
    assert all(re.fullmatch(r"part-[0-9a-f]{16}\.parquet", p.name) for p in visible_files(data))

    frame = pd.read_parquet(data / "measurements")
    assert sorted(frame["gpu_type"].astype(str)) == ["h100", "h200"]
    assert sorted(frame["candidate_id"]) == sorted([candidate(0).candidate_id, candidate(1).candidate_id])
    table = ds.dataset(data / "candidates", partitioning="hive").to_table()
    assert sorted(table["op"].to_pylist()) == ["layernorm", "softmax"]
    assert table.num_rows == 2


CRASHING_WRITER = """
import os, signal, sys
import kernelcast.storage.dataset
from kernelcast.kernels.records import Candidate

def die(src, dst):  # the temp file is complete; the process dies before renaming it
    os.kill(os.getpid(), signal.SIGKILL)

kernelcast.storage.dataset.os.replace = die
kernelcast.storage.dataset.DataRoot(sys.argv[1]).write_candidates([Candidate(op="softmax", backend="triton", source="x")])
"""


def test_writer_killed_mid_write_leaves_no_visible_file(root: DataRoot, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.run([sys.executable, "-c", CRASHING_WRITER, root.uri], env=env, capture_output=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    partition = tmp_path / "data" / "candidates" / "op=softmax"
    assert [p.name.startswith(".") for p in partition.iterdir()] == [True]  # only the abandoned temp file
    assert root.read_candidates().empty
    assert pd.read_parquet(tmp_path / "data" / "candidates").empty
    assert root.write_candidates([Candidate(op="softmax", backend="triton", source="x")]) == 1
    assert len(root.read_candidates()) == 1


def test_write_failing_after_the_temp_file_leaves_nothing_behind(root: DataRoot, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    def refuse(src, dst):
        raise OSError("No space left on device")

    monkeypatch.setattr(kernelcast.storage.dataset.os, "replace", refuse)
    with pytest.raises(StorageError, match="candidates/op=softmax/part-"):
        root.write_candidates([candidate(0)])
    monkeypatch.undo()
    assert list((tmp_path / "data" / "candidates" / "op=softmax").iterdir()) == []
    assert root.read_candidates().empty


def test_readers_drop_duplicate_keys_left_in_several_files(root: DataRoot, tmp_path: Path):
    root.write_candidates([candidate(0), candidate(1)])
    [only] = visible_files(tmp_path / "data")
    shutil.copy(only, only.with_name("part-racing-writer.parquet"))  # as if two writers raced
    assert len(pd.read_parquet(tmp_path / "data" / "candidates")) == 4
    assert len(root.read_candidates()) == 2


def test_readers_keep_every_distinct_key_when_duplicates_come_first(root: DataRoot, tmp_path: Path):
    root.write_candidates([candidate(0), candidate(1)])
    [only] = visible_files(tmp_path / "data")
    # Two copies named to be read before any later file, as if two writers raced.
    shutil.copy(only, only.with_name("part-0a-racing-writer.parquet"))
    only.rename(only.with_name("part-0b-racing-writer.parquet"))
    root.write_candidates([candidate(2), candidate(3, op="layernorm")])
    expected = {candidate(i).candidate_id for i in range(3)} | {candidate(3, op="layernorm").candidate_id}
    assert set(root.read_candidates()["candidate_id"]) == expected
    assert len(root.read_candidates()) == 4


def test_compaction_leaves_one_file_per_partition_with_every_row_once(root: DataRoot, tmp_path: Path):
    for batch in ([0, 1], [2], [3, 4, 5]):
        root.write_candidates([candidate(i) for i in batch])
    root.write_candidates([candidate(0, op="layernorm")])
    first = visible_files(tmp_path / "data" / "candidates" / "op=softmax")[0]
    shutil.copy(first, first.with_name("part-racing-writer.parquet"))
    expected = sorted([candidate(i).candidate_id for i in range(6)] + [candidate(0, op="layernorm").candidate_id])

    assert root.compact("candidates") == 1  # layernorm already had a single file
    files = visible_files(tmp_path / "data" / "candidates")
    assert [p.parent.name for p in files] == ["op=layernorm", "op=softmax"]
    assert sorted(pd.read_parquet(tmp_path / "data" / "candidates")["candidate_id"]) == expected
    by_id = lambda c: c.candidate_id  # noqa: E731
    compacted = candidates_from_frame(root.read_candidates(op="softmax"))
    assert sorted(compacted, key=by_id) == sorted([candidate(i) for i in range(6)], key=by_id)
    assert root.compact("candidates") == 0


def test_bad_partition_value_is_rejected_by_name(root: DataRoot, tmp_path: Path):
    with pytest.raises(ValueError, match=r"'Soft Max'.*'op'"):
        root.write_candidates([candidate(0), candidate(1, op="Soft Max")])
    assert not (tmp_path / "data").exists()  # nothing of the batch was written
    with pytest.raises(ValueError, match=r"'\.\./h100'"):
        root.read_measurements(gpu_type="../h100")


def test_unknown_table_is_rejected_by_name(root: DataRoot):
    with pytest.raises(ValueError, match="unknown table 'forecast'; known: candidates, measurements"):
        root.read("forecast")


# ---- S3 data root (a real S3-compatible server) ----------------------------------------------


def test_s3_round_trip_of_both_tables(s3_root: DataRoot):
    cands = [candidate(i) for i in range(3)] + [candidate(0, op="layernorm")]
    measurements = [measured(cands[0]), measured(cands[1], gpu_type="h200"), failed_without_hardware(cands[2])]
    assert s3_root.write_candidates(cands) == 4
    assert s3_root.write_measurements(measurements) == 3
    by_id = lambda r: r.candidate_id  # noqa: E731
    assert sorted(candidates_from_frame(s3_root.read_candidates()), key=by_id) == sorted(cands, key=by_id)
    assert sorted(measurements_from_frame(s3_root.read_measurements()), key=by_id) == sorted(measurements, key=by_id)
    assert s3_root.fs.ls("kernelcast/runs/test/measurements/op=softmax/gpu_type=h200")[0].endswith(".parquet")


def test_s3_writing_the_same_batch_twice_stores_each_row_once(s3_root: DataRoot):
    cands = [candidate(i) for i in range(3)]
    assert s3_root.write_candidates(cands) == 3
    assert s3_root.write_candidates(cands + [candidate(3)]) == 1
    assert s3_root.write_measurements([measured(c) for c in cands]) == 3
    assert s3_root.write_measurements([measured(c) for c in cands]) == 0
    assert len(s3_root.read_candidates()) == 4
    assert s3_root.measured_ids("softmax", "h100") == {c.candidate_id for c in cands}


def test_s3_compaction_keeps_every_row_once(s3_root: DataRoot):
    for i in range(3):
        s3_root.write_candidates([candidate(i)])
    assert s3_root.compact("candidates") == 1
    assert len(s3_root.fs.ls("kernelcast/runs/test/candidates/op=softmax")) == 1
    assert sorted(s3_root.read_candidates()["candidate_id"]) == sorted(candidate(i).candidate_id for i in range(3))


def test_unreachable_s3_endpoint_error_names_the_uri(aws_credentials: None):
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
               "config_kwargs": {"retries": {"max_attempts": 1}}}
    root = DataRoot("s3://kernelcast/unreachable", storage_options=options,
                    retry=RetryPolicy(budget_s=1.0, backoff_s=0.1))
    with pytest.raises(StorageError, match=r"s3://kernelcast/unreachable/candidates.*retry budget 1 s"):
        root.read_candidates()
    assert root.retried >= 1  # how many fit in the budget depends on how long each refused attempt takes


class _VanishingFiles(DataRoot):
    """A data root whose listings name a file that is gone by the time it is read, for the first
    ``stale`` listings: what a reader sees while a compactor runs back to back (test-only)."""

    stale = 0

    def _files(self, spec, where):
        files = super()._files(spec, where)
        if self.stale > 0:
            self.stale -= 1
            return files + [files[0].replace("part-", "part-gone-")]
        return files


def test_a_reader_lists_again_through_many_files_vanishing_under_it(tmp_path):
    root = _VanishingFiles(str(tmp_path / "data"))
    root.write_measurements([Measurement(f"c{i}", "softmax", "h100", "ok", "replay", speedup=1.0 + i)
                             for i in range(5)])
    root.stale = 7  # more than a handful of lost races in a row
    assert sorted(root.read("measurements")["candidate_id"]) == [f"c{i}" for i in range(5)]
    root.stale = 1000  # a file that never stops vanishing is an error naming the root
    with pytest.raises(StorageError, match="cannot read .*measurements: FileNotFoundError"):
        root.read("measurements")


def test_a_forecasts_failure_probability_round_trips_and_older_stores_read_it_as_not_forecast(tmp_path):
    import math

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import FORECASTS, forecasts_from_frame
    from kernelcast.surrogate.forecast import Forecast

    bins = (0.1, 0.1, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1)
    said = Forecast("c1", "a", "source", "v1", bins, failure_probability=0.7)
    silent = Forecast("c2", "a", "source", "v1", bins)
    assert math.isnan(silent.failure_probability) and silent.run_probability == 1.0
    assert said.run_probability == pytest.approx(0.3) and said.with_failure(0.2).failure_probability == 0.2
    with pytest.raises(ValueError, match="failure probability"):
        Forecast("c3", "a", "source", "v1", bins, failure_probability=1.5)
    root = DataRoot(str(tmp_path / "new"))
    root.write_forecasts([said, silent], run_id="r", generation=0, op="softmax", gpu_type="h100")
    back = {f.candidate_id: f for f in forecasts_from_frame(root.read("forecasts", op="softmax"))}
    assert back["c1"].failure_probability == pytest.approx(0.7) and math.isnan(back["c2"].failure_probability)
    # a store written before the column existed: its file lacks it, and it reads as null (not forecast)
    old = DataRoot(str(tmp_path / "old"))
    old.write_forecasts([silent], run_id="r", generation=0, op="softmax", gpu_type="h100")
    for f in (tmp_path / "old").rglob("*.parquet"):
        table = pq.read_table(f)
        assert "failure_probability" in table.column_names
        pq.write_table(table.drop(["failure_probability"]), f)
    frame = old.read("forecasts", op="softmax")
    assert frame["failure_probability"].isna().all()
    assert math.isnan(forecasts_from_frame(frame)[0].failure_probability)
    assert pa.types.is_floating(FORECASTS.schema.field("failure_probability").type)
