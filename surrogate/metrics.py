"""The paper's yardsticks for a surrogate, over arrays of bin distributions and measured outcomes.

``probs`` is (n, 8) over the speedup bins 1..8, with ``true_bins`` in 1..8; or (n, 9) over bins
0..8, bin 0 being failure (``with_failure`` builds it from a forecast's 8 bins and its failure
probability), with ``true_bins`` in 0..8. Every metric of bins reads which from the number of
columns. ``speedups`` are the measured speedups.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
from scipy.stats import kendalltau, rankdata, spearmanr

from kernelcast.surrogate.bins import BIN_SPEEDUP, FAILURE_BIN, first_bin, predicted_bins


def with_failure(probs, failure_probability) -> np.ndarray:
    """(n, 9) probabilities of bins 0..8: P(fail), then the 8 speedup bins scaled by P(runs)."""
    probs = np.asarray(probs, dtype=float)
    p_fail = np.asarray(failure_probability, dtype=float)
    if first_bin(probs) != 1 or p_fail.shape != (len(probs),):
        raise ValueError(f"need (n, 8) bin probabilities and n failure probabilities, got {probs.shape} "
                         f"and {p_fail.shape}")
    if not np.all((p_fail >= 0) & (p_fail <= 1)):
        raise ValueError("every failure probability must lie in [0, 1] (a NaN is no forecast: fill it first)")
    runs = probs / probs.sum(axis=1, keepdims=True)
    return np.hstack([p_fail[:, None], runs * (1 - p_fail)[:, None]])


def _onehot(probs, true_bins) -> np.ndarray:
    return np.eye(np.shape(probs)[1])[np.asarray(true_bins) - first_bin(probs)]


def expected_speedups(probs: np.ndarray) -> np.ndarray:
    return np.exp(probs @ np.log(np.array(BIN_SPEEDUP)) / probs.sum(axis=1))


def bin_accuracy(probs, true_bins) -> float:
    return float(np.mean(predicted_bins(probs) == np.asarray(true_bins)))


def brier(probs, true_bins) -> float:
    return float(np.mean(np.sum((np.asarray(probs) - _onehot(probs, true_bins)) ** 2, axis=1)))


def ordinal_crps(probs, true_bins) -> float:
    """Ranked probability score over the ordered bins, normalised to [0, 1]."""
    probs = np.asarray(probs)
    k = probs.shape[1] - 1
    cdf = np.cumsum(probs, axis=1)[:, :-1]
    first = first_bin(probs)
    truth = (np.arange(first, first + k)[None, :] >= np.asarray(true_bins)[:, None]).astype(float)
    return float(np.mean(np.sum((cdf - truth) ** 2, axis=1) / k))


def nll(probs, true_bins) -> float:
    p = np.asarray(probs)[np.arange(len(probs)), np.asarray(true_bins) - first_bin(probs)]
    return float(-np.mean(np.log(np.clip(p, 1e-12, None))))


def ece(probs, true_bins, n_bins: int = 15) -> float:
    """Expected calibration error of the max-probability against bin correctness."""
    probs = np.asarray(probs)
    conf = probs.max(axis=1)
    correct = predicted_bins(probs) == np.asarray(true_bins)
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            total += inside.mean() * abs(correct[inside].mean() - conf[inside].mean())
    return float(total)


def sharpness(probs) -> float:
    """Mean entropy (nats); lower is sharper."""
    return float(-np.mean(np.sum(probs * np.log(np.clip(probs, 1e-12, None)), axis=1)))


def pairwise_accuracy(pred, truth, groups, max_pairs: int = 200_000, seed: int = 0) -> float:
    """Fraction of candidate pairs in the same pool that the forecast orders like the measurement."""
    rng = np.random.default_rng(seed)
    right = total = 0
    for idx in pd.Series(np.arange(len(pred))).groupby(np.asarray(groups)).indices.values():
        if len(idx) < 2:
            continue
        n = min(max_pairs // 10, len(idx) * (len(idx) - 1) // 2)
        a, b = rng.choice(idx, n), rng.choice(idx, n)
        keep = truth[a] != truth[b]
        agree = np.sign(pred[a] - pred[b])[keep] * np.sign(truth[a] - truth[b])[keep]
        right += np.sum(agree > 0) + 0.5 * np.sum(agree == 0)  # a tie in the forecast is a coin flip
        total += keep.sum()
    return float(right / total) if total else float("nan")


LOSSES = ("bin_off_by_more_than_one", "bin_error")


def selective_loss(probs, true_bins, loss: str = "bin_off_by_more_than_one") -> np.ndarray:
    """Per forecast, 1 where trusting it would be wrong: its bin off by more than one
    (the default), or simply not the true bin ('bin_error'). Failure (bin 0) is no neighbour of
    bin 1: forecasting a failure for a kernel that runs, or the reverse, is always wrong."""
    pred, true_bins = predicted_bins(probs), np.asarray(true_bins)
    off = np.where((pred == FAILURE_BIN) != (true_bins == FAILURE_BIN), np.inf, np.abs(pred - true_bins))
    if loss == "bin_off_by_more_than_one":
        return (off > 1).astype(float)
    if loss == "bin_error":
        return (off > 0).astype(float)
    raise ValueError(f"unknown selective loss {loss!r}; known: {', '.join(LOSSES)}")


def risk_coverage(scores, losses) -> tuple[np.ndarray, np.ndarray]:
    """Coverage and selective risk when trusting the most confident first."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    cum = np.cumsum(np.asarray(losses)[order])
    n = np.arange(1, len(order) + 1)
    return n / len(order), cum / n


def aurc(scores, losses) -> float:
    """Area under the risk–coverage curve (lower is better)."""
    _, risk = risk_coverage(scores, losses)
    return float(np.mean(risk))


def selective_risk_at(scores, losses, coverages=(0.25, 0.5, 0.75, 1.0)) -> dict[float, float]:
    """Selective risk when trusting the most confident ``coverage`` fraction (at least one)."""
    cov, risk = risk_coverage(scores, losses)
    if len(risk) == 0:
        return {c: float("nan") for c in coverages}
    return {c: float(risk[max(0, int(np.ceil(c * len(risk))) - 1)]) for c in coverages}


def reliability(probs, true_bins, n_bins: int = 15) -> pd.DataFrame:
    """Reliability-diagram data: per equal-width confidence bin, its count, mean
    max-probability and bin accuracy (empty bins are left out)."""
    probs = np.asarray(probs)
    conf = probs.max(axis=1)
    correct = predicted_bins(probs) == np.asarray(true_bins)
    edges = np.linspace(0, 1, n_bins + 1)
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            rows.append({"lo": lo, "hi": hi, "count": int(inside.sum()),
                         "confidence": float(conf[inside].mean()), "accuracy": float(correct[inside].mean())})
    return pd.DataFrame(rows, columns=["lo", "hi", "count", "confidence", "accuracy"])


def parse_rate(parsed) -> float:
    """Fraction of forecasts whose answer parsed (an unparsed one is a forced deferral)."""
    parsed = np.asarray(parsed, dtype=bool)
    return float(parsed.mean()) if len(parsed) else float("nan")


def topk_recovery(pred, truth, groups, k: float = 0.10) -> np.ndarray:
    """Per pool: best measured speedup among the top-k% by forecast, over the pool's best."""
    out = []
    frame = pd.DataFrame({"pred": pred, "truth": truth, "g": list(groups)})
    for _, g in frame.groupby("g"):
        top = g.nlargest(max(1, int(round(k * len(g)))), "pred")
        out.append(top["truth"].max() / g["truth"].max())
    return np.array(out)


def summary(probs, true_bins, speedups, groups, parsed=None, coverages=(0.25, 0.5, 0.75, 1.0),
            topk: float = 0.10, loss: str = "bin_off_by_more_than_one", expected=None) -> dict:
    """Every metric of a batch of forecasts, as one flat dict (keys are MLflow metric names).

    Rankings (Spearman, Kendall, pairwise, top-k) use ``expected``, the forecasts' expected
    speedups, when given, else the speedups the bin probabilities imply. Selective risk ranks
    by max-probability; an unparsed forecast ranks last (never trusted).
    """
    probs, true_bins, speedups = np.asarray(probs), np.asarray(true_bins), np.asarray(speedups)
    parsed = np.ones(len(probs), bool) if parsed is None else np.asarray(parsed, dtype=bool)
    pred = expected_speedups(probs) if expected is None else np.asarray(expected, dtype=float)
    rec = topk_recovery(pred, speedups, groups, k=topk)
    losses = selective_loss(probs, true_bins, loss)
    scores = np.where(parsed, probs.max(axis=1), -np.inf)
    k = f"top{round(100 * topk)}"
    return {
        "n": len(probs), "bin_accuracy": bin_accuracy(probs, true_bins),
        "pairwise_accuracy": pairwise_accuracy(pred, speedups, groups),
        "spearman": float(spearmanr(pred, speedups).statistic), "kendall": float(kendalltau(pred, speedups).statistic),
        "ece": ece(probs, true_bins), "brier": brier(probs, true_bins), "crps": ordinal_crps(probs, true_bins),
        "nll": nll(probs, true_bins), "sharpness": sharpness(probs), "parse_rate": parse_rate(parsed),
        "aurc": aurc(scores, losses), "risk_at_full_coverage": float(losses.mean()),
        **{f"risk_at_coverage_{round(100 * c)}": r for c, r in selective_risk_at(scores, losses, coverages).items()},
        f"{k}_within_5pct": float(np.mean(rec >= 0.95)), f"{k}_within_20pct": float(np.mean(rec >= 0.80)),
        "pools": len(rec),
    }


def auroc(scores, labels) -> float:
    """Area under the ROC curve: the chance that a random positive (``labels`` true) scores above a
    random negative, ties counting half (the Mann-Whitney statistic); NaN without both kinds."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    ranks = rankdata(scores)  # ties share their mean rank
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def random_aurc(losses) -> float:
    """AURC of trusting in a random order, in expectation: at every coverage the expected risk of
    a random subset is the mean loss."""
    return float(np.mean(losses)) if len(losses) else float("nan")


def bootstrap_interval(statistic: Callable[..., float], *arrays, draws: int = 1000, level: float = 0.95,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(*arrays)``, resampling rows (all arrays alike);
    draws where the statistic is undefined (NaN) are left out."""
    arrays = [np.asarray(a) for a in arrays]
    n = len(arrays[0])
    if n == 0 or any(len(a) != n for a in arrays):
        raise ValueError(f"need equally long, non-empty arrays, got lengths {[len(a) for a in arrays]}")
    rng = np.random.default_rng(seed)
    values = np.array([statistic(*(a[idx] for a in arrays)) for idx in rng.integers(0, n, size=(draws, n))])
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    tail = 100 * (1 - level) / 2
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def _spearman(pred, truth) -> float:
    if len(pred) < 3 or np.ptp(pred) == 0 or np.ptp(truth) == 0:
        return float("nan")
    return float(spearmanr(pred, truth).statistic)


def outcome_summary(probs, true_bins, expected, speedups, recalibrated=None, draws: int = 1000,
                    seed: int = 0) -> dict:
    """The failure-aware yardsticks of forecasts over bins 0..8, each with a bootstrap 95% interval
    (keys ``<metric>_lo``, ``<metric>_hi``).

    ``probs`` (n, 9) as ``with_failure`` builds it; ``expected`` the forecasts' expected speedups
    given that the kernel runs; ``speedups`` the measured ones (NaN where it failed).
    ``recalibrated`` (n, 9), when given, adds ``ece_recalibrated``. Failure AUROC ranks by
    P(fail); Spearman is over the kernels that ran; AURC trusts the most confident (max
    probability) first, a forecast being wrong when its bin is off by more than one or it
    mistakes failure for running or the reverse.
    """
    probs, true_bins = np.asarray(probs, dtype=float), np.asarray(true_bins)
    expected, speedups = np.asarray(expected, dtype=float), np.asarray(speedups, dtype=float)
    if first_bin(probs) != FAILURE_BIN:
        raise ValueError("outcome_summary scores bins 0..8: build the probabilities with with_failure")
    failed = true_bins == FAILURE_BIN
    ran = ~failed
    losses = selective_loss(probs, true_bins)
    confidence = probs.max(axis=1)
    statistics = {
        "failure_auroc": (lambda p, f: auroc(p, f), (probs[:, 0], failed)),
        "spearman_valid": (_spearman, (expected[ran], speedups[ran])),
        "bin_accuracy": (lambda p, t: bin_accuracy(p, t), (probs, true_bins)),
        "ece": (lambda p, t: ece(p, t), (probs, true_bins)),
        "aurc": (aurc, (confidence, losses)),
        "random_aurc": (lambda loss: random_aurc(loss), (losses,)),
    }
    if recalibrated is not None:
        statistics["ece_recalibrated"] = (lambda p, t: ece(p, t), (np.asarray(recalibrated, dtype=float), true_bins))
    out = {"n": len(probs), "failed": int(failed.sum()), "ran": int(ran.sum())}
    for name, (fn, args) in statistics.items():
        out[name] = fn(*args) if len(args[0]) else float("nan")
        out[f"{name}_lo"], out[f"{name}_hi"] = (bootstrap_interval(fn, *args, draws=draws, seed=seed)
                                                if len(args[0]) else (float("nan"), float("nan")))
    out["aurc_over_random"] = out["aurc"] / out["random_aurc"] if out["random_aurc"] > 0 else float("nan")
    return out
