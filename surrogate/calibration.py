"""Recalibrating a surrogate's bin distributions on measured forecasts.

Both calibrators take ``probs`` (n, 8) and ``true_bins`` (n,) in 1..8, learn from them in
``fit`` and map new distributions with ``transform``. Temperature scaling changes how
peaked every distribution is, keeping its ranking of bins; isotonic calibration maps the
confidence (max probability) onto the accuracy observed at that confidence.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar

_FLOOR = 1e-12  # log(0) guard: a bin the surrogate rules out still gets a sliver


def _check(probs, true_bins=None) -> tuple[np.ndarray, np.ndarray | None]:
    probs = np.asarray(probs, dtype=float)
    if probs.ndim != 2 or probs.shape[1] != 8:
        raise ValueError(f"probabilities must have shape (n, 8), got {probs.shape}")
    if true_bins is None:
        return probs, None
    true_bins = np.asarray(true_bins, dtype=int)
    if len(true_bins) != len(probs) or len(probs) == 0:
        raise ValueError(f"need one true bin per forecast and at least one: {len(probs)} forecasts, "
                         f"{len(true_bins)} bins")
    if true_bins.min() < 1 or true_bins.max() > 8:
        raise ValueError("true bins must lie in 1..8 (failed candidates, bin 0, have no speedup to calibrate)")
    return probs, true_bins


class TemperatureCalibrator:
    """p_i^(1/T), renormalised; T > 0 fit by minimising the NLL of the true bins.

    T > 1 softens an overconfident surrogate, T < 1 sharpens a timid one.
    """

    def __init__(self, log_t_bounds: tuple[float, float] = (-4.0, 4.0)):
        self.log_t_bounds = log_t_bounds

    def fit(self, probs, true_bins) -> "TemperatureCalibrator":
        probs, true_bins = _check(probs, true_bins)
        logp = np.log(np.clip(probs, _FLOOR, None))
        picked = (np.arange(len(probs)), true_bins - 1)

        def nll(log_t: float) -> float:
            z = logp / np.exp(log_t)
            z -= z.max(axis=1, keepdims=True)
            return -float(np.mean(z[picked] - np.log(np.exp(z).sum(axis=1))))

        # Searching log T keeps T positive and treats softening and sharpening alike.
        best = minimize_scalar(nll, bounds=self.log_t_bounds, method="bounded")
        self.temperature_ = float(np.exp(best.x))
        return self

    def transform(self, probs) -> np.ndarray:
        probs, _ = _check(probs)
        z = np.log(np.clip(probs, _FLOOR, None)) / self.temperature_
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)


class IsotonicCalibrator:
    """Confidence mapped by isotonic regression of bin correctness on max-probability.

    The top bin gets the calibrated confidence; the other bins share the rest in their
    original proportions, so the predicted bin and the ranking of the others are kept.
    """

    def fit(self, probs, true_bins) -> "IsotonicCalibrator":
        from sklearn.isotonic import IsotonicRegression

        probs, true_bins = _check(probs, true_bins)
        correct = (probs.argmax(axis=1) + 1 == true_bins).astype(float)
        # Never below uniform: a top bin under 1/8 would no longer be the top bin.
        self.regressor_ = IsotonicRegression(y_min=1 / 8, y_max=1.0, out_of_bounds="clip")
        self.regressor_.fit(probs.max(axis=1), correct)
        return self

    def transform(self, probs) -> np.ndarray:
        probs, _ = _check(probs)
        probs = probs / probs.sum(axis=1, keepdims=True)
        top = probs.argmax(axis=1)
        rows = np.arange(len(probs))
        old = probs[rows, top]
        new = self.regressor_.predict(old)
        out = probs.copy()
        rest = 1.0 - old
        scale = np.divide(1.0 - new, rest, out=np.zeros_like(rest), where=rest > 0)
        out *= scale[:, None]
        # A forecast that was all on one bin has no proportions to keep: spread the rest evenly.
        lone = rest <= 0
        out[lone] = ((1.0 - new[lone]) / 7)[:, None]
        out[rows, top] = new
        return out
