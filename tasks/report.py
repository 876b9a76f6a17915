"""What searches leave behind, and how they compare.

One search's artifacts: the best kernel's source, the generation table, its search curve.
Several searches side by side (``compare_runs``): the runs of one operation on one GPU
type, read back from the data root's journal — the surrogate run beside its equal-budget
baseline, tonight's run beside last night's — as a two-panel PNG (best measured speedup
against measurements charged, and against GPU-seconds charged), a Markdown table and a CSV.
``kernelcast report`` writes them to a folder and logs them to MLflow; every search logs
the comparison of itself with its neighbours in the data root as artifacts when it finishes.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from kernelcast.kernels.records import fails_strict, is_lower
from kernelcast.storage.tracking import ARTIFACT_FOLDER
from kernelcast.tasks.config import NO_SURROGATE

REPORT_FILES = ("report.png", "report.md", "report.csv")
DEFAULT_LAST = 8  # runs a report shows when none are named (their equal-budget baselines come too)
SEARCH_REPORT_LAST = 6  # runs beside the finishing one in a search's own report: cheap on a busy data root


class ReportError(ValueError):
    """A report that cannot be drawn from the data root as asked; the message names what is missing."""


# ---- one search ------------------------------------------------------------------------------

def generation_table(result) -> pd.DataFrame:
    return pd.DataFrame([dataclasses.asdict(s) for s in result.generations])


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never a window, a server has no display
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    plt = _pyplot()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out.getvalue()


def search_curve_png(result) -> bytes:
    """Best measured speedup against measurements charged, one point per generation."""
    plt = _pyplot()
    table = generation_table(result)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if not table.empty:
        ax.step(table["budget_used"], table["best_speedup"].astype(float), where="post", marker="o")
    ax.set_xlabel("measurements charged")
    ax.set_ylabel("best measured speedup (x eager)")
    ax.set_title(f"{result.op} on {result.gpu_type}: {result.run_id}", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def search_artifacts(result, root=None) -> dict[str, str | bytes]:
    """A finished search's files; with its data root, also its report beside the other runs of its op and GPU type."""
    header = (f"# kernelcast best kernel for {result.op} on {result.gpu_type} (run {result.run_id})\n"
              f"# candidate {result.best_candidate_id}, measured speedup {result.best_speedup}\n"
              f"# launch params: {result.best_params}\n")
    files: dict[str, str | bytes] = {"best_kernel.py": header + result.best_source,
                                     "generations.csv": generation_table(result).to_csv(index=False),
                                     "search_curve.png": search_curve_png(result)}
    if root is not None and result.generations:
        comparison = compare_runs(root, result.op, result.gpu_type, last=SEARCH_REPORT_LAST, anchor=result.run_id)
        files.update(report_files(comparison, highlight=result.run_id))
    return files


def summary_lines(result, data_uri: str, tracking_uri: str, prefect_ui: str | None) -> list[str]:
    speed = f"{result.best_speedup:.3f}x eager PyTorch" if result.best_speedup else "none succeeded"
    how = "replayed from the measured pool (no GPU here)" if result.replayed else "measured on this GPU"
    lines = [f"search {result.run_id}: {result.op} on {result.gpu_type}, {len(result.generations)} generations, "
             f"{result.budget_used} measurements ({how}), {result.gpu_seconds:.1f} GPU-seconds charged; "
             f"stopped: {result.stop_reason}",
             f"best measured kernel: {result.best_candidate_id} at {speed}; params {result.best_params}"]
    if is_lower(result.best_precision):
        lines.append(f"  its arithmetic is below the reference's precision: {result.best_precision} "
                     f"(--precision strict rejects such kernels)")
    for s in result.generations:
        best = f"{s.best_speedup:.3f}" if s.best_speedup else "-"
        acc = f"{s.surrogate_bin_accuracy:.2f}" if s.surrogate_bin_accuracy is not None else "-"
        lines.append(f"  gen {s.generation}: generated {s.generated}, measured {s.measured} (reused {s.reused}), "
                     f"trusted {s.trusted}, dropped {s.dropped}, best {best}, surrogate bin accuracy {acc}")
    lines += [f"resume or replay this run: kernelcast search --run-id {result.run_id} (with the same settings)",
              f"compare it with the other runs: kernelcast report --op {result.op} --gpu-type {result.gpu_type} "
              f"--data {data_uri} --out report",
              f"data:   {data_uri}  (tables runs, candidates, forecasts, decisions, measurements, generations; "
              f"MLflow artifacts under {ARTIFACT_FOLDER}/)",
              f"MLflow: {tracking_uri}  (mlflow ui --backend-store-uri {tracking_uri})"]
    if prefect_ui:
        lines.append(f"Prefect: {prefect_ui}")
    return lines


# ---- runs side by side -------------------------------------------------------------------------

@dataclass(frozen=True)
class RunTrace:
    """One run's search curve as its journal records it: after each point, what was charged and the best so far.

    ``resolution`` is ``measurement`` (one point per charged measurement) or ``generation``
    (one per finished generation, when a measured candidate's row is missing from the data root).
    """

    run_id: str
    surrogate: str  # "none": the equal-budget baseline, every child measured
    seed: int
    budget: int
    created_at: datetime
    resolution: str
    measurements: tuple[int, ...]  # charged so far, 0 first
    gpu_seconds: tuple[float, ...]  # charged so far
    best_speedup: tuple[float, ...]  # best measured so far; nan before any succeeds
    generation_ends: tuple[int, ...]  # measurements charged when each finished generation ended
    trusted: int
    dropped: int
    replayed: bool  # every charged measurement came from a measured pool

    @property
    def baseline(self) -> bool:
        return self.surrogate == NO_SURROGATE

    @property
    def kind(self) -> str:
        return "baseline" if self.baseline else self.surrogate

    @property
    def best(self) -> float:
        return self.best_speedup[-1]

    @property
    def label(self) -> str:
        return (f"{self.kind}, seed {self.seed}, budget {self.budget}, {self.created_at:%Y-%m-%d %H:%M} UTC "
                f"({self.run_id})")

    def reach(self, target: float) -> tuple[int, float] | None:
        """(measurements, GPU-seconds) charged when the best first reached ``target``; None if it never did."""
        for n, s, b in zip(self.measurements, self.gpu_seconds, self.best_speedup):
            if b >= target * (1 - 1e-12):  # nan compares false
                return n, s
        return None


@dataclass(frozen=True)
class Comparison:
    op: str
    gpu_type: str
    traces: tuple[RunTrace, ...]  # oldest first
    table: pd.DataFrame  # one row per trace, same order

    @property
    def run_ids(self) -> list[str]:
        return [t.run_id for t in self.traces]


def compare_runs(root, op: str, gpu_type: str | None = None, run_ids=(), last: int | None = None,
                 anchor: str | None = None) -> Comparison:
    """The runs of ``op`` on ``gpu_type`` in ``root``, side by side.

    ``run_ids`` names the runs exactly; otherwise the latest ``last`` runs (``DEFAULT_LAST``
    when None; ``anchor`` always among them) plus the equal-budget baseline of each
    surrogate run among them. Without ``gpu_type``, the one GPU type ``op`` was searched on.
    """
    runs = _op_runs(root, op)
    gpu_type = _gpu_type(root, op, runs, gpu_type)
    runs = runs[runs["gpu_type"] == gpu_type]
    if run_ids:
        chosen = _named_runs(root, op, gpu_type, runs, list(run_ids))
    else:
        chosen = _latest_runs(runs, DEFAULT_LAST if last is None else last, anchor)
    traces = _traces(root, op, gpu_type, chosen, strict=bool(run_ids))
    if not traces:
        raise ReportError(f"no run of {op} on {gpu_type} under {root.uri} has finished a generation yet")
    return Comparison(op, gpu_type, traces, comparison_table(traces))


def _op_runs(root, op: str) -> pd.DataFrame:
    """The runs table's rows of ``op``, with each run's surrogate, seed and budget, oldest first."""
    from kernelcast.kernels.formats import is_imported_name
    from kernelcast.kernels.ops import get_operation

    runs = root.read("runs")
    if runs.empty or op not in set(runs["op"]):
        searched = sorted(set(runs["op"])) if not runs.empty else []
        try:
            if not is_imported_name(op):  # an imported task is known by its data root only
                get_operation(op)  # its error names the known operations
        except ValueError as exc:
            raise ReportError(f"{exc}; searched under {root.uri}: {', '.join(searched) or 'nothing'}") from None
        raise ReportError(f"no search runs of {op} under {root.uri}; runs there are of: "
                          f"{', '.join(searched) or 'nothing (run kernelcast search first)'}")
    runs = runs[runs["op"] == op].copy()
    configs = [json.loads(c) for c in runs["config"]]
    runs["surrogate"] = [c.get("surrogate", "") for c in configs]
    runs["seed"] = [int(c.get("seed", 0)) for c in configs]
    runs["budget"] = [int(c.get("budget", 0)) for c in configs]
    return runs.sort_values(["created_at", "run_id"], kind="stable").reset_index(drop=True)


def _gpu_type(root, op: str, runs: pd.DataFrame, gpu_type: str | None) -> str:
    types = sorted(set(runs["gpu_type"]))
    if gpu_type is None:
        if len(types) > 1:
            raise ReportError(f"{op} was searched on several GPU types under {root.uri}: {', '.join(types)}; "
                              "choose one (--gpu-type)")
        return types[0]
    if gpu_type not in types:
        raise ReportError(f"no search runs of {op} on {gpu_type} under {root.uri}; {op} was searched on: "
                          f"{', '.join(types)}")
    return gpu_type


def _named_runs(root, op: str, gpu_type: str, runs: pd.DataFrame, run_ids: list[str]) -> pd.DataFrame:
    every = root.read("runs")
    for run_id in run_ids:
        if run_id in set(runs["run_id"]):
            continue
        other = every[every["run_id"] == run_id]
        if not other.empty:
            raise ReportError(f"run {run_id!r} is a search of {other['op'].iloc[0]} on {other['gpu_type'].iloc[0]}, "
                              f"not {op} on {gpu_type}")
        recent = ", ".join(runs["run_id"].iloc[::-1][:10])
        raise ReportError(f"unknown run id {run_id!r} under {root.uri}; latest runs of {op} on {gpu_type}: {recent}")
    return runs[runs["run_id"].isin(run_ids)]


def _latest_runs(runs: pd.DataFrame, last: int, anchor: str | None) -> pd.DataFrame:
    """The latest ``last`` runs (``anchor`` among them), and the equal-budget baseline of each surrogate run."""
    if not isinstance(last, int) or isinstance(last, bool) or last < 1:
        raise ReportError(f"last must be a positive whole number of runs, got {last!r}")
    newest_first = runs.iloc[::-1]
    chosen = list(newest_first["run_id"][:last])
    if anchor is not None and anchor not in chosen:
        chosen = [anchor, *chosen[:last - 1]]
    picked = runs[runs["run_id"].isin(chosen)]
    for _, run in picked[picked["surrogate"] != NO_SURROGATE].iterrows():
        match = newest_first[(newest_first["surrogate"] == NO_SURROGATE) & (newest_first["seed"] == run["seed"])
                             & (newest_first["budget"] == run["budget"])]
        if not match.empty:
            chosen.append(match["run_id"].iloc[0])
    return runs[runs["run_id"].isin(chosen)]


def _traces(root, op: str, gpu_type: str, runs: pd.DataFrame, strict: bool) -> tuple[RunTrace, ...]:
    measured = root.read_table("measurements", columns=["candidate_id", "status", "speedup", "gpu_seconds",
                                                        "replayed", "precision"], op=op, gpu_type=gpu_type).to_pandas()
    traces = []
    for _, run in runs.iterrows():
        trace = run_trace(root, run, measured)
        if trace is None and strict:
            raise ReportError(f"run {run['run_id']!r} has not finished a generation yet: nothing to show")
        if trace is not None:
            traces.append(trace)
    return tuple(traces)


def run_trace(root, run: pd.Series, measured: pd.DataFrame) -> RunTrace | None:
    """A run's curve rebuilt from its journal; None before its first generation is finished.

    Resolution is one point per charged measurement. A generation's ``measure`` decisions
    are the measurements it charged (stored results reused count, as in the search), in
    the order the run listed them (``decided_at``, stamped as it wrote them), each with the
    speedup and GPU-seconds of its stored measurement (0 for a failure, as the search
    counts it). Only generations with their commit mark (a ``generations`` row) count.
    That per-measurement curve must end each generation where the ``generations`` row
    says (measurements, GPU-seconds, best); if a measured row is missing from the data
    root, or the two disagree, the curve falls back to one point per generation.
    """
    run_id, op = run["run_id"], run["op"]
    gens = root.read_run_rows("generations", run_id, op=op).sort_values("generation", kind="stable")
    if gens.empty:
        return None
    decisions = root.read_run_rows("decisions", run_id, op=op)
    decisions = decisions[decisions["generation"].isin(set(gens["generation"]))]
    charged = decisions[decisions["decision"] == "measure"].sort_values(["generation", "decided_at"], kind="stable")
    rows = charged.merge(measured.drop_duplicates("candidate_id"), on="candidate_id", how="left")
    if _precision_mode(run) == "strict":  # as the run counted them: a correct kernel of a lower precision class failed
        precision = rows["precision"] if "precision" in rows else pd.Series("", index=rows.index)
        failed = [fails_strict(str(st), str(p or "")) for st, p in zip(rows["status"], precision)]
        rows.loc[failed, "status"] = "incorrect"
    speed = rows["speedup"].where((rows["status"] == "ok") & (rows["speedup"] > 0), 0.0).astype(float)
    best = speed.cummax().where(lambda s: s > 0)
    seconds = rows["gpu_seconds"].fillna(0.0).astype(float).cumsum()
    ends = [int(n) for n in gens["budget_used"]]
    if not rows["status"].isna().any() and _agrees(rows, best, seconds, gens):
        points = (range(len(rows) + 1), [0.0, *seconds], [math.nan, *best])
        resolution = "measurement"
    else:
        points = ([0, *ends], [0.0, *gens["gpu_seconds_total"].astype(float)],
                  [math.nan, *gens["best_speedup"].astype(float)])
        resolution = "generation"
    return RunTrace(run_id=run_id, surrogate=run["surrogate"], seed=int(run["seed"]), budget=int(run["budget"]),
                    created_at=pd.Timestamp(run["created_at"]).to_pydatetime(), resolution=resolution,
                    measurements=tuple(int(n) for n in points[0]),
                    gpu_seconds=tuple(float(s) for s in points[1]),
                    best_speedup=tuple(float(b) if b is not None else math.nan for b in points[2]),
                    generation_ends=tuple(ends), trusted=int(gens["trusted"].sum()),
                    dropped=int(gens["dropped"].sum()),
                    replayed=bool(len(rows)) and bool(rows["replayed"].eq(True).all()))


def _precision_mode(run: pd.Series) -> str:
    """The precision mode a run searched under, from its stored config (tolerance when it names none)."""
    try:
        return json.loads(run.get("config") or "{}").get("precision", "tolerance")
    except (TypeError, ValueError):
        return "tolerance"


def _agrees(rows: pd.DataFrame, best: pd.Series, seconds: pd.Series, gens: pd.DataFrame) -> bool:
    """Whether the per-measurement curve ends each generation where its ``generations`` row says it did."""
    ends = rows.groupby("generation", sort=True).size().reindex(gens["generation"], fill_value=0).cumsum()
    for n, g in zip(ends, gens.itertuples()):
        if n != g.budget_used:
            return False
        here_best = best.iloc[n - 1] if n else math.nan
        stored_best = math.nan if pd.isna(g.best_speedup) else float(g.best_speedup)
        if not (math.isnan(here_best) and math.isnan(stored_best) or math.isclose(here_best, stored_best)):
            return False
        if not math.isclose(seconds.iloc[n - 1] if n else 0.0, g.gpu_seconds_total, rel_tol=1e-9, abs_tol=1e-9):
            return False
    return True


def reference_baseline(trace: RunTrace, traces) -> RunTrace | None:
    """What ``trace`` is measured against: a baseline itself; else the latest baseline of its seed and budget,
    else the report's best baseline; None when the report has no baseline."""
    if trace.baseline:
        return trace
    baselines = [t for t in traces if t.baseline and not math.isnan(t.best)]
    same = [t for t in baselines if (t.seed, t.budget) == (trace.seed, trace.budget)]
    if same:
        return max(same, key=lambda t: (t.created_at, t.run_id))
    return max(baselines, key=lambda t: t.best, default=None)


def comparison_table(traces) -> pd.DataFrame:
    """One row per run: what it charged, its best, and how it fares against its baseline (see ``reference_baseline``)."""
    rows = []
    for t in traces:
        ref = reference_baseline(t, traces)
        reached = t.reach(ref.best) if ref is not None else None
        rows.append({
            "run": t.run_id, "surrogate": t.kind, "seed": t.seed, "budget": t.budget,
            "date": f"{t.created_at:%Y-%m-%d %H:%M}", "budget_used": t.measurements[-1],
            "gpu_seconds": t.gpu_seconds[-1], "best_speedup": _number(t.best),
            "baseline_run": ref.run_id if ref is not None else None,
            "baseline_best_speedup": _number(ref.best) if ref is not None else None,
            "measurements_to_baseline_best": reached[0] if reached else None,
            "gpu_seconds_to_baseline_best": reached[1] if reached else None,
            "best_over_baseline": _number(t.best / ref.best) if ref is not None else None,
            "trusted": t.trusted, "dropped": t.dropped, "resolution": t.resolution,
        })
    return pd.DataFrame(rows)


def _number(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def comparison_png(comparison: Comparison, highlight: str | None = None) -> bytes:
    """Two panels: best measured speedup against measurements charged, and against GPU-seconds charged."""
    plt = _pyplot()
    traces = comparison.traces
    legend_in = 0.19 * (len(traces) + 1) + 0.75  # one legend line per run below the panels, and the x labels
    fig, (by_count, by_seconds) = plt.subplots(1, 2, figsize=(11, 3.6 + legend_in), sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lone_baseline = sum(t.baseline for t in traces) == 1
    for i, t in enumerate(traces):
        style = dict(color="0.3" if t.baseline and lone_baseline else colours[i % len(colours)],
                     linestyle="--" if t.baseline else "-", linewidth=2.4 if t.run_id == highlight else 1.6)
        ends = [t.measurements.index(n) for n in t.generation_ends]  # generation boundaries, marked
        for ax, xs in ((by_count, t.measurements), (by_seconds, t.gpu_seconds)):
            ax.step(xs, t.best_speedup, where="post", label=t.label if ax is by_count else None, **style)
            ax.plot([xs[j] for j in ends], [t.best_speedup[j] for j in ends], "o", markersize=3.5,
                    color=style["color"])
        ref = reference_baseline(t, traces)
        reached = t.reach(ref.best) if ref is not None and not t.baseline else None
        if reached:  # where a surrogate run first matched its baseline's best
            for ax, x in ((by_count, reached[0]), (by_seconds, reached[1])):
                ax.plot([x], [ref.best], marker="*", markersize=12, color=style["color"], markeredgecolor="black",
                        markeredgewidth=0.6, linestyle="none")
    by_count.set_xlabel("measurements charged (count)")
    by_seconds.set_xlabel("GPU-seconds charged (s)")
    by_count.set_ylabel("best measured speedup (x eager PyTorch)")
    for ax in (by_count, by_seconds):
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
    how = "measurements replayed from a measured pool" if all(t.replayed for t in traces) else "measured"
    fig.suptitle(f"{comparison.op} on {comparison.gpu_type}: best measured speedup, surrogate-filtered search vs "
                 f"equal-budget baseline ({how})", fontsize=10.5)
    handles, labels = by_count.get_legend_handles_labels()
    handles.append(plt.Line2D([], [], marker="*", markersize=11, color="0.6", markeredgecolor="black",
                              linestyle="none"))
    labels.append("first matches its baseline's best   (solid: surrogate, dashed: baseline, dots: generation ends)")
    height = 3.6 + legend_in
    fig.legend(handles, labels, loc="lower left", bbox_to_anchor=(0.06, 0.01), fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.07, right=0.98, wspace=0.06, top=1 - 0.45 / height, bottom=legend_in / height)
    return _png(fig)


def comparison_markdown(comparison: Comparison) -> str:
    """The table as Markdown, with a line saying what each run is measured against."""
    table = comparison.table
    columns = {"run": "run", "surrogate": "surrogate", "seed": "seed", "budget": "budget", "date": "date (UTC)",
               "budget_used": "measurements", "gpu_seconds": "GPU-s", "best_speedup": "best speedup",
               "measurements_to_baseline_best": "measurements to baseline's best",
               "gpu_seconds_to_baseline_best": "GPU-s to baseline's best", "best_over_baseline": "best / baseline's",
               "trusted": "trusted", "dropped": "dropped"}
    lines = [f"Runs of {comparison.op} on {comparison.gpu_type}: best measured speedup over eager PyTorch.",
             "", "| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join(_cell(row[c]) for c in columns) + " |")
    lines.append("")
    for _, row in table.iterrows():
        if row["surrogate"] != "baseline":
            against = row["baseline_run"] or "no baseline in this report"
            lines.append(f"- {row['run']} is compared with {against}.")
    coarse = table.loc[table["resolution"] == "generation", "run"].tolist()
    if coarse:
        lines.append(f"- one point per generation for {', '.join(coarse)} (a measured row is missing from the "
                     "data root): its measurements to reach are counted at generation ends.")
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def report_files(comparison: Comparison, highlight: str | None = None) -> dict[str, str | bytes]:
    """The report as files: ``report.png``, ``report.md``, ``report.csv``."""
    return {"report.png": comparison_png(comparison, highlight),
            "report.md": comparison_markdown(comparison),
            "report.csv": comparison.table.to_csv(index=False)}


def write_report(files: dict[str, str | bytes], out_dir: str) -> list[str]:
    """The report's files written under ``out_dir`` (created); their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, content in files.items():
        path = os.path.join(out_dir, name)
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
        paths.append(path)
    return paths


def log_report(tracker, comparison: Comparison, files: dict[str, str | bytes]) -> str:
    """The report as a run of its own in MLflow (tagged ``kernelcast.report`` = op/GPU type); its MLflow run id.

    A run of its own, not artifacts added to one of the searches: a report compares
    several runs and belongs to none, a finished search stays as it finished (its own
    report, as of its end, is already among its artifacts), and each morning's report
    is kept beside the earlier ones.
    """
    stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M")
    run = tracker.open_run(f"report {comparison.op} on {comparison.gpu_type} {stamp}", tags={
        "kernelcast.report": f"{comparison.op}/{comparison.gpu_type}", "op": comparison.op,
        "gpu_type": comparison.gpu_type, "runs": ",".join(comparison.run_ids)[:4000]})
    tracker.log_files(run, files)
    tracker.finish(run)
    return run
