"""Calibration, metrics, selective policies and the offline evaluation, each on a case small
enough to check by hand, or on seeded synthetic data where the guarantee is statistical."""

import numpy as np
import pandas as pd
import pytest

from kernelcast.surrogate import metrics
from kernelcast.surrogate.bins import BIN_SPEEDUP, speedup_bin
from kernelcast.surrogate.calibration import IsotonicCalibrator, LevelSpreadCalibrator, PlattCalibrator, TemperatureCalibrator
from kernelcast.surrogate.forecast import Forecast
from kernelcast.surrogate.policies import BudgetPolicy, ConformalRiskPolicy, ThresholdPolicy

HALF_ON_1_AND_2 = np.array([[0.5, 0.5, 0, 0, 0, 0, 0, 0]])


def test_brier_crps_nll_match_hand_computed_values():
    # true bin 2: Brier 0.5^2 + 0.5^2; the CDF misses only at k=1 by 0.5; NLL -ln 0.5.
    assert metrics.brier(HALF_ON_1_AND_2, [2]) == pytest.approx(0.5)
    assert metrics.ordinal_crps(HALF_ON_1_AND_2, [2]) == pytest.approx(0.25 / 7)
    assert metrics.nll(HALF_ON_1_AND_2, [2]) == pytest.approx(np.log(2))


def test_ece_matches_a_hand_computed_value():
    probs = np.array([[0.7, 0.3, 0, 0, 0, 0, 0, 0],   # 70% sure, right
                      [0.6, 0.4, 0, 0, 0, 0, 0, 0]])  # 60% sure, wrong
    assert metrics.ece(probs, [1, 2]) == pytest.approx(0.5 * 0.3 + 0.5 * 0.6)


def test_selective_risk_at_coverage_trusts_the_most_confident_first():
    scores, losses = np.array([0.9, 0.8, 0.7, 0.6]), np.array([0, 1, 0, 1])
    assert metrics.selective_risk_at(scores, losses, (0.25, 0.5, 1.0)) == \
        pytest.approx({0.25: 0.0, 0.5: 0.5, 1.0: 0.5})
    assert metrics.aurc(scores, losses) == pytest.approx(np.mean([0, 1 / 2, 1 / 3, 2 / 4]))


def test_zero_one_loss_counts_near_misses_that_the_default_loss_forgives():
    probs = np.eye(8)[[3, 3]]  # both say bin 4
    assert list(metrics.selective_loss(probs, [5, 7])) == [0.0, 1.0]
    assert list(metrics.selective_loss(probs, [5, 7], loss="bin_error")) == [1.0, 1.0]


def test_reliability_data_has_one_row_per_occupied_confidence_bin():
    probs = np.array([[0.9, 0.1] + [0] * 6, [0.9, 0.1] + [0] * 6, [0.3, 0.7] + [0] * 6])
    rel = metrics.reliability(probs, [1, 2, 2])
    assert list(rel["count"]) == [1, 2] and list(rel["accuracy"]) == [1.0, 0.5]


def test_topk_recovery_per_pool_and_the_share_within_five_percent():
    pred = np.array([5, 4, 3, 2, 1, 1, 2, 3, 4, 5], dtype=float)
    truth = np.array([2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.9, 4.0])
    groups = ["a"] * 5 + ["b"] * 5
    rec = metrics.topk_recovery(pred, truth, groups, k=0.2)  # top 1 of 5 per pool
    assert rec == pytest.approx([1.0, 1.0])
    rec = metrics.topk_recovery(-pred, truth, groups, k=0.4)  # top 2 by the reversed forecast
    assert rec == pytest.approx([0.5, 0.25])


def overconfident(n, seed):
    """99% sure of a bin that is right about 56% of the time."""
    rng = np.random.default_rng(seed)
    true = rng.integers(1, 9, n)
    guess = np.where(rng.random(n) < 0.5, true, rng.integers(1, 9, n))
    probs = np.full((n, 8), 0.01 / 7)
    probs[np.arange(n), guess - 1] = 0.99
    return probs, true


def test_temperature_scaling_lowers_the_nll_of_an_overconfident_forecaster_on_new_data():
    cal = TemperatureCalibrator().fit(*overconfident(2000, seed=0))
    probs, true = overconfident(2000, seed=1)
    assert cal.temperature_ > 1
    assert metrics.nll(cal.transform(probs), true) < metrics.nll(probs, true)


def test_isotonic_calibration_brings_confidence_to_accuracy_and_keeps_the_predicted_bin():
    cal = IsotonicCalibrator().fit(*overconfident(2000, seed=0))
    probs, true = overconfident(2000, seed=1)
    out = cal.transform(probs)
    assert np.allclose(out.sum(axis=1), 1) and (out.argmax(axis=1) == probs.argmax(axis=1)).all()
    assert metrics.ece(out, true) < 0.05 < metrics.ece(probs, true)


def test_isotonic_calibration_keeps_the_predicted_bin_when_it_lowers_a_close_top_bin():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(8, 0.5), 4000)  # often two bins close at the top
    true = rng.integers(1, 9, 4000)  # right 1 time in 8: the calibrated confidence falls to ~1/8
    out = IsotonicCalibrator().fit(probs, true).transform(probs)
    assert (out.argmax(axis=1) == probs.argmax(axis=1)).all()
    assert np.allclose(out.sum(axis=1), 1) and out.max(axis=1).mean() < 0.2


def test_platt_calibration_brings_confidence_to_accuracy_and_keeps_the_predicted_bin():
    cal = PlattCalibrator().fit(*overconfident(2000, seed=0))
    probs, true = overconfident(2000, seed=1)
    out = cal.transform(probs)
    assert np.allclose(out.sum(axis=1), 1) and (out.argmax(axis=1) == probs.argmax(axis=1)).all()
    assert metrics.ece(out, true) < 0.05 < metrics.ece(probs, true)
    assert out.max(axis=1) == pytest.approx(np.full(len(out), 0.56), abs=0.03)  # right ~56% of the time


def test_platt_calibration_follows_confidence_that_tracks_accuracy():
    rng = np.random.default_rng(3)
    sure = rng.uniform(0.2, 0.95, 6000)
    true = rng.integers(1, 9, 6000)
    guess = np.where(rng.random(6000) < sure ** 2, true, true % 8 + 1)  # right less often than it says
    probs = np.full((6000, 8), 0.0) + ((1 - sure) / 7)[:, None]
    probs[np.arange(6000), guess - 1] = sure
    cal = PlattCalibrator().fit(probs[:3000], true[:3000])
    out = cal.transform(probs[3000:])
    assert metrics.ece(out, true[3000:]) < 0.03 < metrics.ece(probs[3000:], true[3000:])
    assert np.all(np.diff(cal.confidence(probs[3000:][np.argsort(sure[3000:])])) >= -1e-12)  # monotone


def test_platt_calibration_stays_finite_when_every_calibration_forecast_is_right():
    probs = np.eye(8)[[0, 1, 2]] * 0.9 + 0.1 / 8
    cal = PlattCalibrator().fit(probs, [1, 2, 3])
    out = cal.transform(probs)
    assert np.isfinite(out).all() and (out.argmax(axis=1) == [0, 1, 2]).all()


def test_level_spread_calibration_recovers_a_known_shift_and_scale():
    rng = np.random.default_rng(0)
    mean = rng.normal(0, 0.8, 4000)
    truth = mean + 0.4 + rng.normal(0, 0.3, 4000)  # the forecast is 0.4 low and claims 0.6 spread
    true_bins = np.array([speedup_bin(float(np.exp(t))) for t in truth])
    cal = LevelSpreadCalibrator().fit(mean, np.full(4000, 0.6), true_bins)
    assert cal.shift_ == pytest.approx(0.4, abs=0.05) and cal.scale_ == pytest.approx(0.5, abs=0.08)
    before = LevelSpreadCalibrator(max_shift=0.0, log_scale_bounds=(0.0, 0.0)).fit(mean, np.full(4000, 0.6), true_bins)
    assert metrics.nll(cal.transform(mean, np.full(4000, 0.6)), true_bins) < \
        metrics.nll(before.transform(mean, np.full(4000, 0.6)), true_bins)


def test_level_spread_calibration_refuses_a_spread_that_is_not_positive():
    with pytest.raises(ValueError, match="spread finite and positive"):
        LevelSpreadCalibrator().fit([0.0, 0.1], [0.2, 0.0], [4, 5])
    with pytest.raises(ValueError, match="one mean and one spread per forecast"):
        LevelSpreadCalibrator().fit([0.0, 0.1], [0.2], [4, 5])


def forecast(cid, bin_, sure, parsed=True):
    p = np.full(8, (1 - sure) / 7)
    p[bin_ - 1] = sure
    return Forecast(cid, "ref", "test", "1", tuple(p), parsed=parsed)


def noisy_forecasts(n, rng):
    """Confidence that tracks correctness: right with probability equal to the confidence."""
    true = rng.integers(1, 9, n)
    sure = rng.uniform(0.2, 1.0, n)
    guess = np.where(rng.random(n) < sure, true, (true + 3) % 8 + 1)
    return [forecast(str(i), int(g), float(s)) for i, (g, s) in enumerate(zip(guess, sure))], true


def test_conformal_policy_risk_on_held_out_data_stays_under_the_target():
    rng = np.random.default_rng(7)
    policy = ConformalRiskPolicy(target_risk=0.05).fit(*noisy_forecasts(5000, rng))
    held, true = noisy_forecasts(50000, rng)
    trusted = np.array([policy.trusted(f) for f in held])
    wrong = np.array([abs(f.predicted_bin - b) > 1 for f, b in zip(held, true)])
    assert np.mean(trusted & wrong) <= 0.05
    assert trusted.mean() > 0.2  # while still trusting a real share


@pytest.mark.parametrize("budget", [0, 2, 100])
def test_budget_policy_never_trusts_unparsed_forecasts_and_measures_at_most_the_budget(budget):
    fs = [forecast(f"u{i}", 8, 0.99, parsed=False) for i in range(4)] + \
         [forecast(f"c{i}", 1, 0.99) for i in range(4)] + [forecast(f"s{i}", 5, 0.3) for i in range(4)]
    sel = BudgetPolicy(budget=budget, trust=ThresholdPolicy(threshold=0.9)).select(fs, best_speedup=1.0)
    assert len(sel.measure) <= budget
    assert not any(cid.startswith("u") for cid in sel.trust)
    assert sorted(sel.measure + sel.trust + sel.drop) == sorted(f.candidate_id for f in fs)


# ---- evaluate() end to end on a synthetic pool, with a fittable dummy forecaster ----

class HintForecaster:
    """Reads a noisy speedup hint out of the candidate's source; ``fit`` learns how often the
    hint's bin is right on the training pairs and uses that as its confidence (test-only)."""

    name, version = "hint", "1"

    def fit(self, pairs):
        hint_bins = [speedup_bin(float(s.split()[-1])) for s in pairs["source"]]
        self.confidence_ = float(np.clip(np.mean(np.array(hint_bins) == pairs["true_bin"]), 0.2, 0.95))
        return self

    def forecast(self, requests):
        out = []
        for r in requests:
            p = np.full(8, (1 - self.confidence_) / 7)
            p[speedup_bin(float(r.candidate.source.split()[-1])) - 1] = self.confidence_
            out.append(Forecast(r.candidate.candidate_id, r.anchor.candidate_id, self.name, self.version,
                                tuple(p)))
        return out


def synthetic_pairs(seed=0, per_pool=30):
    rng = np.random.default_rng(seed)
    rows = []
    for op in ("softmax", "rmsnorm", "transpose", "row_sum"):
        for case in ("small", "large"):
            for i in range(per_pool):
                s = float(np.exp(rng.normal(0, 0.8)))
                hint = s * float(np.exp(rng.normal(0, 0.1)))
                rows.append({"op": op, "gpu_type": "h100", "case_name": case, "candidate_id": f"{op}-{i}",
                             "source": f"# candidate {i} hint {hint}", "params": {}, "template": f"{op}/x",
                             "anchor_runtime_us": 10.0, "speedup": s, "true_bin": speedup_bin(s)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("how", ["random", "operation"])
def test_evaluate_keeps_the_conformal_risk_within_one_point_of_each_target_per_fold(how):
    from kernelcast.surrogate.evaluate import evaluate

    table = evaluate(HintForecaster, synthetic_pairs(per_pool=300), how=how)
    calibrated = table[table["forecasts"] == "calibrated"]
    for target in (5, 10):
        assert (calibrated[f"conformal{target}_risk"] <= target / 100 + 0.01).all()
        assert (calibrated[f"conformal{target}_coverage"] > 0).all()


def test_conformal_risk_over_many_calibration_draws_stays_within_one_point_of_each_target_per_fold():
    from kernelcast.surrogate.evaluate import conformal_draws

    rows = conformal_draws(BiasedGaussianForecaster, synthetic_pairs(per_pool=150), how="operation", draws=8)
    assert len(rows) == 4 * 8 * 2 and set(rows["target_risk"]) == {0.05, 0.10}
    per_fold = rows.groupby(["target_risk", "fold"])[["risk", "coverage"]].mean()
    for (target, _), row in per_fold.iterrows():
        assert row["risk"] <= target + 0.01
    assert per_fold["coverage"].min() > 0.2  # while trusting a real share
    with pytest.raises(ValueError, match="draws must be at least 1"):
        conformal_draws(BiasedGaussianForecaster, synthetic_pairs(), draws=0)


def test_cross_fitted_calibration_forecasts_never_saw_their_own_candidate():
    from kernelcast.surrogate.evaluate import _Recalibration, _forecast, measured_candidates

    pairs = synthetic_pairs(per_pool=100)
    test = pairs[pairs["op"] == "softmax"].reset_index(drop=True)
    raw, parsed, _, mean, sigma = _forecast(BiasedGaussianForecaster(), test, gaussian=True)
    measured = measured_candidates(test, 0.2, 0)
    fit = _Recalibration(raw, mean, sigma, test, "platt", True)
    crossed = fit.cross_fitted(measured, 0)
    in_sample = fit(measured, measured)[0]
    assert crossed.shape == in_sample.shape and np.allclose(crossed.sum(axis=1), 1)
    assert not np.allclose(crossed, in_sample)  # each part fit without it: different maps
    # Refit on one part's complement by hand: the same numbers for that part.
    ids = np.random.default_rng(0).permutation(np.sort(test.loc[measured, "candidate_id"].unique()))
    inside = measured & test["candidate_id"].isin(set(ids[0::5])).to_numpy()
    by_hand = fit(measured & ~inside, inside)[0]
    assert np.allclose(crossed[np.isin(np.flatnonzero(measured), np.flatnonzero(inside))], by_hand)


def test_unknown_calibrator_is_a_clear_error():
    from kernelcast.surrogate.evaluate import evaluate

    with pytest.raises(ValueError, match="unknown calibrator 'beta'; known: temperature, isotonic, platt"):
        evaluate(HintForecaster, synthetic_pairs(), calibrator="beta")
    with pytest.raises(ValueError, match="unknown calibrate_on 'test'; known: measured, training"):
        evaluate(HintForecaster, synthetic_pairs(), calibrate_on="test")


class BiasedGaussianForecaster:
    """A Gaussian over log speedup centred on a noisy hint, shifted by ``bias`` on softmax (test-only):
    the level error a forecaster makes on an operation it has not seen."""

    name, version, bias = "gaussian", "1", 1.0

    def fit(self, pairs):
        return self

    def forecast(self, requests):
        from kernelcast.surrogate.learned import bin_probabilities

        mu = np.array([np.log(float(r.candidate.source.split()[-1])) - (self.bias if r.op == "softmax" else 0.0)
                       for r in requests])
        probs = bin_probabilities(mu, np.full(len(mu), 0.3))
        return [Forecast(r.candidate.candidate_id, r.anchor.candidate_id, self.name, self.version,
                         tuple(p / p.sum()), extra={"log_speedup_mean": float(m), "log_speedup_sigma": 0.3})
                for r, p, m in zip(requests, probs, mu)]


def test_evaluate_recentres_a_gaussian_forecaster_per_operation_on_the_measured_candidates():
    from kernelcast.surrogate.evaluate import evaluate

    pairs = synthetic_pairs(per_pool=150)
    on = evaluate(BiasedGaussianForecaster, pairs, how="operation").set_index(["fold", "forecasts"])
    off = evaluate(BiasedGaussianForecaster, pairs, how="operation", recentre=False).set_index(["fold", "forecasts"])
    assert on.loc[("softmax", "calibrated"), "recentred_groups"] == 1
    assert off.loc[("softmax", "calibrated"), "recentred_groups"] == 0
    # Shifted by a whole bin's width on softmax: recentring wins back the bins the level error cost.
    assert on.loc[("softmax", "raw"), "bin_accuracy"] < 0.3
    assert on.loc[("softmax", "calibrated"), "bin_accuracy"] > 0.6
    assert off.loc[("softmax", "calibrated"), "bin_accuracy"] == pytest.approx(
        on.loc[("softmax", "raw"), "bin_accuracy"], abs=0.05)
    # The ranking is the forecaster's own either way.
    assert on.loc[("softmax", "calibrated"), "spearman"] == pytest.approx(off.loc[("softmax", "calibrated"), "spearman"])


def test_evaluate_leaves_a_forecaster_without_a_gaussian_as_it_is():
    from kernelcast.surrogate.evaluate import evaluate

    table = evaluate(HintForecaster, synthetic_pairs(per_pool=50), how="operation")
    assert (table.loc[table["forecasts"] == "calibrated", "recentred_groups"] == 0).all()


def test_calibrated_rows_score_only_the_candidates_not_used_to_calibrate():
    from kernelcast.surrogate.evaluate import evaluate

    pairs = synthetic_pairs(per_pool=50)  # 100 pairs of 50 candidates per operation
    table = evaluate(HintForecaster, pairs, how="operation", measured_fraction=0.2)
    fold = table[table["fold"] == "softmax"].set_index("forecasts")
    assert fold.loc["raw", "n"] == 100
    assert fold.loc["calibrated", "n"] == 80 and fold.loc["calibrated", "calibration_pairs"] == 20


def test_evaluate_writes_table_and_plots_and_logs_to_a_real_mlflow_store(tmp_path):
    from mlflow.tracking import MlflowClient

    from kernelcast.surrogate.evaluate import evaluate

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    table = evaluate(HintForecaster, synthetic_pairs(), how="operation", out_dir=str(tmp_path / "eval"),
                     name="hint", tracking_uri=uri)
    assert set(table["fold"]) == {"softmax", "rmsnorm", "transpose", "row_sum", "all"}
    overall = table[table["fold"] == "all"].set_index("forecasts")
    assert overall.loc["raw", "bin_accuracy"] > 0.5 and overall.loc["raw", "n"] == 240
    assert {"risk_at_coverage_50", "top10_within_5pct", "conformal5_risk", "conformal10_coverage"} <= set(table.columns)
    assert (tmp_path / "eval" / "hint-operation.csv").exists()
    assert (tmp_path / "eval" / "hint-operation.png").stat().st_size > 0

    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("surrogate-evaluation").experiment_id])
    assert run.data.params["surrogate"] == "hint"
    assert run.data.metrics["raw.bin_accuracy"] == pytest.approx(overall.loc["raw", "bin_accuracy"])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"hint-operation.csv", "hint-operation.png"}
