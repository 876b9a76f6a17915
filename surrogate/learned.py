"""The learned forecaster (the embedded default, no LLM): gradient-boosted log-speedup regression
with a predictive distribution.

The mean of log(speedup) is built from what transfers across operations:

- a pool level: the median log speedup of the candidate's (op, case, GPU) pool, from what
  the pool shares (bytes, FLOPs, how close the anchor is to the roofline);
- a pool scale: the spread (interquartile range) of log speedups in that pool, likewise;
- a configuration's rank: where in its pool the candidate falls, as a percentile (0 the
  slowest, 1 the fastest), from its launch parameters and code;
- a pool shape: the average quantile function of (log speedup - median) / scale over the
  training pools, which turns a rank into a deviation.

mean = level + scale * shape(rank). Ranking by percentile rather than by log-speedup
deviation is what carries to an operation never seen: operations differ far more in how
widely their variants spread than in which kinds of configuration sit near the top, and a
regression on raw deviations spends itself on the wide-spread operations. The spread of
the forecast comes from a fourth model, fit on out-of-fold absolute residuals, so the
forecaster is less sure where it has been wrong before. A fifth, fit on the residuals left
when the pool's true level and scale are put in, gives the spread *within* a pool: most of
the whole spread is the level of an operation not seen before, which every candidate of
that operation shares, and which a search learns from its first measurements. The Gaussian in log space is
integrated over the 8 bin edges to give the bin distribution, and its median is the
forecast's expected speedup. Refitting on a few thousand rows takes seconds, so it refits
as measurements arrive.

A kernel that is no template variant (a language model's rewrite, an imported submission)
has launch-parameter features unlike any the rank model was fit on. Its bins come from the
source model (``kernelcast.surrogate.source.SourceForecaster``), which reads its code against its
anchor's; the source model also gives every forecast, template variants' included, its
failure probability.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.model_selection import GroupKFold

from kernelcast.surrogate.bins import bin_probabilities  # noqa: F401  (re-exported: its old home)
from kernelcast.surrogate.dataset import requests_from
from kernelcast.surrogate.features import FEATURE_NAMES, feature_matrix
from kernelcast.surrogate.forecast import CandidateIds, Forecast, ForecastRequest

_MIN_SIGMA = 0.03
_MIN_SCALE = 0.01  # a pool whose variants all run alike still has a measurable spread
_SHAPE_GRID = np.linspace(0.0, 1.0, 101)
# What every candidate of one (op, case, GPU) pool shares: the pool-level model sees only
# these, so it is evaluated once per distinct pool in a batch, not once per candidate.
POOL_FEATURES = ("log_bytes", "log_flops", "log_row_len", "log_rows", "dtype_bytes", "intensity", "memory_bound",
                 "sm_count", "peak_gbps", "l2_mib", "anchor_is_reference", "log_anchor_us",
                 "anchor_fraction_of_roofline", "log_roofline_us")
# The source part, which forecasts imported and written kernels: its speed regression stacked with a
# within-problem one, both learning the median log speedup (absolute error). On the CUDA-L1 development problems,
# held out by problem, the learned forecaster's within-problem Spearman rose 0.51 -> 0.58 and its ECE fell 0.09 ->
# 0.06, top-1 and the 10% selection no worse (leave one level out: Spearman 0.35 -> 0.40, ECE 0.17 -> 0.08).
SOURCE_OPTIONS = {"speed_loss": "absolute_error", "stack_centred": True}
_POOL_COLUMNS = np.array([FEATURE_NAMES.index(n) for n in POOL_FEATURES])


def _encode(X: np.ndarray) -> np.ndarray:
    """Absent features (NaN) as -1: every feature is non-negative, and a column that is absent
    for a whole training fold must still bin (scikit-learn cannot bin an all-NaN column)."""
    return np.nan_to_num(X, nan=-1.0)


class LearnedForecaster:
    name = "learned"

    def __init__(self, max_iter: int = 300, learning_rate: float = 0.05, max_leaf_nodes: int = 31,
                 folds: int = 4, random_state: int = 0, held_out: str = "op", source_max_iter: int = 100,
                 source_options: dict | None = None):
        if held_out not in ("op", "gpu_type"):
            raise ValueError(f"held_out must be 'op' or 'gpu_type', got {held_out!r}")
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.folds = folds
        self.random_state = random_state
        self.held_out = held_out
        self.source_max_iter = source_max_iter
        # keyword arguments of the source model (kernelcast.surrogate.source.SourceForecaster) over SOURCE_OPTIONS
        self.source_options = {**SOURCE_OPTIONS, **(source_options or {})}

    @property
    def version(self) -> str:
        source = getattr(self, "source_", None)
        return (f"hgb-rank-{self.max_iter}-{self.learning_rate}-{getattr(self, 'n_train_', 0)}"
                + (f"+{source.version}" if source is not None else ""))

    def _model(self):
        return HistGradientBoostingRegressor(max_iter=self.max_iter, learning_rate=self.learning_rate,
                                             max_leaf_nodes=self.max_leaf_nodes, random_state=self.random_state)

    def fit(self, pairs: pd.DataFrame, sources: pd.DataFrame | None = None) -> "LearnedForecaster":
        """Fit on measured pairs (``kernelcast.surrogate.dataset.case_pairs``; the rank models skip failed
        candidates). The source model fits on ``sources`` (``kernelcast.surrogate.dataset.source_pairs``:
        written kernels, failed ones included) when given, else on ``pairs``."""
        from kernelcast.surrogate.source import SourceForecaster

        ok = pairs[pairs["speedup"].notna() & (pairs["speedup"] > 0)]
        if len(ok) < 20:
            raise ValueError(f"the learned forecaster needs at least 20 measured pairs, got {len(ok)}")
        X = _encode(feature_matrix(requests_from(ok)))
        y = np.log(ok["speedup"].to_numpy())
        pool = pd.Series(y, index=ok.index).groupby([ok["op"], ok["case_name"], ok["gpu_type"]])
        level = pool.transform("median").to_numpy()
        scale = np.maximum(pool.transform(lambda v: v.quantile(0.75) - v.quantile(0.25)).to_numpy(), _MIN_SCALE)
        rank = pool.rank(pct=True).to_numpy()
        self.shape_ = _mean_shape(pd.Series((y - level) / scale, index=ok.index).groupby(
            [ok["op"], ok["case_name"], ok["gpu_type"]]))
        # Out-of-fold residuals, so the spread models learn how wrong the mean is on what they
        # will be asked about: by default operations never seen (folds by operation); with
        # held_out "gpu_type", operations seen on another GPU type (porting a tuned operation):
        # each fold holds out one GPU type's rows of some operations while their other GPU
        # types' rows stay in, and only operations measured on two or more GPU types count.
        folds, use = self._folds(ok)
        oof, oof_within = np.zeros_like(y), np.zeros_like(y)
        P = X[:, _POOL_COLUMNS]
        for test_mask in folds:
            train, test = np.flatnonzero(~test_mask), np.flatnonzero(test_mask)
            oof_rank = self._model().fit(X[train], rank[train]).predict(X[test])
            oof[test] = self._mean(self._model().fit(P[train], level[train]).predict(P[test]),
                                   self._model().fit(P[train], np.log(scale[train])).predict(P[test]), oof_rank)
            # The same forecast had the pool's level and spread been known: what is left is the
            # error of the ranking alone, the part that differs between candidates of one pool.
            oof_within[test] = self._mean(level[test], np.log(scale[test]), oof_rank)
        self.level_model_ = self._model().fit(P, level)
        self.scale_model_ = self._model().fit(P, np.log(scale))
        self.rank_model_ = self._model().fit(X, rank)
        self.spread_model_ = self._model().fit(X[use], np.abs(y - oof)[use] * math.sqrt(math.pi / 2))
        self.within_model_ = self._model().fit(X[use], np.abs(y - oof_within)[use] * math.sqrt(math.pi / 2))
        self.source_ = SourceForecaster(max_iter=self.source_max_iter, random_state=self.random_state,
                                        **self.source_options).fit(
            pairs if sources is None else sources)
        self.n_train_ = len(ok)
        return self

    def _folds(self, ok: pd.DataFrame) -> tuple[list[np.ndarray], np.ndarray]:
        """Test masks of the out-of-fold residuals, and which rows the spread models learn from."""
        everything = np.ones(len(ok), dtype=bool)
        if self.held_out == "gpu_type":
            gpus_per_op = ok.groupby("op")["gpu_type"].transform("nunique").to_numpy()
            use = gpus_per_op >= 2
            if use.any():
                op_code = pd.factorize(ok["op"])[0]
                gpu_code = pd.factorize(ok["gpu_type"])[0]
                k = min(self.folds, max(2, int(gpus_per_op.max())))
                # an operation's GPU types land in different folds, so each held-out row's
                # operation stays in training on another GPU type
                fold = (op_code + gpu_code) % k
                return [use & (fold == f) for f in range(k)], use
        by = ok["op"].to_numpy() if ok["op"].nunique() >= self.folds else ok["candidate_id"].to_numpy()
        splits = GroupKFold(n_splits=min(self.folds, len(set(by)))).split(np.zeros(len(ok)), groups=by)
        masks = []
        for _, test in splits:
            mask = np.zeros(len(ok), dtype=bool)
            mask[test] = True
            masks.append(mask)
        return masks, everything

    def _mean(self, level: np.ndarray, log_scale: np.ndarray, rank: np.ndarray) -> np.ndarray:
        return level + np.exp(log_scale) * np.interp(np.clip(rank, 0.0, 1.0), _SHAPE_GRID, self.shape_)

    def predict_log_speedup(self, requests: Sequence[ForecastRequest]) -> tuple[np.ndarray, np.ndarray]:
        """(mean, spread) of log speedup per request; the spread is the whole forecast error,
        the pool's level included."""
        mu, (sigma,) = self._predict(requests, (self.spread_model_,), feature_matrix(list(requests)))
        return mu, sigma

    def predict_log_speedup_split(self, requests: Sequence[ForecastRequest]) -> tuple[np.ndarray, ...]:
        """(mean, whole spread, within-pool spread) of log speedup per request, in one pass.

        The within-pool spread is the error of the candidate's place within its pool alone:
        what separates candidates of one operation on one GPU once a search has measured a
        few and so knows the level (``kernelcast.surrogate.online``)."""
        mu, (sigma, within) = self._predict(requests, (self.spread_model_, self.within_model_),
                                            feature_matrix(list(requests)))
        return mu, sigma, within

    def predict_failure(self, requests: Sequence[ForecastRequest]) -> np.ndarray:
        """P(the kernel fails) per request, from the source model (``kernelcast.surrogate.source``)."""
        return self.source_.predict_failure(list(requests))

    def _predict(self, requests: Sequence[ForecastRequest], spread_models,
                 features: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """(mean, spreads) of log speedup; ``features`` is ``feature_matrix(requests)``."""
        if not requests:
            return np.empty(0), [np.empty(0) for _ in spread_models]
        X = _encode(features)
        pools, which = np.unique(X[:, _POOL_COLUMNS], axis=0, return_inverse=True)
        which = which.ravel()
        mu = self._mean(self.level_model_.predict(pools)[which], self.scale_model_.predict(pools)[which],
                        self.rank_model_.predict(X))
        spreads = [np.maximum(model.predict(X), _MIN_SIGMA) for model in spread_models]
        # A kernel that is no template variant: the source model's Gaussian, for the whole spread
        # and the within-pool one alike (it has no pool level of its own to separate out).
        novel = np.flatnonzero([not r.candidate.template for r in requests])
        if len(novel):
            _, source_mu, source_sigma = self.source_.predict([requests[i] for i in novel], features[novel])
            mu[novel] = source_mu
            for sigma in spreads:
                sigma[novel] = source_sigma
        return mu, spreads

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        if not hasattr(self, "level_model_"):
            raise RuntimeError("LearnedForecaster.forecast called before fit")
        if not requests:
            return []
        t0 = time.perf_counter()
        requests = list(requests)
        features = feature_matrix(requests)
        mu, (sigma,) = self._predict(requests, (self.spread_model_,), features)
        failure = self.source_.predict_failure(requests, features)
        probs = bin_probabilities(mu, sigma)
        raw_sums = probs.sum(axis=1)  # 1 plus the few 1e-9 the clipped tails add
        probs /= raw_sums[:, None]
        latency = (time.perf_counter() - t0) / max(1, len(requests))
        version, ids = self.version, CandidateIds()
        return [Forecast(ids(req.candidate), ids(req.anchor), self.name, version, tuple(p.tolist()),
                         raw_sum=float(r), latency_s=latency, expected_speedup=math.exp(m),
                         failure_probability=float(f),
                         extra={"log_speedup_mean": float(m), "log_speedup_sigma": float(s)})
                for req, p, r, m, s, f in zip(requests, probs, raw_sums, mu, sigma, failure)]


def _mean_shape(standardised) -> np.ndarray:
    """The training pools' average quantile function of standardised deviation, on _SHAPE_GRID."""
    curves = [np.quantile(v.to_numpy(), _SHAPE_GRID) for _, v in standardised if len(v) >= 2]
    return np.mean(curves, axis=0) if curves else np.zeros_like(_SHAPE_GRID)
