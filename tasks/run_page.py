"""What a search run shows on its Prefect flow run page, as artifacts updated after every generation.

* the budget's progress (a progress artifact: measurements, or seconds, used of the budget);
* the best kernels so far (a table: measured speedup, forecast, how sure, decision), keyed
  ``<op>-best-kernels`` so the Artifacts page keeps the latest table of each operation;
* the forecaster's accuracy so far and where to look next (a Markdown artifact: the MLflow run,
  the run report, the commands that resume and compare it).

The contents are plain functions of the ``Search`` and its journal; ``RunPage`` only publishes them.
"""

from __future__ import annotations

import json
import posixpath

from kernelcast.tasks.search import Search

BEST_ROWS = 10  # kernels in the best-so-far table


def budget_progress(search: Search) -> float:
    """Percent of the run's budget used, in its own units (measurements, or GPU / GPU+compile seconds)."""
    c = search.config
    used = search.budget_spent if c.budget_in_seconds else search.budget_used
    return round(min(100.0, 100.0 * used / c.budget), 1) if c.budget else 100.0


def budget_text(search: Search) -> str:
    c = search.config
    if c.budget_in_seconds:
        return f"{search.budget_spent:.1f} of {c.budget:g} {c.budget_kind.replace('_', '-')} used"
    return (f"{search.budget_used} of {c.budget:g} measurements used, {search.gpu_seconds:.1f} GPU-seconds "
            "charged")


def best_kernels(search: Search, limit: int = BEST_ROWS) -> list[dict]:
    """The best kernels so far, fastest first: measured ones by their measured speedup, trusted forecasts after
    them (a forecast is never the best measured kernel), each with the forecast and decision the journal holds."""
    c = search.config
    decisions = search.root.read_run_rows("decisions", c.run_id, op=c.op)
    latest = {} if decisions.empty else {
        row.candidate_id: row for row in decisions.sort_values("generation").itertuples()}
    entries = [e for e in search.archive.entries.values() if e.speedup and e.status in ("ok", "forecast")]
    entries.sort(key=lambda e: (not e.measured, -(e.speedup or 0.0)))
    rows = []
    for e in entries[:limit]:
        d = latest.get(e.candidate.candidate_id)
        forecast = getattr(d, "expected_speedup", None) if d is not None else None
        sure = getattr(d, "confidence", None) if d is not None else None
        rows.append({"candidate": e.candidate.candidate_id[:12], "origin": e.candidate.origin,
                     "measured speedup": f"{e.speedup:.3f}" if e.measured else "-",
                     "forecast speedup": f"{forecast:.3f}" if _number(forecast) else "-",
                     "how sure": f"{sure:.2f}" if _number(sure) else "-",
                     "decision": getattr(d, "decision", "seed") if d is not None else "seed",
                     "generation": int(d.generation) if d is not None else "-"})
    return rows


def forecaster_accuracy(search: Search) -> str:
    """The forecaster's record on this run's measured children: exact bin and within one bin, overall and by
    generation."""
    hits = [(f.predicted_bin, b) for f, b in search.calibration]
    if search.surrogate is None:
        return "no forecaster: every child is measured (the equal-budget baseline)"
    if not hits:
        return "no measured child has a forecast yet"
    exact = sum(p == b for p, b in hits) / len(hits)
    near = sum(abs(p - b) <= 1 for p, b in hits) / len(hits)
    lines = [f"{len(hits)} measured children: speedup bin exact {exact:.0%}, within one bin {near:.0%}", "",
             "| generation | measured | bin exact | within one | trusted | dropped |", "|---|---|---|---|---|---|"]
    for s in search.summaries:
        exact_g = f"{s.surrogate_bin_accuracy:.0%}" if _number(s.surrogate_bin_accuracy) else "-"
        near_g = f"{s.surrogate_within_one:.0%}" if _number(s.surrogate_within_one) else "-"
        lines.append(f"| {s.generation} | {s.measured} | {exact_g} | {near_g} | {s.trusted} | {s.dropped} |")
    return "\n".join(lines)


def mlflow_link(search: Search) -> str:
    """Where the run's MLflow page is: its URL on an MLflow server, or how to open it on a local store."""
    if search.tracker is None or not search.mlflow_run:
        return "not tracked"
    t = search.tracker
    path = f"#/experiments/{t.experiment_id}/runs/{search.mlflow_run}"
    if t.uri.startswith(("http://", "https://")):
        return f"[run {search.mlflow_run}]({t.uri.rstrip('/')}/{path})"
    return (f"run `{search.mlflow_run}` in `{t.uri}`: `mlflow ui --backend-store-uri {t.uri}`, then "
            f"[http://127.0.0.1:5000/{path}](http://127.0.0.1:5000/{path})")


def report_link(search: Search, finished: bool) -> str:
    """The run report: its files under the data root once the run has finished, and the command that makes it."""
    c = search.config
    where = ""
    if finished and search.tracker is not None and search.mlflow_run and search.tracker.data is not None:
        folder = posixpath.join(search.tracker.artifact_location or "", search.mlflow_run, "artifacts")
        where = f"[search_curve.png]({folder}/search_curve.png), [report.md]({folder}/report.md), in `{folder}`; "
    elif not finished:
        where = "written when the run finishes; "
    command = f"kernelcast report --op {c.op} --gpu-type {c.gpu_type} --data {c.data}"
    return f"{where}beside earlier runs: `{command}`"


def links_markdown(search: Search, finished: bool = False) -> str:
    c = search.config
    best_id, best = search.archive.best()
    state = "finished" if finished else f"after generation {search.summaries[-1].generation}" if search.summaries \
        else "started"
    return "\n".join([
        f"# search {c.run_id}: {c.op} on {c.gpu_type} ({state})", "",
        f"- **budget**: {budget_text(search)}",
        f"- **best measured**: {best:.3f}x eager PyTorch, candidate `{best_id}`" if best else
        "- **best measured**: none yet",
        f"- **surrogate**: {c.surrogate}, policy {c.policy}; **generator**: {c.generator}",
        f"- **MLflow**: {mlflow_link(search)}",
        f"- **report**: {report_link(search, finished)}",
        f"- **data root**: `{c.data}` (resume: `kernelcast search --run-id {c.run_id} --op {c.op} --data {c.data}` "
        "with the run's settings)", "",
        "## Forecaster accuracy so far", "", forecaster_accuracy(search)])


class RunPage:
    """The run's artifacts on its flow run page: created at the first publish and updated in place after it, so
    the page holds one of each, showing the latest generation (earlier states are in the logs and the journal)."""

    def __init__(self, search: Search):
        self.search = search
        self._ids: dict[str, object] = {}  # artifact kind -> its id, once created
        slug = search.config.op.replace("_", "-").replace(".", "-").lower()
        self.table_key = f"{slug}-best-kernels"
        self.summary_key = f"{slug}-search"

    def publish(self, finished: bool = False) -> None:
        from prefect.artifacts import (create_markdown_artifact, create_progress_artifact, create_table_artifact,
                                       update_progress_artifact)

        s, c = self.search, self.search.config
        budget = f"budget of {c.run_id}: {budget_text(s)}"
        if "progress" in self._ids:
            update_progress_artifact(self._ids["progress"], budget_progress(s), description=budget)
        else:
            self._ids["progress"] = create_progress_artifact(budget_progress(s), key=f"{self.summary_key}-budget",
                                                             description=budget)
        rows = best_kernels(s)
        table = f"best kernels of {c.run_id} so far ({len(s.summaries)} generations)"
        if rows:
            self._put("table", lambda: create_table_artifact(rows, key=self.table_key, description=table),
                      json.dumps(rows), table)
        summary = f"{c.run_id}: progress, forecaster accuracy and links"
        text = links_markdown(s, finished)
        self._put("markdown", lambda: create_markdown_artifact(text, key=self.summary_key, description=summary),
                  text, summary)

    def _put(self, kind: str, create, data: str, description: str) -> None:
        if kind not in self._ids:
            self._ids[kind] = create()
            return
        from prefect import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        with get_client(sync_client=True) as client:
            client.update_artifact(self._ids[kind], ArtifactUpdate(data=data, description=description))


def _number(x) -> bool:
    return isinstance(x, (int, float)) and x == x

