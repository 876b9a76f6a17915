"""Bins, measured pairs, and the learned and baseline forecasters on the committed pool."""

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from kernelcast.storage.dataset import DataRoot
from kernelcast.surrogate.bins import BIN_SPEEDUP, expected_speedup, speedup_bin
from kernelcast.surrogate.dataset import case_pairs, requests_from, split
from kernelcast.surrogate.registry import get_forecaster_factory

POOL = Path(__file__).resolve().parent.parent / "data" / "pools"


@pytest.mark.parametrize("speedup,expected", [
    (None, 0), (float("nan"), 0), (-1.0, 0), (0.1, 1), (0.25, 1), (0.3, 2), (0.71, 3), (0.99, 4),
    (1.0, 4), (1.2, 5), (1.41, 5), (2.0, 6), (3.9, 7), (4.01, 8), (math.inf, 8)])
def test_speedup_bin_follows_the_papers_edges(speedup, expected):
    assert speedup_bin(speedup) == expected


def test_expected_speedup_of_a_certain_bin_is_that_bins_speedup():
    for k in range(8):
        probs = [0.0] * 8
        probs[k] = 1.0
        assert expected_speedup(probs) == pytest.approx(BIN_SPEEDUP[k])
    with pytest.raises(ValueError, match="8 bin probabilities"):
        expected_speedup([1.0] * 7)


@pytest.fixture(scope="module")
def pairs():
    return case_pairs(DataRoot(str(POOL)))


def test_pairs_are_per_case_and_anchored_at_the_eager_reference(pairs):
    assert set(pairs["op"]) >= {"softmax", "matmul"} and len(pairs) > 6000
    row = pairs.iloc[0]
    assert row["speedup"] == pytest.approx(row["anchor_runtime_us"] / row["runtime_us"])
    assert speedup_bin(row["speedup"]) == row["true_bin"]
    assert pairs.groupby("candidate_id")["case_name"].nunique().eq(3).all()


@pytest.fixture(scope="module")
def random_split(pairs):
    (_, train, test), = split(pairs, "random", seed=1)
    return train, test.sample(n=600, random_state=0)


@pytest.fixture(scope="module")
def learned(random_split):
    """The registered learned forecaster with fewer boosting rounds (60, and 30 for its source model,
    whose forecasts the tests compare with its own): its rank correlation here is 0.95 against 0.97
    with the defaults, in a third of the time."""
    from kernelcast.surrogate.learned import LearnedForecaster

    assert isinstance(get_forecaster_factory("learned")(), LearnedForecaster)
    return LearnedForecaster(max_iter=60, source_max_iter=30).fit(random_split[0])


def _spearman(name, train, test, forecaster=None):
    forecaster = forecaster or get_forecaster_factory(name)().fit(train)
    forecasts = forecaster.forecast(requests_from(test))
    assert len(forecasts) == len(test)
    for f in forecasts[:20]:
        assert len(f.probabilities) == 8 and sum(f.probabilities) == pytest.approx(1.0) and f.parsed
    return spearmanr([f.expected_speedup for f in forecasts], test["speedup"]).statistic


def test_learned_forecaster_ranks_held_out_candidates_far_better_than_random(random_split, learned):
    train, test = random_split
    learned, random = _spearman("learned", train, test, learned), _spearman("random", train, test)
    assert learned > 0.8 and abs(random) < 0.2


def test_learned_expected_speedup_is_its_median_and_separates_candidates_within_a_bin(random_split, learned):
    forecasts = learned.forecast(requests_from(random_split[1]))
    mu = np.array([f.extra["log_speedup_mean"] for f in forecasts])
    assert np.allclose([math.log(f.expected_speedup) for f in forecasts], mu)
    same_bin = [f for f in forecasts if f.predicted_bin == forecasts[0].predicted_bin]
    assert len({round(f.expected_speedup, 6) for f in same_bin}) > 0.9 * len(same_bin)


def test_requests_of_one_candidate_share_one_candidate_and_anchor(pairs):
    requests = requests_from(pairs[pairs["op"] == "softmax"].head(9))  # three candidates, three cases each
    assert len({id(r.candidate) for r in requests}) == len({r.candidate.candidate_id for r in requests}) == 3
    assert len({id(r.anchor) for r in requests}) == 1


def test_learned_forecast_of_an_empty_batch_is_empty(learned):
    assert learned.forecast([]) == []


def test_roofline_forecaster_needs_no_training_and_ranks_better_than_random(random_split):
    train, test = random_split
    assert _spearman("roofline", None, test) > 0.3


def test_learned_forecaster_refuses_to_fit_on_almost_nothing(pairs):
    with pytest.raises(ValueError, match="at least 20 measured pairs"):
        get_forecaster_factory("learned")().fit(pairs.head(5))


def test_unknown_surrogate_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown surrogate 'lerned'; known: learned"):
        get_forecaster_factory("lerned")


def test_gaussian_over_log_speedup_puts_its_mass_in_the_right_bins():
    from kernelcast.surrogate.learned import bin_probabilities

    probs = bin_probabilities(np.log(np.array([1.2, 3.0, 1.0])), np.array([0.01, 0.01, 2.0]))
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    assert probs[0].argmax() + 1 == speedup_bin(1.2) and probs[0].max() > 0.99
    assert probs[1].argmax() + 1 == speedup_bin(3.0)
    assert probs[2].max() < 0.5  # a wide spread is unsure


def test_learned_forecast_of_a_kernel_that_is_no_template_variant_comes_from_its_source(random_split, learned):
    import dataclasses

    requests = requests_from(random_split[1].head(30))
    foreign = [dataclasses.replace(r, candidate=dataclasses.replace(r.candidate, template=None, origin="import"))
               for r in requests]
    novel = learned.forecast(foreign)
    p_fail, mu, sigma = learned.source_.predict(foreign)
    assert [f.extra["log_speedup_mean"] for f in novel] == pytest.approx(list(mu))
    assert [f.extra["log_speedup_sigma"] for f in novel] == pytest.approx(list(sigma))
    assert [f.failure_probability for f in novel] == pytest.approx(list(p_fail))


def test_learned_split_spread_agrees_with_the_whole_forecast_and_is_the_source_models_for_novel_kernels(
        random_split, learned):
    import dataclasses

    requests = requests_from(random_split[1].head(60))
    mu, sigma = learned.predict_log_speedup(requests)
    mu2, sigma2, within = learned.predict_log_speedup_split(requests)
    assert np.allclose(mu, mu2) and np.allclose(sigma, sigma2)
    assert (within > 0).all() and not np.allclose(within, sigma)  # a model of its own
    foreign = [dataclasses.replace(r, candidate=dataclasses.replace(r.candidate, template=None)) for r in requests]
    _, novel_sigma, novel_within = learned.predict_log_speedup_split(foreign)
    assert np.allclose(novel_sigma, learned.source_.predict(foreign)[2]) and np.allclose(novel_within, novel_sigma)


def test_a_prior_held_out_by_gpu_type_is_as_sure_of_a_ported_op_as_its_errors_warrant(pairs):
    from kernelcast.surrogate.learned import LearnedForecaster

    some = pairs[pairs["op"].isin(["softmax", "rmsnorm", "layernorm", "bias_gelu", "cross_entropy"])]
    target = (some["op"] == "cross_entropy") & (some["gpu_type"] == "h100")
    asked = some[target & (some["speedup"] > 0)]
    # The source model plays no part in template variants' forecasts: few rounds for it.
    new_op = LearnedForecaster(max_iter=100, source_max_iter=20).fit(some[some["op"] != "cross_entropy"])
    ported = LearnedForecaster(max_iter=100, source_max_iter=20, held_out="gpu_type").fit(some[~target])
    truth = np.log(asked["speedup"].to_numpy())
    errors = {}
    for name, model in (("new", new_op), ("ported", ported)):
        mu, sigma, within = model.predict_log_speedup_split(requests_from(asked))
        errors[name] = (np.sqrt(np.mean((truth - mu) ** 2)), np.median(sigma), np.median(within))
    # Seeing the op on the H200 makes the forecast better, and the ported prior says so: its spread
    # tracks its own error instead of the far larger error of an op never seen.
    (new_err, new_sigma, _), (port_err, port_sigma, _) = errors["new"], errors["ported"]
    assert port_err < 0.7 * new_err
    assert port_sigma < 0.6 * new_sigma and 0.5 * port_err < port_sigma < 2.0 * port_err
    with pytest.raises(ValueError, match="held_out must be 'op' or 'gpu_type'"):
        LearnedForecaster(held_out="gpu")
