"""A search's MLflow artifacts live with its data: under the data root, local or s3://, wherever it was started.

Searches run on the replay backend with a real MLflow SQLite store; the S3 data root is a
moto server on loopback, and its objects are listed with boto3, as anyone reading the
bucket would see them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from kernelcast.storage.tracking import Tracker, default_tracking_uri
from kernelcast.tasks.config import SearchConfig
from kernelcast.tasks.setup import open_search

ARTIFACTS = {"best_kernel.py", "generations.csv", "search_curve.png"}


def config(data: str, **changes) -> SearchConfig:
    return SearchConfig(**{**dict(op="softmax", gpu_type="h100", budget=4, generations=2, children=8,
                                  surrogate="roofline", seed=1, data=data, backend="replay"), **changes})


def run(cfg: SearchConfig):
    search = open_search(cfg, track=True)
    try:
        return search, search.run()
    finally:
        search.pool.close()


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """The search starts from a folder of its own, as a scheduled worker's would be."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_a_search_started_elsewhere_keeps_its_artifacts_under_its_local_data_root(tmp_path, elsewhere):
    data = tmp_path / "data"
    search, result = run(config(str(data), run_id="local"))
    client = MlflowClient(search.tracker.uri)
    folder = data / "mlartifacts" / search.mlflow_run / "artifacts"
    assert ARTIFACTS <= {p.name for p in folder.iterdir()}
    assert (folder / "best_kernel.py").read_text().endswith(result.best_source)
    assert client.get_experiment_by_name("kernelcast").artifact_location == f"file://{data}/mlartifacts"
    assert ARTIFACTS <= {a.path for a in client.list_artifacts(search.mlflow_run)}  # MLflow reads them there
    assert list(elsewhere.iterdir()) == []  # nothing left in the folder it was started from


def test_a_search_on_s3_keeps_its_artifacts_under_the_same_prefix(tmp_path, elsewhere, s3_root, monkeypatch):
    import boto3

    options = {"client_kwargs": {"endpoint_url": s3_root.endpoint}}
    search, result = run(config("s3://kernelcast/search", storage_options=options, run_id="on-s3",
                                tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    s3 = boto3.client("s3", endpoint_url=s3_root.endpoint)
    listed = s3.list_objects_v2(Bucket="kernelcast", Prefix="search/mlartifacts/")
    keys = {o["Key"] for o in listed.get("Contents", [])}
    where = f"search/mlartifacts/{search.mlflow_run}/artifacts"
    assert {f"{where}/{name}" for name in ARTIFACTS} <= keys
    body = s3.get_object(Bucket="kernelcast", Key=f"{where}/best_kernel.py")["Body"].read().decode()
    assert body.endswith(result.best_source)
    client = MlflowClient(search.tracker.uri)
    assert client.get_run(search.mlflow_run).info.artifact_uri == f"s3://kernelcast/{where}"
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", s3_root.endpoint)  # what an MLflow UI reading this bucket sets
    assert ARTIFACTS <= {a.path for a in client.list_artifacts(search.mlflow_run)}
    assert list(elsewhere.iterdir()) == []


def test_an_earlier_store_keeps_its_runs_and_new_runs_keep_their_artifacts_under_the_data_root(tmp_path,
                                                                                                 monkeypatch):
    data, started = tmp_path / "data", tmp_path / "first-cwd"
    started.mkdir()
    monkeypatch.chdir(started)
    uri = default_tracking_uri(str(data))
    # As a search logged before artifacts moved under the data root: MLflow's default location,
    # ./mlruns of the folder it was started from.
    before = Tracker(uri, "kernelcast")
    old_run = before.start("before", {}, tags={})
    before.log_files(old_run, {"note.txt": "logged before"})
    before.finish(old_run)
    client = MlflowClient(uri)
    old_location = client.get_experiment_by_name("kernelcast").artifact_location
    assert old_location.startswith(str(started / "mlruns"))

    monkeypatch.chdir(tmp_path)
    resumed, _ = run(config(str(data), run_id="before"))
    assert resumed.mlflow_run == old_run  # the same MLflow run continues, its artifacts where they always were
    assert ARTIFACTS | {"note.txt"} <= {a.path for a in client.list_artifacts(old_run)}
    assert client.get_run(old_run).info.artifact_uri.startswith(old_location)

    fresh, _ = run(config(str(data), run_id="after"))
    experiment = client.get_experiment(client.get_run(fresh.mlflow_run).info.experiment_id)
    assert experiment.name == f"kernelcast @ {data}"
    assert experiment.artifact_location == f"file://{data}/mlartifacts"
    assert ARTIFACTS <= {p.name for p in (data / "mlartifacts" / fresh.mlflow_run / "artifacts").iterdir()}
    assert client.get_experiment_by_name("kernelcast").artifact_location == old_location  # left as it was

    again, _ = run(config(str(data), run_id="after"))  # found again, in the experiment of its data root
    assert again.mlflow_run == fresh.mlflow_run


def test_a_tracker_without_a_data_root_leaves_artifacts_to_mlflow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "elsewhere")
    run_id = tracker.open_run("no data root", tags={})
    tracker.log_files(run_id, {"a.txt": "x"})
    assert tracker.artifact_location is None
    assert [a.path for a in MlflowClient(tracker.uri).list_artifacts(run_id)] == ["a.txt"]
