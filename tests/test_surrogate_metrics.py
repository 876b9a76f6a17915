"""Surrogate metrics on hand-computed cases, temperature scaling, and the offline evaluation end to end."""

import numpy as np
import pandas as pd
import pytest

from kernelcast.surrogate import metrics
from kernelcast.surrogate.calibration import TemperatureCalibrator
from kernelcast.surrogate.evaluate import evaluate

CERTAIN_RIGHT = np.eye(8)[[3]]  # all mass on bin 4


def test_brier_crps_nll_of_a_certain_right_forecast_are_zero():
    assert metrics.brier(CERTAIN_RIGHT, [4]) == pytest.approx(0.0)
    assert metrics.ordinal_crps(CERTAIN_RIGHT, [4]) == pytest.approx(0.0)
    assert metrics.nll(CERTAIN_RIGHT, [4]) == pytest.approx(0.0, abs=1e-9)


def test_crps_grows_with_the_distance_in_bins_while_brier_does_not():
    near, far = metrics.ordinal_crps(CERTAIN_RIGHT, [5]), metrics.ordinal_crps(CERTAIN_RIGHT, [8])
    assert near == pytest.approx(1 / 7) and far == pytest.approx(4 / 7)
    assert metrics.brier(CERTAIN_RIGHT, [5]) == metrics.brier(CERTAIN_RIGHT, [8]) == pytest.approx(2.0)


def test_ece_of_a_half_sure_forecast_right_half_the_time_is_zero():
    probs = np.tile([0.5, 0.5, 0, 0, 0, 0, 0, 0], (4, 1))
    assert metrics.ece(probs, [1, 2, 1, 2]) == pytest.approx(0.0)
    assert metrics.ece(probs, [2, 2, 2, 2]) == pytest.approx(0.5)


def test_aurc_rewards_confidence_that_tracks_loss():
    losses = np.array([0, 0, 1, 1])
    assert metrics.aurc([4, 3, 2, 1], losses) < metrics.aurc([1, 2, 3, 4], losses)


def test_topk_recovery_and_pairwise_accuracy_on_a_hand_made_pool():
    truth = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    groups = ["p"] * 10
    assert metrics.topk_recovery(truth, truth, groups, k=0.1)[0] == pytest.approx(1.0)
    assert metrics.topk_recovery(-truth, truth, groups, k=0.1)[0] == pytest.approx(0.1)
    assert metrics.pairwise_accuracy(truth, truth, groups) == pytest.approx(1.0)
    assert metrics.pairwise_accuracy(np.zeros(10), truth, groups) == pytest.approx(0.5)  # ties are coin flips


def test_temperature_scaling_lowers_the_nll_of_an_overconfident_forecaster():
    rng = np.random.default_rng(0)
    true = rng.integers(1, 9, 2000)
    guess = np.where(rng.random(2000) < 0.5, true, rng.integers(1, 9, 2000))
    probs = np.full((2000, 8), 0.01 / 7)
    probs[np.arange(2000), guess - 1] = 0.99  # 99% sure, right about 56% of the time
    cal = TemperatureCalibrator().fit(probs, true)
    assert cal.temperature_ > 1.5
    assert metrics.nll(cal.transform(probs), true) < metrics.nll(probs, true)
    assert metrics.ece(cal.transform(probs), true) < metrics.ece(probs, true)


class _Oracle:
    """Fittable forecaster that puts 80% on the true bin it was told about (test-only)."""

    def fit(self, pairs):
        return self

    def forecast(self, requests):
        from kernelcast.surrogate.forecast import Forecast

        out = []
        for r in requests:
            p = np.full(8, 0.2 / 7)
            p[_TRUTH[r.candidate.candidate_id, r.case_names[0], r.hardware.gpu_type] - 1] = 0.8
            out.append(Forecast(r.candidate.candidate_id, r.anchor.candidate_id, "oracle", "1", tuple(p)))
        return out


_TRUTH: dict = {}


def test_evaluate_writes_its_table_and_plots(tmp_path):
    from pathlib import Path

    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs

    pool = Path(__file__).resolve().parent.parent / "data" / "pools"
    pairs = case_pairs(DataRoot(str(pool)))
    pairs = pairs[pairs["op"].isin(["softmax", "rmsnorm", "transpose"])]
    _TRUTH.update({(c, n, g): b for c, n, g, b in
                   zip(pairs["candidate_id"], pairs["case_name"], pairs["gpu_type"], pairs["true_bin"])})
    table = evaluate(_Oracle, pairs, how="operation", out_dir=str(tmp_path), name="oracle")
    raw = table[table["forecasts"] == "raw"].iloc[0]
    assert raw["bin_accuracy"] == pytest.approx(1.0) and raw["top10_within_5pct"] == pytest.approx(1.0)
    assert (tmp_path / "oracle-operation.csv").exists() and (tmp_path / "oracle-operation.png").exists()
    assert set(pd.read_csv(tmp_path / "oracle-operation.csv")["forecasts"]) == {"raw", "calibrated"}
