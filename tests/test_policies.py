"""Selective policies: budgets, never trusting unparsed forecasts, conformal risk control's guarantee."""

import math

import numpy as np
import pytest

from kernelcast.surrogate.forecast import Forecast
from kernelcast.surrogate.policies import BudgetPolicy, ConformalRiskPolicy, ThresholdPolicy


def forecast(cid, bin_, sure, parsed=True):
    p = np.full(8, (1 - sure) / 7)
    p[bin_ - 1] = sure
    return Forecast(cid, "ref", "test", "1", tuple(p), parsed=parsed)


def synthetic(n, rng):
    """Forecasts whose confidence tracks how often their bin is right."""
    true = rng.integers(1, 9, n)
    sure = rng.uniform(0.2, 1.0, n)
    right = rng.random(n) < sure
    guess = np.where(right, true, (true + 3) % 8 + 1)  # wrong means three bins away
    return [forecast(str(i), int(g), float(s)) for i, (g, s) in enumerate(zip(guess, sure))], true


@pytest.mark.parametrize("target", [0.05, 0.10])
def test_conformal_policy_keeps_trusted_and_wrong_under_the_target_on_new_data(target):
    # The guarantee is in expectation over calibration draws: average over many draws.
    rng = np.random.default_rng(0)
    test, test_bins = synthetic(20000, rng)
    sure = np.array([f.max_probability for f in test])
    wrong = np.array([abs(f.predicted_bin - b) > 1 for f, b in zip(test, test_bins)])
    risks, coverages = [], []
    for _ in range(200):
        policy = ConformalRiskPolicy(target_risk=target).fit(*synthetic(500, rng))
        trusted = sure >= policy.threshold
        risks.append(np.mean(trusted & wrong))
        coverages.append(np.mean(trusted))
    standard_error = np.std(risks) / np.sqrt(len(risks))
    assert np.mean(risks) <= target + 3 * standard_error
    assert np.mean(coverages) > 0.1  # and it does trust a real share of candidates


def test_conformal_policy_counts_a_candidates_cases_as_one_exchangeable_unit():
    # 60 candidates of 3 cases each: the finite-sample term is 1/(60+1), not 1/(180+1), so
    # a 1% target that 180 independent forecasts could certify is out of reach.
    fs = [forecast(f"{i}-{c}", 4, 0.9) for i in range(60) for c in range(3)]
    units = [f.candidate_id.split("-")[0] for f in fs]
    assert ConformalRiskPolicy(target_risk=0.01).fit(fs, [4] * len(fs)).threshold == pytest.approx(0.9)
    assert ConformalRiskPolicy(target_risk=0.01).fit(fs, [4] * len(fs), units=units).threshold == float("inf")


def test_conformal_policy_trusts_nothing_when_too_few_calibration_points_certify_the_target():
    policy = ConformalRiskPolicy(target_risk=0.05).fit([forecast("a", 4, 0.99)] * 10, [4] * 10)
    assert policy.threshold == float("inf") and not policy.trusted(forecast("b", 4, 0.999))


def test_budget_policy_measures_at_most_the_budget_and_never_trusts_unparsed():
    fs = [forecast(f"u{i}", 6, 0.99, parsed=False) for i in range(5)] + \
         [forecast(f"s{i}", 2, 0.3) for i in range(5)] + [forecast(f"c{i}", 1, 0.99) for i in range(5)]
    sel = BudgetPolicy(budget=4, trust=ThresholdPolicy(threshold=0.9)).select(fs, best_speedup=1.0)
    assert len(sel.measure) == 4
    assert not any(cid.startswith("u") for cid in sel.trust)
    assert {f"c{i}" for i in range(5)} <= set(sel.drop)  # confident losers are dropped
    assert sorted(sel.measure + sel.trust + sel.drop) == sorted(f.candidate_id for f in fs)


def test_a_confident_new_best_is_measured_not_trusted():
    sel = BudgetPolicy(budget=1, trust=ThresholdPolicy(threshold=0.9)).select(
        [forecast("star", 8, 0.99), forecast("meh", 3, 0.4)], best_speedup=1.0)
    assert sel.measure == ["star"] and "star" not in sel.trust


def test_a_confident_new_best_beyond_the_budget_waits_for_a_later_generation_rather_than_being_trusted():
    # Measured on a replay of KernelBench level2/35 with the oracle (every forecast sure): the generation's budget
    # went to the roots, the 2.53x child was trusted as leftover, so never measured and never offered again, and
    # the oracle's best stayed 2.10x while the learned surrogate, unsure of it, measured it two generations later.
    trust = ThresholdPolicy(threshold=0.9)
    stars = [forecast(f"star{i}", 8, 0.99) for i in range(3)]
    level = Forecast("level", "ref", "test", "1", stars[0].probabilities, expected_speedup=2.0,
                     extra={"log_speedup_mean": math.log(2.0), "log_speedup_sigma": 0.01})
    sel = BudgetPolicy(budget=1, trust=trust).select([*stars, level], best_speedup=2.0)
    assert sel.measure == ["star0"]
    assert {"star1", "star2"} <= set(sel.drop) and not {"star1", "star2"} & set(sel.trust)
    assert sel.trust == ["level"]  # a sure tie with the best is still trusted: measuring it finds nothing
    # and a generation with budget left over measures the waiting ones first
    sel = BudgetPolicy(budget=0, trust=trust, spend_all=True).select(stars, best_speedup=2.0)
    assert sel.measure == [] and sorted(sel.drop) == ["star0", "star1", "star2"]


def test_a_child_in_the_top_bin_is_no_sure_loss_against_a_best_within_that_bin():
    # The top bin is 4x and up: a forecast of bins alone cannot say a child there is slower than a 13x incumbent,
    # though the bins' representative (5.66x) is. Measured on a replay of a KernelBench problem whose CUDA-L1 kernel
    # ran at 13.1x: every variant of it was forecast in the top bin and dropped as a sure loss.
    trust = ThresholdPolicy(threshold=0.9)
    top, low = forecast("top", 8, 0.99), forecast("low", 6, 0.99)
    sel = BudgetPolicy(budget=1, trust=trust).select([top, low], best_speedup=13.1)
    assert sel.measure == ["top"] and sel.drop == ["low"]  # 1.41-2x lies wholly below 13.1x
    # a continuous forecaster's point estimate says which side it is on
    above = Forecast("above", "ref", "test", "1", top.probabilities, expected_speedup=17.0,
                     extra={"log_speedup_mean": math.log(17.0), "log_speedup_sigma": 0.2})
    below = Forecast("below", "ref", "test", "1", top.probabilities, expected_speedup=6.0,
                     extra={"log_speedup_mean": math.log(6.0), "log_speedup_sigma": 0.2})
    sel = BudgetPolicy(budget=1, trust=trust).select([below, above], best_speedup=13.1)
    assert sel.measure == ["above"] and sel.drop == ["below"]


def test_bad_policy_settings_are_clear_errors():
    with pytest.raises(ValueError, match="unknown confidence score 'certainty'"):
        ThresholdPolicy(score="certainty")
    with pytest.raises(ValueError, match="target risk must lie in"):
        ConformalRiskPolicy(target_risk=1.5)
    with pytest.raises(ValueError, match="budget must be zero or more"):
        BudgetPolicy(budget=-1, trust=ThresholdPolicy())


# ---- failure-aware selection ------------------------------------------------------------------


def test_a_confident_bin_is_not_trusted_when_the_kernel_is_not_as_sure_to_run():
    trust = ThresholdPolicy(threshold=0.9)
    sure = forecast("a", 3, 0.95)
    assert trust.trusted(sure)
    assert trust.trusted(sure.with_failure(0.05)) and not trust.trusted(sure.with_failure(0.2))


def test_a_child_as_sure_to_fail_as_trust_needs_is_dropped_unmeasured():
    fs = [forecast("doomed", 7, 0.4).with_failure(0.95), forecast("maybe", 5, 0.4).with_failure(0.5),
          forecast("plain", 5, 0.4)]
    sel = BudgetPolicy(budget=3, trust=ThresholdPolicy(threshold=0.9)).select(fs, best_speedup=1.0)
    assert sel.drop == ["doomed"] and sorted(sel.measure) == ["maybe", "plain"]
    kept = BudgetPolicy(budget=3, trust=ThresholdPolicy(threshold=0.9), drop_failures=False).select(fs, 1.0)
    assert "doomed" in kept.measure


def test_budget_left_in_the_last_generation_is_spent_on_children_forecast_to_fail_likeliest_to_run_first():
    fs = [forecast("doomed", 7, 0.4).with_failure(0.99), forecast("likelier", 7, 0.4).with_failure(0.91),
          forecast("plain", 5, 0.4)]
    trust = ThresholdPolicy(threshold=0.9)
    kept = BudgetPolicy(budget=2, trust=trust).select(fs, best_speedup=1.0)
    assert kept.measure == ["plain"] and sorted(kept.drop) == ["doomed", "likelier"]  # budget saved for later
    last = BudgetPolicy(budget=2, trust=trust, spend_all=True).select(fs, best_speedup=1.0)
    assert last.measure == ["plain", "likelier"] and last.drop == ["doomed"]
    everything = BudgetPolicy(budget=5, trust=trust, spend_all=True).select(fs, best_speedup=1.0)
    assert sorted(everything.measure) == ["doomed", "likelier", "plain"] and everything.drop == []


def test_rankings_are_weighted_by_run_probability():
    from kernelcast.surrogate.online import log_expected_improvement, thompson_draw
    from kernelcast.surrogate.policies import run_weighted

    fast_but_fragile = forecast("fragile", 7, 0.4).with_failure(0.8)
    slower_but_sound = forecast("sound", 6, 0.4).with_failure(0.1)
    for score in (lambda f: log_expected_improvement(f, 1.0), lambda f: thompson_draw(f, "0:1")):
        assert score(fast_but_fragile) > score(slower_but_sound)
        assert run_weighted(score)(slower_but_sound) > run_weighted(score)(fast_but_fragile)
    sel = BudgetPolicy(budget=1, trust=ThresholdPolicy(threshold=0.9)).select([fast_but_fragile, slower_but_sound])
    assert sel.measure == ["sound"]


def test_forecasts_that_say_nothing_about_failure_are_selected_as_before():
    import math

    from kernelcast.surrogate.online import log_expected_improvement
    from kernelcast.surrogate.policies import run_weighted

    rng = np.random.default_rng(3)
    fs = [forecast(str(i), int(b), float(s)) for i, (b, s) in enumerate(zip(rng.integers(1, 9, 40),
                                                                         rng.uniform(0.2, 1.0, 40)))]
    assert all(math.isnan(f.failure_probability) and f.run_probability == 1.0 for f in fs)
    score = lambda f: log_expected_improvement(f, 1.2)  # noqa: E731
    assert [run_weighted(score)(f) for f in fs] == [score(f) for f in fs]
    trust = ThresholdPolicy(threshold=0.8)
    sel = BudgetPolicy(budget=6, trust=trust, rank=run_weighted(score)).select(fs, best_speedup=1.2)
    # What the policy did before failure was forecast, spelled out: confident new bests (bins wholly above the
    # best, 1.41x and up) first, then the unsure by score, among them the confident ones whose bin holds the best
    # (bin 5, 1.0-1.41x); confident losers (bins wholly below) dropped.
    sure = [f for f in fs if f.max_probability >= 0.8]
    unsure = [f for f in fs if f.max_probability < 0.8 or f.predicted_bin == 5]
    queue = sorted([f for f in sure if f.predicted_bin >= 6], key=lambda f: -f.expected_speedup) + \
        sorted(unsure, key=lambda f: -score(f))
    assert sel.measure == [f.candidate_id for f in queue[:6]]
    assert set(sel.drop) == {f.candidate_id for f in sure if f.predicted_bin <= 4} | \
        {f.candidate_id for f in queue[6:] if f.max_probability < 0.8}
    assert {f.candidate_id for f in queue[6:] if f.max_probability >= 0.8} <= set(sel.trust)  # left, and trusted


def test_expected_improvement_per_second_measures_a_cheap_child_before_a_likelier_dear_one():
    """A child forecast a little likelier to beat the best, but of an origin that has cost 40 s a measurement
    (a max-autotune compile), waits behind one that costs 1 s under ei-per-second, not under ei."""
    from kernelcast.tasks.config import SearchConfig
    from kernelcast.tasks.search import select_children

    dear, cheap = forecast("dear", 6, 0.6), forecast("cheap", 6, 0.5)
    seconds = {"dear": 40.0, "cheap": 1.0}
    for acquisition, first in (("ei", "dear"), ("ei-per-second", "cheap")):
        config = SearchConfig(op="softmax", acquisition=acquisition, trust_threshold=0.99)
        chosen = select_children(config, [dear, cheap], best=1.0, generation=0, budget=1, cost=seconds.__getitem__)
        assert chosen.measure == [first], acquisition


def test_a_child_surely_slower_than_a_root_measured_beside_it_is_no_new_best():
    """A generation that measures the search's roots first weighs its children against a root it is sure of, not
    against the best before it (none, in the first generation). Measured on a replay of KernelBench level3/31
    with the oracle: a 1.45x compile variant (162 GPU seconds) was measured beside the 13.1x root it could not
    beat, and spent a budget of seconds the root's 16x CUDA graph needed. An unsure root changes nothing."""
    from kernelcast.tasks.config import SearchConfig
    from kernelcast.tasks.search import select_children

    def sure(cid, speedup, sigma=0.001):
        return Forecast(cid, "ref", "test", "1", forecast(cid, 6, 0.99).probabilities, expected_speedup=speedup,
                        failure_probability=0.001,
                        extra={"log_speedup_mean": math.log(speedup), "log_speedup_sigma": sigma})

    config = SearchConfig(op="softmax", trust_threshold=0.9)
    child = sure("compiled", 1.45)
    alone = select_children(config, [child], best=0.0, generation=0, budget=1)
    assert alone.measure == ["compiled"]  # nothing measured yet: a sure 1.45x is a new best
    beside = select_children(config, [child], best=0.0, generation=0, budget=1, measured_first=[sure("root", 13.1)])
    assert beside.measure == [] and beside.drop == ["compiled"]
    unsure_root = Forecast("root", "ref", "test", "1", tuple([1 / 8] * 8), expected_speedup=13.1,
                           extra={"log_speedup_mean": math.log(13.1), "log_speedup_sigma": 1.5})
    assert select_children(config, [child], best=0.0, generation=0, budget=1,
                           measured_first=[unsure_root]).measure == ["compiled"]


# ---- the oracle: hindsight over a measured space ------------------------------------------------


def test_the_oracle_forecasts_each_measured_outcome_of_its_root_as_certain_and_what_it_never_saw_as_unknown(tmp_path):
    """A committed variant space read back: every child's forecast is its measured speedup (over the reference,
    and over a measured parent where the request is against it), a failure is forecast as one, and a kernel the
    root never measured gets no confidence; a root without measurements is a clear error."""
    from pathlib import Path

    from kernelcast.kernels.records import Candidate
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
    from kernelcast.surrogate.baselines import OracleForecaster
    from kernelcast.surrogate.forecast import ForecastRequest
    from kernelcast.surrogate.registry import get_forecaster_factory, load_trained, reads_folder

    folder = Path(__file__).resolve().parents[1] / "data" / "pools" / "spaces" / "kb.cudal1-l2-035"
    op = "kb.cudal1-l2-035"
    root = DataRoot(str(folder))
    measured = {m.candidate_id: m for m in measurements_from_frame(root.read_measurements(op=op, gpu_type="h100"))}
    made = {c.candidate_id: c for c in candidates_from_frame(root.read_candidates(op))}
    ran = [m for m in measured.values() if m.status == "ok" and m.speedup and m.candidate_id in made]
    failed = [m for m in measured.values() if m.status != "ok" and m.candidate_id in made]
    assert len(ran) > 5 and failed
    hardware = ran[0].hardware
    assert reads_folder("oracle") and get_forecaster_factory("oracle")().name == "oracle"
    from kernelcast.tasks.setup import measurements_of

    oracle = load_trained("oracle", str(folder), measurements_of(str(folder)))
    anchor = made[ran[0].candidate_id]

    def ask(candidate, against=anchor, anchor_speedup=1.0):  # 1.0: as the reference's requests carry it
        return ForecastRequest(anchor=against, candidate=candidate, op=op, hardware=hardware,
                               anchor_speedup=anchor_speedup)

    requests = [ask(made[m.candidate_id]) for m in ran]
    mu, sigma = oracle.predict_log_speedup(requests)
    assert mu == pytest.approx([math.log(m.speedup) for m in ran], abs=1e-9)
    assert (sigma == OracleForecaster.SURE).all()
    # against a measured parent: the ratio of the two
    fast, slow = max(ran, key=lambda m: m.speedup), min(ran, key=lambda m: m.speedup)
    [m], _ = oracle.predict_log_speedup([ask(made[fast.candidate_id], made[slow.candidate_id], slow.speedup)])
    assert m == pytest.approx(math.log(fast.speedup / slow.speedup))
    [m], _ = oracle.predict_log_speedup([ask(made[fast.candidate_id], made[slow.candidate_id], math.nan)])
    assert m == pytest.approx(math.log(fast.speedup / slow.speedup))  # the anchor's own measurement, read
    assert oracle.predict_failure([ask(made[failed[0].candidate_id])])[0] == pytest.approx(1 - OracleForecaster.SURE)
    assert oracle.predict_failure(requests) == pytest.approx([OracleForecaster.SURE] * len(ran))
    # the forecasts a search ranks by carry the same point
    best = max(oracle.forecast(requests), key=lambda f: f.expected_speedup)
    assert best.candidate_id == fast.candidate_id and best.expected_speedup == pytest.approx(fast.speedup)
    stranger = Candidate(op=op, backend="torch", source=made[fast.candidate_id].source + "\n# never measured\n")
    [m], [s] = oracle.predict_log_speedup([ask(stranger)])
    assert (m, s) == (0.0, OracleForecaster.UNKNOWN_SIGMA)
    assert oracle.predict_failure([ask(stranger)])[0] == 0.5
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no measurements"):
        measurements_of(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="needs a reader of them"):  # the surrogate reads no storage itself
        load_trained("oracle", str(folder))
