"""The source forecaster: features of hand-written kernels, a fit on a small synthetic corpus, the
failure-aware metrics on hand-computed cases, and the learned forecaster's use of it."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelcast.surrogate import metrics
from kernelcast.surrogate.bins import speedup_bin
from kernelcast.surrogate.source import SOURCE_FEATURE_NAMES, CODE_FEATURES, change_features, code_features

POOL = Path(__file__).resolve().parent.parent / "data" / "pools"

PARENT = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _row_sum(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + row, tl.sum(x, axis=0))


def launch(x, y, num_warps=4):
    BLOCK = 128
    _row_sum[(x.shape[0],)](x, y, x.shape[1], BLOCK=BLOCK, num_warps=num_warps)
'''


def code(source: str) -> dict:
    return dict(zip(CODE_FEATURES, code_features(source)))


def change(source: str, anchor: str = PARENT) -> dict:
    from kernelcast.surrogate.source import CHANGE_FEATURES

    return dict(zip(CHANGE_FEATURES, change_features(source, anchor)))


def test_features_of_a_plain_kernel_count_its_triton_calls_and_written_constants():
    f = code(PARENT)
    assert f["parses"] == 1 and f["n_jit"] == 1 and f["n_functions"] == 2 and f["has_launch"] == 1
    assert (f["tl_load"], f["tl_store"], f["tl_reduce"], f["tl_arange"], f["tl_program_id"]) == (1, 1, 1, 1, 1)
    assert f["log2_block_written"] == 7 and f["n_masks"] == 1
    assert f["undefined_name"] == f["unjitted_launches"] == f["jit_called_from_host"] == 0
    assert f["missing_tl_attributes"] == 0


def test_a_kernel_that_does_not_parse_still_gets_features():
    cut = PARENT[: PARENT.index("tl.store")] + "tl.store(y_ptr + row, tl.sum(x"  # an answer cut at its token limit
    f = code(cut)
    assert f["parses"] == 0 and math.isnan(f["n_ast_nodes"])
    assert f["tl_load"] == 1 and f["n_jit"] == 1 and f["n_tokens"] > 50
    assert np.isfinite(change(cut)["token_edit_ratio"])


def test_a_helper_the_rewrite_dropped_is_an_undefined_name():
    f = code(PARENT.replace("x.shape[1], BLOCK", "_cols(x), BLOCK"))
    assert f["undefined_name"] == 1


def test_a_launch_of_a_function_without_triton_jit_is_counted():
    f = code(PARENT.replace("@triton.jit\n", ""))
    assert f["unjitted_launches"] == 1 and f["n_jit"] == 0


def test_a_jit_function_called_from_host_code_is_counted():
    f = code(PARENT + "\n\ndef helper(x, y):\n    return _row_sum(x, y, 1, 128)\n")
    assert f["jit_called_from_host"] == 1


def test_a_tl_attribute_the_installed_triton_lacks_is_counted():
    f = code(PARENT.replace("tl.sum(x, axis=0)", "tl.fancy_sum(x, axis=0) + tl.math.not_a_function(x)"))
    assert f["missing_tl_attributes"] == 2


HAND_BUILT = """
import math
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))  # not torch.Tensor(out, in)
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert isinstance(x, torch.Tensor)
        return x @ self.weight.t()
"""


def test_parameters_made_by_the_legacy_tensor_constructor_are_counted_and_torch_empty_is_not():
    f = code(HAND_BUILT)
    assert f["legacy_tensor_constructors"] == 0  # annotations, isinstance and comments are no construction
    assert f["hand_initialised"] == 1
    legacy = code(HAND_BUILT.replace("torch.empty(out_features", "torch.Tensor(out_features")
                  .replace("x @ self", "torch.FloatTensor(2) + x @ self"))
    assert legacy["legacy_tensor_constructors"] == 2 and legacy["hand_initialised"] == 1


def test_a_kernel_built_from_the_references_modules_is_not_hand_initialised():
    f = code(HAND_BUILT.replace("nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))", "self.linear = nn.Linear(2, 2)"))
    assert f["hand_initialised"] == 0 and f["legacy_tensor_constructors"] == 0
    assert code(PARENT)["hand_initialised"] == code(PARENT)["legacy_tensor_constructors"] == 0


def test_a_change_of_constants_against_the_parent_is_seen_and_a_reformatting_is_not():
    bigger = change(PARENT.replace("BLOCK = 128", "BLOCK = 256").replace("num_warps=4", "num_warps=8"))
    assert bigger["constants_changed"] == 4  # 128 and 4 gone, 256 and 8 come
    assert bigger["block_change"] == 1 and bigger["warps_change"] == 1 and bigger["same_as_anchor"] == 0
    assert 0 < bigger["token_edit_ratio"] < 0.1
    reformatted = change(PARENT.replace("    row = tl.program_id(0)", "    # one program per row\n\n"
                                        "    row = tl.program_id( 0 )"))
    assert reformatted["same_as_anchor"] == 1 and reformatted["constants_changed"] == 0
    assert reformatted["calls_added"] == reformatted["calls_removed"] == 0


def test_features_take_milliseconds():
    import time

    sources = [PARENT.replace("BLOCK = 128", f"BLOCK = {b}") for b in range(1, 41)]
    t0 = time.perf_counter()
    for s in sources:
        code_features(s)
        change_features(s, PARENT)
    assert (time.perf_counter() - t0) / len(sources) < 0.05


# ---- the forecaster on a small synthetic corpus -------------------------------------------------

HARDWARE = {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132,
            "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "bus_width_bits": 5120, "memory_gib": 79.2,
            "l2_mib": 50.0, "threads_per_sm": 2048, "driver_version": "", "cuda_version": "",
            "torch_version": "", "triton_version": ""}


def _row(op: str, i: int, source: str, failed: bool, speedup: float) -> dict:
    from kernelcast.kernels.ops import get_operation

    names = tuple(c.name for c in get_operation(op).cases)
    return {"op": op, "gpu_type": "h100", "candidate_id": f"{op}-{i}", "source": source,
            "params": {}, "template": None, "origin": "llm", "backend": "triton",
            "status": "runtime_error" if failed else "ok", "failed": failed, "case_names": names,
            "anchor_runtime_us": tuple(100.0 for _ in names), "anchor_source": PARENT, "anchor_params": {},
            "anchor_template": None, "anchor_origin": "template", "anchor_backend": "triton", "anchor_speedup": 1.5,
            "speedup": math.nan if failed else speedup, **HARDWARE}


@pytest.fixture(scope="module")
def corpus() -> pd.DataFrame:
    """Children of PARENT on three operations: those that call a dropped helper fail; the others run
    faster the larger the block they write."""
    rng = np.random.default_rng(0)
    rows = []
    for op in ("softmax", "rmsnorm", "row_sum"):
        for i in range(30):
            block = int(rng.choice([64, 128, 256, 512]))
            source = PARENT.replace("BLOCK = 128", f"BLOCK = {block}").replace("num_warps=4", f"num_warps={i % 8 + 1}")
            broken = i % 3 == 0
            if broken:
                source = source.replace("x.shape[1], BLOCK", "_cols(x), BLOCK")
            rows.append(_row(op, i, source, broken, block / 128 * float(np.exp(rng.normal(0, 0.05)))))
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def fitted(corpus):
    from kernelcast.surrogate.source import SourceForecaster

    return SourceForecaster(max_iter=40, folds=3).fit(corpus)


def test_source_forecasts_carry_bins_a_failure_probability_and_the_speed_they_learned(fitted, corpus):
    from kernelcast.surrogate.dataset import source_requests

    out = fitted.forecast(source_requests(corpus))
    assert len(out) == len(corpus) and all(len(f.probabilities) == 8 for f in out)
    assert all(0 <= f.failure_probability <= 1 for f in out) and {f.surrogate for f in out} == {"source"}
    ran = corpus[~corpus["failed"]]
    expected = np.array([f.expected_speedup for f, failed in zip(out, corpus["failed"]) if not failed])
    assert np.corrcoef(np.log(expected), np.log(ran["speedup"]))[0, 1] > 0.8


def test_failure_probability_moves_with_a_failing_feature(fitted, corpus):
    from kernelcast.surrogate.dataset import source_requests

    good = corpus[~corpus["failed"]].head(5)
    broken = good.assign(source=good["source"].str.replace("x.shape[1], BLOCK", "_cols(x), BLOCK", regex=False))
    p_good = fitted.predict_failure(source_requests(good))
    p_broken = fitted.predict_failure(source_requests(broken))
    assert (p_broken > p_good + 0.3).all()


def test_the_source_forecaster_refuses_too_little_data(corpus):
    from kernelcast.surrogate.source import SourceForecaster

    with pytest.raises(ValueError, match="at least 5 measured kernels that ran, got 3"):
        SourceForecaster().fit(corpus.head(5))  # two of the five call a dropped helper


def test_source_is_a_registered_surrogate():
    from kernelcast.surrogate.registry import get_forecaster_factory
    from kernelcast.surrogate.source import SourceForecaster

    assert isinstance(get_forecaster_factory("source")(), SourceForecaster)
    assert len(SOURCE_FEATURE_NAMES) == len(set(SOURCE_FEATURE_NAMES))


# ---- the measured corpus: pairs against the parent ----------------------------------------------

def test_source_pairs_anchor_children_at_their_parent_and_variants_at_the_reference():
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import source_pairs

    llm = DataRoot(str(POOL / "llm"))
    pairs = source_pairs(llm, gpu_type="h100")  # the reference comes from the template pool only
    assert pairs.empty or (pairs["anchor_origin"] == "seed").sum() == 0
    pairs = source_pairs(DataRoot(str(POOL)), llm, gpu_type="h100")
    children = pairs[pairs["origin"] == "llm"]
    parents = llm.read("provenance").set_index("candidate_id")["parent_id"]
    assert len(children) == len(parents) > 1000 and (children["anchor_id"] == children["candidate_id"].map(parents)).all()
    status = llm.read_measurements(gpu_type="h100").drop_duplicates("candidate_id", keep="last") \
        .set_index("candidate_id")["status"]
    assert (children["failed"] == (children["true_bin"] == 0)).all()
    assert (children["failed"] == (children["candidate_id"].map(status) != "ok")).all() and children["failed"].any()
    ran = children.loc[~children["failed"], "speedup"]  # against the parent: mostly the parent again
    assert ran.gt(0).all() and 0.95 < ran.median() < 1.05
    variants = pairs[pairs["origin"] == "template"]
    assert (variants["anchor_origin"] == "seed").all() and variants["speedup"].gt(0).all()


# ---- the failure-aware metrics, by hand ---------------------------------------------------------

def test_auroc_is_the_chance_a_failure_scores_above_a_kernel_that_runs():
    assert metrics.auroc([0.9, 0.8, 0.3, 0.1], [1, 0, 1, 0]) == pytest.approx(0.75)
    assert metrics.auroc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)  # a tie counts half
    assert math.isnan(metrics.auroc([0.1, 0.2], [0, 0]))


def test_nine_bin_metrics_put_failure_in_bin_zero():
    probs = metrics.with_failure(np.eye(8)[[3, 3]], [0.8, 0.1])  # bin 4 if it runs; 80% and 10% it fails
    assert probs.shape == (2, 9) and probs.sum(axis=1) == pytest.approx([1, 1])
    assert list(metrics.predicted_bins(probs)) == [0, 4]
    assert metrics.bin_accuracy(probs, [0, 4]) == 1.0
    # failure is no neighbour of bin 1: forecasting it for a kernel in bin 1 is wrong, as is the reverse
    assert list(metrics.selective_loss(probs, [1, 0])) == [1.0, 1.0]
    assert list(metrics.selective_loss(probs, [0, 5])) == [0.0, 0.0]


def test_nine_bin_ece_and_aurc_match_hand_computed_values():
    probs = metrics.with_failure(np.eye(8)[[3, 3]], [0.7, 0.4])  # 70% sure of failure; 60% sure of bin 4
    assert metrics.ece(probs, [0, 0]) == pytest.approx(0.5 * 0.3 + 0.5 * 0.6)
    losses = metrics.selective_loss(probs, [0, 0])  # right, then wrong
    assert metrics.aurc(probs.max(axis=1), losses) == pytest.approx(np.mean([0, 1 / 2]))
    assert metrics.random_aurc(losses) == pytest.approx(0.5)


def test_bootstrap_interval_brackets_the_statistic_and_narrows_with_data():
    rng = np.random.default_rng(0)
    small, large = rng.normal(size=50), rng.normal(size=5000)
    lo, hi = metrics.bootstrap_interval(np.mean, small, draws=300)
    assert lo < small.mean() < hi
    lo2, hi2 = metrics.bootstrap_interval(np.mean, large, draws=300)
    assert hi2 - lo2 < (hi - lo) / 3


def test_outcome_summary_scores_failure_speed_and_recalibration():
    from kernelcast.surrogate.calibration import PlattCalibrator

    rng = np.random.default_rng(1)
    n = 400
    failed = rng.random(n) < 0.5
    speedup = np.where(failed, np.nan, np.exp(rng.normal(0, 0.5, n)))
    true_bins = np.array([0 if f else speedup_bin(s) for f, s in zip(failed, speedup)])
    runs = np.tile(np.full(8, 1 / 8), (n, 1))
    probs = metrics.with_failure(runs, np.where(failed, 0.99, 0.01))  # sure and right of failure
    s = metrics.outcome_summary(probs, true_bins, np.where(failed, 1.0, speedup), speedup,
                                recalibrated=PlattCalibrator().fit(probs, true_bins).transform(probs), draws=100)
    assert s["failure_auroc"] == pytest.approx(1.0) and s["spearman_valid"] == pytest.approx(1.0)
    assert s["n"] == n and s["failed"] == failed.sum()
    assert s["failure_auroc_lo"] <= s["failure_auroc"] <= s["failure_auroc_hi"]
    assert s["aurc"] < s["random_aurc"]
    assert s["ece_recalibrated"] <= s["ece"] + 1e-9


# ---- the learned forecaster reads the source of kernels that are no template variant ------------

def test_learned_forecaster_gives_a_non_template_kernel_the_source_forecast(corpus):
    import dataclasses

    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs, requests_from, source_requests
    from kernelcast.surrogate.learned import LearnedForecaster

    cases = case_pairs(DataRoot(str(POOL)), gpu_type="h100")
    cases = cases[cases["op"].isin(["softmax", "rmsnorm", "row_sum"])]
    learned = LearnedForecaster(max_iter=30, source_max_iter=40).fit(cases, sources=corpus)
    written = source_requests(corpus[~corpus["failed"]].head(10))
    out = learned.forecast(written)
    _, mu, sigma = learned.source_.predict(written)
    assert [f.extra["log_speedup_mean"] for f in out] == pytest.approx(list(mu))
    assert [f.extra["log_speedup_sigma"] for f in out] == pytest.approx(list(sigma))
    assert np.ptp(mu) > 0.1  # not the anchor's speed for all of them
    variants = requests_from(cases.head(10))
    out_variants = learned.forecast(variants)
    assert all(0 <= f.failure_probability <= 1 for f in out + out_variants)
    # the same kernel as a template variant keeps the rank model's forecast
    as_written = [dataclasses.replace(r, candidate=dataclasses.replace(r.candidate, template=None))
                  for r in variants]
    assert [f.expected_speedup for f in learned.forecast(as_written)] != \
        pytest.approx([f.expected_speedup for f in out_variants])


# ---- the source model's speed regressions: stacked with a within-operation one, their loss --------------

def test_stacked_tilt_weighs_the_two_regressions_by_their_out_of_fold_fit(corpus):
    """Each operation's level differs and the block orders kernels within it: the stack gives the
    within-operation regression a real share, and the mean is the stacked sum."""
    from kernelcast.surrogate.dataset import source_requests
    from kernelcast.surrogate.source import SourceForecaster, SourceFeatures, _encode

    level = {"softmax": 0.0, "rmsnorm": 0.7, "row_sum": -0.7}
    shifted = corpus.assign(speedup=corpus["speedup"] * np.exp(corpus["op"].map(level)))
    model = SourceForecaster(max_iter=40, folds=3, stack_centred=True).fit(shifted)
    a, b, c = model.blend_
    assert c > 0.1 and (a, b, c) != (0.0, 1.0, 0.0)
    requests = source_requests(shifted.head(12))
    X = _encode(SourceFeatures().matrix(requests))
    _, mu, _ = model.predict(requests)
    assert mu == pytest.approx(a + b * model.speed_model_.predict(X) + c * model.centred_model_.predict(X))


def test_learned_forecaster_passes_its_source_options_to_the_source_model(corpus):
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs
    from kernelcast.surrogate.learned import SOURCE_OPTIONS, LearnedForecaster

    cases = case_pairs(DataRoot(str(POOL)), gpu_type="h100")
    cases = cases[cases["op"].isin(["softmax", "rmsnorm", "row_sum"])]
    default = LearnedForecaster(max_iter=30, source_max_iter=40).fit(cases, sources=corpus)
    assert default.source_.speed_loss == SOURCE_OPTIONS["speed_loss"] == "absolute_error"
    assert default.source_.speed_model_.loss == "absolute_error" and default.source_.centred_model_ is not None
    from kernelcast.surrogate.source import SourceForecaster
    assert SourceForecaster(max_iter=40, folds=3).fit(corpus).centred_model_ is None  # stand-alone: not stacked
    other = LearnedForecaster(max_iter=30, source_max_iter=40, source_options={
        "speed_loss": "squared_error", "stack_centred": False}).fit(cases, sources=corpus)
    assert other.source_.speed_model_.loss == "squared_error" and other.source_.centred_model_ is None
    assert other.source_.blend_ == (0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="speed_loss"):
        LearnedForecaster(source_options={"speed_loss": "huber"}).fit(cases, sources=corpus)
