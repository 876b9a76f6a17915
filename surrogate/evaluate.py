"""Offline evaluation of a surrogate on a measured pool, with held-out splits and recalibration.

For each fold the surrogate is fit on the training operations (or GPU types, or a random
80%). Its temperature is fit on out-of-fold forecasts of the training data, grouped the
same way as the split (whole operations held out for leave-one-operation-out), so it
learns how over- or under-confident the surrogate is on data of the kind the test fold
holds. Metrics are computed on the pooled test forecasts, before and after scaling.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from surrogate import metrics
from surrogate.dataset import requests_from, split


class TemperatureCalibrator:
    """p_i^(1/T), renormalised; T fit by minimising the NLL of the true bins."""

    def fit(self, probs: np.ndarray, true_bins: np.ndarray) -> "TemperatureCalibrator":
        logp = np.log(np.clip(probs, 1e-12, None))
        idx = (np.arange(len(probs)), np.asarray(true_bins) - 1)

        def loss(log_t):
            z = logp / np.exp(log_t)
            z -= z.max(axis=1, keepdims=True)
            return -np.mean(z[idx] - np.log(np.exp(z).sum(axis=1)))

        self.temperature_ = float(np.exp(minimize_scalar(loss, bounds=(-4, 4), method="bounded").x))
        return self

    def transform(self, probs: np.ndarray) -> np.ndarray:
        z = np.log(np.clip(probs, 1e-12, None)) / self.temperature_
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)


def _forecast_probs(forecaster, frame: pd.DataFrame) -> np.ndarray:
    return np.array([f.probabilities for f in forecaster.forecast(requests_from(frame))])


def _calibration_set(make_forecaster, train: pd.DataFrame, how: str, folds: int = 3):
    """Out-of-fold forecasts over the training data, grouped like the split (by operation for
    leave-one-operation-out), so the calibrator sees the same kind of shift the test fold has."""
    groups = train["op"] if how == "operation" else train["gpu_type"] if how == "gpu" else train["candidate_id"]
    names = sorted(groups.unique())
    probs, bins = [], []
    for k in range(min(folds, len(names))):
        held = set(names[k::folds])
        inside = groups.isin(held)
        forecaster = make_forecaster().fit(train[~inside])
        probs.append(_forecast_probs(forecaster, train[inside]))
        bins.append(train.loc[inside, "true_bin"].to_numpy())
    return np.vstack(probs), np.concatenate(bins)


def evaluate(make_forecaster: Callable[[], object], pairs: pd.DataFrame, how: str = "operation",
             out_dir: str | None = None, name: str = "surrogate") -> pd.DataFrame:
    """Rows 'raw' and 'calibrated' of every metric over the pooled held-out forecasts."""
    pairs = pairs[pairs["speedup"].notna() & (pairs["speedup"] > 0)]
    raw, cal, tests = [], [], []
    for fold, train, test in split(pairs, how):
        calibrator = TemperatureCalibrator().fit(*_calibration_set(make_forecaster, train, how))
        forecaster = make_forecaster().fit(train)
        p = _forecast_probs(forecaster, test)
        raw.append(p)
        cal.append(calibrator.transform(p))
        tests.append(test)
    test = pd.concat(tests)
    groups = (test["op"] + "/" + test["case_name"] + "/" + test["gpu_type"]).to_numpy()
    rows = []
    for label, probs in (("raw", np.vstack(raw)), ("calibrated", np.vstack(cal))):
        rows.append({"surrogate": name, "split": how, "forecasts": label,
                     **metrics.summary(probs, test["true_bin"].to_numpy(), test["speedup"].to_numpy(), groups)})
        if out_dir and label == "calibrated":
            _plots(probs, test["true_bin"].to_numpy(), os.path.join(out_dir, f"{name}-{how}"))
    table = pd.DataFrame(rows)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        table.to_csv(os.path.join(out_dir, f"{name}-{how}.csv"), index=False)
    return table


def _plots(probs: np.ndarray, true_bins: np.ndarray, stem: str) -> None:
    """Risk–coverage curve and reliability diagram as PNGs next to the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    coverage, risk = metrics.risk_coverage(probs.max(axis=1), metrics.selective_loss(probs, true_bins))
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.6))
    ax[0].plot(coverage, risk)
    ax[0].set(xlabel="coverage (trusted fraction)", ylabel="risk: bin off by >1", title="risk–coverage")
    conf = probs.max(axis=1)
    correct = probs.argmax(axis=1) + 1 == true_bins
    edges = np.linspace(0, 1, 11)
    centres, accs = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            centres.append(conf[inside].mean())
            accs.append(correct[inside].mean())
    ax[1].plot([0, 1], [0, 1], "--", color="grey")
    ax[1].plot(centres, accs, "o-")
    ax[1].set(xlabel="confidence (max probability)", ylabel="bin accuracy", title="reliability")
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    plt.close(fig)
