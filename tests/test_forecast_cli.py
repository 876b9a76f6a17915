"""``kernelcast forecast``: a user's kernel files forecast as a search would, with a real learned prior."""

import json
import math

import pytest

from kernelcast.flows.cli import main
from kernelcast.storage.dataset import DataRoot
from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
from kernelcast.tasks.config import PACKAGED_POOL
from tests.kernels_for_tests import SOURCES

OP = "softmax"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """A data root holding the H100 template variants of rmsnorm (the prior learns from them) and of the op."""
    root = DataRoot(str(tmp_path_factory.mktemp("forecast")))
    pool = DataRoot(PACKAGED_POOL)
    for op in ("rmsnorm", OP):
        root.write_candidates(candidates_from_frame(pool.read_candidates(op)))
        root.write_measurements(measurements_from_frame(pool.read_measurements(op=op, gpu_type="h100")))
    return root.uri


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("kernels")
    paths = {}
    for kind in ("malformed", "no_launch", "out_of_bounds", "wrong_values"):
        paths[kind] = str(folder / f"{kind}.py")
        (folder / f"{kind}.py").write_text(SOURCES[kind])
    return paths


def forecast(capsys, data, *argv) -> dict:
    assert main(["forecast", "--op", OP, "--data", data, "--prior-data", data, "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_kernel_that_cannot_run_is_dropped_with_the_static_checks_reason(capsys, data, files):
    report = forecast(capsys, data, files["malformed"], files["no_launch"], files["out_of_bounds"])
    by_file = {k["file"]: k for k in report["kernels"]}
    assert by_file[files["malformed"]]["decision"] == "drop"
    assert by_file[files["malformed"]]["reason"] == "unparsable"
    assert by_file[files["no_launch"]]["reason"] == "no_entry"
    assert by_file[files["no_launch"]]["probabilities"] == []  # nothing forecast for a kernel that cannot run
    runs = by_file[files["out_of_bounds"]]
    assert runs["reason"] == "" and runs["decision"] in ("measure", "trust", "drop")


def test_a_runnable_kernel_gets_bins_a_failure_probability_and_an_expected_speedup(capsys, data, files):
    report = forecast(capsys, data, files["wrong_values"], files["out_of_bounds"])
    assert report["anchor"] == "reference" and report["best_measured"] > 0  # the root's measured softmax variants
    for k in report["kernels"]:
        assert math.isclose(sum(k["probabilities"]), 1.0, abs_tol=1e-6) and len(k["probabilities"]) == 8
        assert 0.0 <= k["failure_probability"] <= 1.0
        assert k["expected_speedup"] == pytest.approx(k["expected_speedup_vs_reference"])
        assert k["confidence"] == pytest.approx(max(k["probabilities"]))


def test_against_a_measured_anchor_the_speedup_is_stated_over_its_measured_one(capsys, data, files):
    measured = DataRoot(data).read_measurements(op=OP, gpu_type="h100")
    ok = measured[(measured["status"] == "ok") & (measured["speedup"] > 1.5)]
    anchor = ok.iloc[0]
    report = forecast(capsys, data, "--anchor", anchor["candidate_id"], files["out_of_bounds"])
    assert report["anchor_measured"] and report["anchor_speedup"] == pytest.approx(anchor["speedup"])
    (k,) = report["kernels"]
    assert k["expected_speedup"] * anchor["speedup"] == pytest.approx(k["expected_speedup_vs_reference"])
    assert math.isclose(sum(k["probabilities"]), 1.0, abs_tol=1e-6)


def test_an_anchor_that_is_neither_a_file_nor_a_measured_candidate_is_a_clear_error(capsys, data, files):
    assert main(["forecast", "--op", OP, "--data", data, "--prior-data", data, "--anchor", "feedfacecafebeef",
                 files["out_of_bounds"]]) == 2
    assert "anchor 'feedfacecafebeef' is neither a kernel file nor a candidate of softmax" in capsys.readouterr().err


def test_the_table_names_the_decision_and_the_reason(capsys, data, files):
    assert main(["forecast", "--op", OP, "--data", data, "--prior-data", data, files["malformed"],
                 files["out_of_bounds"]]) == 0
    out = capsys.readouterr().out
    assert "-> drop" in out and "cannot run: unparsable" in out and "bins against the anchor" in out


def test_a_kernel_against_itself_as_the_anchor_file_is_forecast_at_one(capsys, data, files):
    report = forecast(capsys, data, "--anchor", files["out_of_bounds"], files["out_of_bounds"])
    assert report["anchor"] == files["out_of_bounds"] and not report["anchor_measured"]
    (k,) = report["kernels"]
    assert k["expected_speedup"] == pytest.approx(1.0)


def test_an_imported_tasks_submission_is_forecast_and_its_problem_file_has_no_entry(capsys, tmp_path):
    from tests.formats_for_tests import KB_ROW_SUM_NEW, write_kernelbench

    ref, (new,) = write_kernelbench(tmp_path / "kb", new=KB_ROW_SUM_NEW)
    data = str(tmp_path / "data")
    assert main(["import", "--format", "kernelbench", "--reference", str(ref), "--data", data]) == 0
    capsys.readouterr()
    assert main(["forecast", "--op", "kb.row_sum", "--data", data, "--surrogate", "roofline", "--json",
                 str(new), str(ref)]) == 0
    by_file = {k["file"]: k for k in json.loads(capsys.readouterr().out)["kernels"]}
    assert by_file[str(ref)]["reason"] == "no_entry" and "ModelNew" in by_file[str(ref)]["detail"]
    assert by_file[str(new)]["reason"] == "" and len(by_file[str(new)]["probabilities"]) == 8


def test_a_surrogate_that_needs_a_server_or_none_is_refused_by_name(capsys, tmp_path, files):
    assert main(["forecast", "--op", OP, "--surrogate", "none", "--data", str(tmp_path), files["malformed"]]) == 2
    assert ("--surrogate none: forecast with learned, source, lmhead, physics, labels, roofline or random"
            in capsys.readouterr().err)


def test_the_report_says_what_the_forecasts_were_fit_on_and_what_corrected_them(capsys, data, files, tmp_path):
    report = forecast(capsys, data, files["out_of_bounds"])
    assert report["fit_on"] == data and report["fit_operations"] == ["rmsnorm"]  # other-ops: not softmax itself
    assert report["data_root"] == data and report["corrected_by"] > 100  # the root's measured softmax variants
    empty = str(tmp_path / "empty")
    assert main(["forecast", "--op", OP, "--data", empty, "--prior-data", data, files["out_of_bounds"]]) == 0
    text = capsys.readouterr().out
    assert f"fit on: {data} (1 operations on h100: rmsnorm; prior scope other-ops)" in text
    assert f"corrected by no measurement of {OP} on h100 under {DataRoot(empty).uri}" in text
