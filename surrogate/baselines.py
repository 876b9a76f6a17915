"""Baseline forecasters: random, and an analytical roofline/occupancy model.

Both follow the same small protocol as the learned one (``fit`` returns self,
``forecast`` maps requests to forecasts), so every evaluation compares like with like.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from surrogate.features import FEATURE_NAMES, feature_matrix
from surrogate.forecast import Forecast, ForecastRequest, normalise
from surrogate.bins import bin_probabilities

_F = {name: i for i, name in enumerate(FEATURE_NAMES)}


class RandomForecaster:
    """Random bin distributions (Dirichlet): the floor every surrogate must clear."""

    name = "random"
    version = "dirichlet-1"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def fit(self, pairs=None) -> "RandomForecaster":
        self.rng_ = np.random.default_rng(self.seed)
        return self

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        rng = getattr(self, "rng_", None) or np.random.default_rng(self.seed)
        out = []
        for req in requests:
            p, raw = normalise(rng.dirichlet(np.ones(8)))
            out.append(Forecast(req.candidate.candidate_id, req.anchor.candidate_id, self.name, self.version, p,
                                raw_sum=raw))
        return out


class RooflineForecaster:
    """Runtime from the roofline (bytes over bandwidth, FLOPs over peak) inflated by occupancy penalties.

    The candidate's time is the roofline time divided by an efficiency: full for a block
    of 4-64 elements per thread with enough programs to fill the SMs, less for idle
    lanes, register spills or too few resident programs. The anchor's time is its
    measurement when known (else the roofline at 60%). The log-speedup spread is fixed.
    """

    name = "roofline"
    version = "occupancy-1"

    def __init__(self, sigma: float = 0.5):
        self.sigma = sigma

    def fit(self, pairs=None) -> "RooflineForecaster":
        return self

    @staticmethod
    def efficiency(f: np.ndarray) -> float:
        eff = 0.85 if f[_F["memory_bound"]] else 0.6
        ept = f[_F["elems_per_thread"]]
        if ept == ept:  # not NaN
            if ept < 4:
                eff *= max(0.25, ept / 4)
            elif ept > 64:
                eff *= max(0.2, math.sqrt(64 / ept))  # register spills grow with the tile
        programs = math.exp(f[_F["log_programs"]]) if f[_F["log_programs"]] == f[_F["log_programs"]] else math.inf
        waves = programs / max(1.0, f[_F["sm_count"]] if f[_F["sm_count"]] == f[_F["sm_count"]] else 100.0)
        if f[_F["persistent"]] == 1.0:
            waves = max(waves, 4.0)
        if waves < 2:
            eff *= max(0.3, waves / 2)
        return eff

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        t0 = time.perf_counter()
        X = feature_matrix(list(requests))
        mu = []
        for f in X:
            roof = math.exp(f[_F["log_roofline_us"]]) + 3.0  # plus a launch's fixed cost
            anchor = math.exp(f[_F["log_anchor_us"]]) if f[_F["log_anchor_us"]] == f[_F["log_anchor_us"]] else roof / 0.6
            mu.append(math.log(anchor / (roof / self.efficiency(f))))
        mu = np.array(mu)
        probs = bin_probabilities(mu, np.full(len(mu), self.sigma))
        latency = (time.perf_counter() - t0) / max(1, len(requests))
        out = []
        for req, pr, m in zip(requests, probs, mu):
            p, raw = normalise(pr)
            out.append(Forecast(req.candidate.candidate_id, req.anchor.candidate_id, self.name, self.version, p,
                                raw_sum=raw, latency_s=latency, expected_speedup=math.exp(m),
                                extra={"log_speedup_mean": float(m), "log_speedup_sigma": self.sigma}))
        return out
