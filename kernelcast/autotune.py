"""Forecast-ranked config pruning for ``@triton.autotune``: time only the configs a forecaster ranks on top.

    from kernelcast.autotune import forecast_pruner

    @triton.autotune(configs=configs, key=["M", "N"],
                     prune_configs_by=forecast_pruner(op="softmax", top_k=0.3))
    @triton.jit
    def softmax_kernel(x_ptr, y_ptr, M, N, stride_x, stride_y, BLOCK_N: tl.constexpr, ROWS: tl.constexpr): ...

A config is read as a variant of the operation's template space (``kernels/ops/<op>.py``): its
meta-parameters are the axes of one of the op's algorithms (the one whose axes they name, or the
``algorithm`` given), ``num_warps`` and ``num_stages`` the template's axes of those names. Each
config is forecast by the learned forecaster, fit on the measured pool under ``data`` (every
operation's pairs on one GPU type) and then corrected, as a search corrects it, with every
measurement the pool holds of this operation (``kernelcast.surrogate.online.SearchSurrogate``): a config
that is a measured variant is forecast close to its measurement. A config that is no variant of
the space (a value off the template's grid, a meta-parameter it lacks) is forecast from its
source by the learned forecaster's source model, never dropped. Where the pool has no
measurement of the operation on that GPU type, the source forecaster (``kernelcast.surrogate.source``),
fit on the rest of the pool, forecasts every config.

The forecast is of the template's speed on the operation's own cases (the geometric mean over
them, the quantity the pool measures), not of the caller's shapes: a ranking of launch settings
for that operation and GPU type. Nothing is fit until Triton first asks (the first call of the
autotuned kernel); fits are kept for the life of the process.

Triton 3.x calls ``perf_model(**named_args, **kwargs, **config.all_kwargs())`` for each config and
keeps the ``top_k`` with the lowest estimates (``top_k`` an int, or a fraction of the configs that
Triton rounds down); ``early_config_prune(configs, named_args, **kwargs)`` runs first. Here it
forecasts the whole list in one batch, keeping every config, so that ``perf_model`` is a lookup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import Candidate
from kernelcast.kernels.spaces import get_space

# The measured pool shipped with the project.
PACKAGED_POOL = str(Path(__file__).resolve().parents[1] / "data" / "pools")
# Triton's launch settings that templates take as axes of the same name.
_LAUNCH_AXES = frozenset({"num_warps", "num_stages"})
# Triton's other config fields, at the values every template variant was measured with.
_TRITON_DEFAULTS = {"num_ctas": 1, "maxnreg": None, "ir_override": None}


@dataclass(frozen=True)
class ConfigForecast:
    """What the forecaster says of one config: the kernel it was read as, and its forecast."""

    candidate: Candidate
    known_variant: bool  # a variant of the template space (else forecast from its source)
    expected_speedup: float  # over the op's eager PyTorch reference
    estimated_us: float  # the reference's runtime / expected speedup; relative (1 = the reference) when unmeasured


class ForecastPruner:
    """``prune_configs_by`` for ``@triton.autotune``, ranked by a forecaster of kernelcast (see the module docstring)."""

    def __init__(self, op: str, data: str = PACKAGED_POOL, top_k: int | float = 0.25, gpu_type: str | None = None,
                 algorithm: str | None = None, source: str | None = None):
        self.space = get_space(op)  # an unknown op, or one without a template space, fails here by name
        self.op = op
        if algorithm is not None:
            self.space.algorithm(algorithm)  # names the known ones when it is not one
        if isinstance(top_k, bool) or not isinstance(top_k, (int, float)):
            raise TypeError(f"top_k is an int or a fraction, got {top_k!r}")
        if isinstance(top_k, int) and top_k < 1:
            raise ValueError(f"top_k as an int keeps that many configs and must be at least 1, got {top_k}")
        if isinstance(top_k, float) and not 0.0 < top_k <= 1.0:
            raise ValueError(f"top_k as a fraction of the configs lies in (0, 1], got {top_k}")
        self.top_k = top_k
        self.algorithm = algorithm
        self.source = source
        self.root, self.gpu_types = _open_pool(data)
        if gpu_type is not None and gpu_type not in self.gpu_types:
            raise ValueError(f"the pool at {data} has no measurements on {gpu_type!r}; "
                             f"it has: {', '.join(self.gpu_types)}")
        self.gpu_type = gpu_type or _default_gpu_type(self.gpu_types)
        self._variant_ids = {c.candidate_id for c in self.space.variants()}
        self._surrogate = None
        self._reference_us = math.nan
        self._cache: dict[tuple, ConfigForecast] = {}

    # ---- reading a config as a kernel ---------------------------------------------------------------

    def candidate(self, settings: Mapping[str, Any], exact: bool = True) -> tuple[Candidate, bool]:
        """(the kernel a config's settings name, whether it is a variant of the template space).

        ``settings`` is ``config.all_kwargs()`` (``exact``: its meta-parameters are the algorithm's
        axes, no more) or, from ``perf_model``, those merged with the kernel's arguments (the
        algorithm with the most axes all present)."""
        settings = {k: v for k, v in settings.items()
                    if not (k in _TRITON_DEFAULTS and v == _TRITON_DEFAULTS[k])}  # what every variant ran with
        algo = self._algorithm_of(settings, exact)
        if algo is not None and all(k in settings for k in algo.axes) and not (
                exact and set(settings) - set(algo.axes) - set(_TRITON_DEFAULTS) - _LAUNCH_AXES):
            extra = {k for k in settings if k in _TRITON_DEFAULTS}  # num_ctas 2, a register cap: not measured
            params = {axis: _like(settings[axis], algo.axes[axis]) for axis in algo.axes}
            variant = self.space.candidate(algo.name, params)
            if not extra and variant.candidate_id in self._variant_ids:
                return variant, True
        algo = algo or self._nearest_algorithm(settings)
        params = {k: v for k, v in settings.items() if isinstance(v, (int, float))}
        return Candidate(op=self.op, backend="triton", source=self.source or algo.source, params=params,
                         template=None, origin="import"), False

    def _algorithm_of(self, settings: Mapping[str, Any], exact: bool):
        if self.algorithm is not None:
            return self.space.algorithm(self.algorithm)
        meta = set(settings) - _LAUNCH_AXES - set(_TRITON_DEFAULTS)
        if exact:
            fits = [a for a in self.space.algorithms if set(a.axes) - _LAUNCH_AXES == meta]
        else:
            fits = [a for a in self.space.algorithms if set(a.axes) <= set(settings)]
            most = max((len(a.axes) for a in fits), default=0)
            fits = [a for a in fits if len(a.axes) == most]
        if len(fits) > 1:
            raise ValueError(f"a config with meta-parameters {sorted(meta)} fits {self.op}'s algorithms "
                             f"{', '.join(a.name for a in fits)} alike; name one: forecast_pruner(..., algorithm=...)")
        return fits[0] if fits else None

    def _nearest_algorithm(self, settings: Mapping[str, Any]):
        """The algorithm sharing the most meta-parameters with ``settings`` (the first on a tie)."""
        return max(self.space.algorithms, key=lambda a: len((set(a.axes) - _LAUNCH_AXES) & set(settings)))

    # ---- forecasting ----------------------------------------------------------------------------------

    def forecast(self, settings: Sequence[Mapping[str, Any]], exact: bool = True) -> list[ConfigForecast]:
        """One forecast per config's settings, in one batch (kept, so a config is forecast once)."""
        keys = [_key(s) for s in settings]
        todo = {k: s for k, s in zip(keys, settings) if k not in self._cache}
        if todo:
            read = [self.candidate(s, exact) for s in todo.values()]
            speedups = self._expected_speedups([c for c, _ in read])
            for key, (cand, known), speedup in zip(todo, read, speedups):
                scale = self._reference_us if self._reference_us == self._reference_us else 1.0
                self._cache[key] = ConfigForecast(cand, known, float(speedup), scale / float(speedup))
        return [self._cache[k] for k in keys]

    def _expected_speedups(self, candidates: Sequence[Candidate]) -> np.ndarray:
        # The median of the forecast's Gaussian over log speedup where it has one (corrected by the
        # op's measurements), else the forecast's own expected speedup.
        return np.array([math.exp(f.extra["log_speedup_mean"]) if "log_speedup_mean" in f.extra
                         else f.expected_speedup for f in self.surrogate().forecast(candidates)])

    def surrogate(self):
        """The forecaster of this op on this GPU type, fit (once per process) and corrected by the pool."""
        if self._surrogate is None:
            self._surrogate, self._reference_us = _corrected_surrogate(self.root, self.op, self.gpu_type)
        return self._surrogate

    # ---- Triton's hooks -----------------------------------------------------------------------------

    def perf_model(self, **kwargs: Any) -> float:
        """Triton's ``perf_model``: the estimated runtime of the config among ``kwargs`` (lower is better)."""
        best = None
        for key, forecast in self._cache.items():  # the configs early_config_prune read exactly
            if all(k in kwargs and _same(kwargs[k], v) for k, v in key) and (best is None or len(key) > best[0]):
                best = (len(key), forecast)
        if best is not None:
            return best[1].estimated_us
        return self.forecast([kwargs], exact=False)[0].estimated_us

    def early_config_prune(self, configs: Sequence, named_args: Mapping[str, Any], **kwargs: Any) -> list:
        """Triton's ``early_config_prune``: forecasts every config in one batch and keeps them all
        (Triton's ``perf_model`` pass then keeps the ``top_k``)."""
        configs = list(configs)
        keep = top_k_count(self.top_k, len(configs))
        if keep < 1:
            raise ValueError(f"top_k={self.top_k} of {len(configs)} configs keeps none (Triton rounds a fraction "
                             f"down); give an int or a fraction of at least {1 / len(configs):.3g}")
        self.forecast([c.all_kwargs() for c in configs])
        return configs

    def rank(self, configs: Sequence) -> list:
        """``configs`` (``triton.Config``s) by estimated runtime, fastest first, as Triton orders them."""
        estimates = self.forecast([c.all_kwargs() for c in configs])
        return [c for _, c in sorted(zip(estimates, configs), key=lambda pair: pair[0].estimated_us)]

    def prune(self, configs: Sequence, named_args: Mapping[str, Any] | None = None, **kwargs: Any) -> list:
        """What Triton's autotuner times of ``configs``: the ``top_k`` of them by estimated runtime."""
        configs = self.early_config_prune(configs, named_args or {}, **kwargs)
        keep = top_k_count(self.top_k, len(configs))
        return self.rank(configs)[:keep] if len(configs) > keep else configs

    def prune_configs_by(self) -> dict:
        return {"perf_model": self.perf_model, "top_k": self.top_k, "early_config_prune": self.early_config_prune}


def forecast_pruner(op: str, data: str = PACKAGED_POOL, top_k: int | float = 0.25, gpu_type: str | None = None,
                    algorithm: str | None = None, source: str | None = None) -> dict:
    """``prune_configs_by`` for ``@triton.autotune``: the ``top_k`` configs (an int, or a fraction of them)
    a forecaster of ``op``, fit on the measured pool ``data``, ranks fastest on ``gpu_type`` (the GPU
    this process sees when the pool measured it, else the pool's first GPU type). ``algorithm``: which
    of the op's template algorithms the kernel is, where its meta-parameters do not tell; ``source``:
    the kernel's own source, read for configs that are no template variant."""
    return ForecastPruner(op, data, top_k, gpu_type, algorithm, source).prune_configs_by()


def top_k_count(top_k: int | float, n: int) -> int:
    """How many of ``n`` configs Triton 3.x keeps for ``top_k``: a fraction rounds down, an int is a count."""
    return int(n * top_k) if isinstance(top_k, float) else top_k


# ---- the pool and the fitted forecasters --------------------------------------------------------------

_FITTED: dict[tuple, object] = {}  # (pool, its files, GPU type, held-out op or "") -> fitted forecaster


def _open_pool(data: str):
    """(the data root, its GPU types with measurements); a clear error where ``data`` holds no measured pool."""
    from kernelcast.storage.dataset import DataRoot

    if "://" not in data and not Path(data).is_dir():
        raise FileNotFoundError(f"no measured pool at {data!r}: not a folder (a pool has candidates/ and "
                                f"measurements/ tables; the project ships one at {PACKAGED_POOL})")
    root = DataRoot(data)
    if not root.fingerprint("measurements"):
        raise ValueError(f"{data!r} holds no measurements (a pool has candidates/ and measurements/ tables; "
                         f"the project ships one at {PACKAGED_POOL})")
    gpu_types = sorted(root.read_table("measurements", columns=["gpu_type"]).column("gpu_type").unique().to_pylist())
    return root, gpu_types


def _default_gpu_type(gpu_types: Sequence[str]) -> str:
    """The GPU this process sees where the pool measured it, else the pool's first GPU type."""
    try:
        import torch

        if torch.cuda.is_available():
            from kernelcast.kernels.hardware import gpu_type_of

            here = gpu_type_of(torch.cuda.get_device_name(0))
            if here in gpu_types:
                return here
    except ImportError:
        pass
    return gpu_types[0]


def _corrected_surrogate(root, op: str, gpu_type: str):
    """(a ``SearchSurrogate`` of ``op`` on ``gpu_type`` corrected by the pool's measurements of it,
    the reference's runtime in us: the geometric mean over the op's cases, NaN where unmeasured)."""
    from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
    from kernelcast.surrogate.dataset import case_pairs, hardware_of
    from kernelcast.surrogate.online import SearchSurrogate

    pairs = case_pairs(root, gpu_type=gpu_type)
    if pairs.empty:
        raise ValueError(f"{root.uri} has no measured pairs on {gpu_type} to fit a forecaster on")
    measured = measurements_from_frame(root.read_measurements(op=op, gpu_type=gpu_type))
    candidates = {c.candidate_id: c for c in candidates_from_frame(root.read_candidates(op=op))}
    seeds = [m for m in measured if m.status == "ok" and candidates.get(m.candidate_id, None) is not None
             and candidates[m.candidate_id].origin == "seed"]
    children = [m for m in measured if m.candidate_id in candidates and candidates[m.candidate_id].origin != "seed"]
    own = pairs["op"] == op
    hardware = hardware_of(pairs[own].iloc[0] if own.any() else pairs.iloc[0])
    if seeds and children:
        forecaster = _fitted(root, gpu_type, "", pairs, "learned")
        reference_us = tuple(seeds[0].runtime_us_median)
    else:  # no pool of this op here: the source forecaster, fit on the other operations
        forecaster = _fitted(root, gpu_type, op, pairs[~own], "source")
        reference_us = ()
    surrogate = SearchSurrogate(forecaster, op, hardware, reference_us)
    if seeds and children:
        forecasts = surrogate.forecast([candidates[m.candidate_id] for m in children])
        surrogate.update(candidates, forecasts, children)
    geomean = math.exp(float(np.mean(np.log(reference_us)))) if reference_us else math.nan
    return surrogate, geomean


def _fitted(root, gpu_type: str, held_out: str, pairs, kind: str):
    from threadpoolctl import threadpool_limits

    from kernelcast.surrogate.registry import fit_prior, get_forecaster_factory

    key = (root.uri, tuple(sorted(root.fingerprint("measurements"))), gpu_type, held_out, kind)
    if key not in _FITTED:
        if pairs.empty:
            raise ValueError(f"{root.uri} has no measured pairs on {gpu_type} besides {held_out} to fit on")
        # One OpenMP thread: gradient boosting's pool spins for its share of cores, and on a busy
        # machine (a GPU harness compiling beside it) that makes fitting many times slower.
        with threadpool_limits(limits=1, user_api="openmp"):
            _FITTED[key] = fit_prior(kind, get_forecaster_factory(kind)(), pairs)
    return _FITTED[key]


def _key(settings: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, v) for k, v in settings.items() if _hashable(v)))


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a tensor compared with a number
        return False


def _like(value, axis_values: Sequence[Any]):
    """``value`` as the axis spells its values (``True`` -> 1 where the axis holds ints)."""
    if isinstance(value, bool) and axis_values and isinstance(axis_values[0], int) and not isinstance(
            axis_values[0], bool):
        return int(value)
    return value
