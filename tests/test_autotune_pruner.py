"""kernelcast.autotune: a forecast-ranked ``prune_configs_by`` that Triton's own autotuner runs.

The pool here is a real one cut down: the shipped H100 measurements of four row operations, so
the learned forecaster fits in seconds. Under Triton's CPU interpreter the autotuner runs end to
end when given a benchmarker (it has no GPU driver to ask for one): a wall clock here.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from kernelcast.autotune import PACKAGED_POOL, ForecastPruner, forecast_pruner, top_k_count
from kernelcast.kernels.spaces import get_space
from kernelcast.storage.dataset import DataRoot
from kernelcast.storage.schema import measurements_from_frame
from kernelcast.storage.sources import share_sources

ROW_OPS = ("softmax", "layernorm", "rmsnorm", "row_sum")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _pool(dst: Path, ops) -> str:
    for op in ops:
        shutil.copytree(Path(PACKAGED_POOL) / "candidates" / f"op={op}", dst / "candidates" / f"op={op}")
        shutil.copytree(Path(PACKAGED_POOL) / "measurements" / f"op={op}" / "gpu_type=h100",
                        dst / "measurements" / f"op={op}" / "gpu_type=h100")
    share_sources(DataRoot(str(dst)), DataRoot(PACKAGED_POOL))  # the copied rows' sources stay in the pool's table
    return str(dst)


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> str:
    return _pool(tmp_path_factory.mktemp("pool"), ROW_OPS)


def configs_of(op: str, algorithm: str) -> list[tuple[str, triton.Config]]:
    """(candidate id, config) for every variant of one template algorithm, as a user writes them."""
    out = []
    for v in get_space(op).variants():
        if v.template == f"{op}/{algorithm}":
            meta = {k: x for k, x in v.params.items() if k not in ("num_warps", "num_stages")}
            out.append((v.candidate_id, triton.Config(meta, num_warps=v.params["num_warps"],
                                                      num_stages=v.params["num_stages"])))
    return out


def measured_speedups(pool: str, op: str) -> dict[str, float]:
    ms = measurements_from_frame(DataRoot(pool).read_measurements(op=op, gpu_type="h100"))
    return {m.candidate_id: m.speedup for m in ms if m.status == "ok" and m.speedup}


# ---- Triton's autotuner runs the pruner ------------------------------------------------------------

@triton.jit
def _softmax_two_pass(x_ptr, y_ptr, M, N, stride_x, stride_y, BLOCK_N: tl.constexpr, PERSISTENT: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    for row in range(pid, M, nprog):
        x_row = x_ptr + row * stride_x
        m = tl.full([BLOCK_N], -float("inf"), tl.float32)
        for start in range(0, N, BLOCK_N):
            offs = start + cols
            m = tl.maximum(m, tl.load(x_row + offs, mask=offs < N, other=-float("inf")).to(tl.float32))
        row_max = tl.max(m, axis=0)
        s = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, N, BLOCK_N):
            offs = start + cols
            s += tl.exp(tl.load(x_row + offs, mask=offs < N, other=-float("inf")).to(tl.float32) - row_max)
        inv = 1.0 / tl.sum(s, axis=0)
        for start in range(0, N, BLOCK_N):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < N, other=-float("inf")).to(tl.float32)
            tl.store(y_ptr + row * stride_y + offs, tl.exp(x - row_max) * inv, mask=offs < N)


def wall_clock(kernel_call, quantiles):
    """A benchmarker for the interpreter, which has no GPU driver to lend Triton one: one call, timed."""
    t0 = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - t0) * 1e3
    return [ms] * len(quantiles)


def test_triton_autotuner_times_only_the_top_k_configs_the_forecaster_ranks_fastest(pool):
    configs = [c for _, c in configs_of("softmax", "two_pass")]
    prune = forecast_pruner(op="softmax", data=pool, top_k=0.25)
    kernel = triton.autotune(configs=configs, key=["M", "N"], prune_configs_by=prune,
                             do_bench=wall_clock)(_softmax_two_pass)
    x = torch.randn(3, 40, device=DEVICE)
    y = torch.empty_like(x)
    kernel[lambda meta: (2 if meta["PERSISTENT"] else 3,)](x, y, 3, 40, x.stride(0), y.stride(0))

    assert torch.allclose(y, torch.softmax(x, dim=-1), atol=1e-5)
    timed = set(kernel.configs_timings)
    ranker = prune["perf_model"].__self__
    assert len(timed) == int(len(configs) * 0.25) == 12
    assert timed == set(ranker.rank(configs)[:12])
    assert kernel.best_config in timed


# ---- the ranking -------------------------------------------------------------------------------------

def test_the_pools_best_measured_variant_ranks_first_when_the_forecast_says_so(pool):
    pairs = configs_of("softmax", "two_pass")
    measured = measured_speedups(pool, "softmax")
    best_id = max((cid for cid, _ in pairs), key=lambda cid: measured[cid])
    ranked = ForecastPruner("softmax", pool, top_k=1).rank([c for _, c in pairs])
    by_config = {id(c): cid for cid, c in pairs}
    assert by_config[id(ranked[0])] == best_id


@pytest.mark.parametrize("op", ["softmax", "layernorm"])
def test_every_algorithms_best_measured_variant_is_in_the_top_quarter(pool, op):
    measured = measured_speedups(pool, op)
    for algorithm in (a.name for a in get_space(op).algorithms):
        pairs = configs_of(op, algorithm)
        pruner = ForecastPruner(op, pool, top_k=0.25, algorithm=algorithm)
        kept = pruner.prune([c for _, c in pairs])
        by_config = {id(c): cid for cid, c in pairs}
        best = max(measured[cid] for cid, _ in pairs)
        assert len(kept) == int(len(pairs) * 0.25)
        assert max(measured[by_config[id(c)]] for c in kept) == best, algorithm


def test_top_k_is_a_count_or_a_fraction_rounded_down_as_triton_does(pool):
    configs = [c for _, c in configs_of("softmax", "two_pass")]
    assert len(ForecastPruner("softmax", pool, top_k=5).prune(configs)) == 5
    assert len(ForecastPruner("softmax", pool, top_k=0.3).prune(configs)) == top_k_count(0.3, 48) == 14
    assert len(ForecastPruner("softmax", pool, top_k=100).prune(configs)) == 48


def test_perf_model_takes_named_args_and_config_kwargs_as_triton_passes_them(pool):
    configs = [c for _, c in configs_of("softmax", "online")]
    x = torch.randn(2, 8)
    named = {"x_ptr": x, "y_ptr": x, "M": 2, "N": 8, "stride_x": 8, "stride_y": 8}
    warm = ForecastPruner("softmax", pool)
    warm.early_config_prune(configs, named)
    cold = ForecastPruner("softmax", pool)  # perf_model alone: the config read from the merged kwargs
    estimates = []
    for config in configs:
        kwargs = {**named, "grid": (2,), "warmup": False, **config.all_kwargs()}
        assert warm.perf_model(**kwargs) == pytest.approx(cold.perf_model(**kwargs))
        estimates.append(warm.perf_model(**kwargs))
    kept = warm.prune(configs)
    cut = sorted(estimates)[len(kept) - 1]
    assert all(warm.perf_model(**named, **c.all_kwargs()) <= cut for c in kept)
    assert len(set(estimates)) > len(configs) // 2  # a ranking, not a constant


def test_configs_off_the_template_grid_are_forecast_from_source_and_never_dropped(pool):
    on_grid = [c for _, c in configs_of("softmax", "online")][:6]
    off_grid = [triton.Config({"BLOCK_N": 8192, "ROWS": 1, "PERSISTENT": 0}, num_warps=4, num_stages=1),
                triton.Config({"BLOCK_N": 1024, "ROWS": 1, "PERSISTENT": 0}, num_warps=4, num_stages=1, num_ctas=2),
                triton.Config({"BLOCK_N": 1024, "ROWS": 1, "PERSISTENT": 0, "EVEN_N": 1}, num_warps=4)]
    pruner = ForecastPruner("softmax", pool, top_k=len(on_grid) + len(off_grid), algorithm="online")
    forecasts = pruner.forecast([c.all_kwargs() for c in on_grid + off_grid])
    assert [f.known_variant for f in forecasts] == [True] * 6 + [False] * 3
    assert all(f.candidate.template is None and f.candidate.params["BLOCK_N"] in (8192, 1024)
               for f in forecasts[6:])
    assert all(0 < f.estimated_us < float("inf") for f in forecasts)
    assert set(pruner.prune(on_grid + off_grid)) == set(on_grid + off_grid)


def test_an_op_without_a_pool_is_ranked_by_the_source_forecaster(tmp_path):
    others = _pool(tmp_path / "pool", ("layernorm", "rmsnorm", "row_sum"))
    pruner = ForecastPruner("softmax", others, top_k=4)
    configs = [c for _, c in configs_of("softmax", "two_pass")]
    kept = pruner.prune(configs)
    assert pruner.surrogate().forecaster.name == "source"
    assert len(kept) == 4
    forecasts = pruner.forecast([c.all_kwargs() for c in configs])
    assert all(f.known_variant for f in forecasts)
    # no measured reference for softmax here: estimates are relative to it (1 / speedup)
    assert all(f.estimated_us == pytest.approx(1 / f.expected_speedup) for f in forecasts)


# ---- errors name the thing ---------------------------------------------------------------------------

def test_an_unknown_op_is_named_with_the_known_ones(pool):
    with pytest.raises(ValueError, match=r"unknown operation 'sofmax'.*softmax"):
        forecast_pruner(op="sofmax", data=pool)


def test_a_missing_or_empty_pool_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no measured pool at .*nowhere"):
        forecast_pruner(op="softmax", data=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="holds no measurements"):
        forecast_pruner(op="softmax", data=str(tmp_path))


def test_bad_settings_are_named(pool):
    with pytest.raises(ValueError, match="no measurements on 'a100'; it has: h100"):
        forecast_pruner(op="softmax", data=pool, gpu_type="a100")
    with pytest.raises(ValueError, match="no algorithm 'nope'; known: single_tile, online, two_pass"):
        forecast_pruner(op="softmax", data=pool, algorithm="nope")
    for bad in (0, 1.5, 0.0):
        with pytest.raises(ValueError, match="top_k"):
            forecast_pruner(op="softmax", data=pool, top_k=bad)
    with pytest.raises(TypeError, match="top_k"):
        forecast_pruner(op="softmax", data=pool, top_k="all")


def test_a_fraction_that_keeps_no_config_fails_before_any_timing(pool):
    prune = forecast_pruner(op="softmax", data=pool, top_k=0.1)
    with pytest.raises(ValueError, match="keeps none"):
        prune["early_config_prune"]([c for _, c in configs_of("softmax", "two_pass")][:5], {})


def test_a_config_that_fits_several_algorithms_asks_for_one():
    flash = next(a for a in get_space("attention").algorithms if a.name == "flash")
    meta = {axis: values[0] for axis, values in flash.axes.items() if axis not in ("num_warps", "num_stages")}
    config = triton.Config(meta, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match="fits attention's algorithms flash, block_ptr, tma alike; name one"):
        ForecastPruner("attention", PACKAGED_POOL).candidate(config.all_kwargs())
    cand, _ = ForecastPruner("attention", PACKAGED_POOL, algorithm="tma").candidate(config.all_kwargs())
    assert cand.template in ("attention/tma", None)
