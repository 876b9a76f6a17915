"""GPU timing of one callable: CUDA events, L2 flushed before each repetition, adaptive repetitions.

Each repetition flushes the L2 cache (zeroing a buffer several times its size), then
records a start event, makes one call and records an end event; nothing else sits
inside the window. Inputs are prepared before timing and rotated between several
sets, so a call never finds its operands (or a cached result) from the previous one.
Repetitions continue in rounds until the median is pinned down: the half-width of
its 95% notch, 1.57 * IQR / sqrt(n), falls under ``target_notch`` of the median.

The flush gives the host a head start: while the GPU zeroes the buffer, the host records
the start event and issues the call, so a call whose host side (Python, launches) takes less
than the flush is timed by its GPU work alone. A call whose host side takes longer keeps the
GPU waiting inside the window, and its time then follows the host's speed, which on a shared
machine moves by 2x from one second to the next (pure Python on a pinned core, measured on an
H100 host: docs/harness.md). ``host_us_median`` says how long the host spent issuing a call;
``host_bound`` compares it with the flush, and such calls are timed again later in separate
windows while the windows disagree, the fastest window counting (``fastest``).
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
    host_us_median: float = 0.0  # time the host spent inside one call (issuing its work)
    windows: int = 1  # separate timing windows this figure is the fastest of

    def host_bound(self, flush_us: float) -> bool:
        """Whether the host's side of a call outlasts the flush: the GPU may then wait inside the window."""
        return self.host_us_median > flush_us


def fastest(timings: list[Timing]) -> Timing:
    """The window with the lowest median (the host least slowed), counting every window's repetitions."""
    best = min(timings, key=lambda t: t.runtime_us_median)
    return Timing(best.runtime_us_median, best.runtime_us_iqr, sum(t.repetitions for t in timings),
                  best.host_us_median, sum(t.windows for t in timings))


def agree(timings: list[Timing], tolerance: float = 0.01) -> bool:
    """Whether the two fastest windows' medians lie within ``tolerance``: the host was not slowed in either."""
    medians = sorted(t.runtime_us_median for t in timings)
    return len(medians) >= 2 and medians[1] <= (1 + tolerance) * medians[0]


def flush_us(flush: torch.Tensor, reps: int = 5) -> float:
    """The median time the GPU takes to zero ``flush``: the host's head start in every timed repetition."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        flush.zero_()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[reps // 2]


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
    host_s: list[float] = []
    started = time.perf_counter()
    rep = 0
    while True:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(round_size)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(round_size)]
        for j in range(round_size):
            flush.zero_()
            starts[j].record()
            t = time.perf_counter()
            call(rep)
            host_s.append(time.perf_counter() - t)
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
            return Timing(runtime_us_median=median * 1e3, runtime_us_iqr=iqr * 1e3, repetitions=n,
                          host_us_median=_quantile(sorted(host_s), 0.5) * 1e6)
