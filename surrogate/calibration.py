"""Recalibrating a surrogate's bin distributions on measured forecasts.

The confidence calibrators take ``probs`` (n, 8) and ``true_bins`` (n,) in 1..8 (or (n, 9) and
bins 0..8, failure included: ``kernelcast.surrogate.metrics.with_failure``), learn from
them in ``fit`` and map new distributions with ``transform``. Temperature scaling changes how
peaked every distribution is, keeping its ranking of bins; isotonic and Platt calibration map
the confidence (max probability) onto the accuracy observed at that confidence, isotonic with
a free monotone step function, Platt with a two-parameter logistic curve, which a few hundred
measured forecasts pin down with less noise.

``LevelSpreadCalibrator`` works one step earlier, on a forecaster that gives a Gaussian over
log speedup (the learned and roofline ones): it shifts the mean and rescales the spread to fit
the measured bins of one operation on one GPU, which is what a search's online correction
does to its prior (``kernelcast.surrogate.online``). It moves whole distributions, so it can change the
predicted bin; a confidence calibrator then maps what it gives.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit, logit

from kernelcast.surrogate.bins import first_bin, predicted_bins

_FLOOR = 1e-12  # log(0) guard: a bin the surrogate rules out still gets a sliver


def _check(probs, true_bins=None) -> tuple[np.ndarray, np.ndarray | None]:
    probs = np.asarray(probs, dtype=float)
    if probs.ndim != 2:
        raise ValueError(f"probabilities must have shape (n, 8) or (n, 9), got {probs.shape}")
    first = first_bin(probs)
    if true_bins is None:
        return probs, None
    true_bins = np.asarray(true_bins, dtype=int)
    if len(true_bins) != len(probs) or len(probs) == 0:
        raise ValueError(f"need one true bin per forecast and at least one: {len(probs)} forecasts, "
                         f"{len(true_bins)} bins")
    if true_bins.min() < first or true_bins.max() > 8:
        raise ValueError(f"true bins must lie in {first}..8 (with 8 columns, failed candidates, bin 0, "
                         "have no speedup to calibrate)")
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
        picked = (np.arange(len(probs)), true_bins - first_bin(probs))

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
        correct = (predicted_bins(probs) == true_bins).astype(float)
        # Never down to uniform: a top bin at 1/k or below could not stay the top bin.
        self.regressor_ = IsotonicRegression(y_min=1 / probs.shape[1] + 1e-6, y_max=1.0, out_of_bounds="clip")
        self.regressor_.fit(probs.max(axis=1), correct)
        return self

    def transform(self, probs) -> np.ndarray:
        probs, _ = _check(probs)
        probs = probs / probs.sum(axis=1, keepdims=True)
        return with_confidence(probs, self.regressor_.predict(probs.max(axis=1)))


class PlattCalibrator:
    """Confidence mapped by a logistic curve in the logit of the max-probability (Platt scaling).

    Two parameters, fit by the likelihood of the top bin being right, with Platt's smoothed
    targets ((k + 1) / (k + 2) for right, 1 / (k + 2) for wrong), so that a calibration set
    with no wrong (or no right) forecasts still gives a finite curve. The bins are then set
    as ``IsotonicCalibrator`` sets them: the predicted bin and the order of the others kept.
    """

    def fit(self, probs, true_bins) -> "PlattCalibrator":
        probs, true_bins = _check(probs, true_bins)
        probs = probs / probs.sum(axis=1, keepdims=True)
        correct = predicted_bins(probs) == true_bins
        hits, misses = int(correct.sum()), int((~correct).sum())
        target = np.where(correct, (hits + 1) / (hits + 2), 1 / (misses + 2))
        x = _logit_confidence(probs)

        def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
            p = np.clip(expit(w[0] * x + w[1]), 1e-12, 1 - 1e-12)
            g = p - target
            return (-float(np.mean(target * np.log(p) + (1 - target) * np.log(1 - p))),
                    np.array([np.mean(g * x), np.mean(g)]))

        self.slope_, self.intercept_ = (float(v) for v in minimize(loss, np.array([1.0, 0.0]), jac=True,
                                                                    method="L-BFGS-B").x)
        return self

    def confidence(self, probs) -> np.ndarray:
        probs, _ = _check(probs)
        probs = probs / probs.sum(axis=1, keepdims=True)
        # Never down to uniform: a top bin at 1/k or below could not stay the top bin.
        return np.clip(expit(self.slope_ * _logit_confidence(probs) + self.intercept_), 1 / probs.shape[1] + 1e-6,
                       1.0)

    def transform(self, probs) -> np.ndarray:
        probs, _ = _check(probs)
        probs = probs / probs.sum(axis=1, keepdims=True)
        return with_confidence(probs, self.confidence(probs))


def _logit_confidence(probs: np.ndarray) -> np.ndarray:
    return logit(np.clip(probs.max(axis=1), 1e-6, 1 - 1e-6))


def with_confidence(probs: np.ndarray, conf: np.ndarray) -> np.ndarray:
    """``probs`` (rows summing to 1, k bins) with each top bin set to ``conf`` (> 1/k).

    The other bins share 1 - conf in their original proportions, flattened toward uniform
    just enough that none exceeds conf, so the predicted bin and the others' order are kept.
    """
    rows, top = np.arange(len(probs)), probs.argmax(axis=1)
    even = 1 / (probs.shape[1] - 1)  # an even share of the other bins
    others = probs.copy()
    others[rows, top] = 0.0
    rest = others.sum(axis=1, keepdims=True)
    # A forecast that was all on one bin has no proportions to keep: the rest is uniform.
    share = np.where(rest > 0, others / np.where(rest > 0, rest, 1.0), even)
    share[rows, top] = 0.0
    # Mix the others' shares with uniform (weight lam) until the largest, times 1 - c, is at
    # most c; c > 1/k makes that reachable. The margin keeps the top bin strictly on top.
    cap = np.maximum(conf * (1 - 1e-9) / (1 - conf + 1e-12), even)
    biggest = share.max(axis=1)
    lam = np.clip((biggest - cap) / np.maximum(biggest - even, 1e-12), 0.0, 1.0)
    uniform = np.full_like(share, even)
    uniform[rows, top] = 0.0
    share = (1 - lam)[:, None] * share + lam[:, None] * uniform
    out = share * (1 - conf)[:, None]
    out[rows, top] = conf
    return out


class LevelSpreadCalibrator:
    """A Gaussian forecaster's (mean, spread) of log speedup corrected: mean + shift, spread * scale.

    The shift and the scale maximise the likelihood of the measured bins (not of the measured
    speedups: the Gaussian is only a model of them, and the bins are what is scored). Bounded,
    so a handful of measurements cannot push the spread to nothing.
    """

    def __init__(self, max_shift: float = 5.0, log_scale_bounds: tuple[float, float] = (-2.0, 2.0)):
        self.max_shift = max_shift
        self.log_scale_bounds = log_scale_bounds

    def fit(self, mean, sigma, true_bins) -> "LevelSpreadCalibrator":
        # Here, not at the top: kernelcast.surrogate.learned brings scikit-learn, and CALIBRATORS is what a
        # command line checks --calibrator against before anything heavy loads.
        from kernelcast.surrogate.learned import bin_probabilities

        mean, sigma = _gaussian(mean, sigma)
        _, true_bins = _check(np.full((len(mean), 8), 1 / 8), true_bins)
        picked = (np.arange(len(mean)), true_bins - 1)

        def nll(w: np.ndarray) -> float:
            p = bin_probabilities(mean + w[0], sigma * np.exp(w[1]))
            return -float(np.mean(np.log(p[picked] / p.sum(axis=1))))

        best = minimize(nll, np.zeros(2), method="L-BFGS-B",
                        bounds=[(-self.max_shift, self.max_shift), self.log_scale_bounds])
        self.shift_, self.scale_ = float(best.x[0]), float(np.exp(best.x[1]))
        return self

    def transform(self, mean, sigma) -> np.ndarray:
        """(n, 8) bin probabilities of the corrected Gaussians."""
        from kernelcast.surrogate.learned import bin_probabilities

        mean, sigma = _gaussian(mean, sigma)
        probs = bin_probabilities(mean + self.shift_, sigma * self.scale_)
        return probs / probs.sum(axis=1, keepdims=True)


def _gaussian(mean, sigma) -> tuple[np.ndarray, np.ndarray]:
    mean, sigma = np.asarray(mean, dtype=float), np.asarray(sigma, dtype=float)
    if mean.shape != sigma.shape or mean.ndim != 1:
        raise ValueError(f"need one mean and one spread per forecast: shapes {mean.shape} and {sigma.shape}")
    if not (np.isfinite(mean).all() and np.isfinite(sigma).all() and (sigma > 0).all()):
        raise ValueError("every mean must be finite and every spread finite and positive")
    return mean, sigma


CALIBRATORS = {"temperature": TemperatureCalibrator, "isotonic": IsotonicCalibrator, "platt": PlattCalibrator}
