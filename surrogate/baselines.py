"""Baseline forecasters: random, and an analytical roofline/occupancy model.

Both follow the same small protocol as the learned one (``fit`` returns self,
``forecast`` maps requests to forecasts), so every evaluation compares like with like.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import numpy as np

from kernelcast.surrogate.features import FEATURE_NAMES, feature_matrix
from kernelcast.surrogate.forecast import Forecast, ForecastRequest, gaussian_forecasts, normalise
from kernelcast.surrogate.bins import bin_probabilities

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


class OracleForecaster:
    """Hindsight: each candidate's measured outcome, read from a data root, forecast as certain.

    No search can have this surrogate. It gives the ceiling a perfect one would reach on the same
    measurements: a replay whose children were all measured before (``surrogate="oracle"``,
    ``surrogate_folder`` the replayed data root) ranks them by their real speedups, so its best against
    the baseline's bounds what any forecaster could win there. Each candidate's outcome is the one a replay
    of that root answers (``kernelcast.infra.measure.ReplayMeasurer``: its last measurement on the request's GPU type).
    A candidate the root never measured is forecast as its anchor with a wide spread: known to be unknown.
    The root's measurements come through ``read``, which the layer that owns the data root hands it
    (``kernelcast.tasks.setup.forecaster``): a surrogate reads no storage itself.
    """

    name = "oracle"
    version = "hindsight-1"
    SURE = 1e-3  # the spread of a measured outcome's log speedup, and how far from 0 or 1 its failure lies
    UNKNOWN_SIGMA = 1.0

    def __init__(self, read: Callable[[str, str], object] | None = None):
        self.read = read  # (op, gpu_type) -> the data root's measurements of them, a frame in the order stored
        self._known: dict[tuple[str, str], dict[str, tuple[bool, float]]] = {}  # (op, gpu) -> id -> (ran, speedup)

    def fit(self, pairs=None) -> "OracleForecaster":
        return self

    def _outcomes(self, op: str, gpu_type: str) -> dict[str, tuple[bool, float]]:
        if (op, gpu_type) not in self._known:
            frame = self.read(op, gpu_type) if self.read is not None else None
            known: dict[str, tuple[bool, float]] = {}
            rows = () if frame is None or frame.empty else \
                frame[["candidate_id", "status", "speedup"]].itertuples(index=False)
            for cid, status, speedup in rows:  # in order, the last measurement of a kernel standing, as a replay answers
                ran = status == "ok" and speedup == speedup and bool(speedup)
                known[cid] = (ran, float(speedup) if ran else 0.0)
            self._known[op, gpu_type] = known
        return self._known[op, gpu_type]

    def _outcome(self, req: ForecastRequest, candidate) -> tuple[bool, float] | None:
        return self._outcomes(req.op, req.hardware.gpu_type).get(candidate.candidate_id)

    def predict_log_speedup(self, requests: Sequence[ForecastRequest]) -> tuple[np.ndarray, np.ndarray]:
        """Per request, the log of the candidate's measured speedup over its anchor's (the anchor's measured
        one where the request carries it, else the root's, else 1: the reference) and a spread of ``SURE``;
        (0, ``UNKNOWN_SIGMA``) for a candidate never measured, and a floor of 1e-3x for one that failed."""
        mu, sigma = [], []
        for req in requests:
            got = self._outcome(req, req.candidate)
            if got is None:
                mu.append(0.0)
                sigma.append(self.UNKNOWN_SIGMA)
                continue
            anchor = req.anchor_speedup
            if not anchor > 0:
                known = self._outcome(req, req.anchor)
                anchor = known[1] if known is not None and known[0] else 1.0
            mu.append(math.log(max(got[1], 1e-3) / anchor) if got[0] else math.log(1e-3 / anchor))
            sigma.append(self.SURE)
        return np.array(mu), np.array(sigma)

    def predict_failure(self, requests: Sequence[ForecastRequest]) -> np.ndarray:
        """Per request, ``SURE`` where the candidate ran, 1 - ``SURE`` where it failed, 0.5 where never measured."""
        out = []
        for req in requests:
            got = self._outcome(req, req.candidate)
            out.append(0.5 if got is None else (self.SURE if got[0] else 1.0 - self.SURE))
        return np.array(out)

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        t0 = time.perf_counter()
        mu, sigma = self.predict_log_speedup(requests)
        return gaussian_forecasts(requests, self.name, self.version, self.predict_failure(requests), mu, sigma, t0)
