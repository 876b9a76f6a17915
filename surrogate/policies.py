"""Selective policies: which children to measure, which forecasts to trust, which to drop.

An unparsed forecast is never trusted. A confident forecast that would beat the best
measured kernel is measured, never trusted, so the reported best is always measured.

Failure-aware: a forecast's bins say how fast a kernel runs *if* it runs. Where the forecaster
also says how likely it is to fail (``Forecast.failure_probability``), a confident bin is trusted
only when the kernel is as sure to run (run probability at least the trust threshold), a child
as sure to fail is dropped unmeasured, and the ranking of the unsure ones is discounted by their
run probability (``run_weighted``). A forecaster that says nothing about failure (NaN) has run
probability 1: every decision is what it was without this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from kernelcast.surrogate.bins import UPPER_EDGES
from kernelcast.surrogate.forecast import Forecast

SCORES = ("max_probability", "neg_entropy", "margin")


def confidence(forecast: Forecast, score: str) -> float:
    if score not in SCORES:
        raise ValueError(f"unknown confidence score {score!r}; known: {', '.join(SCORES)}")
    return float(getattr(forecast, score))


@dataclass(frozen=True)
class Selection:
    measure: list[str] = field(default_factory=list)  # candidate ids
    trust: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    threshold: float = math.inf


class ThresholdPolicy:
    """Trust a parsed forecast whose confidence score reaches ``threshold``."""

    def __init__(self, score: str = "max_probability", threshold: float = 0.9):
        confidence_check = Forecast("x", "y", "check", "0", (1.0,) + (0.0,) * 7)
        confidence(confidence_check, score)  # fail now on an unknown score
        self.score = score
        self.threshold = threshold

    def trusted(self, forecast: Forecast) -> bool:
        """A parsed forecast whose bin is confident, of a kernel as sure to run."""
        return (forecast.parsed and confidence(forecast, self.score) >= self.threshold
                and forecast.run_probability >= self.threshold)

    def sure_to_fail(self, forecast: Forecast) -> bool:
        """A parsed forecast at least as sure the kernel fails as trusting a bin needs (never where failure is NaN)."""
        return forecast.parsed and forecast.failure_probability >= self.threshold


class ConformalRiskPolicy(ThresholdPolicy):
    """A threshold set by conformal risk control from measured calibration forecasts.

    The loss of a candidate at threshold t is 1 when its forecast is trusted (score >= t)
    and its bin is off by more than one. The threshold is the smallest t whose calibration
    risk satisfies (n/(n+1)) R(t) + 1/(n+1) <= target_risk, which guarantees that, on new
    exchangeable candidates, the expected fraction trusted-and-wrong is at most target_risk.
    """

    def __init__(self, target_risk: float = 0.05, score: str = "max_probability"):
        if not 0 < target_risk < 1:
            raise ValueError(f"target risk must lie in (0, 1), got {target_risk}")
        super().__init__(score, math.inf)
        self.target_risk = target_risk

    def fit(self, forecasts: Sequence[Forecast], true_bins: Sequence[int],
            units: Sequence[str] | None = None) -> "ConformalRiskPolicy":
        """Set the threshold from measured calibration forecasts.

        ``units`` names the exchangeable unit of each forecast when several forecasts belong
        to one (the cases of one candidate: measured together, never apart). The loss is then
        averaged within a unit and n counts units, as the guarantee requires.
        """
        scores = np.array([confidence(f, self.score) if f.parsed else -np.inf for f in forecasts])
        wrong = np.array([abs(f.predicted_bin - b) > 1 for f, b in zip(forecasts, true_bins)], dtype=float)
        if len(scores) == 0:
            raise ValueError("conformal risk control needs calibration forecasts with measured bins")
        unit_of = np.arange(len(scores)) if units is None else np.unique(np.asarray(units), return_inverse=True)[1]
        unit_of = unit_of.ravel()
        n = int(unit_of.max()) + 1
        weight = 1.0 / np.bincount(unit_of, minlength=n)[unit_of]  # each unit's losses sum to at most 1
        best = math.inf  # trust nothing unless some threshold is certified
        thresholds = np.unique(scores[np.isfinite(scores)])[::-1]  # from strict to permissive
        if len(thresholds):
            order = np.argsort(-scores, kind="stable")
            trusted = np.searchsorted(-scores[order], -thresholds, side="right")  # how many score >= t
            risk = np.cumsum((wrong * weight)[order])[trusted - 1] / n
            certified = n / (n + 1) * risk + 1 / (n + 1) <= self.target_risk
            # The risk only grows as the threshold falls: stop at the first threshold that fails.
            k = len(certified) if certified.all() else int(np.argmin(certified))
            best = float(thresholds[k - 1]) if k > 0 else math.inf
        self.threshold = best
        self.threshold_ = best
        return self


def run_weighted(log_score: Callable[[Forecast], float]) -> Callable[[Forecast], float]:
    """A log-scale ranking score (log expected improvement, a Thompson draw of log speedup) of a
    kernel that gains nothing when it fails: the score times the run probability, in logs."""
    return lambda f: log_score(f) + math.log(max(f.run_probability, 1e-300))


class BudgetPolicy:
    """Spend at most ``budget`` measurements: the most promising uncertain children first.

    Trusted forecasts predicting a loss against ``best_speedup`` are dropped; a trusted
    forecast predicting a new best is measured (it takes precedence in the budget); one whose
    bin holds the best predicts neither (``_against``) and is ranked with the unsure;
    forecasts as sure the kernel fails are dropped (``drop_failures``); other children
    are measured in order of ``rank`` (default: expected speedup times run probability;
    a search passes expected improvement over its best, ``run_weighted``) until the
    budget is spent, and the rest are dropped for this generation.

    ``spend_all`` (a search's last generation, where budget left over is lost): budget the
    measured children leave is spent on the dropped ones too, in order of ``rank``, so that a
    child forecast to fail is measured rather than the budget left unused.
    """

    def __init__(self, budget: int, trust: ThresholdPolicy, rank: Callable[[Forecast], float] | None = None,
                 drop_failures: bool = True, spend_all: bool = False):
        if budget < 0:
            raise ValueError(f"budget must be zero or more, got {budget}")
        self.budget = budget
        self.trust = trust
        self.rank = rank or (lambda f: f.expected_speedup * f.run_probability)
        self.drop_failures = drop_failures
        self.spend_all = spend_all

    def select(self, forecasts: Sequence[Forecast], best_speedup: float = 0.0) -> Selection:
        would_be_best, unsure, trust, drop = [], [], [], []
        for f in forecasts:
            side = _against(f, best_speedup)
            if self.drop_failures and self.trust.sure_to_fail(f):
                drop.append(f.candidate_id)
            elif not self.trust.trusted(f) or side is None:
                unsure.append(f)
            elif side > 0:
                would_be_best.append(f)
            elif side < 0:
                drop.append(f.candidate_id)
            else:
                trust.append(f.candidate_id)
        queue = sorted(would_be_best, key=lambda f: -f.expected_speedup) + \
            sorted(unsure, key=lambda f: -self.rank(f))
        measure = [f.candidate_id for f in queue[: self.budget]]
        leftover = queue[self.budget:]
        # A would-be best the budget cannot take waits for a later generation (dropped for this one): trusted, it
        # would never be measured, and the best it promises would never be found.
        ahead = {f.candidate_id for f in would_be_best}
        trust += [f.candidate_id for f in leftover if self.trust.trusted(f) and f.candidate_id not in ahead]
        drop += [f.candidate_id for f in leftover if not self.trust.trusted(f) or f.candidate_id in ahead]
        if self.spend_all and len(measure) < self.budget and drop:
            by_id = {f.candidate_id: f for f in forecasts}
            extra = sorted(drop, key=lambda i: -self.rank(by_id[i]))[: self.budget - len(measure)]
            measure += extra  # likeliest first: with a GPU-seconds budget, the first waves are measured
            kept = set(extra)
            drop = [i for i in drop if i not in kept]
        return Selection(measure=measure, trust=trust, drop=drop, threshold=self.trust.threshold)


def _against(forecast: Forecast, best_speedup: float) -> int | None:
    """Where a trusted forecast puts the child against ``best_speedup``: 1 above it, -1 below, 0 level, None where
    the forecast cannot say. A continuous forecaster's point estimate (``log_speedup_mean``) says; a forecast of
    bins alone says only where its bin lies wholly on one side. Its bins' representative speedup is no point
    within the bin: the top bin (4x and up) holds a child of 5x and an incumbent of 13x alike, and comparing its
    representative (5.66x) dropped the fastest children of a 13x kernel as sure losses."""
    if forecast.has_point:
        point = forecast.expected_speedup
        return (point > best_speedup) - (point < best_speedup)
    k = forecast.predicted_bin - 1
    lower, upper = (UPPER_EDGES[k - 1] if k else 0.0), UPPER_EDGES[k]
    if lower >= best_speedup:
        return 1
    if upper <= best_speedup:
        return -1
    return None
