"""Prefect flows against a real temporary Prefect server, and the ``kernelcast search`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _task_run_names(flow_run_id, expected=(), timeout=60.0):
    """The names of a flow run's task runs, once every expected name is recorded or the timeout passes.

    Prefect reports a task run's states as events that its server writes asynchronously, so the last task of a
    flow that has returned may reach the API a moment later; the caller's assertions decide what was missing."""
    import time

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            names = {t.name for t in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))}
            if set(expected) <= names or time.monotonic() > deadline:
                return names
            time.sleep(0.5)


def test_kernel_search_flow_runs_each_step_as_a_named_task(prefect_server, tmp_path):
    from prefect import get_client

    from kernelcast.flows.search import kernel_search

    state = kernel_search(op="softmax", gpu_type="h100", budget=6, generations=2, children=8, surrogate="roofline",
                          data=str(tmp_path / "data"), backend="replay",
                          tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", return_state=True)
    assert state.is_completed()
    out = state.result()
    assert out["budget_used"] == 6 and out["best_speedup"] > 0
    steps = {f"{step} g{g}" for step in ("generate", "forecast", "select", "measure", "update") for g in (0, 1)}
    names = _task_run_names(state.state_details.flow_run_id, steps)
    assert steps <= names
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
    assert flow_run.name == "search softmax on h100, roofline, b6, seed 0"


def test_rerunning_a_search_flow_replays_finished_generations_from_the_journal(prefect_server, tmp_path):
    from kernelcast.flows.search import kernel_search

    args = dict(op="softmax", gpu_type="h100", budget=4, generations=2, children=6, surrogate="roofline",
                run_id="again", data=str(tmp_path / "data"), backend="replay",
                tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    first = kernel_search(**args)
    state = kernel_search(**args, return_state=True)
    replayed = {"replay g0 from the journal", "replay g1 from the journal"}
    names = _task_run_names(state.state_details.flow_run_id, replayed)
    assert replayed <= names
    assert not any(n.startswith("measure") for n in names)
    assert state.result()["best_candidate_id"] == first["best_candidate_id"]


def test_backfill_flow_measures_on_the_target_type_only_what_it_lacks(prefect_server, tmp_path):
    from kernelcast.flows.search import backfill
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
    from kernelcast.tasks.config import PACKAGED_POOL

    pool, root = DataRoot(PACKAGED_POOL), DataRoot(str(tmp_path / "data"))
    h100 = pool.read_measurements(op="row_sum", gpu_type="h100").head(5)
    root.write_candidates(candidates_from_frame(pool.read_candidates("row_sum").query("candidate_id in @h100.candidate_id")))
    root.write_measurements(measurements_from_frame(h100))
    out = backfill("h100", "h200", op="row_sum", data=root.uri, backend="replay")
    assert out["planned"] == 5 and out.get("ok") == 5
    h200 = root.read_measurements(op="row_sum", gpu_type="h200")
    assert set(h200["candidate_id"]) == set(h100["candidate_id"]) and h200["replayed"].all()
    again = backfill("h100", "h200", op="row_sum", data=root.uri, backend="replay")
    assert again["planned"] == 0 and again["already_measured"] == 5


def test_search_command_ends_with_where_to_look_and_keeps_everything_under_the_data_root(tmp_path):
    env = {**os.environ, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
           "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    elsewhere = tmp_path / "elsewhere"  # started from a folder of its own, as a scheduled worker would be
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", "search", "--op", "softmax", "--budget", "4",
                           "--generations", "2", "--children", "8", "--surrogate", "roofline",
                           "--data", str(tmp_path / "data")], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "best measured kernel:" in done.stdout
    assert f"data:   {tmp_path / 'data'}" in done.stdout
    assert f"MLflow: sqlite:///{tmp_path / 'data' / 'mlflow.db'}" in done.stdout and "Prefect" in done.stdout
    assert len(list((tmp_path / "data" / "mlartifacts").glob("*/artifacts/best_kernel.py"))) == 1
    assert list(elsewhere.iterdir()) == []


def test_search_command_rejects_a_zero_budget_before_starting_anything(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", "search", "--op", "softmax", "--budget", "0",
                           "--data", str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "budget must be a positive whole number, got 0" in done.stderr
    assert not (tmp_path / "data").exists()
