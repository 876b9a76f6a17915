"""A search's surrogate: candidate-level forecasts against the op's reference, corrected online.

A candidate's speedup is the geometric mean over the op's cases, so its log speedup is
the mean of the per-case log speedups. Forecasters that expose a Gaussian over log speedup
(``predict_log_speedup``: the learned one) are asked per case and averaged; the spread is
averaged too, since errors on the cases of one kernel move together. Every other forecaster
(LLM, roofline, random) gets one request per candidate naming all cases.

As the search measures its own children, the prior (fit on other operations) is corrected
on this operation, in closed form, every generation:

- level: a shrunken mean residual shifts every forecast (the prior's level is often off
  on an operation it has not seen);
- neighbourhood: a kernel-weighted mean of the remaining residuals of measured
  neighbours (same algorithm, launch parameters a few powers of two apart) corrects
  candidates near what was measured, and narrows their spread, so the search learns the
  shape of this operation's space, which the prior ranks only roughly;
- spread: rescaled so that the residuals' z-scores have unit variance.

A forecaster that can also say how unsure it is of a candidate's place *within* the pool
(``predict_log_speedup_split``: the learned one) has its spread split in two:
the level of the operation, which every candidate shares and which the first measurements
pin down (its variance shrinks as 1 / (1/level² + n/within²) with n measured), and the
within-pool part, which is what tells candidates apart. The bin probabilities use both;
choosing what to measure uses the within-pool part alone (``thompson_draw``,
``log_expected_improvement``), since a level error shifts every child of a generation
alike. Ranked by the whole spread, the children the prior is least sure of, which on
these spaces are mostly slow ones, were measured first.

A forecaster that reads source (``predict_failure``: the learned and source ones) learned on
children written from a parent, against that parent. A free-form child (no template) whose
parent this search measured is forecast the same way, against its parent, and the forecast is
shifted by the parent's measured speedup onto the reference's scale. Every forecast keeps the
failure probability of the forecaster's, corrected online as well: a logit shift, fit to the
failures measured so far and shrunk towards none, moves the probabilities of an operation
whose children fail more (or less) often than the prior's corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
import zlib
from typing import Mapping, Sequence

import numpy as np

from scipy.special import expit, log_ndtr, logit
from scipy.stats import norm

from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import Candidate, HardwareSpec, Measurement
from kernelcast.surrogate.forecast import Forecast, ForecastRequest, normalise
from kernelcast.surrogate.bins import bin_probabilities

_SHRINK = 4.0  # pseudo-observations pulling the level correction towards none
_NEIGHBOUR_SHRINK = 1.0  # kernel weight of the prior in the neighbourhood correction
_BANDWIDTH2 = 2.0  # squared distance at which a neighbour's weight falls to 1/e
_OTHER_ALGORITHM = 4.0  # squared distance added between different algorithms
_FAILURE_PRIOR_SD = 1.0  # the failure correction's prior: a logit shift of about +-1 before any evidence


def _coordinates(c: Candidate) -> tuple[str, dict[str, float]]:
    """(algorithm, launch parameters on a log2 scale): the space a neighbourhood is measured in."""
    coords = {}
    for k, v in c.params.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            coords[k] = float(zlib.crc32(str(v).encode()) % 997)  # stable across processes
        else:
            coords[k] = math.log2(v) if v > 0 else -1.0
    return c.template or c.op, coords


def _distance2(a: tuple[str, dict[str, float]], b: tuple[str, dict[str, float]]) -> float:
    d = 0.0 if a[0] == b[0] else _OTHER_ALGORITHM
    for k in a[1].keys() | b[1].keys():
        if k in a[1] and k in b[1]:
            d += (a[1][k] - b[1][k]) ** 2
        else:
            d += 1.0
    return d


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
        self._residuals: list[tuple[float, float]] = []  # (log measured - prior mean, prior within-pool sigma)
        self._coordinates: list[tuple[str, dict[str, float]]] = []  # of each residual's candidate
        self.failure_shift_ = 0.0
        self._failures: list[tuple[float, bool]] = []  # (logit of the forecast failure probability, failed)
        self._measured: dict[str, tuple[Candidate, float, tuple[float, ...]]] = {}  # ran: (kernel, speedup, us)

    @property
    def name(self) -> str:
        return self.forecaster.name

    @property
    def version(self) -> str:
        return f"{self.forecaster.version}+online{len(self._residuals)}"

    @property
    def gaussian(self) -> bool:
        return hasattr(self.forecaster, "predict_log_speedup")

    @property
    def reads_source(self) -> bool:
        """Whether the forecaster reads a kernel against its parent (and so says how likely it fails)."""
        return hasattr(self.forecaster, "predict_failure")

    def _parent(self, candidate: Candidate) -> tuple[Candidate, float, tuple[float, ...]] | None:
        """(parent, its measured speedup, its runtimes per case) where ``candidate`` is forecast against
        its parent: a free-form child, of a parent this search measured running, by a forecaster that
        reads source; None where it is forecast against the reference."""
        if not self.reads_source or candidate.template or not candidate.parent_id:
            return None
        return self._measured.get(candidate.parent_id)

    def _request(self, candidate: Candidate, cases: tuple[int, ...]) -> ForecastRequest:
        names = tuple(self.case_names[i] for i in cases)
        parent = self._parent(candidate)
        if parent is not None:
            kernel, speedup, runtime_us = parent
            return ForecastRequest(anchor=kernel, candidate=candidate, op=self.op, hardware=self.hardware,
                                   case_names=names, anchor_speedup=speedup,
                                   anchor_runtime_us=tuple(runtime_us[i] for i in cases) if runtime_us else ())
        reference_us = tuple(self.reference_us[i] for i in cases) if self.reference_us else ()
        return ForecastRequest(anchor=self.reference, candidate=candidate, op=self.op, hardware=self.hardware,
                               case_names=names, anchor_runtime_us=reference_us)

    def _shift(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """Per candidate, what moves its forecast against its anchor onto the reference's scale: the log
        of its parent's measured speedup where it is forecast against its parent, else 0."""
        return np.array([math.log(p[1]) if (p := self._parent(c)) is not None else 0.0 for c in candidates])

    def failure_probability(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """P(each candidate fails): the forecaster's, logit-shifted by what this search measured fail
        (``update``); NaN for a forecaster that says nothing about failure."""
        if not self.reads_source:
            return np.full(len(candidates), math.nan)
        everything = tuple(range(len(self.case_names)))
        p = np.asarray(self.forecaster.predict_failure([self._request(c, everything) for c in candidates]), float)
        return expit(_logit(p) + self.failure_shift_) if self.failure_shift_ else p

    def prior_log_speedup(self, candidates: Sequence[Candidate]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The uncorrected (mean, sigma, within-pool sigma) of each candidate's log speedup, averaged
        over the op's cases; the within-pool sigma is the whole one for a forecaster that does not split it."""
        k = len(self.case_names)
        requests = [self._request(c, (i,)) for c in candidates for i in range(k)]
        if hasattr(self.forecaster, "predict_log_speedup_split"):
            mu, sigma, within = self.forecaster.predict_log_speedup_split(requests)
        else:
            mu, sigma = self.forecaster.predict_log_speedup(requests)
            within = sigma
        sigma, within = (np.asarray(v).reshape(-1, k).mean(axis=1) for v in (sigma, within))
        mu = np.asarray(mu).reshape(-1, k).mean(axis=1) + self._shift(candidates)
        return mu, sigma, np.minimum(within, sigma)

    def forecast(self, candidates: Sequence[Candidate]) -> list[Forecast]:
        if not candidates:
            return []
        if not self.gaussian:
            return self._forecast_whole(candidates)
        t0 = time.perf_counter()
        failure = self.failure_probability(candidates)
        prior_mu, prior_sigma, prior_within = self.prior_log_speedup(candidates)
        local, weight = self._neighbourhood(candidates)
        mu = prior_mu + self.bias_ + local
        within = prior_within * self.scale_ * np.sqrt(_NEIGHBOUR_SHRINK / (weight + _NEIGHBOUR_SHRINK))
        level_var = np.maximum(prior_sigma ** 2 - prior_within ** 2, 0.0)
        if self._residuals:  # the level's posterior after n measurements of this operation
            level_var = 1.0 / (1.0 / np.maximum(level_var, 1e-12) + len(self._residuals) / prior_within ** 2)
        sigma = np.sqrt(within ** 2 + level_var)
        probs = bin_probabilities(mu, sigma)
        latency = (time.perf_counter() - t0) / len(candidates)
        out = []
        for c, p, m, s, w, pm, ps, pw, f in zip(candidates, probs, mu, sigma, within, prior_mu, prior_sigma,
                                                prior_within, failure):
            pr, raw = normalise(p)
            out.append(Forecast(c.candidate_id, self.reference.candidate_id, self.name, self.version, pr,
                                raw_sum=raw, latency_s=latency, failure_probability=float(f),
                                expected_speedup=math.exp(m),  # the point, not the bins' (capped at 5.66x)
                                extra={"log_speedup_mean": float(m), "log_speedup_sigma": float(s),
                                       "log_speedup_sigma_within": float(w),
                                       "prior_log_speedup_mean": float(pm), "prior_log_speedup_sigma": float(ps),
                                       "prior_log_speedup_sigma_within": float(pw)}))
        return out

    def _forecast_whole(self, candidates: Sequence[Candidate]) -> list[Forecast]:
        """One request per candidate naming all cases (a forecaster without a per-case Gaussian). Where a
        child was forecast against its parent, its Gaussian is shifted onto the reference's scale; every
        forecast keeps its failure probability, corrected as ``failure_probability`` says."""
        everything = tuple(range(len(self.case_names)))
        forecasts = self.forecaster.forecast([self._request(c, everything) for c in candidates])
        if not self.reads_source:
            return forecasts
        out = []
        for f, shift in zip(forecasts, self._shift(candidates)):
            if self.failure_shift_ and not math.isnan(f.failure_probability):
                f = f.with_failure(float(expit(_logit(f.failure_probability) + self.failure_shift_)))
            if shift and "log_speedup_mean" in f.extra:
                mu = np.array([f.extra["log_speedup_mean"] + shift])
                sigma = np.array([f.extra["log_speedup_sigma"]])
                probabilities, raw = normalise(bin_probabilities(mu, sigma)[0])
                f = dataclasses.replace(f, anchor_id=self.reference.candidate_id, probabilities=probabilities,
                                        raw_sum=raw, expected_speedup=math.exp(mu[0]),
                                        extra={**f.extra, "log_speedup_mean": float(mu[0]),
                                               "anchor_log_speedup": float(shift)})
            out.append(f)
        return out

    def _neighbourhood(self, candidates: Sequence[Candidate]) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate: the kernel-weighted residual of measured neighbours (shrunk to 0) and their total weight."""
        local, weight = np.zeros(len(candidates)), np.zeros(len(candidates))
        if not self._residuals:
            return local, weight
        r = np.array([res for res, _ in self._residuals]) - self.bias_
        for i, c in enumerate(candidates):
            here = _coordinates(c)
            w = np.array([math.exp(-_distance2(here, there) / _BANDWIDTH2) for there in self._coordinates])
            weight[i] = w.sum()
            local[i] = float(w @ r) / (weight[i] + _NEIGHBOUR_SHRINK)
        return local, weight

    def update(self, candidates: Mapping[str, Candidate], forecasts: Sequence[Forecast],
               measurements: Sequence[Measurement]) -> "SearchSurrogate":
        """Correct the prior with the measured speedups of forecast candidates (failures carry no speedup),
        and the failure probabilities with which of them failed."""
        for m in measurements:
            if m.status == "ok" and m.speedup and m.speedup > 0 and m.candidate_id in candidates:
                self._measured[m.candidate_id] = (candidates[m.candidate_id], float(m.speedup),
                                                  tuple(m.runtime_us_median))
        self._update_failure(forecasts, measurements)
        if not self.gaussian:
            return self
        by_id = {f.candidate_id: f for f in forecasts if "prior_log_speedup_mean" in f.extra}
        for m in measurements:
            f = by_id.get(m.candidate_id)
            if f is not None and m.status == "ok" and m.speedup and m.speedup > 0:
                self._residuals.append((math.log(m.speedup) - f.extra["prior_log_speedup_mean"],
                                        f.extra.get("prior_log_speedup_sigma_within",
                                                    f.extra["prior_log_speedup_sigma"])))
                self._coordinates.append(_coordinates(candidates[m.candidate_id]))
        if self._residuals:
            r, s = np.array(self._residuals).T
            n = len(r)
            self.bias_ = float(r.sum() / (n + _SHRINK))
            z2 = ((r - self.bias_) / s) ** 2
            self.scale_ = float(math.sqrt((z2.sum() + _SHRINK) / (n + _SHRINK)))
        return self


    def _update_failure(self, forecasts: Sequence[Forecast], measurements: Sequence[Measurement]) -> None:
        """Refit the logit shift of the failure probability to every measured child whose forecast gave one.

        The shift b maximises the likelihood of the measured outcomes under sigmoid(logit p + b) with a
        Gaussian prior on b (sd ``_FAILURE_PRIOR_SD``), by Newton's method; the forecasts' p are the
        uncorrected ones (the shift in force when they were made is taken back out), so a refit never
        compounds."""
        by_id = {f.candidate_id: f for f in forecasts if not math.isnan(f.failure_probability)}
        for m in measurements:
            f = by_id.get(m.candidate_id)
            if f is not None:
                self._failures.append((float(_logit(f.failure_probability)) - self.failure_shift_, m.status != "ok"))
        if self._failures:
            self.failure_shift_ = logit_shift(*map(np.array, zip(*self._failures)), prior_sd=_FAILURE_PRIOR_SD)


def logit_shift(logits: np.ndarray, failed: np.ndarray, prior_sd: float = _FAILURE_PRIOR_SD) -> float:
    """The maximum a posteriori b of outcomes ``failed`` under P(fail) = sigmoid(logits + b), b ~ N(0, prior_sd²)."""
    y = np.asarray(failed, dtype=float)
    b = 0.0
    for _ in range(50):  # the log posterior is strictly concave: Newton's method converges in a few steps
        p = expit(logits + b)
        step = (np.sum(y - p) - b / prior_sd ** 2) / (np.sum(p * (1 - p)) + 1 / prior_sd ** 2)
        b += step
        if abs(step) < 1e-10:
            break
    return float(b)


def _logit(p) -> np.ndarray:
    return logit(np.clip(p, 1e-6, 1 - 1e-6))


def log_expected_improvement(forecast: Forecast, best_speedup: float) -> float:
    """How worth measuring a child is: the log of its expected gain in log speedup over
    ``best_speedup``, under its within-pool spread where the forecast gives one.

    The within-pool spread, not the whole: the level of the operation is shared by every
    child, so it cannot tell them apart. Uncertain children near the best outrank confident
    ones a little below it; that is what a budget should be spent on. In logs, because far
    below the best the gain underflows to 0 and would leave the children unordered; there the
    tail's asymptote keeps them in order of mean and spread. A forecast without a Gaussian is
    ranked by its expected speedup.
    """
    mu, sigma = _within_gaussian(forecast)
    if not best_speedup or best_speedup <= 0:
        return mu
    gap = mu - math.log(best_speedup)
    if sigma <= 0:
        return math.log(gap) if gap > 0 else -1e6 + gap  # still ordered among those below the best
    z = gap / sigma
    if z > -8:
        return math.log(sigma) + math.log(z * math.exp(log_ndtr(z)) + norm.pdf(z))
    # z * Phi(z) + phi(z) = phi(z) / z^2 * (1 - 3 / z^2 + 15 / z^4 - ...) as z -> -inf
    return math.log(sigma) + norm.logpdf(z) - 2 * math.log(-z) + math.log1p(-3 / z ** 2 + 15 / z ** 4)


def thompson_draw(forecast: Forecast, key: str) -> float:
    """One draw of the child's log speedup from its forecast (within-pool spread): Thompson sampling.

    Measuring the children whose draws are highest spends the budget in proportion to how
    likely each is to be the best: where the forecast is sure, on its top; where it ranks
    an operation poorly (wide spreads, close means), nearly at random, which is what the
    equal-budget baseline does. Expected improvement ranks the widest spreads first instead,
    and on an operation whose prior is poor those were mostly the slow children. The draw
    is a pure function of ``key`` (the run's seed and generation) and the candidate, so a
    resumed run chooses what the interrupted one chose.
    """
    mu, sigma = _within_gaussian(forecast)
    digest = hashlib.blake2b(f"{key}:{forecast.candidate_id}".encode(), digest_size=8).digest()
    return mu + sigma * float(norm.ppf((int.from_bytes(digest, "big") + 0.5) / 2.0 ** 64))


def _within_gaussian(forecast: Forecast) -> tuple[float, float]:
    """(mean, within-pool spread) of a forecast's log speedup: the whole spread where it gives no
    within-pool one, and (log expected speedup, 0) where it gives no Gaussian at all."""
    mu = forecast.extra.get("log_speedup_mean", math.log(max(forecast.expected_speedup, 1e-300)))
    return mu, forecast.extra.get("log_speedup_sigma_within", forecast.extra.get("log_speedup_sigma", 0.0))
