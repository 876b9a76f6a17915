"""Offline evaluation of a surrogate on a measured pool, with held-out splits and recalibration.

For each fold the surrogate is fit on the training operations (or GPU types, or a random
80%). Its temperature, and the conformal trust threshold, are fit on out-of-fold forecasts
of the training data, grouped the same way as the split (whole operations held out for
leave-one-operation-out, whole candidates for a random split), so the calibration sees the
kind of shift the test fold holds. Metrics are computed per test fold and over the pooled
test forecasts, before and after scaling. MLflow is written to only when a tracking URI is
given.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from typing import Callable

import numpy as np
import pandas as pd

from surrogate import metrics
from surrogate.calibration import TemperatureCalibrator
from surrogate.dataset import requests_from, split
from surrogate.forecast import Forecast



def _forecast(forecaster, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities (n, 8), parsed flags (n,)) of a fitted forecaster on pair rows."""
    out = forecaster.forecast(requests_from(frame))
    return np.array([f.probabilities for f in out], dtype=float), np.array([f.parsed for f in out], dtype=bool)


def _calibration_set(make_forecaster, train: pd.DataFrame, how: str, folds: int = 3):
    """Out-of-fold forecasts over the training data, grouped like the split (by operation for
    leave-one-operation-out), so the calibrator sees the same kind of shift the test fold has."""
    groups = train["op"] if how == "operation" else train["gpu_type"] if how == "gpu" else train["candidate_id"]
    names = sorted(groups.unique())
    if len(names) < 2:
        raise ValueError(f"calibration needs the training data to span two or more groups; it has {names}")
    probs, parsed, bins = [], [], []
    for k in range(min(folds, len(names))):
        inside = groups.isin(set(names[k::folds]))
        forecaster = make_forecaster().fit(train[~inside])
        p, ok = _forecast(forecaster, train[inside])
        probs.append(p)
        parsed.append(ok)
        bins.append(train.loc[inside, "true_bin"].to_numpy())
    return np.vstack(probs), np.concatenate(parsed), np.concatenate(bins)


def _conformal_threshold(probs, parsed, true_bins, target_risk: float) -> float:
    from surrogate.policies import ConformalRiskPolicy

    forecasts = [Forecast(str(i), "", "calibration", "", tuple(p), parsed=bool(ok))
                 for i, (p, ok) in enumerate(zip(probs, parsed))]
    return float(ConformalRiskPolicy(target_risk=target_risk).fit(forecasts, list(true_bins)).threshold)


def _trust_outcome(probs, parsed, true_bins, threshold: float) -> dict:
    """What trusting at the conformal threshold does on the test fold: the share trusted and
    the share trusted-and-off-by-more-than-one (the risk the guarantee bounds)."""
    trusted = parsed & (probs.max(axis=1) >= threshold)
    wrong = metrics.selective_loss(probs, true_bins) > 0
    return {"conformal_threshold": threshold, "conformal_coverage": float(trusted.mean()),
            "conformal_risk": float(np.mean(trusted & wrong))}


def evaluate(make_forecaster: Callable[[], object], pairs: pd.DataFrame, how: str = "operation",
             calibrate: bool = True, out_dir: str | None = None, coverages=(0.25, 0.5, 0.75, 1.0),
             topk: float = 0.10, name: str = "surrogate", tracking_uri: str | None = None,
             target_risk: float = 0.05, experiment: str = "surrogate-evaluation") -> pd.DataFrame:
    """One row per (fold, raw|calibrated) and overall rows (fold 'all') of every metric.

    ``make_forecaster()`` returns an object with ``fit(train_pairs) -> self`` and
    ``forecast(requests)``. Writes ``{name}-{how}.csv`` and ``.png`` under ``out_dir``, and
    logs params, the overall metrics and those files to MLflow when ``tracking_uri`` is set.
    """
    pairs = pairs[pairs["speedup"].notna() & (pairs["speedup"] > 0)]  # failures have no bin to forecast
    if pairs.empty:
        raise ValueError("no pairs with a measured speedup to evaluate on")
    labels = ("raw", "calibrated") if calibrate else ("raw",)
    pooled: dict[str, list] = {label: [] for label in labels}
    parsed_all, tests, rows, trust_all = [], [], [], []
    for fold, train, test in split(pairs, how):
        forecaster = make_forecaster().fit(train)
        raw, parsed = _forecast(forecaster, test)
        fold_probs = {"raw": raw}
        extra = {"raw": {}}
        if calibrate:
            cal_probs, cal_parsed, cal_bins = _calibration_set(make_forecaster, train, how)
            calibrator = TemperatureCalibrator().fit(cal_probs, cal_bins)
            threshold = _conformal_threshold(calibrator.transform(cal_probs), cal_parsed, cal_bins, target_risk)
            fold_probs["calibrated"] = calibrator.transform(raw)
            outcome = _trust_outcome(fold_probs["calibrated"], parsed, test["true_bin"].to_numpy(), threshold)
            trust_all.append(outcome)
            extra["calibrated"] = {"temperature": calibrator.temperature_, **outcome}
        for label in labels:
            pooled[label].append(fold_probs[label])
            rows.append({"surrogate": name, "split": how, "fold": fold, "forecasts": label, **extra[label],
                         **_summary(fold_probs[label], parsed, test, coverages, topk)})
        parsed_all.append(parsed)
        tests.append(test)

    test, parsed = pd.concat(tests), np.concatenate(parsed_all)
    for label in labels:
        probs = np.vstack(pooled[label])
        extra = {}
        if label == "calibrated":
            n = np.array([len(t) for t in tests], dtype=float)
            extra = {k: float(np.average([o[k] for o in trust_all], weights=n))
                     for k in ("conformal_coverage", "conformal_risk")}
        rows.append({"surrogate": name, "split": how, "fold": "all", "forecasts": label, **extra,
                     **_summary(probs, parsed, test, coverages, topk)})
        pooled[label] = probs
    table = pd.DataFrame(rows)

    files = []
    if out_dir or tracking_uri:
        where = out_dir or tempfile.mkdtemp(prefix="kernelcast-eval-")
        files = _write(table, pooled, test["true_bin"].to_numpy(), parsed, os.path.join(where, f"{name}-{how}"))
    if tracking_uri:
        _log_mlflow(tracking_uri, experiment, table, files,
                    {"surrogate": name, "split": how, "calibrate": calibrate, "topk": topk,
                     "coverages": ",".join(map(str, coverages)), "target_risk": target_risk,
                     "pairs": len(pairs), "folds": len(tests)})
    return table


def _summary(probs, parsed, test: pd.DataFrame, coverages, topk) -> dict:
    groups = (test["op"] + "/" + test["case_name"] + "/" + test["gpu_type"]).to_numpy()
    return metrics.summary(probs, test["true_bin"].to_numpy(), test["speedup"].to_numpy(), groups,
                           parsed=parsed, coverages=coverages, topk=topk)


def _write(table, pooled: dict, true_bins, parsed, stem: str) -> list[str]:
    """The table as CSV and the pooled risk–coverage curve and reliability diagram as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    table.to_csv(stem + ".csv", index=False)
    fig, ax = plt.subplots(1, 2, figsize=(9.5, 3.8))
    ax[1].plot([0, 1], [0, 1], "--", color="grey", label="perfectly calibrated")
    for label, probs in pooled.items():
        scores = np.where(parsed, probs.max(axis=1), -np.inf)
        coverage, risk = metrics.risk_coverage(scores, metrics.selective_loss(probs, true_bins))
        ax[0].plot(coverage, risk, label=label)
        rel = metrics.reliability(probs, true_bins)
        ax[1].plot(rel["confidence"], rel["accuracy"], "o-", label=label)
    ax[0].set(xlabel="coverage (share trusted, most confident first)", ylabel="risk: bin off by > 1",
              title="risk–coverage", xlim=(0, 1), ylim=(0, None))
    ax[1].set(xlabel="confidence (max probability)", ylabel="bin accuracy", title="reliability",
              xlim=(0, 1), ylim=(0, 1))
    for a in ax:
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    plt.close(fig)
    return [stem + ".csv", stem + ".png"]


def _log_mlflow(uri: str, experiment: str, table: pd.DataFrame, files: list[str], params: dict) -> None:
    """One MLflow run: params, the overall metrics as '<raw|calibrated>.<metric>', the files."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    overall = table[table["fold"] == "all"]
    with mlflow.start_run(run_name=f"{params['surrogate']}-{params['split']}"):
        mlflow.log_params(params)
        for row in overall.to_dict("records"):
            for key, value in row.items():
                if isinstance(value, (int, float, np.number)) and not isinstance(value, bool) \
                        and math.isfinite(value):
                    mlflow.log_metric(f"{row['forecasts']}.{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}", float(value))
        for path in files:
            mlflow.log_artifact(path)
