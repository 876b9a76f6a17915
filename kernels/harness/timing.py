"""GPU timing of one callable: CUDA events, L2 flushed before each repetition, adaptive repetitions.

Each repetition flushes the L2 cache (zeroing a buffer several times its size), then
records a start event, makes one call and records an end event; nothing else sits
inside the window. Inputs are prepared before timing and rotated between several
sets, so a call never finds its operands (or a cached result) from the previous one.
Repetitions continue in rounds until the median is pinned down: the half-width of
its 95% notch, 1.57 * IQR / sqrt(n), falls under ``target_notch`` of the median.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    runtime_us_median: float
    runtime_us_iqr: float  # interquartile range of the per-repetition runtimes
    repetitions: int


def l2_flush_buffer(device=None) -> torch.Tensor:
    """A buffer four times the L2 (at least 256 MiB) whose zeroing evicts everything cached."""
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    size = max(256 * 2**20, 4 * getattr(props, "L2_cache_size", 0))
    return torch.empty(size, dtype=torch.int8, device=device or "cuda")


def _quantile(sorted_values: list[float], q: float) -> float:
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def time_call(call: Callable[[int], object], flush: torch.Tensor, *, warmup: int = 3,
              min_reps: int = 20, max_reps: int = 400, target_notch: float = 0.005,
              max_seconds: float = 1.0, round_size: int = 10) -> Timing:
    """Time ``call(i)`` (i = repetition index, used to rotate input sets) on the current stream."""
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    times_ms: list[float] = []
    started = time.perf_counter()
    rep = 0
    while True:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(round_size)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(round_size)]
        for j in range(round_size):
            flush.zero_()
            starts[j].record()
            call(rep)
            ends[j].record()
            rep += 1
        torch.cuda.synchronize()
        times_ms.extend(s.elapsed_time(e) for s, e in zip(starts, ends))
        ordered = sorted(times_ms)
        n = len(ordered)
        median = _quantile(ordered, 0.5)
        iqr = _quantile(ordered, 0.75) - _quantile(ordered, 0.25)
        notch = 1.57 * iqr / math.sqrt(n)
        if n >= min_reps and (notch <= target_notch * median or n >= max_reps
                              or time.perf_counter() - started > max_seconds):
            return Timing(runtime_us_median=median * 1e3, runtime_us_iqr=iqr * 1e3, repetitions=n)
