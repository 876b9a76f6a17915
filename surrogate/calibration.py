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

    This fits what ECE measures, the accuracy of the top bin at each confidence, which
    temperature scaling (fit to the NLL of all 8 bins) does not. The top bin gets the
    calibrated confidence c; the other bins share 1 - c in their original proportions,
    flattened toward uniform just enough that none exceeds c, so the predicted bin and
    the order of the others are kept.
    """

    def fit(self, probs, true_bins) -> "IsotonicCalibrator":
        from sklearn.isotonic import IsotonicRegression

        probs, true_bins = _check(probs, true_bins)
        probs = probs / probs.sum(axis=1, keepdims=True)
        correct = (probs.argmax(axis=1) + 1 == true_bins).astype(float)
        # Never down to uniform: a top bin at 1/8 or below could not stay the top bin.
        self.regressor_ = IsotonicRegression(y_min=1 / 8 + 1e-6, y_max=1.0, out_of_bounds="clip")
        self.regressor_.fit(probs.max(axis=1), correct)
        return self

    def transform(self, probs) -> np.ndarray:
        probs, _ = _check(probs)
        probs = probs / probs.sum(axis=1, keepdims=True)
        rows, top = np.arange(len(probs)), probs.argmax(axis=1)
        conf = self.regressor_.predict(probs[rows, top])
        others = probs.copy()
        others[rows, top] = 0.0
        rest = others.sum(axis=1, keepdims=True)
        # A forecast that was all on one bin has no proportions to keep: the rest is uniform.
        share = np.where(rest > 0, others / np.where(rest > 0, rest, 1.0), 1 / 7)
        share[rows, top] = 0.0
        # Mix the others' shares with uniform (weight lam) until the largest, times 1 - c, is at
        # most c; c > 1/8 makes that reachable. The margin keeps the top bin strictly on top.
        cap = np.maximum(conf * (1 - 1e-9) / (1 - conf + 1e-12), 1 / 7)
        biggest = share.max(axis=1)
        lam = np.clip((biggest - cap) / np.maximum(biggest - 1 / 7, 1e-12), 0.0, 1.0)
        uniform = np.full_like(share, 1 / 7)
        uniform[rows, top] = 0.0
        share = (1 - lam)[:, None] * share + lam[:, None] * uniform
        out = share * (1 - conf)[:, None]
        out[rows, top] = conf
        return out


CALIBRATORS = {"temperature": TemperatureCalibrator, "isotonic": IsotonicCalibrator}
