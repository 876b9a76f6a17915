"""A forecaster that reads a kernel's source: will it fail, and if it runs, how fast against its anchor.

The learned forecaster's parameter model knows template variants by their launch parameters;
a kernel a language model rewrote is known only by its text. ``SourceFeatures`` turns any
source into named floats without a GPU, in about a millisecond, whether it parses or not:

- its text: whether it parses, its size (characters, lines, tokens, syntax-tree nodes), its
  functions and how many are ``@triton.jit``;
- the Triton operations it calls, by kind (loads, stores, dots, reductions, atomics, ...);
- the constants and launch settings as written (the largest ``BLOCK*`` constant, ``num_warps``,
  ``num_stages``);
- what dies before timing: a name read but never bound (``kernelcast.kernels.screen.undefined_name``), a
  ``tl.`` attribute the installed Triton lacks, a ``f[grid](...)`` launch of a function without
  ``@triton.jit``, a ``@triton.jit`` function called from host code, no ``launch``;
- what computes other numbers than the reference: tensors made with the legacy ``torch.Tensor(...)``
  constructors, which ignore the default device (a model built on the GPU from a seeded generator gets
  such parameters from the CPU's generator, so its weights are not the reference's), and parameters
  initialised by hand (``nn.init.*_``) in place of the reference's modules;
- what changed against the anchor: the token edit ratio, whether it is the anchor again up to
  formatting (normalised syntax trees), numeric constants and calls added or removed, the
  change in block size and warps;
- the context the learned forecaster reads (``kernelcast.surrogate.features``: launch parameters, the
  case's bytes and FLOPs on the GPU, the anchor's measured runtime) and the anchor's measured
  speedup over the op's reference.

``SourceForecaster`` fits two gradient-boosted models on them. A classifier of failure (any
status but ok), Platt-calibrated on out-of-fold scores with whole operations held out, so its
probabilities are as sure as it is on an operation it has not seen. A regression of log speedup
against the anchor on the kernels that ran (optionally stacked with a regression of the same less its
operation's mean, what orders the kernels of one operation free of how operations differ, the two
weighed by a least-squares fit on their out-of-fold forecasts); its spread comes from a model of its
out-of-fold absolute residuals; the Gaussian is mapped onto the 8 bins by ``kernelcast.surrogate.learned``'s
``bin_probabilities``. Every forecast carries the failure probability.
"""

from __future__ import annotations

import ast
import difflib
import math
import re
import time
from collections import Counter
from functools import lru_cache
from typing import Sequence

import numpy as np
import pandas as pd
from scipy.special import logit
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.model_selection import GroupKFold

from kernelcast.kernels.facts import DEFAULT_CACHE_DIR
from kernelcast.kernels.screen import fingerprint, undefined_name

# Both parse the source; an anchor is the anchor of many kernels, so each source is parsed once.
_fingerprint = lru_cache(maxsize=8192)(fingerprint)
_undefined = lru_cache(maxsize=8192)(undefined_name)
from kernelcast.surrogate.features import FEATURE_NAMES, feature_matrix
from kernelcast.surrogate.forecast import Forecast, ForecastRequest, gaussian_forecasts

# Triton calls by kind, counted on the text so that a kernel that does not parse has them too.
_TL_CALLS = {
    "tl_load": r"load", "tl_store": r"store", "tl_dot": r"dot(?:_scaled)?",
    "tl_reduce": r"(?:sum|max|min|argmax|argmin|reduce|xor_sum)", "tl_scan": r"(?:cumsum|cumprod|associative_scan)",
    "tl_atomic": r"atomic_\w+", "tl_where": r"where",
    "tl_math": r"(?:math\.)?(?:exp2?|log2?|sqrt(?:_rn)?|rsqrt|erf|tanh|sigmoid|fma|fdiv|div_rn|abs|cos|sin)",
    "tl_arange": r"arange", "tl_program_id": r"(?:program_id|num_programs)",
    "tl_block_ptr": r"(?:make_block_ptr|advance)",
    "tl_descriptor": r"(?:make_tensor_descriptor|load_tensor_descriptor)",
    "tl_range": r"(?:range|static_range)", "tl_hint": r"(?:multiple_of|max_contiguous|assume)",
    "tl_shape": r"(?:reshape|view|trans|permute|broadcast_to|expand_dims|join|split)",
    "tl_alloc": r"(?:zeros|full|zeros_like|full_like)",
}
_TL_REGEXES = tuple(re.compile(rf"\btl\.{pattern}\s*\(") for pattern in _TL_CALLS.values())
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\S")
_NUMBER = re.compile(r"\d")
_COMMENT = re.compile(r"#[^\n]*")
_CALL = re.compile(r"(?<!def )(?<![\w.])([A-Za-z_][\w.]*)\s*\(")
_TL_ATTRIBUTE = re.compile(r"\b(?:tl|triton\.language)\.(\w+)(?:\.(\w+))?")
_SETTINGS = {"block": re.compile(r"\bBLOCK\w*\s*(?::\s*tl\.constexpr\s*)?=\s*(\d+)"),
             "warps": re.compile(r"\bnum_warps\s*=\s*(\d+)"), "stages": re.compile(r"\bnum_stages\s*=\s*(\d+)")}
_JIT = {"jit", "autotune", "heuristics"}
# torch.Tensor(2, 3) is made on the CPU even under `with torch.device("cuda")`, unlike torch.empty: on the
# re-measured CUDA-L1 pool's development problems (2026-11-29) 16 of the 17 kernels that call it failed, 15 of them
# with other weights than the reference's, one mixing CPU and GPU tensors
_LEGACY_TENSOR = re.compile(r"\btorch\.(?:Float|Double|Half|BFloat16|Long|Int|Short|Byte|Bool)?Tensor\(")
# nn.init.kaiming_uniform_(w, ...): a module's initialisation written out again (16 of those 45 kernels failed, 0
# of the 28 others that initialise by hand)
_HAND_INIT = re.compile(r"\binit\.\w+_\(")

CODE_FEATURES = (
    "parses", "log_chars", "n_lines", "n_tokens", "n_ast_nodes", "n_functions", "n_jit", "n_loop_nodes",
    *_TL_CALLS, "n_masks", "n_casts", "n_torch_calls",
    "log2_block_written", "log2_warps_written", "log2_stages_written",
    "undefined_name", "missing_tl_attributes", "unjitted_launches", "jit_called_from_host", "has_launch",
    "legacy_tensor_constructors", "hand_initialised",
)
CHANGE_FEATURES = (
    "token_edit_ratio", "same_as_anchor", "log_length_ratio", "constants_changed",
    "calls_added", "calls_removed", "block_change", "warps_change", "anchor_undefined_name",
)
SOURCE_FEATURE_NAMES = FEATURE_NAMES + ("log_anchor_speedup",) + CODE_FEATURES + CHANGE_FEATURES
_MIN_SIGMA = 0.03
_MIN_RAN = 5  # the learned forecaster fits on as few as 7 candidates (20 per-case pairs)
# An absent feature (NaN) as a value below every real one: features here may be negative, and a
# column that is absent for a whole training fold must still bin (scikit-learn cannot bin all-NaN).
_ABSENT = -1e9


@lru_cache(maxsize=1)
def _triton_language():
    """The installed ``triton.language``, or None where Triton is not installed."""
    try:
        import triton.language as tl
    except ImportError:
        return None
    return tl


@lru_cache(maxsize=4096)
def _missing_attribute(name: str, sub: str) -> bool:
    tl = _triton_language()
    if not hasattr(tl, name):
        return True
    inner = getattr(tl, name)
    # tl.math.erf: a module's member is checked too; tl.float32.x is an attribute of a value, not a module's
    return bool(sub) and isinstance(inner, type(tl)) and not hasattr(inner, sub)


def _missing_tl_attributes(source: str) -> float:
    if _triton_language() is None:
        return math.nan
    return float(sum(_missing_attribute(name, sub or "") for name, sub in set(_TL_ATTRIBUTE.findall(source))))


def _tokens(source: str) -> list[str]:
    """Tokens of the text without comments: names, numbers and single symbols (no parsing needed)."""
    return _TOKEN.findall(_COMMENT.sub("", source))


def _written(source: str, setting: str) -> float:
    values = [int(v) for v in _SETTINGS[setting].findall(source)]
    return math.log2(max(values)) if values and max(values) > 0 else math.nan


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in _JIT:
            return True
    return False


def _structure(tree: ast.Module) -> tuple[float, ...]:
    """(nodes, functions, jit functions, loops, launches of non-jit functions, jit functions called
    from host code, defines launch) of a parsed module."""
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    jit = {f.name for f in functions if _is_jit(f)}
    host = [f for f in functions if f.name not in jit]
    plain = {f.name for f in host}
    unjitted = jit_from_host = 0
    for fn in host:
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Subscript) and getattr(node.func.value, "id", None) in plain:
                unjitted += 1  # f[grid](...) where f is a plain Python function
            elif getattr(node.func, "id", None) in jit:
                jit_from_host += 1  # a @triton.jit function called like a Python one
    nodes = sum(1 for _ in ast.walk(tree))
    loops = sum(isinstance(n, (ast.For, ast.While)) for n in ast.walk(tree))
    launch = any(isinstance(n, ast.FunctionDef) and n.name == "launch" for n in tree.body)
    return (float(nodes), float(len(functions)), float(len(jit)), float(loops), float(unjitted),
            float(jit_from_host), 1.0 if launch else 0.0)


@lru_cache(maxsize=8192)
def code_features(source: str) -> tuple[float, ...]:
    """CODE_FEATURES of one source; a source that does not parse gets NaN for what needs its tree."""
    code = _COMMENT.sub("", source)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: null bytes
        tree = None
    nodes, functions, jit, loops, unjitted, from_host, launch = (
        _structure(tree) if tree is not None else
        (math.nan, math.nan, float(len(re.findall(r"@triton\.(?:jit|autotune)", source))),
         float(len(re.findall(r"\b(?:for|while)\b", source))), math.nan, math.nan,
         1.0 if re.search(r"^def launch\b", source, re.M) else 0.0))
    return (
        1.0 if tree is not None else 0.0, math.log(len(source) + 1), float(source.count("\n") + 1),
        float(len(_tokens(source))), nodes, functions, jit, loops,
        *(float(len(rx.findall(source))) for rx in _TL_REGEXES),
        float(source.count("mask=")), float(source.count(".to(")), float(len(re.findall(r"\btorch\.\w", source))),
        _written(source, "block"), _written(source, "warps"), _written(source, "stages"),
        1.0 if tree is not None and _undefined(source) else 0.0, _missing_tl_attributes(source),
        unjitted, from_host, launch,
        float(len(_LEGACY_TENSOR.findall(code))), float(len(_HAND_INIT.findall(code))),
    )


_BLOCK, _WARPS = CODE_FEATURES.index("log2_block_written"), CODE_FEATURES.index("log2_warps_written")


@lru_cache(maxsize=8192)
def change_features(source: str, anchor_source: str) -> tuple[float, ...]:
    """CHANGE_FEATURES of ``source`` against its anchor's source."""
    mine, theirs = _tokens(source), _tokens(anchor_source)
    # autojunk off: in a kernel the common tokens (parentheses, "tl") are the structure itself
    edit = 1.0 - difflib.SequenceMatcher(None, mine, theirs, autojunk=False).ratio()
    same = _fingerprint(source)
    constants = Counter(t for t in mine if _NUMBER.match(t))
    constants.subtract(t for t in theirs if _NUMBER.match(t))
    calls = Counter(_CALL.findall(_COMMENT.sub("", source)))
    calls.subtract(_CALL.findall(_COMMENT.sub("", anchor_source)))
    a, b = code_features(source), code_features(anchor_source)
    return (
        edit, 1.0 if same is not None and same == _fingerprint(anchor_source) else 0.0,
        math.log((len(source) + 1) / (len(anchor_source) + 1)),
        float(sum(abs(v) for v in constants.values())),
        float(sum(v for v in calls.values() if v > 0)), float(-sum(v for v in calls.values() if v < 0)),
        a[_BLOCK] - b[_BLOCK], a[_WARPS] - b[_WARPS],
        1.0 if _undefined(anchor_source) else 0.0,
    )


class SourceFeatures:
    """The source forecaster's feature map: one row of SOURCE_FEATURE_NAMES per forecast request."""

    names = SOURCE_FEATURE_NAMES

    def matrix(self, requests: Sequence[ForecastRequest], base: np.ndarray | None = None) -> np.ndarray:
        """(n, len(names)) features of ``requests``; ``base``, their ``kernelcast.surrogate.features.feature_matrix``
        when the caller has it (the learned forecaster), so it is not computed twice."""
        if not requests:
            return np.empty((0, len(self.names)))
        base = feature_matrix(list(requests)) if base is None else base
        # the reference is as fast as itself
        anchor = np.array([1.0 if r.anchor.origin == "seed" else r.anchor_speedup for r in requests], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_anchor = np.where(anchor > 0, np.log(anchor), np.nan)
        code = np.array([code_features(r.candidate.source) for r in requests], dtype=float)
        change = np.array([change_features(r.candidate.source, r.anchor.source) for r in requests], dtype=float)
        return np.hstack([base, log_anchor[:, None], code, change])


def _group_folds(groups: np.ndarray, folds: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index pairs holding out whole groups (operations)."""
    k = min(folds, len(set(groups)))
    if k < 2:
        raise ValueError(f"out-of-fold fitting needs two or more groups, got {sorted(set(groups))}")
    return list(GroupKFold(n_splits=k).split(np.zeros(len(groups)), groups=groups))


class SourceForecaster:
    """Failure probability and speed against the anchor, read from the kernel's source (see the module
    docstring). ``fit`` takes rows of ``kernelcast.surrogate.dataset.source_pairs`` (or ``case_pairs``)."""

    name = "source"

    def __init__(self, max_iter: int = 200, learning_rate: float = 0.05, max_leaf_nodes: int = 15,
                 folds: int = 5, random_state: int = 0, speed_loss: str = "squared_error", stack_centred: bool = False,
                 embeddings=None, facts: bool = False, facts_cache: str | None = DEFAULT_CACHE_DIR):
        if speed_loss not in ("squared_error", "absolute_error"):
            raise ValueError(f"speed_loss must be 'squared_error' or 'absolute_error', got {speed_loss!r}")
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.folds = folds
        self.random_state = random_state
        # the loss of the speed regressions (scikit-learn's name): absolute_error learns the median log speedup
        self.speed_loss = speed_loss
        # stack_centred: a second regression learns the kernel's log speedup less its operation's mean (what
        # orders the kernels of one operation, free of how fast operations differ), and the two forecasts are
        # weighed, with an offset, by least squares on their out-of-fold forecasts (operations held out). On by
        # default in the learned forecaster's source part (learned.SOURCE_OPTIONS), which forecasts imported and
        # written kernels; off here: held out by operation on the template and written-kernel pools it lowered
        # this forecaster's Spearman from 0.60 to 0.50 on the template variants (benchmarks/source_forecasters.py)
        self.stack_centred = stack_centred
        # embeddings: a kernelcast.surrogate.embeddings.PairEmbeddings, whose projection (fit on the training kernels) adds
        # a code language model's reading of each pair to the features
        self.embeddings = embeddings
        # facts: what each kernel makes the device do and its time by the GPU model (``kernelcast.surrogate.physics.
        # facts_matrix``: bytes, FLOPs, launches, registers, occupancy, the bound, a compile error), found on the CPU
        # in child processes and kept in ``facts_cache`` (None: in memory only), among the features
        self.facts = facts
        self.facts_cache = facts_cache

    @property
    def version(self) -> str:
        stacked = "-stacked" if getattr(self, "stack_centred", False) else ""
        loss = "-median" if getattr(self, "speed_loss", "squared_error") == "absolute_error" else ""
        emb = f"-{self.embeddings.version}" if getattr(self, "embeddings", None) is not None else ""
        emb += "-facts" if getattr(self, "facts", False) else ""
        return f"hgb-source{stacked}{loss}{emb}-{self.max_iter}-{self.learning_rate}-{getattr(self, 'n_train_', 0)}"

    def _features(self, requests: Sequence[ForecastRequest], base: np.ndarray | None = None) -> np.ndarray:
        """The source features of ``requests``, with the fitted embeddings' columns when there are any."""
        X = SourceFeatures().matrix(list(requests), base)
        fitted = getattr(self, "embeddings_", None)
        if fitted is not None:
            X = np.hstack([X, fitted.matrix(list(requests))])
        if getattr(self, "facts", False):
            from kernelcast.surrogate.physics import facts_matrix

            X = np.hstack([X, facts_matrix(list(requests), True, self.facts_cache)])
        return _encode(X)

    def _params(self) -> dict:
        return dict(max_iter=self.max_iter, learning_rate=self.learning_rate, max_leaf_nodes=self.max_leaf_nodes,
                    random_state=self.random_state)

    def fit(self, pairs: pd.DataFrame) -> "SourceForecaster":
        """Fit on ``source_pairs`` rows (failed kernels included); ``case_pairs`` rows are taken one
        per candidate (``by_candidate``)."""
        from kernelcast.surrogate.dataset import by_candidate, source_requests

        if pairs is not None and "anchor_source" not in pairs.columns:
            pairs = by_candidate(pairs)
        if pairs is None or len(pairs) == 0:
            raise ValueError("the source forecaster needs measured kernels to fit on, got none")
        failed = (pairs["status"] != "ok").to_numpy()
        speedup = pairs["speedup"].to_numpy(dtype=float)
        ran = ~failed & (speedup > 0)
        if ran.sum() < _MIN_RAN:
            raise ValueError(f"the source forecaster needs at least {_MIN_RAN} measured kernels that ran, "
                             f"got {int(ran.sum())}")
        requests = source_requests(pairs)
        self.embeddings_ = self.embeddings.fit(requests) if getattr(self, "embeddings", None) is not None else None
        X = self._features(requests)
        ops = pairs["op"].to_numpy()
        groups = ops if len(set(ops)) >= 2 else pairs["candidate_id"].to_numpy()
        self._fit_failure(X, failed, groups)
        self._fit_speed(X[ran], np.log(speedup[ran]), groups[ran])
        self.n_train_ = len(pairs)
        return self

    def _fit_failure(self, X: np.ndarray, failed: np.ndarray, groups: np.ndarray) -> None:
        """The failure classifier and its Platt map, fit on out-of-fold scores held out by group."""
        self.failure_rate_ = float(failed.mean())
        if failed.all() or not failed.any():  # nothing to tell apart: every kernel gets the (smoothed) rate
            self.failure_model_ = None
            self.failure_rate_ = (failed.sum() + 1) / (len(failed) + 2)
            return
        oof = np.full(len(failed), self.failure_rate_)
        for train, test in _group_folds(groups, self.folds):
            if failed[train].all() or not failed[train].any():
                continue  # a fold that saw one outcome only keeps the base rate
            model = HistGradientBoostingClassifier(**self._params()).fit(X[train], failed[train])
            oof[test] = model.predict_proba(X[test])[:, 1]
        self.platt_ = LogisticRegression(C=1e4).fit(_logit(oof)[:, None], failed)
        self.failure_model_ = HistGradientBoostingClassifier(**self._params()).fit(X, failed)

    def _fit_speed(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray) -> None:
        """The log-speedup regression (with ``stack_centred``, stacked with the within-operation one), and the
        spread model on the out-of-fold absolute residuals of their forecast."""
        centred = y - pd.Series(y).groupby(groups).transform("mean").to_numpy()
        oof, oof_centred = np.zeros_like(y), np.zeros_like(y)
        stacked = self.stack_centred and len(set(groups)) >= 2
        if len(set(groups)) >= 2:
            for train, test in _group_folds(groups, self.folds):
                oof[test] = self._regressor().fit(X[train], y[train]).predict(X[test])
                if stacked:
                    oof_centred[test] = self._regressor().fit(X[train], centred[train]).predict(X[test])
        else:
            oof[:] = np.median(y)
        self.speed_model_ = self._regressor().fit(X, y)
        self.centred_model_ = self._regressor().fit(X, centred) if stacked else None
        # mean = a + b * absolute + c * centred: the least squares fit of the log speedup on the two out-of-fold
        # forecasts; (0, 1, 0) unstacked
        self.blend_ = (0.0, 1.0, 0.0)
        if stacked:
            stack = LinearRegression().fit(np.column_stack([oof, oof_centred]), y)
            self.blend_ = (float(stack.intercept_), float(stack.coef_[0]), float(stack.coef_[1]))
        a, b, c = self.blend_
        oof = a + b * oof + c * oof_centred
        # |residual| * sqrt(pi/2) is, in expectation, the sigma of a Gaussian residual
        self.spread_model_ = HistGradientBoostingRegressor(**self._params()).fit(
            X, np.abs(y - oof) * math.sqrt(math.pi / 2))

    def _regressor(self) -> HistGradientBoostingRegressor:
        return HistGradientBoostingRegressor(**self._params(), loss=self.speed_loss)

    def _mean(self, X: np.ndarray) -> np.ndarray:
        mu = self.speed_model_.predict(X)
        if getattr(self, "centred_model_", None) is not None:  # a model fit before the stack has none
            a, b, c = self.blend_
            mu = a + b * mu + c * self.centred_model_.predict(X)
        return mu

    def predict_failure(self, requests: Sequence[ForecastRequest], base: np.ndarray | None = None) -> np.ndarray:
        """P(the kernel fails) per request (``base``: as in ``SourceFeatures.matrix``)."""
        return self._predict(requests, base, speed=False)[0]

    def predict(self, requests: Sequence[ForecastRequest],
                base: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(failure probability, mean, spread of log speedup against the anchor) per request."""
        return self._predict(requests, base, speed=True)

    def _predict(self, requests: Sequence[ForecastRequest], base: np.ndarray | None,
                 speed: bool) -> tuple[np.ndarray, ...]:
        if not hasattr(self, "speed_model_"):
            raise RuntimeError("SourceForecaster used before fit")
        if not requests:
            return np.empty(0), np.empty(0), np.empty(0)
        facts = getattr(self, "facts", False)
        if not speed and self.failure_model_ is None and not facts:  # nothing (or everything) failed: no features
            return (np.full(len(requests), self.failure_rate_),)
        X = self._features(requests, base)
        if self.failure_model_ is None:
            p_fail = np.full(len(X), self.failure_rate_)
        else:
            p_fail = self.platt_.predict_proba(_logit(self.failure_model_.predict_proba(X)[:, 1])[:, None])[:, 1]
        if facts:  # a kernel that does not compile for the target fails: a compiler's verdict, not a pattern to learn
            # (the pools hold no such kernel to learn it from: none of CUDA-L1's measured kernels has a compile error)
            # and one that breaks a rule the harness judges by fails its check (``physics.RULE_FACTS``)
            from kernelcast.surrogate.physics import COMPILE_FAILURE, LEARNED_FACT_FEATURES, RULE_FACTS, RULE_FAILURE

            first = X.shape[1] - len(LEARNED_FACT_FEATURES)
            column = first + LEARNED_FACT_FEATURES.index("compile_error")
            p_fail = np.where(X[:, column] == 1.0, np.maximum(p_fail, COMPILE_FAILURE), p_fail)
            rules = [first + LEARNED_FACT_FEATURES.index(r) for r in RULE_FACTS]
            p_fail = np.where((X[:, rules] == 1.0).any(axis=1), np.maximum(p_fail, RULE_FAILURE), p_fail)
        if not speed:
            return (p_fail,)
        sigma = np.maximum(self.spread_model_.predict(X), _MIN_SIGMA)
        return p_fail, self._mean(X), sigma

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        if not requests:
            return []
        t0 = time.perf_counter()
        p_fail, mu, sigma = self.predict(requests)
        return gaussian_forecasts(requests, self.name, self.version, p_fail, mu, sigma, t0)


def _encode(X: np.ndarray) -> np.ndarray:
    return np.nan_to_num(X, nan=_ABSENT)


def _logit(p: np.ndarray) -> np.ndarray:
    return logit(np.clip(p, 1e-6, 1 - 1e-6))
