"""The paper's yardsticks for a surrogate, over arrays of bin distributions and measured outcomes.

``probs`` is (n, 8); ``true_bins`` holds bins 1..8; ``speedups`` the measured speedups.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import kendalltau, spearmanr

from surrogate.bins import BIN_SPEEDUP


def expected_speedups(probs: np.ndarray) -> np.ndarray:
    return np.exp(probs @ np.log(np.array(BIN_SPEEDUP)) / probs.sum(axis=1))


def bin_accuracy(probs, true_bins) -> float:
    return float(np.mean(probs.argmax(axis=1) + 1 == true_bins))


def brier(probs, true_bins) -> float:
    onehot = np.eye(8)[np.asarray(true_bins) - 1]
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def ordinal_crps(probs, true_bins) -> float:
    """Ranked probability score over the 8 ordered bins, normalised to [0, 1]."""
    cdf = np.cumsum(probs, axis=1)[:, :-1]
    truth = (np.arange(1, 8)[None, :] >= np.asarray(true_bins)[:, None]).astype(float)
    return float(np.mean(np.sum((cdf - truth) ** 2, axis=1) / 7))


def nll(probs, true_bins) -> float:
    p = probs[np.arange(len(probs)), np.asarray(true_bins) - 1]
    return float(-np.mean(np.log(np.clip(p, 1e-12, None))))


def ece(probs, true_bins, n_bins: int = 15) -> float:
    """Expected calibration error of the max-probability against bin correctness."""
    conf = probs.max(axis=1)
    correct = probs.argmax(axis=1) + 1 == np.asarray(true_bins)
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
    (the default), or simply not the true bin ('bin_error')."""
    off = np.abs(np.asarray(probs).argmax(axis=1) + 1 - np.asarray(true_bins))
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
    correct = probs.argmax(axis=1) + 1 == np.asarray(true_bins)
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
