"""A search's surrogate: the split of its spread into the operation's level and the within-pool
part, the level learned from measurements, ranking children by log expected improvement, and
failure: carried from the forecaster, children forecast against their measured parent, and the
failure probability corrected by what the search measured fail."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import Candidate, HardwareSpec, Measurement
from kernelcast.kernels.spaces import get_space
from kernelcast.surrogate.forecast import Forecast
from kernelcast.surrogate.online import SearchSurrogate, log_expected_improvement, logit_shift, thompson_draw

H100 = HardwareSpec(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3")
LEVEL_ERROR = 0.7  # the prior's level is this far below the truth, for every child alike


def true_log_speedup(candidate) -> float:
    """A made-up, deterministic truth per candidate (test-only)."""
    return (int(candidate.candidate_id[:6], 16) % 1000) / 1000 - 0.5


class SplitSpreadForecaster:
    """A Gaussian prior that knows each child's place within the pool to 0.2 but the operation's
    level only to 0.8, and is off by LEVEL_ERROR (test-only)."""

    name, version = "split", "1"

    def predict_log_speedup(self, requests):
        return np.array([true_log_speedup(r.candidate) - LEVEL_ERROR for r in requests]), np.full(len(requests), 0.8)

    def predict_log_speedup_split(self, requests):
        mu, sigma = self.predict_log_speedup(requests)
        return mu, sigma, np.full(len(requests), 0.2)


class WholeSpreadForecaster:
    name, version = "whole", "1"
    predict_log_speedup = SplitSpreadForecaster.predict_log_speedup


@pytest.fixture(scope="module")
def children():
    return get_space("softmax").variants()[:60]


def surrogate_for(forecaster) -> SearchSurrogate:
    cases = get_operation("softmax").cases
    return SearchSurrogate(forecaster, "softmax", H100, [10.0] * len(cases))


def measured(candidate) -> Measurement:
    return Measurement(candidate.candidate_id, "softmax", "h100", "ok", "replay",
                       speedup=math.exp(true_log_speedup(candidate)))


def test_forecasts_carry_the_within_pool_spread_apart_from_the_whole(children):
    forecasts = surrogate_for(SplitSpreadForecaster()).forecast(children)
    assert all(f.extra["log_speedup_sigma_within"] == pytest.approx(0.2) for f in forecasts)
    assert all(f.extra["log_speedup_sigma"] == pytest.approx(math.hypot(0.2, math.sqrt(0.8 ** 2 - 0.2 ** 2)))
               for f in forecasts)


def test_a_forecaster_that_does_not_split_its_spread_is_ranked_by_the_whole(children):
    forecasts = surrogate_for(WholeSpreadForecaster()).forecast(children)
    assert all(f.extra["log_speedup_sigma_within"] == pytest.approx(0.8) for f in forecasts)


class FarAboveForecaster(SplitSpreadForecaster):
    """Every child some 17x faster than eager, beyond the top bin's 4x (test-only)."""

    def predict_log_speedup_split(self, requests):
        mu, sigma, within = super().predict_log_speedup_split(requests)
        return mu + LEVEL_ERROR + math.log(17.0), sigma, within


def test_a_forecasts_speedup_is_its_gaussians_point_not_the_bins_capped_one(children):
    # The bins' representative of the open top bin is 5.66x: a policy comparing it with a 13x incumbent dropped a
    # 17x child as a sure loss (a replayed KernelBench problem whose CUDA-L1 kernel ran at 13.1x).
    forecasts = surrogate_for(FarAboveForecaster()).forecast(children)
    assert all(f.expected_speedup == pytest.approx(math.exp(f.extra["log_speedup_mean"])) for f in forecasts)
    assert min(f.expected_speedup for f in forecasts) > 8.0 and all(f.predicted_bin == 8 for f in forecasts)


def test_measurements_pin_down_the_level_and_shrink_its_share_of_the_spread(children):
    surrogate = surrogate_for(SplitSpreadForecaster())
    first = surrogate.forecast(children[:20])
    surrogate.update({c.candidate_id: c for c in children[:20]}, first, [measured(c) for c in children[:20]])
    later = surrogate.forecast(children[20:])
    level_var = [f.extra["log_speedup_sigma"] ** 2 - f.extra["log_speedup_sigma_within"] ** 2 for f in later]
    # 0.6 a priori; after 20 measurements with within-pool spread 0.2: 1 / (1/0.6 + 20/0.04) ~ 0.002
    assert max(level_var) < 0.01
    # and the level error is mostly corrected: the mean moved up towards the truth
    shift = np.mean([f.extra["log_speedup_mean"] - f.extra["prior_log_speedup_mean"] for f in later])
    assert 0.5 < shift <= LEVEL_ERROR + 0.05


@pytest.mark.parametrize("mu, sigma", [(0.1, 0.2), (-0.5, 0.2), (-1.5, 0.2), (0.0, 1.0)])
def test_log_expected_improvement_is_the_log_of_the_closed_form(mu, sigma):
    z = mu / sigma
    ei = sigma * (z * norm.cdf(z) + norm.pdf(z))
    f = Forecast("c", "r", "x", "1", (1 / 8,) * 8, extra={"log_speedup_mean": mu, "log_speedup_sigma_within": sigma})
    assert log_expected_improvement(f, 1.0) == pytest.approx(math.log(ei), rel=1e-9)


def test_log_expected_improvement_keeps_children_far_below_the_best_in_order():
    # exp(-z^2 / 2) underflows past z ~ -38: expected improvement itself would tie them all at 0.
    gaps = np.linspace(-30.0, -8.5, 50)
    values = [log_expected_improvement(Forecast("c", "r", "x", "1", (1 / 8,) * 8, extra={
        "log_speedup_mean": float(g), "log_speedup_sigma_within": 0.2}), 1.0) for g in gaps]
    assert all(np.isfinite(values)) and np.all(np.diff(values) > 0)
    # across the switch to the tail's asymptote at z = -8, no step out of order
    near = [log_expected_improvement(Forecast("c", "r", "x", "1", (1 / 8,) * 8, extra={
        "log_speedup_mean": z * 0.2, "log_speedup_sigma_within": 0.2}), 1.0) for z in np.linspace(-8.2, -7.8, 41)]
    assert np.all(np.diff(near) > 0)


def test_log_expected_improvement_ranks_by_the_within_pool_spread_not_the_whole():
    def f(total):
        return Forecast("c", "r", "x", "1", (1 / 8,) * 8, extra={
            "log_speedup_mean": -0.1, "log_speedup_sigma": total, "log_speedup_sigma_within": 0.1})
    assert log_expected_improvement(f(0.2), 1.0) == log_expected_improvement(f(2.0), 1.0)


def _gaussian(cid, mu, sigma):
    return Forecast(cid, "r", "x", "1", (1 / 8,) * 8, extra={"log_speedup_mean": mu, "log_speedup_sigma_within": sigma,
                                                             "log_speedup_sigma": 5.0})


def test_thompson_draws_are_a_pure_function_of_the_key_and_the_candidate():
    f = _gaussian("abc", 0.3, 0.2)
    assert thompson_draw(f, "0:1") == thompson_draw(f, "0:1")
    assert thompson_draw(f, "0:1") != thompson_draw(f, "0:2")
    assert thompson_draw(_gaussian("abc", 0.3, 0.0), "0:1") == 0.3


def test_thompson_draws_follow_the_within_pool_gaussian():
    draws = np.array([thompson_draw(_gaussian("abc", 0.3, 0.2), f"s:{k}") for k in range(4000)])
    assert draws.mean() == pytest.approx(0.3, abs=0.01) and draws.std() == pytest.approx(0.2, abs=0.01)
    # The better of two children is chosen as often as it is likely to be the better one.
    a, b = _gaussian("a", 0.0, 0.1), _gaussian("b", 0.1, 0.1)
    wins = np.mean([thompson_draw(b, f"s:{k}") > thompson_draw(a, f"s:{k}") for k in range(4000)])
    assert wins == pytest.approx(norm.cdf(0.1 / math.hypot(0.1, 0.1)), abs=0.03)


CHILD_GAIN = 0.1  # a written child's log speedup over the anchor it is forecast against
BROKEN = "# BROKEN"  # a written child whose source says it fails (test-only)


class _ReadsSource:
    """A forecaster that, like the learned and source ones, reads a kernel against its anchor and says
    how likely it fails: 0.95 for a source marked BROKEN, 0.2 otherwise; it records the anchors it was
    asked against (test-only)."""

    name, version = "reads-source", "1"

    def __init__(self):
        self.anchors = []

    def _gaussian(self, requests):
        self.anchors += [r.anchor.candidate_id for r in requests]
        mu = np.array([CHILD_GAIN if r.candidate.template is None else true_log_speedup(r.candidate)
                       for r in requests])
        return mu, np.full(len(requests), 0.3)

    def predict_failure(self, requests):
        return np.array([0.95 if BROKEN in r.candidate.source else 0.2 for r in requests])


class SourceReadingForecaster(_ReadsSource):
    """Per-case Gaussians, as the learned forecaster gives."""

    def predict_log_speedup(self, requests):
        return self._gaussian(requests)

    def predict_log_speedup_split(self, requests):
        mu, sigma = self._gaussian(requests)
        return mu, sigma, sigma


class WholeSourceForecaster(_ReadsSource):
    """Whole forecasts with their Gaussian in ``extra``, as the source forecaster gives."""

    def forecast(self, requests):
        mu, sigma = self._gaussian(requests)
        return [Forecast(r.candidate.candidate_id, r.anchor.candidate_id, self.name, self.version, (1 / 8,) * 8,
                         expected_speedup=math.exp(m), failure_probability=float(p),
                         extra={"log_speedup_mean": float(m), "log_speedup_sigma": float(s)})
                for r, m, s, p in zip(requests, mu, sigma, self.predict_failure(requests))]


def written_children(parent, n: int, broken: int = 0) -> list[Candidate]:
    return [Candidate(op="softmax", backend="triton", source=parent.source + f"\n# rewrite {i}" +
                      (f"\n{BROKEN}" if i < broken else ""), params=dict(parent.params), parent_id=parent.candidate_id,
                      origin="llm") for i in range(n)]


def test_the_forecasters_failure_probability_survives_the_search_surrogate(children):
    kids = written_children(children[0], 4, broken=2)
    forecasts = surrogate_for(SourceReadingForecaster()).forecast(kids)
    assert [f.failure_probability for f in forecasts] == pytest.approx([0.95, 0.95, 0.2, 0.2])
    # a forecaster that says nothing of failure still says nothing
    assert all(math.isnan(f.failure_probability) for f in surrogate_for(SplitSpreadForecaster()).forecast(kids))


@pytest.mark.parametrize("forecaster", [SourceReadingForecaster, WholeSourceForecaster])
def test_a_written_child_of_a_measured_parent_is_forecast_against_it_and_shifted_by_its_speedup(children,
                                                                                                forecaster):
    forecaster = forecaster()
    surrogate = surrogate_for(forecaster)
    parent = children[0]
    kids = written_children(parent, 3, broken=1)
    before = surrogate.forecast(kids)  # the parent is not measured yet: against the reference
    assert set(forecaster.anchors) == {surrogate.reference.candidate_id}
    assert [f.extra["log_speedup_mean"] for f in before] == pytest.approx([CHILD_GAIN] * 3)
    surrogate.update({parent.candidate_id: parent}, [], [Measurement(
        parent.candidate_id, "softmax", "h100", "ok", "replay", speedup=2.0,
        runtime_us_median=(5.0,) * len(surrogate.case_names))])
    forecaster.anchors.clear()
    after = surrogate.forecast(kids)
    assert set(forecaster.anchors) == {parent.candidate_id}
    assert [f.extra["log_speedup_mean"] for f in after] == pytest.approx([CHILD_GAIN + math.log(2.0)] * 3)
    assert all(f.anchor_id == surrogate.reference.candidate_id for f in after)
    assert after[0].failure_probability == pytest.approx(0.95) and after[1].failure_probability == pytest.approx(0.2)
    # a template variant is forecast against the reference still, parent or none
    forecaster.anchors.clear()
    surrogate.forecast([children[1]])
    assert set(forecaster.anchors) == {surrogate.reference.candidate_id}


def test_the_logit_shift_is_the_map_estimate_and_shrinks_towards_none():
    logits = np.zeros(200)
    failed = np.arange(200) < 160  # 80% failed where 50% was forecast
    assert logit_shift(logits, failed, prior_sd=1e6) == pytest.approx(math.log(0.8 / 0.2), rel=1e-6)
    few = logit_shift(logits[:5], failed[:5], prior_sd=1.0)  # 5 of 5 failed: shrunk well short of +inf
    assert 0.5 < few < 2.0
    assert logit_shift(logits, failed, prior_sd=1.0) < math.log(4.0)  # the prior pulls towards 0
    assert logit_shift(np.array([]), np.array([], dtype=bool)) == 0.0


def test_measured_failures_move_the_failure_probabilities_and_a_refit_never_compounds(children):
    surrogate = surrogate_for(SourceReadingForecaster())
    kids = written_children(children[0], 40)  # all forecast 0.2; 30 of them fail
    first = surrogate.forecast(kids[:20])
    outcome = ["ok"] * 5 + ["compile_error"] * 15
    measurements = [Measurement(c.candidate_id, "softmax", "h100", s, "replay", speedup=1.0 if s == "ok" else None)
                    for c, s in zip(kids, outcome)]
    surrogate.update({c.candidate_id: c for c in kids}, first, measurements)
    once = surrogate.failure_shift_
    second = surrogate.forecast(kids[20:])
    assert once > 0 and all(0.2 < f.failure_probability < 0.75 for f in second)
    # the same 20 outcomes again, from forecasts made under the shift: the shift is taken back out first
    surrogate.update({c.candidate_id: c for c in kids}, second, [
        Measurement(c.candidate_id, "softmax", "h100", s, "replay", speedup=1.0 if s == "ok" else None)
        for c, s in zip(kids[20:], outcome)])
    assert surrogate.failure_shift_ == pytest.approx(logit_shift(np.full(40, math.log(0.25)),
                                                                 np.array([s != "ok" for s in outcome * 2])))
