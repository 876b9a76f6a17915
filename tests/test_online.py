"""A search's surrogate: the split of its spread into the operation's level and the within-pool
part, the level learned from measurements, and ranking children by log expected improvement."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from kernels.ops import get_operation
from kernels.records import HardwareSpec, Measurement
from kernels.spaces import get_space
from surrogate.forecast import Forecast
from surrogate.online import SearchSurrogate, log_expected_improvement, thompson_draw

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
