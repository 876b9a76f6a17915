"""benchmarks/zeroshot_score.py given a GPU's measurements: a synthetic measurements parquet, shaped as
benchmarks/zeroshot_measure.py writes it, scored on the CPU. A forecaster that is told the measured answer must
rank every problem perfectly, one told its reverse must rank every problem backwards, and the sealed third is read
only when asked for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tests.formats_for_tests  # noqa: F401  (a tasks folder of the tests' own, before any import)
from benchmarks import zeroshot_score
from kernelcast.kernels.formats import submission_of
from kernelcast.surrogate import registry
from kernelcast.surrogate.forecast import gaussian_forecasts

SET = Path(zeroshot_score.__file__).parent / "zeroshot"


def _small_set(tmp_path: Path) -> Path:
    """Two development problems and one sealed one of the committed set, with its manifest trimmed to them."""
    manifest = json.loads((SET / "manifest.json").read_text())
    dev = [p for p in manifest["problems"] if not p["sealed"]][:2]
    sealed = [p for p in manifest["problems"] if p["sealed"]][:1]
    folder = tmp_path / "set"
    folder.mkdir()
    for p in dev + sealed:
        shutil.copytree(SET / p["name"], folder / p["name"])
    (folder / "manifest.json").write_text(json.dumps({**manifest, "problems": dev + sealed}))
    return folder


def _speedup_of(kernel: str, position: int) -> float:
    return 0.3 + 0.25 * position + (0.9 if kernel.startswith("triton_b1024") else 0.0)


def _measurements(folder: Path, out: Path) -> Path:
    """measurements.parquet and summary.json as zeroshot_measure.py writes them, for every problem of ``folder``
    (sealed ones too): the designed compile error fails to compile, wrong math is incorrect, the others run."""
    rows = []
    for problem in json.loads((folder / "manifest.json").read_text())["problems"]:
        rows.append({"problem": problem["name"], "kernel": "reference", "status": "ok", "speedup": 1.0,
                     "runtime_us_median": [100.0], "compile_seconds": 1.0, "gpu_seconds": 2.0})
        for i, kernel in enumerate(problem["kernels"]):
            status = {"missing": "compile_error", "wrong": "incorrect"}.get(kernel, "ok")
            rows.append({"problem": problem["name"], "kernel": kernel, "status": status,
                         "speedup": _speedup_of(kernel, i) if status == "ok" else float("nan"),
                         "runtime_us_median": [100.0 / _speedup_of(kernel, i)] if status == "ok" else [],
                         "compile_seconds": 1.0, "gpu_seconds": 2.0})
    out.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(out / "measurements.parquet")
    (out / "summary.json").write_text(json.dumps({"device": "a synthetic H100"}))
    return out / "measurements.parquet"


class _Told:
    """A forecaster told the measured answer (``sign`` 1) or its reverse (-1): by operation and submitted text,
    what each kernel measured."""

    def __init__(self, answers: dict, sign: int, name: str):
        self.answers, self.sign, self.name = answers, sign, name

    def fit(self, pairs=None):
        return self

    def forecast(self, requests):
        known = [self.answers[r.op, submission_of(r.candidate.source)] for r in requests]
        mu = np.array([self.sign * np.log(s) if s > 0 else 0.0 for s, _ in known])
        p_fail = np.array([0.99 if failed else 0.01 for _, failed in known])
        return gaussian_forecasts(list(requests), self.name, "told", p_fail, mu, np.full(len(mu), 0.1), 0.0)


@pytest.fixture
def told(tmp_path, monkeypatch):
    """(set folder, measurements path): and forecasters `told` and `reversed`, registered for the test only."""
    folder = _small_set(tmp_path)
    path = _measurements(folder, tmp_path / "gpu")
    measured = pd.read_parquet(path)
    answers = {}
    for problem in json.loads((folder / "manifest.json").read_text())["problems"]:
        for kernel in problem["kernels"]:
            row = measured[(measured["problem"] == problem["name"]) & (measured["kernel"] == kernel)].iloc[0]
            text = (folder / problem["name"] / f"{kernel}.py").read_text()
            answers[f"kb.{problem['name']}", text] = (float(np.nan_to_num(row["speedup"])), row["status"] != "ok")
    monkeypatch.setitem(registry.SURROGATES, "told",
                        registry.SurrogateEntry(lambda: _Told(answers, 1, "told")))
    monkeypatch.setitem(registry.SURROGATES, "reversed",
                        registry.SurrogateEntry(lambda: _Told(answers, -1, "reversed")))
    return folder, path


def test_a_forecaster_told_the_measured_answer_ranks_every_development_problem_perfectly(told, tmp_path):
    folder, path = told
    out = tmp_path / "score"
    assert zeroshot_score.main(["--set", str(folder), "--measurements", str(path), "--forecasters", "told,reversed",
                                "--out", str(out), "--draws", "50"]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["problems"] == "dev" and result["n_problems"] == 2 and result["device"] == "a synthetic H100"
    mine, theirs = result["forecasters"]["told"], result["forecasters"]["reversed"]
    assert mine["problems"] == 2 and mine["spearman_problems"] == 2
    assert mine["spearman"] == pytest.approx(1.0) and mine["spearman_median"] == pytest.approx(1.0)
    assert mine["top1_within_10pct"] == pytest.approx(1.0)
    assert mine["failure_auroc"] == pytest.approx(1.0)
    assert mine["measured_compile_errors_at_095"] == "2/2" and mine["compile_errors_at_095"] == "2/2"
    assert theirs["spearman"] == pytest.approx(-1.0) and theirs["spearman_median"] == pytest.approx(-1.0)
    assert theirs["top1_within_10pct"] < 1.0
    printed = out.with_suffix(".txt").read_text()
    assert "Spearman median" in printed and "top-1 within 10%" in printed and "distinct forecasts" in printed


def test_the_sealed_third_is_scored_only_with_sealed(told, tmp_path):
    folder, path = told
    out = tmp_path / "sealed"
    assert zeroshot_score.main(["--set", str(folder), "--measurements", str(path), "--forecasters", "told",
                                "--out", str(out), "--draws", "20", "--sealed"]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    sealed = [p["name"] for p in json.loads((folder / "manifest.json").read_text())["problems"] if p["sealed"]]
    assert result["problems"] == "sealed" and result["n_problems"] == len(sealed) == 1
    scored = pd.read_parquet(str(out) + "-forecasts.parquet")
    assert set(scored["problem"]) == set(sealed)
    with pytest.raises(SystemExit):
        zeroshot_score.parse(["--problems", "sealed"])  # never by accident


def test_every_registered_forecaster_that_needs_no_folder_is_scored_by_default():
    names = zeroshot_score.parse([]).forecasters.split(",")
    assert {"physics", "physics-fit", "learned", "learned-facts", "labels", "source", "roofline"} <= set(names)
    assert "lmhead" not in names and "oracle" not in names


def test_a_problems_kernels_are_scored_in_candidate_id_order_not_the_manifests(told):
    """Ties in a ranking go to the first kernel; the manifest lists BLOCK 1024, often the best, first."""
    folder, path = told
    problems = zeroshot_score.problems_of(folder, "dev")
    rows = []
    for problem in problems:
        _, kernels = zeroshot_score.imported(folder, problem)
        rows += [{"problem": problem["name"], "kernel": k, "candidate_id": c.candidate_id} for k, c in kernels.items()]
    table = pd.DataFrame(rows)
    measured, _ = zeroshot_score.read_measurements(str(path), problems)
    scored = zeroshot_score.truth(table, measured)
    for problem, g in scored.groupby("op", sort=False):
        ids = table.loc[g["row"], "candidate_id"].tolist()
        assert ids == sorted(ids)
        assert g["kernel"].tolist() != [k for k in table[table["problem"] == problem]["kernel"]]
