"""A speedup measured on one GPU carried to another: the measured speedup scaled by a learned ratio.

Rows are (problem, kernel, target GPU type, speedup measured on the source GPU, speedup on the
target). Three forecasts of the target's speedup, each fit on other problems only:

- ``same``: the source GPU's speedup unchanged (the naive baseline);
- ``ratio``: the source speedup times the median ratio target / source of the training rows on
  that target GPU;
- ``specs``: log(target / source) as a linear function of log source speedup and the two GPUs'
  datasheet ratios (bandwidth, FP32 rate; ``kernelcast.kernels.hardware.datasheet``), fit by least squares
  over every target GPU at once.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from kernelcast.kernels.hardware import datasheet

MODELS = ("same", "ratio", "specs")
WITHIN = 0.20
_RIDGE = 1e-3


def _design(rows: pd.DataFrame, source_gpu: str) -> np.ndarray:
    src = datasheet(source_gpu)
    bw = rows["gpu_type"].map(lambda g: np.log(datasheet(g).bandwidth_gbps / src.bandwidth_gbps))
    fp = rows["gpu_type"].map(lambda g: np.log(datasheet(g).fp32_tflops / src.fp32_tflops))
    return np.column_stack([np.ones(len(rows)), np.log(rows["source_speedup"].to_numpy(float)), bw, fp])


def fit_predict(model: str, train: pd.DataFrame, test: pd.DataFrame, source_gpu: str = "h100") -> np.ndarray:
    """The target speedups of ``test`` rows forecast by ``model`` fit on ``train`` rows (columns
    gpu_type, source_speedup, target_speedup)."""
    source = test["source_speedup"].to_numpy(float)
    if model == "same":
        return source
    log_ratio = np.log(train["target_speedup"].to_numpy(float) / train["source_speedup"].to_numpy(float))
    if model == "ratio":
        median = pd.Series(log_ratio).groupby(train["gpu_type"].to_numpy()).median()
        return source * np.exp(test["gpu_type"].map(median).fillna(0.0).to_numpy(float))
    if model == "specs":
        X = _design(train, source_gpu)
        w = np.linalg.solve(X.T @ X + _RIDGE * np.eye(X.shape[1]), X.T @ log_ratio)
        return source * np.exp(_design(test, source_gpu) @ w)
    raise ValueError(f"unknown cross-GPU model {model!r}; known: {', '.join(MODELS)}")


def held_out(rows: pd.DataFrame, folds: Sequence[tuple[str, frozenset]], model: str,
             source_gpu: str = "h100") -> np.ndarray:
    """Each row's forecast by ``model`` fit on the rows of problems outside its fold."""
    out = np.full(len(rows), np.nan)
    for _, held in folds:
        test = rows["op"].isin(held).to_numpy()
        if test.any():
            out[test] = fit_predict(model, rows[~test], rows[test], source_gpu)
    return out


def scores(forecast, target) -> dict:
    """Spearman, median absolute log error, and the share within 20% of the target."""
    forecast, target = np.asarray(forecast, float), np.asarray(target, float)
    error = np.abs(np.log(forecast / target))
    spearman = float(spearmanr(forecast, target).statistic) if len(target) >= 3 else float("nan")
    return {"n": int(len(target)), "spearman": spearman, "median_abs_log_error": float(np.median(error)),
            "within_20pct": float(np.mean(np.abs(forecast / target - 1.0) <= WITHIN))}
