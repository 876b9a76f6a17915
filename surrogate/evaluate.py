"""Offline evaluation of a surrogate on a measured pool, with held-out splits and recalibration.

For each fold the surrogate is fit on the training operations (or GPU types, or a random
80%) and forecasts the held-out pairs: the 'raw' rows score those forecasts on the whole fold.

Recalibration is scored the way a search uses it. A search on a new operation measures some
candidates first; the recalibration (Platt scaling of the confidence by default) and the
conformal trust threshold are fit on their forecasts and measured bins, and applied to the rest
(the threshold on recalibrated forecasts cross-fitted over the measured candidates). So in
each fold a random ``measured_fraction`` of the held-out candidates (whole candidates, all
their cases) counts as measured, and the 'calibrated' rows, with the conformal coverage and
realised risk at each target, are scored on the other candidates only. Those are exchangeable
with the measured ones, which is what conformal risk control's guarantee needs. A forecaster
with a Gaussian over log speedup (learned, roofline) is first recentred as a search's online
correction recentres it: per (operation, GPU type), a shift of its mean and a scale of its
spread fit on the measured candidates' bins (``LevelSpreadCalibrator``; ``recentre=False``
turns it off); the confidence calibration (Platt by default) is fit on what that gives.

``calibrate_on="training"`` instead fits both on out-of-fold forecasts of the training pairs,
grouped like the split (whole operations for leave-one-operation-out): nothing of the held-out
operation is seen, and neither the calibration nor the guarantee carries over to it as well.

MLflow is written to only when a tracking URI is given.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from typing import Callable

import numpy as np
import pandas as pd

from kernelcast.surrogate import metrics
from kernelcast.surrogate.calibration import CALIBRATORS, LevelSpreadCalibrator
from kernelcast.surrogate.dataset import requests_from, split
from kernelcast.surrogate.forecast import Forecast

CALIBRATE_ON = ("measured", "training")
_MIN_RECENTRE = 10  # measured pairs of one (operation, GPU type) needed to recentre its forecasts


def _forecast(forecaster, frame: pd.DataFrame, gaussian: bool = False):
    """(probabilities (n, 8), parsed flags (n,), expected speedups (n,)) of a fitted forecaster on
    pair rows; with ``gaussian`` also (means, spreads) of log speedup, NaN where it gives none."""
    out = forecaster.forecast(requests_from(frame))
    scored = (np.array([f.probabilities for f in out], dtype=float), np.array([f.parsed for f in out], dtype=bool),
              np.array([f.expected_speedup for f in out], dtype=float))
    if not gaussian:
        return scored
    return scored + (np.array([f.extra.get("log_speedup_mean", np.nan) for f in out], dtype=float),
                     np.array([f.extra.get("log_speedup_sigma", np.nan) for f in out], dtype=float))


def recentred(probs: np.ndarray, mean: np.ndarray, sigma: np.ndarray, frame: pd.DataFrame,
              measured: np.ndarray) -> tuple[np.ndarray, int]:
    """``probs`` with each (operation, GPU type) group's Gaussians recentred on its measured rows,
    and how many groups were: a group with fewer than ``_MIN_RECENTRE`` measured pairs, or a
    forecaster without a Gaussian, keeps its distributions."""
    out, done = probs.copy(), 0
    if not (np.isfinite(mean).all() and np.isfinite(sigma).all()):
        return out, done
    keys = (frame["op"] + "/" + frame["gpu_type"]).to_numpy()
    true_bins = frame["true_bin"].to_numpy()
    for key in np.unique(keys):
        rows = keys == key
        fit = rows & measured
        if fit.sum() >= _MIN_RECENTRE:
            out[rows] = LevelSpreadCalibrator().fit(mean[fit], sigma[fit], true_bins[fit]).transform(
                mean[rows], sigma[rows])
            done += 1
    return out, done


def _training_calibration_set(make_forecaster, train: pd.DataFrame, how: str, folds: int = 3):
    """Out-of-fold (probs, parsed, frame) over the training pairs, grouped like the split."""
    groups = train["op"] if how == "operation" else train["gpu_type"] if how == "gpu" else train["candidate_id"]
    names = sorted(groups.unique())
    if len(names) < 2:
        raise ValueError(f"calibration needs the training data to span two or more groups; it has {names}")
    probs, parsed, frames = [], [], []
    for k in range(min(folds, len(names))):
        inside = groups.isin(set(names[k::folds]))
        p, ok, _ = _forecast(make_forecaster().fit(train[~inside]), train[inside])
        probs.append(p)
        parsed.append(ok)
        frames.append(train[inside])
    return np.vstack(probs), np.concatenate(parsed), pd.concat(frames)


def measured_candidates(test: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """Row mask of a random ``fraction`` of the candidates of ``test`` (all cases of each)."""
    ids = np.sort(test["candidate_id"].unique())
    k = min(len(ids) - 1, max(1, int(round(fraction * len(ids)))))
    chosen = np.random.default_rng(seed).choice(ids, size=k, replace=False)
    return test["candidate_id"].isin(set(chosen)).to_numpy()


def _conformal_threshold(probs, parsed, frame: pd.DataFrame, target_risk: float) -> float:
    from kernelcast.surrogate.policies import ConformalRiskPolicy

    forecasts = [Forecast(str(i), "", "calibration", "", tuple(p), parsed=bool(ok))
                 for i, (p, ok) in enumerate(zip(probs, parsed))]
    # A candidate's cases are not exchangeable with each other, only candidates are.
    policy = ConformalRiskPolicy(target_risk=target_risk).fit(
        forecasts, list(frame["true_bin"]), units=list(frame["candidate_id"]))
    return float(policy.threshold)


def _trust_outcome(probs, parsed, true_bins, threshold: float, key: str) -> dict:
    """What trusting at the conformal threshold does on new candidates: the share trusted and
    the share trusted-and-off-by-more-than-one (the risk the guarantee bounds)."""
    trusted = parsed & (probs.max(axis=1) >= threshold)
    wrong = metrics.selective_loss(probs, true_bins) > 0
    return {f"{key}_threshold": threshold, f"{key}_coverage": float(trusted.mean()),
            f"{key}_risk": float(np.mean(trusted & wrong))}


def _conformal_key(target_risk: float) -> str:
    return f"conformal{round(100 * target_risk)}"


class _Recalibration:
    """One held-out fold's recalibration: recentring (where asked and possible), then the
    confidence calibrator, each fit on some rows and applied to others."""

    def __init__(self, raw, mean, sigma, frame: pd.DataFrame, calibrator: str, recentre: bool, parts: int = 5):
        self.raw, self.mean, self.sigma, self.frame = raw, mean, sigma, frame
        self.calibrator, self.recentre, self.parts = calibrator, recentre, parts

    def __call__(self, fit: np.ndarray, apply: np.ndarray) -> tuple[np.ndarray, int]:
        """(recalibrated probabilities of the ``apply`` rows, groups recentred), fit on the ``fit`` rows."""
        probs, groups = recentred(self.raw, self.mean, self.sigma, self.frame, fit) if self.recentre \
            else (self.raw, 0)
        fitted = CALIBRATORS[self.calibrator]().fit(probs[fit], self.frame["true_bin"].to_numpy()[fit])
        return fitted.transform(probs[apply]), groups

    def cross_fitted(self, measured: np.ndarray, seed: int) -> np.ndarray:
        """The ``measured`` rows' probabilities, each recalibrated by a fit that did not see its
        candidate. The conformal threshold is set on these: recalibrated by a fit on themselves,
        they would look surer than the new candidates it is applied to, and the trusted share of
        those would overshoot the target risk."""
        ids = np.random.default_rng(seed).permutation(np.sort(self.frame.loc[measured, "candidate_id"].unique()))
        if len(ids) < 2:
            return self(measured, measured)[0]
        out = np.zeros((int(measured.sum()), 8))
        where = np.flatnonzero(measured)
        for part in range(min(self.parts, len(ids))):
            inside = measured & self.frame["candidate_id"].isin(set(ids[part::self.parts])).to_numpy()
            out[np.isin(where, np.flatnonzero(inside))] = self(measured & ~inside, inside)[0]
        return out


def evaluate(make_forecaster: Callable[[], object], pairs: pd.DataFrame, how: str = "operation",
             calibrate: bool = True, out_dir: str | None = None, coverages=(0.25, 0.5, 0.75, 1.0),
             topk: float = 0.10, name: str = "surrogate", tracking_uri: str | None = None,
             target_risks=(0.05, 0.10), calibrator: str = "platt", calibrate_on: str = "measured",
             measured_fraction: float = 0.2, seed: int = 0, recentre: bool = True,
             experiment: str = "surrogate-evaluation") -> pd.DataFrame:
    """One row per (fold, raw|calibrated) and overall rows (fold 'all') of every metric.

    ``make_forecaster()`` returns an object with ``fit(train_pairs) -> self`` and
    ``forecast(requests)``. ``calibrator`` names the recalibration
    (``kernelcast.surrogate.calibration.CALIBRATORS``) and ``calibrate_on`` what it is fit on (see the
    module docstring); ``recentre`` recentres a Gaussian forecaster's distributions on the
    measured candidates first (with ``calibrate_on="measured"`` only). For each target risk the calibrated rows hold the conformal threshold,
    its coverage and its realised risk as ``conformal<percent>_{threshold,coverage,risk}``.
    Writes ``{name}-{how}.csv`` and ``.png`` under ``out_dir``, and logs params, the overall
    metrics and those files to MLflow when ``tracking_uri`` is set.
    """
    if calibrator not in CALIBRATORS:
        raise ValueError(f"unknown calibrator {calibrator!r}; known: {', '.join(CALIBRATORS)}")
    if calibrate_on not in CALIBRATE_ON:
        raise ValueError(f"unknown calibrate_on {calibrate_on!r}; known: {', '.join(CALIBRATE_ON)}")
    pairs = pairs[pairs["speedup"].notna() & (pairs["speedup"] > 0)]  # failures have no bin to forecast
    if pairs.empty:
        raise ValueError("no pairs with a measured speedup to evaluate on")
    labels = ("raw", "calibrated") if calibrate else ("raw",)
    scored: dict[str, list] = {label: [] for label in labels}  # per fold: (probs, parsed, expected, frame)
    rows = []
    for k, (fold, train, test) in enumerate(split(pairs, how, seed=seed)):
        raw, parsed, expected, mean, sigma = _forecast(make_forecaster().fit(train), test, gaussian=True)
        scored["raw"].append((raw, parsed, expected, test))
        extra = {"raw": {}}
        if calibrate:
            groups = 0
            if calibrate_on == "measured":
                measured = measured_candidates(test, measured_fraction, seed + k)
                fit = _Recalibration(raw, mean, sigma, test, calibrator, recentre)
                rest_probs, groups = fit(measured, ~measured)
                cal = (None, parsed[measured], test[measured])
                rest = (None, parsed[~measured], expected[~measured], test[~measured])
                cal_probs = fit.cross_fitted(measured, seed + k)
            else:
                cal = _training_calibration_set(make_forecaster, train, how)
                rest = (raw, parsed, expected, test)
                fitted = CALIBRATORS[calibrator]().fit(cal[0], cal[2]["true_bin"].to_numpy())
                cal_probs, rest_probs = fitted.transform(cal[0]), fitted.transform(rest[0])
            rest_frame = rest[3]
            outcome = {"calibrator": calibrator, "calibrate_on": calibrate_on, "calibration_pairs": len(cal[2]),
                       "recentred_groups": groups}
            for target in target_risks:
                threshold = _conformal_threshold(cal_probs, cal[1], cal[2], target)
                outcome.update(_trust_outcome(rest_probs, rest[1], rest_frame["true_bin"].to_numpy(), threshold,
                                              _conformal_key(target)))
            # Recalibration re-maps the bin probabilities; the ranking stays the forecaster's own.
            scored["calibrated"].append((rest_probs, rest[1], rest[2], rest_frame))
            extra["calibrated"] = outcome
        for label in labels:
            rows.append({"surrogate": name, "split": how, "fold": fold, "forecasts": label, **extra[label],
                         **_summary(*scored[label][-1], coverages, topk)})

    pooled = {}
    for label in labels:
        probs = np.vstack([s[0] for s in scored[label]])
        parsed = np.concatenate([s[1] for s in scored[label]])
        expected = np.concatenate([s[2] for s in scored[label]])
        frame = pd.concat([s[3] for s in scored[label]])
        extra = {}
        if label == "calibrated":
            folds = [r for r in rows if r["forecasts"] == "calibrated"]
            n = np.array([len(s[3]) for s in scored[label]], dtype=float)
            extra = {"calibrator": calibrator, "calibrate_on": calibrate_on,
                     "recentred_groups": int(sum(r["recentred_groups"] for r in folds))}
            for target in target_risks:
                for key in (f"{_conformal_key(target)}_coverage", f"{_conformal_key(target)}_risk"):
                    extra[key] = float(np.average([r[key] for r in folds], weights=n))
        rows.append({"surrogate": name, "split": how, "fold": "all", "forecasts": label, **extra,
                     **_summary(probs, parsed, expected, frame, coverages, topk)})
        pooled[label] = (probs, parsed, frame["true_bin"].to_numpy())
    table = pd.DataFrame(rows)

    files = []
    if out_dir or tracking_uri:
        where = out_dir or tempfile.mkdtemp(prefix="kernelcast-eval-")
        files = _write(table, pooled, os.path.join(where, f"{name}-{how}"))
    if tracking_uri:
        _log_mlflow(tracking_uri, experiment, table, files,
                    {"surrogate": name, "split": how, "calibrate": calibrate, "calibrator": calibrator,
                     "calibrate_on": calibrate_on, "recentre": recentre, "measured_fraction": measured_fraction,
                     "seed": seed,
                     "topk": topk, "coverages": ",".join(map(str, coverages)),
                     "target_risks": ",".join(map(str, target_risks)),
                     "pairs": len(pairs), "folds": len(scored["raw"])})
    return table


def conformal_draws(make_forecaster: Callable[[], object], pairs: pd.DataFrame, how: str = "operation",
                    draws: int = 20, target_risks=(0.05, 0.10), calibrator: str = "platt", recentre: bool = True,
                    measured_fraction: float = 0.2, seed: int = 0) -> pd.DataFrame:
    """The conformal policy over many draws of which held-out candidates count as measured.

    Conformal risk control bounds the risk in expectation over the calibration draw; one
    draw of a few dozen candidates can overshoot. Each fold is forecast once and then drawn
    ``draws`` times, as ``evaluate`` draws once: one row per (fold, draw, target risk) with
    the threshold, the share of the other candidates trusted and the share trusted and wrong.
    """
    if calibrator not in CALIBRATORS:
        raise ValueError(f"unknown calibrator {calibrator!r}; known: {', '.join(CALIBRATORS)}")
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    pairs = pairs[pairs["speedup"].notna() & (pairs["speedup"] > 0)]
    rows = []
    for k, (fold, train, test) in enumerate(split(pairs, how, seed=seed)):
        raw, parsed, _, mean, sigma = _forecast(make_forecaster().fit(train), test, gaussian=True)
        fit = _Recalibration(raw, mean, sigma, test, calibrator, recentre)
        true_bins = test["true_bin"].to_numpy()
        for draw in range(draws):
            measured = measured_candidates(test, measured_fraction, seed + 1000 * (draw + 1) + k)
            rest, _ = fit(measured, ~measured)
            cal = fit.cross_fitted(measured, seed + 1000 * (draw + 1) + k)
            for target in target_risks:
                threshold = _conformal_threshold(cal, parsed[measured], test[measured], target)
                outcome = _trust_outcome(rest, parsed[~measured], true_bins[~measured], threshold, "c")
                rows.append({"fold": fold, "draw": draw, "target_risk": target, "threshold": threshold,
                             "coverage": outcome["c_coverage"], "risk": outcome["c_risk"]})
    return pd.DataFrame(rows)


def _summary(probs, parsed, expected, test: pd.DataFrame, coverages, topk) -> dict:
    groups = (test["op"] + "/" + test["case_name"] + "/" + test["gpu_type"]).to_numpy()
    return metrics.summary(probs, test["true_bin"].to_numpy(), test["speedup"].to_numpy(), groups,
                           parsed=parsed, coverages=coverages, topk=topk, expected=expected)


def _write(table, pooled: dict, stem: str) -> list[str]:
    """The table as CSV and the pooled risk–coverage curve and reliability diagram as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    table.to_csv(stem + ".csv", index=False)
    fig, ax = plt.subplots(1, 2, figsize=(9.5, 3.8))
    ax[1].plot([0, 1], [0, 1], "--", color="grey", label="perfectly calibrated")
    for label, (probs, parsed, true_bins) in pooled.items():
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
