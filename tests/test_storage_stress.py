"""Storage under stress: concurrent writers and compaction on one partition, and an S3 outage in the middle of a search.

Writers, the compactor and the S3 server are real processes: the S3 server is moto in server
mode inside a process of its own, which stops listening on SIGUSR1 and listens again on
SIGUSR2 (moto keeps its objects in that process, so a restart loses nothing, like a real
S3 endpoint coming back).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kernelcast.storage.dataset import DataRoot, RetryPolicy, StorageError
from kernelcast.tasks.config import SearchConfig
from kernelcast.tasks.setup import open_search

REPO = Path(__file__).resolve().parents[1]
KEYS = 300  # distinct measurement keys over all writers
WRITERS = 4
SPAN = 120  # keys per writer; writer w covers [60 w, 60 w + 120), so neighbours overlap by half

WRITER = r"""
import json, os, random, sys, time
from datetime import datetime, timezone
from kernelcast.kernels.records import Measurement
from kernelcast.storage.dataset import DataRoot

root_uri, writer, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
when = datetime(2026, 1, 1, tzinfo=timezone.utc)
keys = list(range(60 * writer, 60 * writer + 120))
random.Random(writer).shuffle(keys)
rows = lambda ks: [Measurement(f"cand{k:04d}", "softmax", "h100", "ok", "replay", speedup=1 + k / 1000,
                               measured_at=when) for k in ks]
root = DataRoot(root_uri)
while not os.path.exists(go):
    time.sleep(0.001)
written = sum(root.write_measurements(rows(keys[i:i + 6])) for i in range(0, len(keys), 6))
print(json.dumps({"writer": writer, "written": written}))
"""

COMPACTOR = r"""
import json, os, sys, time
from kernelcast.storage.dataset import DataRoot

root_uri, go, stop = sys.argv[1], sys.argv[2], sys.argv[3]
root = DataRoot(root_uri)
while not os.path.exists(go):
    time.sleep(0.001)
merged = passes = 0
deadline = time.monotonic() + 300  # never outlive a test that forgot to stop it
while not os.path.exists(stop) and time.monotonic() < deadline:
    merged += root.compact("measurements")
    passes += 1
print(json.dumps({"merged": merged, "passes": passes}))
"""


def _python(script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen, timeout_s: float = 120) -> dict:
    out, err = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _physical_keys(folder: Path) -> list[str]:
    files = [p for p in folder.rglob("part-*.parquet")]
    return [k for p in files for k in pq.read_table(p, columns=["candidate_id"])["candidate_id"].to_pylist()]


def test_four_writers_and_a_compactor_racing_on_one_partition_lose_and_duplicate_nothing(tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    go, stop = tmp_path / "go", tmp_path / "stop"
    writers = [_python(WRITER, root.uri, str(w), str(go)) for w in range(WRITERS)]
    compactor = _python(COMPACTOR, root.uri, str(go), str(stop))
    try:
        time.sleep(3.0)  # every process imported and waiting: the writes start together
        go.touch()
        written = [_finish(p)["written"] for p in writers]
        stop.touch()
        compaction = _finish(compactor)
    finally:  # a failed writer must not leave the compactor looping
        stop.touch()
        for process in (*writers, compactor):
            if process.poll() is None:
                process.kill()
                process.wait()

    expected = {f"cand{k:04d}": 1 + k / 1000 for k in range(KEYS)}
    back = root.read_measurements(op="softmax", gpu_type="h100")
    assert back["candidate_id"].is_unique and len(back) == KEYS
    assert dict(zip(back["candidate_id"], back["speedup"])) == pytest.approx(expected)
    partition = tmp_path / "data" / "measurements" / "op=softmax" / "gpu_type=h100"
    physical = _physical_keys(partition)
    # Racing writers may both write a key neither saw stored; readers and compaction keep one.
    assert set(physical) == set(expected) and len(physical) >= KEYS and sum(written) >= KEYS
    print(f"\nwriters wrote {written} rows ({sum(written)} in all, {sum(written) - KEYS} written twice by racing "
          f"writers), compactor merged {compaction['merged']} times in {compaction['passes']} passes")

    root.compact("measurements")
    after = _physical_keys(partition)
    assert sorted(after) == sorted(expected) and len(list(partition.glob("part-*.parquet"))) == 1
    again = root.read_measurements(op="softmax", gpu_type="h100")
    assert dict(zip(again["candidate_id"], again["speedup"])) == pytest.approx(expected)


# ---- an S3 server that can be stopped and started again -------------------------------------

S3_SERVER = r"""
import signal, sys
from moto.server import ThreadedMotoServer

port = int(sys.argv[1])
server = None

def start(*_):
    global server
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("listening", flush=True)

def stop(*_):
    server.stop()
    print("stopped", flush=True)

signal.signal(signal.SIGUSR1, stop)
signal.signal(signal.SIGUSR2, start)
start()
while True:
    signal.pause()
"""


class S3Server:
    """moto in server mode, in its own process, on a loopback port."""

    def __init__(self, tmp_path: Path):
        from tests.conftest import free_port

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process = _python(S3_SERVER, str(self.port))
        self._expect("listening")
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket="kernelcast")

    def _expect(self, word: str) -> None:
        line = self.process.stdout.readline().strip()
        assert line == word, f"the S3 server said {line!r}, not {word!r}: {self.process.stderr.read()[-2000:]}"

    def stop(self) -> None:
        self.process.send_signal(signal.SIGUSR1)
        self._expect("stopped")

    def start(self) -> None:
        self.process.send_signal(signal.SIGUSR2)
        self._expect("listening")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()

    def options(self) -> dict:
        # One attempt per call inside botocore: the data root's own retry policy is what is tested.
        return {"client_kwargs": {"endpoint_url": self.endpoint},
                "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10}}


@pytest.fixture
def s3_server(tmp_path, aws_credentials):
    server = S3Server(tmp_path)
    yield server
    server.close()


def _config(**changes) -> SearchConfig:
    base = dict(op="softmax", gpu_type="h100", budget=24, generations=6, children=32, surrogate="roofline",
                seed=3, backend="replay", run_id="outage")
    return SearchConfig(**{**base, **changes})


def _stable(root: DataRoot) -> list[tuple]:
    rows = root.read_run_rows("generations", "outage", op="softmax").sort_values("generation")
    return list(rows[["generation", "measured", "trusted", "dropped", "budget_used", "best_candidate_id",
                      "best_speedup"]].itertuples(index=False, name=None))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same search on a local data root, never interrupted."""
    search = open_search(_config(data=str(tmp_path_factory.mktemp("reference") / "data")), track=False)
    try:
        result = search.run()
    finally:
        search.pool.close()
    root = search.root
    return result, _stable(root), set(root.read_measurements(op="softmax", gpu_type="h100")["candidate_id"])


def _generations(search, gens) -> None:
    for g in gens:
        search.run_generation(g)


def test_search_rides_out_a_30_s_s3_outage_mid_generation_and_loses_nothing(s3_server, reference):
    ref_result, ref_generations, ref_measured = reference
    cfg = _config(data="s3://kernelcast/outage", storage_options=s3_server.options(), storage_retry_s=90)
    search = open_search(cfg, track=False)
    try:
        _generations(search, range(2))
        before = set(search.root.read_measurements(op="softmax", gpu_type="h100")["candidate_id"])
        gen = search.plan(2)
        search.generate(gen)
        s3_server.stop()  # mid-generation: children written, forecasts, decisions and measurements not yet
        down = time.monotonic()
        restart = threading.Timer(30.0, s3_server.start)
        restart.start()
        search.forecast(gen)  # its write waits out the outage
        search.select(gen)
        search.measure(gen)
        search.update(gen)
        waited = time.monotonic() - down
        restart.join()
        _generations(search, range(3, cfg.generations))
        result = search.finish()
    finally:
        search.pool.close()
    assert waited >= 30.0 and search.root.retried >= 3
    assert result.budget_used == ref_result.budget_used and result.best_candidate_id == ref_result.best_candidate_id
    fresh = DataRoot(cfg.data, storage_options=s3_server.options())  # what is stored, read anew
    measured = set(fresh.read_measurements(op="softmax", gpu_type="h100")["candidate_id"])
    assert before <= measured and measured == ref_measured
    assert _stable(fresh) == ref_generations
    print(f"\nS3 down for 30 s mid-generation: the step waited {waited:.1f} s, {search.root.retried} retries "
          f"({search.root.retry_wait_s:.1f} s of backoff); search finished, {len(measured)} measurements, "
          f"best {result.best_candidate_id} as the unbroken run")


def test_an_outage_longer_than_the_retry_budget_fails_clearly_and_a_rerun_completes(s3_server, reference):
    _, ref_generations, ref_measured = reference
    cfg = _config(data="s3://kernelcast/short-budget", storage_options=s3_server.options(), storage_retry_s=3)
    search = open_search(cfg, track=False)
    try:
        _generations(search, range(2))
        kept = set(search.root.read_measurements(op="softmax", gpu_type="h100")["candidate_id"])
        s3_server.stop()
        t0 = time.monotonic()
        with pytest.raises(StorageError, match=r"s3://kernelcast/short-budget/.*retry budget 3 s"):
            search.run_generation(2)
        assert time.monotonic() - t0 < 20
    finally:
        search.pool.close()
    s3_server.start()
    fresh = DataRoot(cfg.data, storage_options=s3_server.options())
    assert kept <= set(fresh.read_measurements(op="softmax", gpu_type="h100")["candidate_id"])
    assert _stable(fresh) == ref_generations[:2]

    again = open_search(cfg, track=False)  # the same run id: resumes after generation 1
    try:
        result = again.run()
    finally:
        again.pool.close()
    assert result.budget_used == cfg.budget
    assert _stable(fresh) == ref_generations
    assert set(fresh.read_measurements(op="softmax", gpu_type="h100")["candidate_id"]) == ref_measured


def test_a_retry_policy_refuses_negative_or_zero_backoff_by_name():
    with pytest.raises(ValueError, match="budget_s"):
        RetryPolicy(budget_s=-1)
    with pytest.raises(ValueError, match="backoff_s must be positive"):
        RetryPolicy(budget_s=5, backoff_s=0)


def test_a_file_another_client_wrote_is_read_despite_an_older_cached_listing(s3_server):
    from kernelcast.kernels.records import Candidate

    def client() -> DataRoot:  # its own S3 filesystem object, with its own listing cache
        return DataRoot("s3://kernelcast/shared", storage_options={**s3_server.options(), "skip_instance_cache": True})

    reader, writer = client(), client()
    writer.write_candidates([Candidate(op="softmax", backend="triton", source="first")])
    assert len(reader.read_candidates(op="softmax")) == 1  # the reader now holds a listing of the partition
    writer.write_candidates([Candidate(op="softmax", backend="triton", source="second")])
    assert len(reader.read_candidates(op="softmax")) == 2


def test_only_failures_that_waiting_can_cure_are_transient():
    from botocore.exceptions import ClientError

    from kernelcast.storage.retry import is_transient

    def wrapped(cause: BaseException) -> OSError:
        try:
            raise cause
        except BaseException as inner:
            try:
                raise OSError("wrapped by a filesystem layer") from inner
            except OSError as outer:
                return outer

    def s3_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    assert is_transient(ConnectionRefusedError()) and is_transient(wrapped(ConnectionResetError()))
    assert is_transient(wrapped(TimeoutError())) and is_transient(s3_error("SlowDown", 503))
    assert is_transient(s3_error("InternalError", 500))
    assert not is_transient(FileNotFoundError("gone")) and not is_transient(wrapped(PermissionError()))
    assert not is_transient(s3_error("AccessDenied", 403)) and not is_transient(ValueError("corrupt footer"))


def test_compaction_sweeps_temp_files_a_killed_writer_left_once_they_are_stale(tmp_path):
    from kernelcast.kernels.records import Candidate

    root = DataRoot(str(tmp_path / "data"))
    root.write_candidates([Candidate(op="softmax", backend="triton", source="kept")])
    partition = tmp_path / "data" / "candidates" / "op=softmax"
    stale, fresh = partition / ".part-a.parquet.1.tmp", partition / ".part-b.parquet.2.tmp"
    stale.write_bytes(b"half a file")
    fresh.write_bytes(b"a write in progress")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    root.compact("candidates")
    assert not stale.exists() and fresh.exists()
    assert len(root.read_candidates(op="softmax")) == 1
