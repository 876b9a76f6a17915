"""The forecasting contract: a request (anchor, candidate, op case, hardware) and its forecast.

A ``Forecaster`` maps a batch of requests to a batch of forecasts. Every forecast is a
distribution over the 8 speedup bins of the candidate relative to the anchor (the op's
eager reference, or a measured parent), with the expected speedup, confidence scores,
and whether the answer parsed at all. Unparsed forecasts are never trusted.

A forecaster may also say how likely the candidate is to fail (not compile, crash, give a
wrong result, time out): ``failure_probability``, "bin 0". The 8 bins are then its speed
given that it runs. NaN means the forecaster says nothing about failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Protocol, Sequence

import numpy as np

from kernelcast.kernels.records import Candidate, HardwareSpec
from kernelcast.surrogate.bins import N_BINS
from kernelcast.surrogate.bins import expected_speedup as speedup_of_bins


@dataclass(frozen=True)
class ForecastRequest:
    """Forecast how fast ``candidate`` runs relative to ``anchor`` on ``op`` cases and ``hardware``."""

    anchor: Candidate
    candidate: Candidate
    op: str
    hardware: HardwareSpec
    case_names: tuple[str, ...] = ()
    # What is known of the anchor's runtime per case (us), when it has been measured.
    anchor_runtime_us: tuple[float, ...] = ()
    # The anchor's measured speedup over the op's eager reference, when known (1 for the reference).
    anchor_speedup: float = math.nan


@dataclass(frozen=True)
class Forecast:
    candidate_id: str
    anchor_id: str
    surrogate: str
    surrogate_version: str
    probabilities: tuple[float, ...]  # 8 bins, renormalised to sum to 1
    parsed: bool = True
    raw_sum: float = 1.0  # the sum before renormalising: a health signal for LLM answers
    latency_s: float = 0.0
    raw_response: str = ""
    extra: Mapping[str, float] = field(default_factory=dict)
    # The forecaster's point estimate of the speedup (geometric mean). Forecasters with a
    # continuous prediction (learned, roofline) give it, since two candidates in the same bin
    # are otherwise tied; the others get the one implied by the bins.
    expected_speedup: float = math.nan
    failure_probability: float = math.nan  # P(the candidate fails); NaN: not forecast

    def __post_init__(self) -> None:
        if len(self.probabilities) != N_BINS:
            raise ValueError(f"a forecast has {N_BINS} bin probabilities, got {len(self.probabilities)}")
        if not self.expected_speedup > 0:  # NaN or unusable: the bins' own estimate
            object.__setattr__(self, "expected_speedup", speedup_of_bins(self.probabilities))
        p = self.failure_probability
        if p is None or (isinstance(p, float) and math.isnan(p)):
            object.__setattr__(self, "failure_probability", math.nan)
        elif not 0.0 <= p <= 1.0:
            raise ValueError(f"a failure probability lies in [0, 1], got {p}")
        else:
            object.__setattr__(self, "failure_probability", float(p))

    @property
    def run_probability(self) -> float:
        """P(the candidate runs correctly): 1 - failure_probability, or 1 where failure is not forecast."""
        p = self.failure_probability
        return 1.0 if math.isnan(p) else 1.0 - p

    def with_failure(self, p: float) -> "Forecast":
        """This forecast with its failure probability set to ``p``."""
        return replace(self, failure_probability=p)

    @property
    def has_point(self) -> bool:
        """Whether ``expected_speedup`` is the forecaster's own point (a Gaussian over log speedup, whose mean
        ``extra`` carries), not the bins' representative, which says nothing within its bin."""
        return "log_speedup_mean" in self.extra

    @property
    def predicted_bin(self) -> int:
        """Most probable bin, 1..8."""
        return int(np.argmax(self.probabilities)) + 1

    @property
    def max_probability(self) -> float:
        return max(self.probabilities)

    @property
    def neg_entropy(self) -> float:
        return sum(p * math.log(p) for p in self.probabilities if p > 0)

    @property
    def margin(self) -> float:
        """Top-1 minus top-2 probability."""
        top = sorted(self.probabilities, reverse=True)
        return top[0] - top[1]


def normalise(probabilities: Sequence[float]) -> tuple[tuple[float, ...], float]:
    """(probabilities scaled to sum to 1, their raw sum); uniform when the sum is not positive."""
    raw = float(sum(probabilities))
    if not raw > 0 or not math.isfinite(raw):
        return tuple([1.0 / N_BINS] * N_BINS), raw
    return tuple(float(p) / raw for p in probabilities), raw


def unparsed(request: ForecastRequest, surrogate: str, version: str, raw_response: str = "",
             latency_s: float = 0.0) -> Forecast:
    """A forced deferral: uniform probabilities, ``parsed=False``; a policy never trusts it."""
    return Forecast(request.candidate.candidate_id, request.anchor.candidate_id, surrogate, version,
                    tuple([1.0 / N_BINS] * N_BINS), parsed=False, raw_sum=0.0, latency_s=latency_s,
                    raw_response=raw_response)


class Forecaster(Protocol):
    """One small protocol: a name, a version, and batched ``forecast``."""

    name: str
    version: str

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        ...


class CandidateIds:
    """candidate_id hashes the whole source; within one batch each distinct object is hashed once
    (a batch shares its anchors, and a candidate may come with several cases)."""

    def __init__(self):
        self._seen: dict[int, tuple[object, str]] = {}

    def __call__(self, candidate) -> str:
        hit = self._seen.get(id(candidate))
        if hit is None or hit[0] is not candidate:
            hit = self._seen[id(candidate)] = (candidate, candidate.candidate_id)
        return hit[1]


def gaussian_forecasts(requests: Sequence[ForecastRequest], surrogate: str, version: str, p_fail, mu, sigma,
                       started: float) -> list[Forecast]:
    """Forecasts from a failure probability and a Gaussian over log speedup per request (``mu``, ``sigma``): its
    mass in each speed bin (renormalised, the raw sum kept), its median speedup, and the latency since
    ``started`` (``time.perf_counter()``) shared out over the requests."""
    import time

    from kernelcast.surrogate.bins import bin_probabilities

    probs = bin_probabilities(np.asarray(mu), np.asarray(sigma))
    raw_sums = probs.sum(axis=1)
    probs /= raw_sums[:, None]
    latency = (time.perf_counter() - started) / len(requests)
    ids = CandidateIds()
    return [Forecast(ids(req.candidate), ids(req.anchor), surrogate, version, tuple(p.tolist()),
                     raw_sum=float(r), latency_s=latency, expected_speedup=math.exp(m), failure_probability=float(f),
                     extra={"log_speedup_mean": float(m), "log_speedup_sigma": float(sd)})
            for req, p, r, m, sd, f in zip(requests, probs, raw_sums, mu, sigma, p_fail)]
