"""MLflow tracking for searches: one MLflow run per search run, metrics per generation, artifacts at the end.

Talks to MLflow through ``MlflowClient`` (no global active run), so several searches in
one process never log into each other. A search run is found again by its tag
``kernelcast.run_id``: a resumed search continues the same MLflow run.

Given the search's data root, the experiment keeps its artifacts under it
(``<data root>/mlartifacts``: a local folder or the same ``s3://`` prefix), and they are
written through the data root's own filesystem and storage options, so one data root holds
everything a run produced wherever the search was started from. Without one, MLflow's
default applies (``./mlruns`` of the working directory for a file or SQLite store).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
import posixpath
import re
import tempfile
import time
from typing import TYPE_CHECKING, Mapping

from kernelcast.kernels.records import GenerationSummary
from kernelcast.kernels.screen import SCREEN_REASONS

if TYPE_CHECKING:
    from kernelcast.storage.dataset import DataRoot

RUN_ID_TAG = "kernelcast.run_id"
ARTIFACT_FOLDER = "mlartifacts"  # under the data root: the MLflow artifacts of every run that used it
_log = logging.getLogger(__name__)
# Per-generation fields logged as metrics (step = generation), under the loop's own words.
GENERATION_METRICS = ("generated", "forecast", "measured", "reused", "trusted", "dropped", "failed", "budget_used",
                      "budget_left", "gpu_seconds", "gpu_seconds_total", "best_speedup", "surrogate_bin_accuracy",
                      "surrogate_within_one", "wall_seconds", "overhead_seconds", "generator_asked",
                      "generator_children", *(f"screened_{reason}" for reason in SCREEN_REASONS), "budget_spent",
                      "budget_remaining", "compile_seconds", "compile_seconds_total")


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
    """One experiment on one tracking URI; ``probe`` fails fast, before any GPU time is spent.

    With ``data`` (the search's ``DataRoot``), the experiment's artifacts live under it; see
    ``experiment_id`` for an experiment created before that.
    """

    def __init__(self, uri: str, experiment: str = "kernelcast", data: "DataRoot | None" = None):
        if uri.startswith(("http://", "https://")):
            # Fail in seconds rather than after minutes of retries when the server is down.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.experiment = experiment
        self.data = data
        # An absolute URI (file:///... or s3://bucket/prefix/...): MLflow stores it as given, and a
        # relative data root would otherwise mean another folder to each process that reads it.
        self.artifact_location = (data.fs.unstrip_protocol(posixpath.join(data.path, ARTIFACT_FOLDER))
                                  if data is not None else None)
        self.client = MlflowClient(tracking_uri=uri)
        self._experiment_id: str | None = None
        self._earlier_ids: list[str] = []  # same-named experiments whose artifacts live elsewhere

    def _call(self, action: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise TrackingError(f"cannot {action} at MLflow {self.uri}: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:300] if str(exc) else ''}") from exc

    @property
    def experiment_id(self) -> str:
        """The experiment new runs go to.

        MLflow cannot move an experiment's artifact location. So when the named experiment
        keeps its artifacts elsewhere (created before they moved under the data root, or by a
        search of another data root sharing this tracking store), new runs go to a sibling
        experiment named for the data root, ``NAME @ DATA_ROOT``, whose artifacts are under
        it; runs already in the named one stay there and are still found and resumed
        (``start``), with their artifacts where they always were.
        """
        if self._experiment_id is None:
            found = self._call("look up the experiment", self.client.get_experiment_by_name, self.experiment)
            if found is None:
                self._experiment_id = self._call("create the experiment", self.client.create_experiment,
                                                 self.experiment, artifact_location=self.artifact_location)
            elif self.data is None or _same_location(found.artifact_location, self.artifact_location):
                self._experiment_id = found.experiment_id
            else:
                root = self.artifact_location.removesuffix("/" + ARTIFACT_FOLDER).removeprefix("file://")
                sibling = f"{self.experiment} @ {root}"
                mine = self._call("look up the experiment", self.client.get_experiment_by_name, sibling)
                self._experiment_id = mine.experiment_id if mine else self._call(
                    "create the experiment", self.client.create_experiment, sibling,
                    artifact_location=self.artifact_location)
                self._earlier_ids = [found.experiment_id]
                _log.warning("MLflow experiment %r keeps its artifacts at %s; new runs of data root %s go to "
                             "experiment %r, whose artifacts are under %s", self.experiment,
                             found.artifact_location, root, sibling, self.artifact_location)
        return self._experiment_id

    def probe(self) -> None:
        """Reach the store now (creating the experiment if needed)."""
        _ = self.experiment_id

    def start(self, run_id: str, params: Mapping[str, object], tags: Mapping[str, str]) -> str:
        """The MLflow run of search ``run_id``: found by tag when resuming, else created."""
        found = self._call("search runs", self.client.search_runs, [self.experiment_id, *self._earlier_ids],
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
        """Artifacts given as name -> text or bytes.

        A run whose artifacts live under the data root is written through the data root (its
        filesystem, storage options and retries: an S3-compatible endpoint needs no MLflow
        settings of its own); any other run through MLflow's artifact store.
        """
        run_folder = self._under_data_root(mlflow_run)
        if run_folder is not None:
            for name, content in files.items():
                self.data.put_object(posixpath.join(run_folder, name),
                                     content.encode() if isinstance(content, str) else content)
            return
        with tempfile.TemporaryDirectory() as folder:
            for name, content in files.items():
                path = os.path.join(folder, name)
                with open(path, "wb") as f:
                    f.write(content.encode() if isinstance(content, str) else content)
                self._call(f"log the artifact {name}", self.client.log_artifact, mlflow_run, path)

    def _under_data_root(self, mlflow_run: str) -> str | None:
        """The run's artifact folder relative to the data root, or None when it is not under it."""
        if self.data is None:
            return None
        run = self._call("look up the run", self.client.get_run, mlflow_run)
        where, root = run.info.artifact_uri.rstrip("/"), self.artifact_location.rstrip("/")
        if not where.startswith(root + "/"):
            return None
        return posixpath.join(ARTIFACT_FOLDER, where[len(root) + 1:])

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


def _same_location(a: str | None, b: str | None) -> bool:
    return (a or "").rstrip("/") == (b or "").rstrip("/")
