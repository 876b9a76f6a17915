"""The side-by-side report: real replayed searches in one data root, then `kernelcast report` over their journal."""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys

import pandas as pd
import pytest

from kernelcast.flows.cli import main
from kernelcast.storage.dataset import DataRoot
from kernelcast.storage.schema import measurements_from_frame
from kernelcast.tasks.config import SearchConfig
from kernelcast.tasks.report import compare_runs
from kernelcast.tasks.setup import open_search

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = dict(op="softmax", gpu_type="h100", budget=8, generations=2, children=16, seed=1, backend="replay")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A baseline, then a surrogate run of the same seed and budget, then a surrogate run of another seed."""
    folder = tmp_path_factory.mktemp("report")
    data, uri = str(folder / "data"), f"sqlite:///{folder / 'mlflow.db'}"
    done = {}
    for run_id, changes in (("baseline-s1", dict(surrogate="none")), ("roofline-s1", dict(surrogate="roofline")),
                            ("roofline-s2", dict(surrogate="roofline", seed=2))):
        search = open_search(SearchConfig(**{**BASE, **changes, "run_id": run_id, "data": data,
                                             "tracking_uri": uri}), track=True)
        try:
            done[run_id] = (search, search.run())
        finally:
            search.pool.close()
    return folder, data, uri, done


def best_so_far(speedups: list[float]) -> list[float]:
    """The search's own in-memory trajectory as a running best, nan before the first success."""
    out, best = [], 0.0
    for s in speedups:
        best = max(best, s)
        out.append(best if best > 0 else math.nan)
    return out


def png_size(path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", head[16:24])


def report(data, out, *flags, tracking_uri):
    return subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", "report", "--op", "softmax", "--data", data,
                           "--out", str(out), "--tracking-uri", tracking_uri, *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_report_command_writes_a_png_and_a_table_that_match_the_journal(runs):
    folder, data, uri, done = runs
    out = folder / "out"
    proc = report(data, out, "--runs", "baseline-s1", "roofline-s1", tracking_uri=uri)
    assert proc.returncode == 0, proc.stderr[-3000:]
    width, height = png_size(out / "report.png")
    assert width >= 800 and height >= 400 and os.path.getsize(out / "report.png") > 20_000

    table = pd.read_csv(out / "report.csv").set_index("run")
    assert list(table.index) == ["baseline-s1", "roofline-s1"]
    for run_id, (search, result) in ((r, done[r]) for r in table.index):
        row = table.loc[run_id]
        assert row["best_speedup"] == pytest.approx(result.best_speedup, rel=1e-12)
        assert row["budget_used"] == result.budget_used == 8
        assert row["gpu_seconds"] == pytest.approx(result.gpu_seconds)
        assert row["trusted"] == sum(g.trusted for g in result.generations)
        assert row["dropped"] == sum(g.dropped for g in result.generations)
        assert row["baseline_run"] == "baseline-s1" and row["resolution"] == "measurement"
    assert table.loc["roofline-s1", "surrogate"] == "roofline" and table.loc["baseline-s1", "surrogate"] == "baseline"

    target = done["baseline-s1"][1].best_speedup
    for run_id, (search, result) in ((r, done[r]) for r in table.index):
        curve = best_so_far(search.trajectory)
        first = next((i + 1 for i, b in enumerate(curve) if b >= target), None)
        expected = math.nan if first is None else first
        assert table.loc[run_id, "measurements_to_baseline_best"] == pytest.approx(expected, nan_ok=True)
        assert table.loc[run_id, "best_over_baseline"] == pytest.approx(result.best_speedup / target)

    markdown = (out / "report.md").read_text()
    assert "| roofline-s1 | roofline | 1 | 8 |" in markdown and "| baseline-s1 | baseline | 1 | 8 |" in markdown
    assert "roofline-s1 is compared with baseline-s1" in markdown and "| roofline-s1 |" in proc.stdout


def test_the_report_is_logged_to_mlflow_as_a_run_of_its_own(runs):
    from mlflow.tracking import MlflowClient

    folder, data, uri, _ = runs
    proc = report(data, folder / "logged", "--last", "2", tracking_uri=uri)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("kernelcast")
    found = client.search_runs([experiment.experiment_id], filter_string="tags.`kernelcast.report` = 'softmax/h100'")
    found = [r for r in found if r.data.tags["runs"] == "baseline-s1,roofline-s1,roofline-s2"]
    assert len(found) == 1 and found[0].info.status == "FINISHED" and found[0].data.tags["gpu_type"] == "h100"
    assert {a.path for a in client.list_artifacts(found[0].info.run_id)} == {"report.png", "report.md", "report.csv"}
    assert found[0].info.run_id in proc.stdout


def test_every_search_logs_its_report_beside_the_earlier_runs_in_its_data_root(runs):
    from mlflow.tracking import MlflowClient

    folder, _, uri, _ = runs
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("kernelcast")
    by_run = {r.data.tags.get("kernelcast.run_id"): r.info.run_id for r in client.search_runs([experiment.experiment_id])}
    first = pd.read_csv(client.download_artifacts(by_run["baseline-s1"], "report.csv", str(folder / "a")))
    assert list(first["run"]) == ["baseline-s1"]  # a fresh data root holds only itself
    second = pd.read_csv(client.download_artifacts(by_run["roofline-s1"], "report.csv", str(folder / "b")))
    assert list(second["run"]) == ["baseline-s1", "roofline-s1"]
    assert png_size(client.download_artifacts(by_run["roofline-s1"], "report.png", str(folder / "b")))[0] >= 800


def test_the_curve_has_one_point_per_charged_measurement_ending_each_generation_where_the_journal_does(runs):
    _, data, _, done = runs
    comparison = compare_runs(DataRoot(data), "softmax", "h100", run_ids=list(done))
    for trace in comparison.traces:
        search, result = done[trace.run_id]
        assert trace.resolution == "measurement"
        assert trace.measurements == tuple(range(result.budget_used + 1))
        assert trace.best_speedup[1:] == pytest.approx(best_so_far(search.trajectory), nan_ok=True)
        assert trace.generation_ends == tuple(g.budget_used for g in result.generations)
        assert [trace.best_speedup[n] for n in trace.generation_ends] == [g.best_speedup for g in result.generations]
        assert trace.gpu_seconds[-1] == pytest.approx(result.gpu_seconds)


def test_a_surrogate_run_without_a_baseline_of_its_seed_is_measured_against_the_best_baseline(runs):
    _, data, _, done = runs
    table = compare_runs(DataRoot(data), "softmax", "h100", run_ids=["roofline-s2", "baseline-s1"]).table
    row = table.set_index("run").loc["roofline-s2"]
    assert row["baseline_run"] == "baseline-s1"
    assert row["best_over_baseline"] == pytest.approx(done["roofline-s2"][1].best_speedup
                                                      / done["baseline-s1"][1].best_speedup)


def test_the_latest_runs_come_with_the_baseline_of_their_seed_and_budget(runs):
    _, data, _, _ = runs
    assert compare_runs(DataRoot(data), "softmax", last=2).run_ids == ["baseline-s1", "roofline-s1", "roofline-s2"]
    alone = compare_runs(DataRoot(data), "softmax", run_ids=["roofline-s1"]).table
    assert alone["baseline_run"].isna().all() and alone["measurements_to_baseline_best"].isna().all()


def test_without_a_measured_row_the_curve_falls_back_to_generation_ends(runs, tmp_path):
    _, data, _, done = runs
    source, copy = DataRoot(data), DataRoot(str(tmp_path / "copy"))
    _, result = done["roofline-s1"]
    for table in ("runs", "decisions", "generations"):
        copy.write(table, source.read_table(table))
    measured = source.read_table("measurements").to_pandas()
    dropped = result.generations[0].best_candidate_id
    copy.write_measurements(measurements_from_frame(measured[measured["candidate_id"] != dropped]))
    trace = next(t for t in compare_runs(copy, "softmax", run_ids=["roofline-s1"]).traces)
    assert trace.resolution == "generation"
    assert trace.measurements == (0, *(g.budget_used for g in result.generations))
    assert trace.best_speedup[1:] == tuple(g.best_speedup for g in result.generations)


@pytest.mark.parametrize("flags, message", [
    (["--op", "sofmax"], "unknown operation 'sofmax'; known: softmax"),
    (["--op", "matmul"], "no search runs of matmul under"),
    (["--op", "softmax", "--gpu-type", "h200"], "no search runs of softmax on h200 under .*; softmax was searched "
                                                "on: h100"),
    (["--op", "softmax", "--runs", "roofline-s1", "nightly-7"], "unknown run id 'nightly-7' under .*; latest runs "
                                                                "of softmax on h100: roofline-s2, roofline-s1"),
    (["--op", "softmax", "--last", "0"], "--last must be a positive whole number of runs, got 0"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(runs, tmp_path, capsys, flags, message):
    import re

    _, data, uri, _ = runs
    assert main(["report", *flags, "--data", data, "--out", str(tmp_path / "out"), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kernelcast report: error: ") and re.search(message, err), err
    assert not (tmp_path / "out").exists()
