"""Schedules that fire: ``kernelcast serve`` against a real Prefect server whose scheduler makes the runs.

Each test runs ``kernelcast serve`` as a subprocess with a per-minute cron, as a user would leave it
running overnight, and reads what happened back through Prefect's API, the data root and the MLflow
store: the nightly search (replayed from the committed pool) and the backfill fire and complete; the
flow run page holds the run's artifacts; missed runs are caught up once; a night killed mid-search
(every process of it SIGKILLed, as a machine restart would) is continued by the next scheduled run
and ends with the archive of an unbroken run, no measurement taken twice. A cron fires on the
minute, so each test waits up to a minute for its first run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[1]
# Replayed from the committed corpus of model-written children, some of which fail: 6 measurements, 2 failed.
FAST = {"gpu_type": "h100", "budget": 6, "generations": 2, "generator": "replay", "surrogate": "roofline",
        "backend": "replay"}
DRILL = {"gpu_type": "h100", "budget": 24, "generations": 6, "children": 32, "surrogate": "roofline", "seed": 7,
         "backend": "replay"}


def _env(tmp_path: Path, api_url: str | None) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": str(REPO),
           "KERNELCAST_GPU_LOCK": str(tmp_path / "gpu.lock"), "OMP_NUM_THREADS": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def _config(tmp_path: Path, settings: dict, name: str) -> Path:
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(settings))
    return path


@contextlib.contextmanager
def serving(tmp_path: Path, data: Path, config: Path, api_url: str | None = None, port: int | None = None,
            extra: tuple[str, ...] = (), log_name: str = "serve.log"):
    """``kernelcast serve --cron '* * * * *' --ops softmax`` running in a session of its own; yields the
    process and its log path; stopped with SIGTERM at the end unless already gone (Prefect's runner shuts down
    gracefully on it; SIGINT is ignored by a process a non-interactive shell started in the background)."""
    log = tmp_path / log_name
    command = [sys.executable, "-m", "kernelcast.flows.cli", "serve", "--cron", "* * * * *", "--ops", "softmax",
               "--config", str(config), "--data", str(data), *extra]
    if port:
        command += ["--port", str(port)]
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=tmp_path, env=_env(tmp_path, api_url), stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process, log
    finally:
        if process.poll() is None:
            _let_flow_runs_exit(process)
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_everything(process)


def _let_flow_runs_exit(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait (up to ``timeout``) until no flow run's process runs below ``process``, and a moment more. Prefect's
    runner, stopped while it still tracks a flow run's process that has reported its state but not yet exited,
    marks that run cancelled (seen in CI under load: a completed search ended CANCELLED at the test's teardown)."""
    def flow_runs() -> list[int]:
        found = []
        for pid in _descendants(process.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"prefect.engine" in f.read():
                        found.append(pid)
            except OSError:
                continue
        return found

    deadline = time.monotonic() + timeout
    while process.poll() is None and flow_runs() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2.0)  # the runner notes the exit after it


def kill_everything(process: subprocess.Popen) -> None:
    """SIGKILL a process and every process it started, wherever their sessions: what a machine restart does."""
    family = [process.pid, *_descendants(process.pid)]  # found first, while every parent is alive
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, read from /proc (each one's parent id)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _wait_for(what: str, check, timeout: float, log: Path | None = None, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s\n{tail}")


@contextlib.contextmanager
def client_of(api_url: str):
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        yield client


def runs_of(api_url: str, deployment: str, flow: str = "kernel-search") -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with client_of(api_url) as client:
        return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
                                     deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment])),
                                     sort=FlowRunSort.EXPECTED_START_TIME_ASC)


def ended(runs, state: str = "COMPLETED") -> list:
    return [r for r in runs if r.state_type is not None and r.state_type.value == state]


def run_tag(flow_run) -> str:
    return next((t[4:] for t in flow_run.tags if t.startswith("run:")), "")


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A real Prefect server with its scheduler (``prefect server start``), as PREFECT_API_URL would name."""
    from kernelcast.flows.server import answers

    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**_env(home, None), "PREFECT_SERVER_UI_API_URL": api_url}
    with open(home / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        _wait_for("the Prefect server's start", lambda: answers(api_url, timeout=2.0), 180,
                  home / "server.log")
        yield api_url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def _seed_row_sum_h100(data: Path) -> set[str]:
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
    from kernelcast.tasks.config import PACKAGED_POOL

    pool, root = DataRoot(PACKAGED_POOL), DataRoot(str(data))
    h100 = pool.read_measurements(op="row_sum", gpu_type="h100").head(5)
    root.write_candidates(candidates_from_frame(pool.read_candidates("row_sum").query(
        "candidate_id in @h100.candidate_id")))
    root.write_measurements(measurements_from_frame(h100))
    return set(h100["candidate_id"])


def test_serve_without_a_server_starts_one_whose_scheduler_fires_the_nightly_search_and_the_backfill(tmp_path):
    from mlflow.tracking import MlflowClient

    from kernelcast.storage.dataset import DataRoot

    data = tmp_path / "data"
    seeded = _seed_row_sum_h100(data)  # what the backfill has to measure on h200
    port = free_port()
    with serving(tmp_path, data, _config(tmp_path, FAST, "fast.yaml"), port=port,
                 extra=("--backfill-cron", "* * * * *", "--backfill-backend", "replay")) as (process, log):
        api_url = f"http://127.0.0.1:{port}/api"
        _wait_for("the UI line", lambda: f"Prefect UI: http://127.0.0.1:{port}" in log.read_text(), 180, log)
        search = _wait_for("a completed nightly search", lambda: ended(runs_of(api_url, "nightly-softmax")), 200,
                           log, every=2)[0]
        backfill = _wait_for("a completed backfill", lambda: ended(runs_of(api_url, "backfill", "backfill")), 60,
                             log, every=2)[0]
        assert "local server started here" in log.read_text()
        with client_of(api_url) as client:
            artifacts = _artifacts(client, search.id)
            task_runs = _task_runs(client, search.id, failed=2)
            deployment = client.read_deployment(search.deployment_id)
    run_id = run_tag(search)
    root = DataRoot(str(data))
    generations = root.read_run_rows("generations", run_id, op="softmax")
    measured = root.read_measurements(op="softmax", gpu_type="h100")
    decided = root.read_run_rows("decisions", run_id, op="softmax")
    h200 = root.read_measurements(op="row_sum", gpu_type="h200")
    mlflow = MlflowClient(f"sqlite:///{data / 'mlflow.db'}")
    tracked = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()],
                                 filter_string=f"tags.`kernelcast.run_id` = '{run_id}'")
    print(f"\nflow run {search.id} '{search.name}': {search.state_type.value}, scheduled "
          f"{search.expected_start_time}, started {search.start_time}, ended {search.end_time}, tags {search.tags}")
    print(f"backfill flow run {backfill.id}: {backfill.state_type.value}, scheduled {backfill.expected_start_time}, "
          f"ended {backfill.end_time}; h200 rows {len(h200)}")
    print(f"data: {len(generations)} generations, {len(decided)} decisions, {len(measured)} softmax measurements "
          f"on h100, MLflow run {tracked[0].info.run_id} {tracked[0].info.status}")
    print("artifacts: " + ", ".join(f"{a.type} {a.key}" for a in artifacts))

    assert deployment.schedules and deployment.schedules[0].active
    assert search.auto_scheduled and {"nightly", "softmax"} <= set(search.tags)
    assert search.name.startswith(f"nightly-softmax {search.expected_start_time:%Y-%m-%d %H:%M} UTC: search softmax")
    assert run_id == f"nightly-softmax-{search.expected_start_time:%Y%m%d-%H%M}"
    assert sorted(generations["generation"]) == [0, 1] and generations["measured"].sum() == 6
    assert search.state_type.value == "COMPLETED"
    assert set(decided.loc[decided["decision"] == "measure", "candidate_id"]) <= set(measured["candidate_id"])
    assert len(tracked) == 1 and tracked[0].info.status == "FINISHED"
    assert {"best_kernel.py", "search_curve.png"} <= {a.path for a in mlflow.list_artifacts(tracked[0].info.run_id)}
    assert backfill.auto_scheduled and set(h200["candidate_id"]) == seeded
    kinds = {(a.type, a.key) for a in artifacts}
    assert {("progress", "softmax-search-budget"), ("table", "softmax-best-kernels"),
            ("markdown", "softmax-search")} <= kinds
    progress = [a for a in artifacts if a.type == "progress"]
    assert len(progress) == 1 and float(progress[0].data) == 100.0  # one progress artifact, updated in place
    finished = [a for a in artifacts if a.key == "softmax-search" and "(finished)" in str(a.data)]
    assert finished and "Forecaster accuracy so far" in finished[0].data
    assert tracked[0].info.run_id in finished[0].data and "search_curve.png" in finished[0].data
    tables = [a for a in artifacts if a.type == "table"]
    assert len(tables) == 1 and "(2 generations)" in tables[0].description  # one table, updated in place
    assert {"measured speedup", "forecast speedup", "how sure", "decision"} <= set(_rows(tables[0])[0])
    assert len([a for a in artifacts if a.type == "markdown"]) == 1
    failed = [t for t in task_runs if t.state_type.value == "FAILED"]
    print("failed tasks: " + "; ".join(f"{t.name}: {t.state.message[:90]}" for t in failed))
    assert len(failed) == generations["failed"].sum() == 2
    assert all(t.name.split()[0] in ("compile_error", "runtime_error", "incorrect", "timeout", "crashed")
               and "MeasurementFailed" in t.state.message for t in failed)
    assert f"GPU lock: {tmp_path / 'gpu.lock'}" in log.read_text()  # every served run takes the one lock


def _artifacts(client, flow_run_id) -> list:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.client.schemas.sorting import ArtifactSort

    return client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
        any_=[flow_run_id])), sort=ArtifactSort.CREATED_DESC)


def _task_runs(client, flow_run_id, failed: int = 0, timeout: float = 30.0) -> list:
    """A flow run's task runs, once ``failed`` of them are recorded as failed or the timeout passes (task run
    states reach the API as events, a moment after the flow run ends)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    while True:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        if sum(r.state_type.value == "FAILED" for r in runs) >= failed or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def _rows(table_artifact) -> list[dict]:
    import json

    data = table_artifact.data
    return json.loads(data) if isinstance(data, str) else data


def test_serve_refuses_in_one_line_when_the_configured_server_does_not_answer(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/api"
    done = subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", "serve", "--ops", "softmax",
                           "--data", str(tmp_path / "data")], cwd=tmp_path, env=_env(tmp_path, dead),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"kernelcast serve: error: PREFECT_API_URL={dead} does not answer; start that "
                                   "server (`prefect server start`) or unset PREFECT_API_URL to have a local one "
                                   "started")


def test_missed_runs_are_caught_up_once_the_latest_searches_and_the_older_are_skipped(prefect_api, tmp_path):
    from prefect.states import Scheduled

    from kernelcast.flows.deployments import nightly_parameters
    from kernelcast.flows.search import kernel_search
    from kernelcast.storage.dataset import DataRoot

    data = tmp_path / "data"
    # The deployment as serve registers it, with a schedule that does not fire during the test; three of its
    # nights were due while nothing served it.
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_api}):
        deployment_id = kernel_search.to_deployment(
            name="nightly-softmax", cron="0 3 1 1 *", tags=["nightly", "softmax"],
            parameters=nightly_parameters("softmax", str(data), FAST)).apply()
    now = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)
    missed = []
    with client_of(prefect_api) as client:
        for minutes in (3, 2, 1):
            missed.append(client.create_flow_run_from_deployment(
                deployment_id, state=Scheduled(scheduled_time=now - dt.timedelta(minutes=minutes))).id)
    with serving(tmp_path, data, _config(tmp_path, FAST, "fast.yaml"), api_url=prefect_api,
                 extra=("--cron", "0 3 1 1 *")) as (process, log):
        _wait_for("the three missed runs to end", lambda: len(
            [r for r in runs_of(prefect_api, "nightly-softmax") if r.id in missed and r.state_type.value
             in ("COMPLETED", "FAILED", "CRASHED")]) == 3, 240, log, every=2)
    runs = {r.id: r for r in runs_of(prefect_api, "nightly-softmax")}
    oldest, older, latest = (runs[i] for i in missed)
    for skipped in (oldest, older):
        print(f"\n{skipped.id} scheduled {skipped.expected_start_time}: {skipped.state_type.value}: "
              f"{skipped.state.message}")
        assert skipped.state_type.value == "COMPLETED" and skipped.state.message.startswith("skipped: a later run")
        assert not any(t.startswith("run:") for t in skipped.tags)
    print(f"{latest.id} scheduled {latest.expected_start_time}: {latest.state_type.value}, run {run_tag(latest)}")
    assert latest.state_type.value == "COMPLETED" and run_tag(latest) == f"nightly-softmax-{now - dt.timedelta(minutes=1):%Y%m%d-%H%M}"
    runs_table = DataRoot(str(data)).read("runs")
    assert list(runs_table["run_id"]) == [run_tag(latest)]  # one search for the three nights


def test_a_night_killed_mid_search_is_continued_by_the_next_scheduled_run_measuring_nothing_twice(prefect_api,
                                                                                                   tmp_path):
    from benchmarks.drills import compare, physical_rows, reference_run
    from kernelcast.storage.dataset import DataRoot

    data = tmp_path / "data"
    config = _config(tmp_path, DRILL, "drill.yaml")
    generations_of = lambda run_id: DataRoot(str(data)).read_run_rows("generations", run_id, op="softmax")  # noqa: E731

    def forecast_generations(run_id: str) -> set[int]:
        if not (data / "forecasts").exists():
            return set()
        return set(DataRoot(str(data)).read_run_rows("forecasts", run_id, op="softmax")["generation"])
    since = dt.datetime.now(dt.timezone.utc)  # the server's earlier runs of nightly-softmax are other tests'
    with serving(tmp_path, data, config, api_url=prefect_api, log_name="serve-1.log") as (first, log):
        started = _wait_for("the first scheduled search to start", lambda: [
            r for r in runs_of(prefect_api, "nightly-softmax") if any(t.startswith("run:") for t in r.tags)
            and r.expected_start_time >= since], 200, log, every=0.5)[0]
        run_id = run_tag(started)
        # Killed as soon as a generation after the first has forecast: inside it, before its commit (the generation
        # row written last), unless that generation outran the poll.
        _wait_for("a forecast of its second generation", lambda: (forecast_generations(run_id) or {0}) - {0}, 120,
                  log, every=0.05)
        kill_everything(first)  # the machine restarts mid-search
    before = generations_of(run_id)
    forecast_before = forecast_generations(run_id)
    measured_before = physical_rows(data, "measurements")[0]
    inside = sorted(forecast_before - set(before["generation"]))
    assert 1 <= len(before) < DRILL["generations"], "the kill came after the search had finished"
    with client_of(prefect_api) as client:
        assert client.read_flow_run(started.id).state_type.value == "RUNNING"  # as the dead process left it

    with serving(tmp_path, data, config, api_url=prefect_api, log_name="serve-2.log") as (second, log):
        continued = _wait_for("a later run to finish the interrupted search", lambda: [
            r for r in ended(runs_of(prefect_api, "nightly-softmax")) if r.id != started.id and run_tag(r) == run_id],
            240, log, every=1)[0]
        kill_everything(second)  # before a later minute starts another search in the data root
    with client_of(prefect_api) as client:
        crashed = client.read_flow_run(started.id)
    assert crashed.state_type.value == "CRASHED"
    assert "continuing run " + run_id in (tmp_path / "serve-2.log").read_text()

    (tmp_path / "reference").mkdir()
    reference, _, result = reference_run(tmp_path / "reference", {**DRILL, "op": "softmax", "run_id": run_id})
    problems, counts = compare(reference, data, {**DRILL, "op": "softmax", "run_id": run_id})
    after = generations_of(run_id)
    print(f"\nkilled flow run {started.id} ({run_id}) with {len(before)} of {DRILL['generations']} generations "
          f"committed, inside generation {inside or 'none (between two)'} (forecast, not committed), "
          f"{measured_before['candidate_id'].nunique()} candidates measured; state now {crashed.state_type.value}")
    print(f"continued by flow run {continued.id} scheduled {continued.expected_start_time}: "
          f"{continued.state_type.value}, {len(after)} generations, reused {int(after['reused'].sum())}")
    print(f"against an unbroken run: {counts}, problems {problems}")
    assert problems == [], problems
    assert counts["duplicated"] == 0 and counts["missing"] == 0
    assert after["measured"].sum() == result["budget_used"] == DRILL["budget"]


def test_a_retried_run_keeps_its_run_id_and_a_new_one_is_named_for_its_schedule(prefect_api, tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Scheduled

    from kernelcast.flows.nightly import plan_night, run_id_for
    from kernelcast.flows.search import kernel_search

    with temporary_settings({PREFECT_API_URL: prefect_api}):
        deployment_id = kernel_search.to_deployment(name="nightly-retried", parameters={"op": "softmax"}).apply()
    at = dt.datetime(2026, 12, 6, 2, 0, tzinfo=dt.timezone.utc)
    with client_of(prefect_api) as client:
        fresh = client.create_flow_run_from_deployment(deployment_id, state=Scheduled(scheduled_time=at))
        retried = client.create_flow_run_from_deployment(deployment_id, tags=["run:nightly-retried-20261205-0200"],
                                                         state=Scheduled(scheduled_time=at))
        assert plan_night(client, retried, "nightly-retried", now=at).run_id == "nightly-retried-20261205-0200"
        assert plan_night(client, fresh, "nightly-retried", now=at).run_id == "nightly-retried-20261206-0200"
    assert run_id_for("nightly-cross-entropy", at) == "nightly-cross-entropy-20261206-0200"
