"""MLflow tracking for searches: one MLflow run per search run, metrics per generation, artifacts at the end.

Talks to MLflow through ``MlflowClient`` (no global active run), so several searches in
one process never log into each other. A search run is found again by its tag
``kernelcast.run_id``: a resumed search continues the same MLflow run.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
import tempfile
import time
from typing import Mapping

from kernels.records import GenerationSummary
from kernels.screen import SCREEN_REASONS

RUN_ID_TAG = "kernelcast.run_id"
# Per-generation fields logged as metrics (step = generation), under the loop's own words.
GENERATION_METRICS = ("generated", "forecast", "measured", "reused", "trusted", "dropped", "failed", "budget_used",
                      "budget_left", "gpu_seconds", "gpu_seconds_total", "best_speedup", "surrogate_bin_accuracy",
                      "surrogate_within_one", "wall_seconds", "overhead_seconds", "generator_asked",
                      "generator_children", *(f"screened_{reason}" for reason in SCREEN_REASONS))


class TrackingError(OSError):
    """The MLflow tracking server or store cannot be reached or written; names the URI."""


def default_tracking_uri(data_root_uri: str) -> str:
    """SQLite beside a local data root; in the working directory when the data root is remote."""
    if "://" in data_root_uri and not data_root_uri.startswith("file://"):
        return "sqlite:///kernelcast-mlflow.db"
    folder = os.path.abspath(data_root_uri.removeprefix("file://"))
    os.makedirs(folder, exist_ok=True)
    return f"sqlite:///{os.path.join(folder, 'mlflow.db')}"


class Tracker:
    """One experiment on one tracking URI; ``probe`` fails fast, before any GPU time is spent."""

    def __init__(self, uri: str, experiment: str = "kernelcast"):
        if uri.startswith(("http://", "https://")):
            # Fail in seconds rather than after minutes of retries when the server is down.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=uri)
        self._experiment_id: str | None = None

    def _call(self, action: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise TrackingError(f"cannot {action} at MLflow {self.uri}: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:300] if str(exc) else ''}") from exc

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            found = self._call("look up the experiment", self.client.get_experiment_by_name, self.experiment)
            self._experiment_id = found.experiment_id if found else self._call(
                "create the experiment", self.client.create_experiment, self.experiment)
        return self._experiment_id

    def probe(self) -> None:
        """Reach the store now (creating the experiment if needed)."""
        _ = self.experiment_id

    def start(self, run_id: str, params: Mapping[str, object], tags: Mapping[str, str]) -> str:
        """The MLflow run of search ``run_id``: found by tag when resuming, else created."""
        found = self._call("search runs", self.client.search_runs, [self.experiment_id],
                           filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'", max_results=1)
        if found:
            mlflow_run = found[0].info.run_id
            self._call("reopen the run", self.client.update_run, mlflow_run, status="RUNNING")
            return mlflow_run
        run = self._call("create a run", self.client.create_run, self.experiment_id,
                         tags={RUN_ID_TAG: run_id, **tags}, run_name=run_id)
        for key, value in params.items():
            self._call("log parameters", self.client.log_param, run.info.run_id, key, str(value))
        return run.info.run_id

    def open_run(self, name: str, tags: Mapping[str, str]) -> str:
        """A new MLflow run of no search (a report, say): never found again by a search's run id."""
        run = self._call("create a run", self.client.create_run, self.experiment_id, tags=dict(tags), run_name=name)
        return run.info.run_id

    def log_generation(self, mlflow_run: str, summary: GenerationSummary) -> None:
        from mlflow.entities import Metric

        fields = dataclasses.asdict(summary)
        stamp = int(summary.finished_at.timestamp() * 1000)
        metrics = [Metric(key, float(fields[key]), stamp, summary.generation) for key in GENERATION_METRICS
                   if isinstance(fields[key], (int, float)) and math.isfinite(float(fields[key]))]
        self._call("log generation metrics", self.client.log_batch, mlflow_run, metrics=metrics)

    def log_files(self, mlflow_run: str, files: Mapping[str, str | bytes]) -> None:
        """Artifacts given as name -> text or bytes."""
        with tempfile.TemporaryDirectory() as folder:
            for name, content in files.items():
                path = os.path.join(folder, name)
                with open(path, "wb") as f:
                    f.write(content.encode() if isinstance(content, str) else content)
                self._call(f"log the artifact {name}", self.client.log_artifact, mlflow_run, path)

    def log_metrics(self, mlflow_run: str, metrics: Mapping[str, float], step: int = 0) -> None:
        """Finite numbers under MLflow-safe names (anything else in a name becomes '_'); the rest is skipped."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(re.sub(r"[^A-Za-z0-9_./ -]", "_", key), float(value), stamp, step)
                 for key, value in metrics.items()
                 if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)]
        if batch:
            self._call("log metrics", self.client.log_batch, mlflow_run, metrics=batch)

    def log_folder(self, mlflow_run: str, folder: str, artifact_path: str | None = None) -> None:
        """A folder's files as artifacts (a model checkpoint), under ``artifact_path``."""
        self._call(f"log the folder {folder}", self.client.log_artifacts, mlflow_run, folder, artifact_path)

    def finish(self, mlflow_run: str, status: str = "FINISHED", tags: Mapping[str, str] | None = None) -> None:
        for key, value in (tags or {}).items():
            self._call("tag the run", self.client.set_tag, mlflow_run, key, value)
        self._call("close the run", self.client.set_terminated, mlflow_run, status)
