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
from dataclasses import dataclass, replace
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    runtime_us_median: float
    runtime_us_iqr: float  # interquartile range of the per-repetition runtimes
    repetitions: int
    host_us_median: float = 0.0  # time the host spent inside one call (issuing its work)
    windows: int = 1  # separate timing windows this figure is the fastest of
    # Timed in a pair (``time_pair``): this call's cost over the other's, the median of their per-round ratios
    # (``paired_ratio``), and those ratios in the order the rounds ran; 0 and () for a call timed alone.
    paired_ratio: float = 0.0
    round_ratios: tuple[float, ...] = ()
    round_anchor_us: tuple[float, ...] = ()  # the other call's median in each of those rounds (us)

    def host_bound(self, flush_us: float) -> bool:
        """Whether the host's side of a call outlasts the flush: the GPU may then wait inside the window."""
        return self.host_us_median > flush_us

    def host_sensitive(self, flush_us: float) -> bool:
        """Whether the host's side of a call comes near enough to the flush (``HOST_SENSITIVE_SHARE`` of it) that
        one window's figure may follow the host: such a case is timed beside the reference (``anchoring.cases_to_pair``).
        A call issues its launches at the end of its host time, so three quarters of the flush can already show."""
        return self.host_us_median > HOST_SENSITIVE_SHARE * flush_us


# Measured on an H100 host (2026-11-27): GPU MODE pmpp/matmul's reference, `a @ b` for 1024x1536x1024 fp16 (a few
# microseconds of device work), spent 79 us of host time a call against a 102 us flush and was timed at 27.9 us in
# one window, then 87.2 and 82.2 us in two windows whose host time outlasted the flush. The case counted as
# GPU-bound, so its twin was not timed beside it, and the twin's 59.8 us (host 99.6 us against 100.3) left the null
# at 0.90. Pairing costs a window beside the reference; re-timing in more windows stays with ``host_bound``.
HOST_SENSITIVE_SHARE = 0.6


def fastest(timings: list[Timing]) -> Timing:
    """The window with the lowest median (the host least slowed), counting every window's repetitions."""
    best = min(timings, key=lambda t: t.runtime_us_median)
    return Timing(best.runtime_us_median, best.runtime_us_iqr, sum(t.repetitions for t in timings),
                  best.host_us_median, sum(t.windows for t in timings))


def agree(timings: list[Timing], tolerance: float = 0.01) -> bool:
    """Whether the two fastest windows' medians lie within ``tolerance``: the host was not slowed in either."""
    medians = sorted(t.runtime_us_median for t in timings)
    return len(medians) >= 2 and medians[1] <= (1 + tolerance) * medians[0]


SHORT_CASE_US = 200.0  # a GPU-bound case shorter than this gets more than one window
SHORT_CASE_WINDOWS = 3
# A call this long is one window, host-bound or not, and gets one fresh-input call per verification round
# (kernelcast.kernels.harness.verify.fresh_calls_for): its few repetitions already span longer than any stall of the host.
SLOW_CALL_US = 200_000.0


# A longer GPU-bound case's one window is timed again when it sits this far above the fastest single call its
# verification made right after it (on unseen inputs, flushed, timed by events as the window's repetitions are).
# Measured on an H200 (2026-11-29): KernelBench level1/4's reference (a matrix-vector product of 8.6 GB) was timed at
# 2,718 us in its one window, 13% above its fastest verification call (2,404 us) and the 2,309-2,355 us the same code
# took elsewhere, which left the null at 1.154. Over 84 such cases of that day's sweeps the window sat at a median
# 0.978 of the fastest call; 3 were more than 5% above it.
DISTURBED_SHARE = 0.05


def disturbed(windows: list[Timing], fastest_call_us: float | None) -> bool:
    """Whether even the fastest window sits more than ``DISTURBED_SHARE`` above the fastest verification call."""
    return (fastest_call_us is not None and fastest_call_us > 0 and bool(windows)
            and min(w.runtime_us_median for w in windows) > (1 + DISTURBED_SHARE) * fastest_call_us)


def time_again(windows: list[Timing], host_bound: bool, most: int, fastest_call_us: float | None = None) -> bool:
    """Whether a case gets another timing window (the fastest counts): a host-bound one until its two fastest
    windows agree, ``most`` at most; a GPU-bound one shorter than ``SHORT_CASE_US`` likewise, three at most;
    a longer GPU-bound one while every window sits above its fastest verification call (``disturbed``) and its
    two fastest windows do not agree, three at most; a call of ``SLOW_CALL_US`` or more, never. (Windows that agree
    with each other above the calls are the case's own: on an H200 the verification calls of KernelBench level1/97
    and /29 ran 5-8% below three windows that agreed within 1.5%.)

    One window of a call of microseconds is one draw of whatever else the host and device did meanwhile: on a
    busy H100 host, GPU MODE pmpp/matmul's 256^3 case came out at 36.7 us in one window of the reference's own
    code, against 7.7 us in another process. A longer GPU-bound call averages that out within its window. A
    call of seconds is host-bound by nature (GPU MODE amd/moe's reference, a Python loop over its experts:
    8.1-9.6 s a call) and its windows never agree within 1%: ten windows of it held an H100 for ten minutes."""
    if windows and windows[0].runtime_us_median >= SLOW_CALL_US:
        return False
    if host_bound:
        limit = most
    elif windows and windows[0].runtime_us_median < SHORT_CASE_US:
        limit = SHORT_CASE_WINDOWS
    else:
        return len(windows) < SHORT_CASE_WINDOWS and disturbed(windows, fastest_call_us) and not agree(windows)
    return len(windows) < limit and not agree(windows)


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


class _Series:
    """The repetitions of one call so far: per-repetition GPU times (ms) and host times (s)."""

    def __init__(self, call: Callable[[int], object]):
        self.call = call
        self.times_ms: list[float] = []
        self.host_s: list[float] = []
        self.round_sizes: list[int] = []  # repetitions of each round, in order
        self.rep = 0

    def round(self, flush: torch.Tensor, size: int) -> list:
        """Issue ``size`` timed repetitions (flush, start event, call, end event); returns the event pairs."""
        events = []
        for _ in range(size):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush.zero_()
            start.record()
            t = time.perf_counter()
            self.call(self.rep)
            self.host_s.append(time.perf_counter() - t)
            end.record()
            events.append((start, end))
            self.rep += 1
        return events

    def timing(self) -> Timing:
        ordered = sorted(self.times_ms)
        iqr = _quantile(ordered, 0.75) - _quantile(ordered, 0.25)
        return Timing(runtime_us_median=_quantile(ordered, 0.5) * 1e3, runtime_us_iqr=iqr * 1e3,
                      repetitions=len(ordered), host_us_median=_quantile(sorted(self.host_s), 0.5) * 1e6)

    def settled(self, min_reps: int, target_notch: float) -> bool:
        """At least ``min_reps`` repetitions, and the median's 95% notch within ``target_notch`` of it."""
        n = len(self.times_ms)
        if n < min_reps:
            return False
        ordered = sorted(self.times_ms)
        iqr = _quantile(ordered, 0.75) - _quantile(ordered, 0.25)
        return 1.57 * iqr / math.sqrt(n) <= target_notch * _quantile(ordered, 0.5)


def _time_series(calls: list[Callable[[int], object]], flush: torch.Tensor, warmup: int, min_reps: int,
                 max_reps: int, target_notch: float, max_seconds: float, round_size: int,
                 long_rounds: bool = True) -> list[_Series]:
    """Rounds of each call in turn until every median is pinned down (or the repetitions or time run out).

    Each round starts on an idle device, for every call alike: issued behind another call's round, a
    host-bound call's launches queue up while the device is still busy and its events see less of the
    host's time than they do after a synchronisation. (Measured on an H100: a problem's own code timed first
    in each round came out 0-8% slower than the same code timed second, on references of 28-187 us.)"""
    series = [_Series(call) for call in calls]
    last = []  # each call's last warm-up call, to the device being idle: its first ones may build and load things
    for s in series:
        took = []
        for i in range(warmup):
            torch.cuda.synchronize()
            t = time.perf_counter()
            s.call(i)
            torch.cuda.synchronize()
            took.append(time.perf_counter() - t)
            if warmed_up(took, warmup, max_seconds):
                break
        last.append(took[-1])
    if last:
        min_reps = repetitions_for(max(last), min_reps, max_seconds)
        if long_rounds and len(series) > 1:
            min_reps = pair_repetitions(min_reps, max(last), round_size)
    round_size = round_size_for(len(series), min_reps, round_size)
    started = time.perf_counter()
    turn = 0
    while True:
        # A B, then B A: whatever the second place in a round does to a call, both get it as often
        for s in (series if turn % 2 == 0 else series[::-1]):
            events = s.round(flush, round_size)
            torch.cuda.synchronize()
            s.times_ms.extend(start.elapsed_time(end) for start, end in events)
            s.round_sizes.append(len(events))
        turn += 1
        if all(s.settled(min_reps, target_notch) for s in series) or \
                min(len(s.times_ms) for s in series) >= max_reps or \
                (len(series[0].times_ms) >= min_reps and time.perf_counter() - started > max_seconds):
            return series


SLOW_CALL_REPS = 5  # the fewest repetitions a call gets, however slow, up to a second
SECONDS_CALL_REPS = 3  # the repetitions of a call of a second or more: the median of three
PAIR_ROUNDS = 8  # the fewest rounds each call of a pair gets before its median may stand
# A pair of calls quicker than this gets PAIR_ROUNDS rounds as long as a call's rounds alone (``pair_repetitions``).
PAIR_QUICK_CALL_S = 0.005


def pair_repetitions(min_reps: int, call_seconds: float, round_size: int) -> int:
    """A pair's fewest repetitions a side: for calls quicker than ``PAIR_QUICK_CALL_S``, enough for ``PAIR_ROUNDS``
    rounds of ``round_size`` (a window's rounds alone, ten); slower ones keep ``min_reps`` (their time is what limits).

    Each round of a pair starts on an idle device, and a round's first repetition meets the host's issuing time where
    later ones find the device busy; in rounds of two (20 repetitions a side) half of a call's repetitions were first
    ones. Measured on H200s (2026-11-29, benchmarks/small_call_spread.py): a host-bound reference (a linear layer and
    five small reductions, 151-173 us alone) came out at 165-265 us beside a GPU-bound call in rounds of two, and the
    pair's ratio at 0.62-0.98 of the two calls' ratio alone; in rounds of ten, 151-164 us and 0.95-1.10. The share a
    first repetition can add is the flush's head start (about 0.1 ms), small beside calls of milliseconds, and eighty
    repetitions of those would hold the device for seconds a pair."""
    if call_seconds <= 0 or not math.isfinite(call_seconds) or call_seconds >= PAIR_QUICK_CALL_S:
        return min_reps
    return max(min_reps, PAIR_ROUNDS * round_size)


def warmed_up(took: list[float], warmup: int, max_seconds: float) -> bool:
    """Whether the warm-up calls so far (their seconds, in order) are enough: all ``warmup`` of them, or two
    once the second alone outlasts the timing window (a call of seconds has nothing left to warm after
    one call built and loaded what it needs, and each further call holds the device that long)."""
    return len(took) >= warmup or (len(took) >= 2 and took[-1] > max_seconds)


def round_size_for(calls: int, min_reps: int, round_size: int) -> int:
    """Repetitions per round: ``round_size`` for one call; for a pair, small enough that its ``min_reps`` span
    ``PAIR_ROUNDS`` alternations at least. The pair's ratio cancels the host's drift only between rounds: measured
    on an H100 whose host ran one eager ResNet-101 call at 15.0-16.9 ms from window to window, two rounds of ten
    15 ms calls each left the same code 4-12% apart on 9 large level-3 networks."""
    size = min(round_size, min_reps)
    if calls > 1:
        size = min(size, max(1, min_reps // PAIR_ROUNDS))
    return max(1, size)


def repetitions_for(call_seconds: float, min_reps: int, max_seconds: float) -> int:
    """The repetitions a call needs before its median may stand: ``min_reps``, or for a call too slow for that
    many to fit twice the window's ``max_seconds``, as many as fit (``SLOW_CALL_REPS`` at least), and for a call
    of a second or more ``SECONDS_CALL_REPS``. A call of a second or more is long against every source of noise
    the repetitions average out (launch jitter, clock steps, a flushed cache's refill), while twenty of them per
    case held the device for minutes per task."""
    if call_seconds <= 0 or not math.isfinite(call_seconds):
        return min_reps
    if call_seconds >= 1.0:
        return min(min_reps, SECONDS_CALL_REPS)
    fit = int(2 * max_seconds / call_seconds)
    return max(min(min_reps, SLOW_CALL_REPS), min(min_reps, fit))


def time_call(call: Callable[[int], object], flush: torch.Tensor, *, warmup: int = 3,
              min_reps: int = 20, max_reps: int = 400, target_notch: float = 0.005,
              max_seconds: float = 1.0, round_size: int = 10) -> Timing:
    """Time ``call(i)`` (i = repetition index, used to rotate input sets) on the current stream."""
    (series,) = _time_series([call], flush, warmup, min_reps, max_reps, target_notch, max_seconds, round_size)
    return series.timing()


def time_pair(call: Callable[[int], object], anchor: Callable[[int], object], flush: torch.Tensor, *,
              warmup: int = 3, min_reps: int = 20, max_reps: int = 400, target_notch: float = 0.005,
              max_seconds: float = 1.0, round_size: int = 10, long_rounds: bool = True) -> tuple[Timing, Timing]:
    """Time ``call`` and ``anchor`` in alternating rounds of one window: both meet the same host.

    ``call``'s cost relative to the anchor's is the median of their per-round ratios (``paired_ratio``), carried
    in the call's timing, free of the host's drifts that separate windows would each see differently. Rounds are
    as long as a window's alone where the calls are quick (``pair_repetitions``; ``long_rounds`` False: rounds as
    ``round_size_for`` gives them for ``min_reps``, as before 2026-11-29)."""
    mine, theirs = _time_series([call, anchor], flush, warmup, min_reps, max_reps, target_notch, max_seconds,
                                round_size, long_rounds)
    rounds = _rounds(mine), _rounds(theirs)
    ratio, per_round = paired_ratio(*rounds)
    anchor_us = tuple(_quantile(sorted(b), 0.5) * 1e3 for a, b in zip(*rounds) if a and b)
    return (replace(mine.timing(), paired_ratio=ratio, round_ratios=tuple(per_round), round_anchor_us=anchor_us),
            theirs.timing())


def _rounds(series: _Series) -> list[list[float]]:
    """A series' repetition times (ms), round by round."""
    out, at = [], 0
    for size in series.round_sizes:
        out.append(series.times_ms[at:at + size])
        at += size
    return out


def paired_ratio(mine: list[list[float]], theirs: list[list[float]]) -> tuple[float, list[float]]:
    """The median over rounds of (my round's median / their round's median), and those ratios.

    Rounds of the two calls alternate (A B, then B A), so round k of each saw the same stretch of the host. A
    host that moves between fast and slow stretches (measured on an H100 host: one level-3 network's windows at
    6.7, 10.4 and 11.5 ms within two seconds) makes each call's median over all its repetitions fall on either
    side of the two, by how many of its repetitions the slow stretches took; a ratio per round compares like
    with like, and their median ignores the rounds that straddle a change. Rounds missing on one side count not."""
    medians = [(_quantile(sorted(a), 0.5), _quantile(sorted(b), 0.5)) for a, b in zip(mine, theirs) if a and b]
    ratios = [a / b for a, b in medians if b > 0]
    if not ratios:
        raise ValueError("no round of the pair has repetitions on both sides")
    return _quantile(sorted(ratios), 0.5), ratios


PROTOCOLS = ("kernelcast", "kernelbench", "gpumode")
# The protocols that time each call alone on the same inputs, as a format's own harness does: the reference's
# trials are taken beside each candidate's, in its process (kernelcast.kernels.harness.case_timing).
FORMAT_PROTOCOLS = ("kernelbench", "gpumode")
# Which of a candidate's cases kernelcast's protocol times beside the reference (WorkerConfig.anchor).
ANCHORS = ("host-bound", "all", "off")


def time_trials(call: Callable[[int], object], flush: torch.Tensor, *, warmup: int = 3,
                trials: int = 100) -> Timing:
    """KernelBench's own timing, for comparing with its published figures: the same inputs every call,
    ``warmup`` calls, then ``trials`` calls each after an L2 flush, timed by events and followed by a
    synchronisation; the figure is their mean (not a median), carried in ``runtime_us_median``."""
    for _ in range(warmup):
        call(0)
    torch.cuda.synchronize()
    runs = [_event_run(call, flush) for _ in range(trials)]
    return _mean_timing(runs)


def _event_run(call: Callable[[int], object], flush: torch.Tensor) -> tuple[float, float]:
    """One call alone, as the formats' own harnesses time it: an L2 flush, the call between two events, a
    synchronisation. (device microseconds, host seconds spent issuing the call)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush.zero_()
    start.record()
    t = time.perf_counter()
    call(0)
    host = time.perf_counter() - t
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3, host


def _mean_timing(runs: list[tuple[float, float]]) -> Timing:
    """The formats' figure from ``_event_run``s: the mean device time (in ``runtime_us_median``), its IQR, the
    median host time."""
    ordered = sorted(us for us, _ in runs)
    return Timing(runtime_us_median=sum(ordered) / len(ordered),
                  runtime_us_iqr=_quantile(ordered, 0.75) - _quantile(ordered, 0.25), repetitions=len(ordered),
                  host_us_median=_quantile(sorted(h for _, h in runs), 0.5) * 1e6)


def gpumode_stop(durations_ns: list[float], elapsed_ns: float, max_time_ns: float = 10e9,
                 max_wall_ns: float = 120e9) -> bool:
    """GPU MODE's rule for ending a benchmark (its eval.py): after at least three runs, once the standard error
    of the mean is below 0.1% of it, or the runs add up to ``max_time_ns``, or the loop has run ``max_wall_ns``."""
    if len(durations_ns) < 3:
        return False
    mean, err = mean_and_error(durations_ns)
    return err / mean < 0.001 or mean * len(durations_ns) > max_time_ns or elapsed_ns > max_wall_ns


def mean_and_error(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (sample standard deviation over the square root of the count)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std / math.sqrt(n)


def time_gpumode(call: Callable[[int], object], flush: torch.Tensor, *, max_repeats: int = 100,
                 max_time_ns: float = 10e9) -> Timing:
    """GPU MODE's own timing (reference-kernels' eval.py, ranked benchmarks), for comparing with its leaderboards:
    the same inputs every call; each run a synchronisation, an L2 flush, then the call between two events and a
    synchronisation; up to ``max_repeats`` runs, ended by ``gpumode_stop``; the figure is their mean (carried in
    ``runtime_us_median``). Its warm-up (a first benchmark of up to 0.1 s) is the first loop below."""
    for budget_ns in (1e8, max_time_ns):
        runs = []
        started = time.perf_counter_ns()
        for _ in range(max_repeats):
            torch.cuda.synchronize()
            runs.append(_event_run(call, flush))
            if gpumode_stop([us * 1e3 for us, _ in runs], time.perf_counter_ns() - started, budget_ns):
                break
    return _mean_timing(runs)
