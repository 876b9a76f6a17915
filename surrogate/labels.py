"""The label baseline: what a user knows of a kernel for free, boosted. Every forecaster table carries it.

Six labels and nothing else: the variant's kind (a custom kernel, a CUDA graph, backend flags such as
cuDNN's, ``torch.compile``, or none of these: PyTorch's own operators, as the reference's null twin), the
reference's measured runtime (log), and the reference's operator count (log). A forecaster that reads code
has to beat this to claim it reads anything: on CUDA-L1's pool such a model ties the learned forecaster.

A gradient-boosted regression of log speedup on the labels (kernels that ran), a spread from its
out-of-fold absolute residuals (one number), and a gradient-boosted classifier of failure.
"""

from __future__ import annotations

import math
import re
import time
from typing import Sequence

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

from kernelcast.surrogate.forecast import ForecastRequest, gaussian_forecasts

KINDS = ("custom", "cuda-graph", "flags", "compile", "null")
LABELS = (*(f"kind_{k}" for k in KINDS), "log_reference_us", "log_reference_operators")
_CUSTOM = re.compile(r"@triton\.jit|load_inline|cpp_extension|__global__")
_GRAPH = re.compile(r"cuda\.graph\(|CUDAGraph\(|make_graphed_callables|mode=[\"']reduce-overhead")
_FLAGS = re.compile(r"cudnn\.(?:benchmark|deterministic|allow_tf32)|allow_tf32|set_float32_matmul_precision|"
                    r"channels_last")
_COMPILE = re.compile(r"torch\.compile\(|\.compile\(|torch\.jit\.(?:script|trace)")


def variant_kind(candidate, variants=None) -> str:
    """The kind of variant a kernel is: as ``variants`` (candidate id -> kind, a pool's own labels) says, its
    origin's (``variant:KIND``), or failing both, read off its source."""
    known = (variants or {}).get(candidate.candidate_id)
    if known:
        return {"cudnn": "flags", "graph": "cuda-graph"}.get(known, known if known in KINDS else "custom")
    origin = candidate.origin or ""
    if origin.startswith("variant:"):
        kind = origin.removeprefix("variant:")
        return {"cudnn": "flags", "graph": "cuda-graph"}.get(kind, kind if kind in KINDS else "custom")
    source = candidate.source
    for kind, rx in (("custom", _CUSTOM), ("cuda-graph", _GRAPH), ("compile", _COMPILE), ("flags", _FLAGS)):
        if rx.search(source):
            return kind
    return "null"


def labels(request: ForecastRequest, variants=None) -> list[float]:
    """LABELS of one request (the reference's runtime NaN where not measured)."""
    from kernelcast.surrogate.features import _operators

    kind = variant_kind(request.candidate, variants)
    us = [u for u in request.anchor_runtime_us if u and u > 0]
    return [*(float(kind == k) for k in KINDS), math.log(float(np.mean(us))) if us else math.nan,
            math.log(_operators(request.anchor.source) + 1)]


class LabelForecaster:
    """Six labels, boosted: the baseline any code-reading forecaster must beat."""

    name = "labels"

    def __init__(self, max_iter: int = 200, random_state: int = 0, variants: dict | None = None):
        self.max_iter = max_iter
        self.random_state = random_state
        self.variants = dict(variants or {})  # candidate id -> variant kind, where the pool labels its kernels

    @property
    def version(self) -> str:
        return f"labels-hgb-{getattr(self, 'n_train_', 0)}"

    def fit(self, pairs: pd.DataFrame) -> "LabelForecaster":
        """Fit on measured kernels (``kernelcast.surrogate.dataset.source_pairs`` rows, failed ones included, or
        ``case_pairs`` rows)."""
        from kernelcast.surrogate.dataset import requests_from, source_requests

        requests = source_requests(pairs) if "anchor_source" in pairs.columns else requests_from(pairs)
        X = np.array([labels(r, self.variants) for r in requests])
        speedup = pairs["speedup"].to_numpy(dtype=float)
        failed = pairs["failed"].to_numpy(dtype=bool) if "failed" in pairs.columns else ~(speedup > 0)
        ran = ~failed & (speedup > 0)
        if ran.sum() < 10:
            raise ValueError(f"the label baseline needs at least 10 kernels that ran, got {int(ran.sum())}")
        y = np.log(speedup[ran])
        self.speed_ = HistGradientBoostingRegressor(max_iter=self.max_iter, learning_rate=0.05, max_leaf_nodes=15,
                                                    random_state=self.random_state).fit(X[ran], y)
        from sklearn.model_selection import cross_val_predict

        oof = cross_val_predict(HistGradientBoostingRegressor(max_iter=self.max_iter, learning_rate=0.05,
                                                              max_leaf_nodes=15, random_state=self.random_state),
                                X[ran], y, cv=min(5, int(ran.sum()) // 2))
        self.sigma_ = float(max(np.mean(np.abs(y - oof)) * math.sqrt(math.pi / 2), 0.05))
        self.base_failure_ = float(failed.mean())
        self.failure_ = (HistGradientBoostingClassifier(max_iter=100, learning_rate=0.05, max_leaf_nodes=15,
                                                        random_state=self.random_state).fit(X, failed)
                         if 0 < failed.sum() < len(failed) else None)
        self.n_train_ = len(pairs)
        return self

    def predict_log_speedup(self, requests: Sequence[ForecastRequest]) -> tuple[np.ndarray, np.ndarray]:
        X = np.array([labels(r, self.variants) for r in requests])
        return self.speed_.predict(X), np.full(len(requests), self.sigma_)

    def predict_failure(self, requests: Sequence[ForecastRequest]) -> np.ndarray:
        if self.failure_ is None:
            return np.full(len(requests), self.base_failure_)
        return self.failure_.predict_proba(np.array([labels(r, self.variants) for r in requests]))[:, 1]

    def forecast(self, requests: Sequence[ForecastRequest]):
        if not hasattr(self, "speed_"):
            raise RuntimeError("LabelForecaster.forecast called before fit")
        if not requests:
            return []
        t0 = time.perf_counter()
        requests = list(requests)
        mu, sigma = self.predict_log_speedup(requests)
        return gaussian_forecasts(requests, self.name, self.version, self.predict_failure(requests), mu, sigma, t0)
