"""A search's surrogate: candidate-level forecasts against the op's reference, corrected online.

A candidate's speedup is the geometric mean over the op's cases, so its log speedup is
the mean of the per-case log speedups. Forecasters that expose a Gaussian over log speedup
(``predict_log_speedup``: the learned one) are asked per case and averaged; the spread is
averaged too, since errors on the cases of one kernel move together. Every other forecaster
(LLM, roofline, random) gets one request per candidate naming all cases.

As the search measures its own children, the prior (fit on other operations) is corrected
on this operation: a shrunken mean residual shifts the forecast, and the spread is rescaled
so that the residuals' z-scores have unit variance. Both are cheap, closed-form updates,
so the correction runs every generation.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from kernels.ops import get_operation
from kernels.records import Candidate, HardwareSpec, Measurement
from surrogate.forecast import Forecast, ForecastRequest, normalise
from surrogate.learned import bin_probabilities

_SHRINK = 4.0  # pseudo-observations pulling the correction towards no correction


class SearchSurrogate:
    """Forecasts children of one (op, hardware) search; ``update`` learns from their measurements."""

    def __init__(self, forecaster, op: str, hardware: HardwareSpec, reference_us: Sequence[float] = ()):
        operation = get_operation(op)
        self.forecaster = forecaster
        self.op = op
        self.hardware = hardware
        self.reference: Candidate = operation.seed_candidates()[0]
        self.case_names = tuple(c.name for c in operation.cases)
        self.reference_us = tuple(reference_us) if len(reference_us) == len(self.case_names) else ()
        self.bias_ = 0.0
        self.scale_ = 1.0
        self._residuals: list[tuple[float, float]] = []  # (log measured - prior mean, prior sigma)

    @property
    def name(self) -> str:
        return self.forecaster.name

    @property
    def version(self) -> str:
        return f"{self.forecaster.version}+online{len(self._residuals)}"

    @property
    def gaussian(self) -> bool:
        return hasattr(self.forecaster, "predict_log_speedup")

    def _request(self, candidate: Candidate, cases: tuple[int, ...]) -> ForecastRequest:
        return ForecastRequest(anchor=self.reference, candidate=candidate, op=self.op, hardware=self.hardware,
                               case_names=tuple(self.case_names[i] for i in cases),
                               anchor_runtime_us=tuple(self.reference_us[i] for i in cases) if self.reference_us else ())

    def prior_log_speedup(self, candidates: Sequence[Candidate]) -> tuple[np.ndarray, np.ndarray]:
        """The uncorrected (mean, sigma) of each candidate's log speedup, averaged over the op's cases."""
        k = len(self.case_names)
        requests = [self._request(c, (i,)) for c in candidates for i in range(k)]
        mu, sigma = self.forecaster.predict_log_speedup(requests)
        return np.asarray(mu).reshape(-1, k).mean(axis=1), np.asarray(sigma).reshape(-1, k).mean(axis=1)

    def forecast(self, candidates: Sequence[Candidate]) -> list[Forecast]:
        if not candidates:
            return []
        if not self.gaussian:
            everything = tuple(range(len(self.case_names)))
            return self.forecaster.forecast([self._request(c, everything) for c in candidates])
        t0 = time.perf_counter()
        prior_mu, prior_sigma = self.prior_log_speedup(candidates)
        mu, sigma = prior_mu + self.bias_, prior_sigma * self.scale_
        probs = bin_probabilities(mu, sigma)
        latency = (time.perf_counter() - t0) / len(candidates)
        out = []
        for c, p, m, s, pm, ps in zip(candidates, probs, mu, sigma, prior_mu, prior_sigma):
            pr, raw = normalise(p)
            out.append(Forecast(c.candidate_id, self.reference.candidate_id, self.name, self.version, pr,
                                raw_sum=raw, latency_s=latency,
                                extra={"log_speedup_mean": float(m), "log_speedup_sigma": float(s),
                                       "prior_log_speedup_mean": float(pm), "prior_log_speedup_sigma": float(ps)}))
        return out

    def update(self, forecasts: Sequence[Forecast], measurements: Sequence[Measurement]) -> "SearchSurrogate":
        """Correct the prior with the measured speedups of forecast candidates (failures carry no speedup)."""
        if not self.gaussian:
            return self
        by_id = {f.candidate_id: f for f in forecasts if "prior_log_speedup_mean" in f.extra}
        for m in measurements:
            f = by_id.get(m.candidate_id)
            if f is not None and m.status == "ok" and m.speedup and m.speedup > 0:
                self._residuals.append((math.log(m.speedup) - f.extra["prior_log_speedup_mean"],
                                        f.extra["prior_log_speedup_sigma"]))
        if self._residuals:
            r, s = np.array(self._residuals).T
            n = len(r)
            self.bias_ = float(r.sum() / (n + _SHRINK))
            z2 = ((r - self.bias_) / s) ** 2
            self.scale_ = float(math.sqrt((z2.sum() + _SHRINK) / (n + _SHRINK)))
        return self
