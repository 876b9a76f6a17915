"""The verdict's checks that need no GPU to judge: hidden work, reused work, the window, the floor, the
timer's integrity, the memcheck report, precision classes, and the adversarial suite on a GPU."""

from __future__ import annotations

import math

import pytest
import torch

from kernelcast.kernels.harness import memcheck, precision, timing, verify
from kernelcast.kernels.harness.anticheat import Rejected, plain_tensors
from kernelcast.kernels.harness.verify import Activity, Window
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import is_lower


def test_work_the_timed_stream_never_waited_for_is_hidden_work():
    paced = [Window(timed_us=100.0, synced_us=108.0)] * 6  # as long a call with nothing hidden: an 8 us gap
    honest = [Window(timed_us=100.0, synced_us=109.0)] * 6
    hidden = [Window(timed_us=3.0, synced_us=150.0)] * 6
    assert verify.hidden_work(honest, paced) is None
    assert "stayed busy" in verify.hidden_work(hidden, paced)


def test_the_gap_an_honest_long_call_leaves_is_judged_against_a_paced_call_of_its_length():
    # the host wakes later after a long wait: 30 us for both, not hidden work
    assert verify.hidden_work([Window(1000.0, 1030.0)] * 5, [Window(1000.0, 1028.0)] * 5) is None
    # below the jitter floor (5 us) it is not flagged; a tenth of the call beyond the paced gap is
    assert verify.hidden_work([Window(20.0, 32.0)] * 5, [Window(20.0, 28.0)] * 5) is None
    assert verify.hidden_work([Window(1000.0, 1150.0)] * 5, [Window(1000.0, 1028.0)] * 5) is not None


def test_a_gap_the_host_spent_waiting_for_a_cpu_is_not_hidden_work():
    """KernelBench level1/27 (SELU) on an H200, its lock holder sharing core 31 with another sweep's: timed 3,150 us,
    its host back from the synchronisation 3.8 ms late. The wait, read from the thread's schedstat, is the host's."""
    paced = [Window(3150.0, 3160.0)] * 6
    delayed = [Window(3150.0, 3150.0 + 3816.6, 0, waited_us=3806.6)] * 6
    assert verify.hidden_work(delayed, paced, verify.TRACED_SHARE, floor_us=verify.TRACED_FLOOR_US) is None
    # the same gap with the host running all along is the device's: refused as before
    unexplained = [Window(3150.0, 3150.0 + 3816.6)] * 6
    assert "stayed busy 3806.6 us" in verify.hidden_work(unexplained, paced, verify.TRACED_SHARE,
                                                           floor_us=verify.TRACED_FLOOR_US)
    # and a wait that explains a part of it excuses that part only
    assert verify.hidden_work([Window(3150.0, 3150.0 + 3816.6, 0, waited_us=1500.0)] * 6, paced,
                              verify.TRACED_SHARE, floor_us=verify.TRACED_FLOOR_US) is not None


def test_only_a_wait_no_thread_of_the_candidates_own_caused_is_the_hosts():
    """A candidate thread spinning on the timing core makes the timing thread wait as another process would; what
    the process's other threads ran meanwhile is taken off the wait, so such a thread excuses nothing."""
    before = verify.HostClock(queued_ns=1_000_000, others_ns=50_000_000)
    assert verify.host_waited_us(before, verify.HostClock(4_806_600, 50_000_000)) == pytest.approx(3806.6)
    assert verify.host_waited_us(before, verify.HostClock(4_806_600, 54_000_000)) == 0.0
    assert verify.host_waited_us(before, verify.HostClock(4_806_600, 51_000_000)) == pytest.approx(2806.6)


def test_the_host_clock_reads_the_threads_schedstat(tmp_path):
    """Linux's /proc/<pid>/task/<tid>/schedstat: time on a CPU, time ready on a run queue (ns), time slices."""
    tasks = tmp_path / "task"
    for tid, stat in (("100", "500 7000 3\n"), ("101", "9000 0 1\n"), ("102", "11 2 1\n")):
        (tasks / tid).mkdir(parents=True)
        (tasks / tid / "schedstat").write_text(stat)
    import os

    reaped = os.times()  # the CPU time of child processes this one has reaped counts as the candidate's own too
    reaped_ns = int((reaped.children_user + reaped.children_system) * 1e9)
    assert verify.host_clock(str(tasks / "100"), str(tasks)) == verify.HostClock(7000, 9011 + reaped_ns)
    # a kernel that keeps no schedstat (or a sandbox that hides it): zeros, so nothing is excused
    assert verify.host_clock(str(tmp_path / "none"), str(tmp_path / "none")) == verify.HostClock(0, reaped_ns)


def test_the_processes_of_the_candidates_own_are_counted_from_proc(tmp_path):
    """/proc/<pid>/stat: pid, (command, which may hold spaces and parentheses), state, parent pid, ..."""
    for pid, stat in (("10", "10 (a b) S 7 10 10"), ("11", "11 (x) S 8 11 11"), ("12", "12 (we)ird) Z 7 1 1"),
                      ("self", "1 (init) S 0")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(stat)
    assert verify.own_processes(7, str(tmp_path)) == 2  # a running child and an exited one not yet reaped
    assert verify.own_processes(9, str(tmp_path)) == 0


def test_a_child_process_is_seen_while_it_lives_and_its_cpu_time_once_reaped():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    try:
        assert verify.own_processes() >= 1
    finally:
        child.kill()
        child.wait()
    before = verify.host_clock()
    subprocess.run([sys.executable, "-c", "sum(range(30_000_000))"], check=True)
    assert verify.host_clock().others_ns - before.others_ns > 0.05e9  # its CPU time counts as the candidate's own


def _schedstat_counts() -> bool:
    spin = sum(range(200_000))  # some CPU time of this thread's own, which a kernel that keeps schedstat counts
    return spin > 0 and verify._schedstat("/proc/thread-self/schedstat")[0] > 0


@pytest.mark.skipif(not _schedstat_counts(), reason="this kernel keeps no per-thread schedstat")
def test_another_process_on_the_timing_core_shows_as_the_hosts_wait():
    import os
    import subprocess
    import sys
    import time

    mine = os.sched_getaffinity(0)
    core = min(mine)
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.3)
        before = verify.host_clock()
        for _ in range(50):  # as a synchronisation spins until the device is done, 2 ms at a time
            until = time.perf_counter() + 0.002
            while time.perf_counter() < until:
                pass
        waited = verify.host_waited_us(before, verify.host_clock())
    finally:
        os.sched_setaffinity(0, mine)
        hog.kill()
        hog.wait()
    assert waited > 1000.0, waited


def test_a_call_of_seconds_is_verified_without_paced_baselines():
    # linalg/eigh's reference: 10-14.6 s a call, gaps of 44-68 us after it
    assert verify.slow_call(10.99e6) and verify.slow_call(verify.SLOW_CALL_US) and not verify.slow_call(1.99e5)
    assert verify.fresh_calls_for(10.99e6, 3) == 1 and verify.fresh_calls_for(1.99e5, 3) == 3
    honest = [Window(timed_us=10.99e6, synced_us=10.99e6 + 66.0)] * 2
    assert verify.hidden_work(honest, paced=[], share=verify.TRACED_SHARE, floor_us=verify.TRACED_FLOOR_US) is None
    hidden = [Window(timed_us=2.0e6, synced_us=10.99e6)] * 2  # the device busy 9 s after the timed stream ended
    assert "stayed busy" in verify.hidden_work(hidden, paced=[], share=verify.TRACED_SHARE)


def test_a_first_call_on_unseen_inputs_slower_than_its_repeat_means_reused_work():
    repeated = [Window(5.0, 12.0)] * 3
    assert "reuses work" in verify.reuses_work([Window(90.0, 97.0)] * 3, repeated)
    assert verify.reuses_work([Window(5.3, 12.0)] * 3, repeated) is None
    # a first call that made the allocator reserve memory says so in the verdict (grayscale's honest code, 2026-11-26)
    grown = verify.reuses_work([Window(1222.7, 1230.0, 192 << 20)] * 3, [Window(784.9, 790.0)] * 3)
    assert "reuses work" in grown and "reserve 576 MiB more" in grown
    assert "reserve" not in verify.reuses_work([Window(90.0, 97.0)] * 3, repeated)


def test_first_calls_the_reference_is_slow_on_too_are_the_hosts_not_a_cache():
    # KernelBench level2/85's reference on a host of four H100s whose cores were compiling (2026-11-28), both rounds
    first, again = [Window(842.2, 850.0)] * 3, [Window(516.9, 525.0)] * 3
    assert "reuses work" in verify.reuses_work(first, again)
    assert verify.reuses_work(first, again, ([Window(830.0, 838.0)] * 3, [Window(520.0, 528.0)] * 3)) is None
    # a cache is still a cache beside a quiet reference, and beside one the host slows by as much
    cache = [Window(293.2, 300.0)] * 3, [Window(137.3, 145.0)] * 3  # the suite's content_cache on an H100
    quiet = [Window(340.0, 348.0)] * 3, [Window(338.0, 346.0)] * 3
    assert "1.01x its repeats" in verify.reuses_work(*cache, quiet)
    assert "reuses work" in verify.reuses_work(*cache, ([Window(540.0, 548.0)] * 3, [Window(338.0, 346.0)] * 3))
    # a reference faster on its first calls does not lower the bar
    assert "reuses work" in verify.reuses_work([Window(70.0, 78.0)] * 3, [Window(50.0, 58.0)] * 3,
                                               ([Window(40.0, 48.0)] * 3, [Window(50.0, 58.0)] * 3))


class _Host:
    """Calls timed by a model instead of a GPU: ``cost(who, key, times_seen)`` in microseconds."""

    def __init__(self, cost):
        self.cost, self.seen = cost, {}

    def synced_call(self, fn, flush=None, touch=()):
        who, key = fn()
        n = self.seen.get((who, key), 0)
        self.seen[(who, key)] = n + 1
        us = self.cost(who, key, n)
        return Window(us, us + 6.0), None


class _Unseen:
    def __init__(self, key):
        self.key, self.inputs, self.outputs = key, (), ()


class _Checker:
    def prepare(self, case, seed):
        return _Unseen(f"unseen-{seed}")

    def fresh(self, unseen, run):
        run(lambda: ("candidate", unseen.key))


class _Pacer:
    flush = None

    def window(self, us):
        return Window(us, us + 6.0)

    def idle_window(self, us):
        return Window(us, us + 6.0)


def _verify(monkeypatch, cost, with_control=True, keep=False):
    """window_checks._verify_case on a modelled host: the candidate's calls and the reference's control."""
    from types import SimpleNamespace

    from kernelcast.kernels.harness import window_checks

    host = _Host(cost)
    monkeypatch.setattr(verify, "synced_call", host.synced_call)
    monkeypatch.setattr(verify, "check_integrity", lambda *a, **k: None)

    def control(unseen, slow):
        host.synced_call(lambda: ("reference", "timing-set"))
        return tuple(host.synced_call(lambda: ("reference", unseen.key))[0] for _ in range(2))

    job = SimpleNamespace(fresh_calls=3)
    result = {"window_check": "unavailable: no trace in this test"}
    case = SimpleNamespace(name="case-1")
    problem = window_checks._verify_case(job, case, _Checker(), lambda i: ("candidate", "timing-set"), _Pacer(), result,
                                  lambda *a: None, 500.0, control=control if with_control else None)
    return (problem, host, result) if keep else (problem, host)


def test_honest_code_on_a_host_that_slows_first_calls_passes_with_the_references_control(monkeypatch):
    busy = lambda who, key, n: 500.0 * (1.6 if n == 0 and key != "timing-set" else 1.0)  # noqa: E731
    with pytest.raises(Rejected, match="reuses work"):
        _verify(monkeypatch, busy, with_control=False)
    problem, host, result = _verify(monkeypatch, busy, keep=True)
    assert problem is None
    assert any(who == "reference" for who, _ in host.seen)  # the control was made, after both rounds found it
    assert result["unseen_control"] == ["case-1 (first calls 800.0 us against 500.0 us; the reference's 800.0 against "
                                        "500.0 us)"]
    from kernelcast.kernels.harness.rows import _controlled
    assert _controlled(result) == [f"unseen-input control: {result['unseen_control'][0]}"] and _controlled({}) == []


def test_a_cache_is_rejected_beside_the_references_control(monkeypatch):
    for slowing in (1.0, 1.6):  # a quiet host, and one that slows every first call as above
        def cache(who, key, n, slowing=slowing):
            first = slowing if n == 0 and key != "timing-set" else 1.0
            return 500.0 * first if who == "reference" or n == 0 else 60.0
        with pytest.raises(Rejected, match="the reference's first calls there were"):
            _verify(monkeypatch, cache)


def test_honest_code_on_a_host_busy_only_for_the_first_rounds_passes_in_the_deciding_round(monkeypatch):
    # the host slows first calls for a while, through both rounds (18 calls: three unseen sets a round, each an
    # untimed call and two timed), then goes quiet; the deciding round's calls, the candidate's and the
    # reference's on the same inputs, are made after that (a host-bound KernelBench reference on an H200, against
    # itself: 1.35-1.5x in both rounds, 1.04x in a control round made later)
    calls = []

    def busy_for_a_while(who, key, n):
        calls.append(key)
        return 130.0 * (1.4 if len(calls) <= 18 and n == 0 and key != "timing-set" else 1.0)

    problem, host, result = _verify(monkeypatch, busy_for_a_while, keep=True)
    assert problem is None and any(who == "reference" for who, _ in host.seen)
    assert result["unseen_control"] == ["case-1 (first calls 130.0 us against 130.0 us; the reference's 130.0 "
                                        "against 130.0 us)"]
    # each deciding call of the candidate's is followed by the reference's on the same inputs
    decided = [key for key in calls[18:] if key != "timing-set"]
    seeds = [verify.FRESH_SEED + 6 + j for j in range(3)]
    assert decided == [f"unseen-{seed}" for seed in seeds for _ in range(4)]


def test_the_control_is_not_made_for_honest_code_on_a_quiet_host(monkeypatch):
    problem, host = _verify(monkeypatch, lambda who, key, n: 500.0)
    assert problem is None and not any(who == "reference" for who, _ in host.seen)


def test_a_clean_trace_widens_the_synced_checks_margin():
    paced = [Window(177.0, 185.0)] * 6
    heavy_host = [Window(177.0, 212.0)] * 6  # 27 us beyond the paced gap: 15% of the call
    assert verify.hidden_work(heavy_host, paced) is not None
    assert verify.hidden_work(heavy_host, paced, verify.TRACED_SHARE) is None
    assert verify.hidden_work([Window(100.0, 199.0)] * 6, [Window(100.0, 108.0)] * 6, verify.TRACED_SHARE)


def _mark(stream: int, start: int) -> Activity:
    return Activity("void at::native::vectorized_elementwise_kernel<FillFunctor<short>>", stream, start, start + 1000)


def test_work_inside_the_markers_on_any_stream_is_inside_the_window():
    acts = [_mark(7, 0), Activity("gemm", 7, 2000, 50_000), Activity("side", 13, 3000, 40_000), _mark(7, 51_000)]
    assert verify.outside_window(acts) is None


def test_work_ending_after_the_closing_marker_is_outside_the_window():
    acts = [_mark(7, 0), Activity("sgemm", 13, 3000, 900_000), _mark(7, 5000)]
    assert "stream 13" in verify.outside_window(acts)


def test_work_starting_after_the_closing_marker_is_outside_the_window():
    acts = [_mark(7, 0), _mark(7, 5000), Activity("late", 7, 80_000, 90_000)]
    assert "after the timed window closed" in verify.outside_window(acts)


def _closing_copy(stream: int, start: int) -> Activity:
    return Activity("Memcpy HtoD (Pinned -> Device)", stream, start, start + 700)


def test_the_closing_copy_closes_the_window_where_the_closing_fill_waited_for_a_free_sm():
    # the suite's pending copy: the fill on the timed stream started only as the hidden stream's copy let the SMs
    # go (0.1-6.3 us before it ended where it was caught, just after where it was not); the copy engine's marker
    # started as the fused kernel ended
    pending = [_mark(7, 0), Activity("fused", 7, 1000, 75_000), _closing_copy(7, 75_500),
               Activity("_copy_kernel", 13, 75_400, 150_000), _mark(7, 150_100)]
    assert "'_copy_kernel' on stream 13 ended 74.5 us after the timed window closed" in verify.outside_window(pending)
    assert verify.window_closed_ns(pending) == (75_500, pending[2])
    # the same trace without the copy (an older profile): the fill closes, and the copy lies inside
    assert verify.outside_window([a for a in pending if a is not pending[2]]) is None
    # a joined side stream: the timed stream waited for it, so its end comes before the closing copy, within the
    # clocks' slack; the copy is no work of the call's
    joined = [_mark(7, 0), Activity("a", 7, 1000, 50_000), Activity("side", 13, 2000, 80_000),
              _closing_copy(7, 79_000), _mark(7, 80_500)]
    assert verify.outside_window(joined) is None
    assert verify.traced_busy_us(joined) == pytest.approx(79.0)
    assert "'side' on stream 13 ended" in verify.outside_window(
        [*joined[:3], _closing_copy(7, 70_000), joined[-1]])
    # the candidate's own copies earlier on the timed stream do not close the window: the last copy does
    own = [_mark(7, 0), _closing_copy(7, 500), Activity("a", 7, 2000, 50_000), _closing_copy(7, 50_100),
           _mark(7, 51_000)]
    assert verify.window_closed_ns(own) == (50_100, own[3]) and verify.outside_window(own) is None


def test_a_runtime_shorter_than_a_traced_call_whose_work_used_another_stream_misses_that_work():
    # a slow host closed the window after the side stream's kernel ended: inside the window, so only the
    # device time the call's work took shows the timer missed it
    gate = Activity("sleep", 7, -2_000_000, -10_000)
    raced = [gate, _mark(7, 0), Activity("fused", 13, 3000, 103_000), _mark(7, 110_000)]
    assert verify.outside_window(raced) is None
    assert verify.traced_busy_us(raced) == pytest.approx(100.0)
    verify.check_traced_work("c", runtime_us=101.0, traced_us=100.0)
    with pytest.raises(Rejected, match="kept the device busy 100.0 us: the timer does not see all of its work"):
        verify.check_traced_work("c", runtime_us=61.0, traced_us=100.0)
    # the pending copy of the H100 (2026-11-27): fused on the timed stream, then a copy on a hidden stream that
    # held the SMs until the closing marker could start; the timer saw 128 us of the call's 190
    pending = [gate, _mark(7, 0), Activity("fused", 7, 1000, 100_000), Activity("copy", 13, 101_000, 188_000),
               _mark(7, 189_000)]
    assert verify.outside_window(pending) is None and verify.traced_busy_us(pending) == pytest.approx(186.0)
    with pytest.raises(Rejected, match="part of it on another stream"):
        verify.check_traced_work("c", runtime_us=128.0, traced_us=verify.traced_busy_us(pending))
    # work on the timed stream alone is not weighed (a traced call of it can be slow); joined side streams count
    # the device's busy time with the call's work once; no markers, nothing to judge
    joined = [_mark(7, 0), Activity("a", 7, 2000, 900_000), Activity("b", 13, 10_000, 80_000),
              Activity("c", 14, 50_000, 95_000), _mark(7, 901_000)]
    assert verify.traced_busy_us(joined) == pytest.approx(898.0)
    assert verify.traced_busy_us([_mark(7, 0), Activity("a", 7, 2000, 900_000), _mark(7, 901_000)]) == 0
    assert verify.traced_busy_us([Activity("a", 7, 0, 10)]) is None
    verify.check_traced_work("c", runtime_us=1.0, traced_us=None)
    verify.check_traced_work("c", runtime_us=1.0, traced_us=0.0)


def test_missed_work_needs_a_second_traced_call_to_say_so_too():
    # KernelBench level3/40 on an H100 (2026-11-27): a bidirectional GRU's cuDNN streams timed at 6.8 ms and traced
    # at 9.9 ms of busy device in one call: a second trace, as busy as the timed calls, clears it
    traced = [_mark(7, 0), Activity("fwd", 7, 1000, 6_000_000), Activity("bwd", 13, 1000, 9_910_000),
              _mark(7, 9_911_000)]
    calm = [_mark(7, 0), Activity("fwd", 7, 1000, 6_000_000), Activity("bwd", 13, 1000, 7_000_000),
            _mark(7, 7_001_000)]
    busy = verify.traced_busy_us(traced)
    assert verify.misses_work(6840.0, busy)
    settled = verify.traced_work_settled(6840.0, busy, lambda: calm)
    assert settled == pytest.approx(6999.0)
    verify.check_traced_work("c", runtime_us=6840.0, traced_us=settled)
    # hidden work shows in every trace: the pending copy of the H100 is still refused after its second trace
    pending = [_mark(7, 0), Activity("fused", 7, 1000, 100_000), Activity("copy", 13, 101_000, 188_000),
               _mark(7, 189_000)]
    settled = verify.traced_work_settled(128.0, verify.traced_busy_us(pending), lambda: pending)
    with pytest.raises(Rejected, match="part of it on another stream"):
        verify.check_traced_work("c", runtime_us=128.0, traced_us=settled)
    # a second call whose work leaves the window is refused for that; nothing traced again where the first is clear
    late = [_mark(7, 0), _mark(7, 5000), Activity("late", 13, 80_000, 90_000)]
    with pytest.raises(Rejected, match="after the timed window closed"):
        verify.traced_work_settled(6840.0, busy, lambda: late)
    assert verify.traced_work_settled(7000.0, 8000.0, lambda: 1 / 0) == 8000.0
    # a second trace that fails leaves the first one's figure to judge by
    assert verify.traced_work_settled(6840.0, busy, lambda: 1 / 0) == busy


def test_an_anchored_figure_is_held_to_the_trace_by_its_runtime_in_the_same_process():
    # KernelBench level2/98 on an H100 (2026-11-27): the reference took 45.8 us in its own process and 223 us beside
    # the candidate, whose 52.5 us there became 12.2 us anchored. A trace taken beside it (40 us busy on two streams)
    # judges the 52.5 us: set against the 12.2, the host's drift alone would have read as missed work.
    from kernelcast.kernels.harness.window_checks import _check_timed
    from kernelcast.kernels.harness.timing import Timing

    anchored, here = Timing(12.2, 1.0, 20), Timing(52.5, 4.0, 20, paired_ratio=0.235)
    _check_timed("c", anchored, here, traced_us=40.0, floor_us=1.0)
    with pytest.raises(Rejected, match="timed at 20.0 us, but one traced call's work"):
        _check_timed("c", anchored, Timing(20.0, 1.0, 20), traced_us=40.0, floor_us=1.0)  # the timer missed work
    with pytest.raises(Rejected, match="below the case's floor"):
        _check_timed("c", anchored, here, traced_us=None, floor_us=20.0)  # the reported figure meets the floor


def test_a_host_bound_call_on_two_streams_is_held_to_its_device_work_not_its_traced_span():
    # KernelBench level3/35 (LSTM) on an H100, 2026-11-27: its reference timed at 38 ms, one traced call 75 ms
    # from first kernel to last; the profiled host launched slowly and the device idled between kernels. Here:
    # 40 small kernels on two streams, 20 us each, 1.8 ms apart: 0.8 ms of work over a 72 ms span
    acts = [_mark(7, 0)] + [Activity(f"k{i}", 7 if i % 2 else 21, 2000 + i * 1_800_000, 22_000 + i * 1_800_000)
                            for i in range(40)] + [_mark(7, 72_100_000)]
    assert verify.outside_window(acts) is None
    assert verify.traced_busy_us(acts) == pytest.approx(800.0)
    verify.check_traced_work("lstm", runtime_us=38_058.8, traced_us=verify.traced_busy_us(acts))
    span = (acts[-2].end_ns - acts[0].end_ns) / 1e3  # what the check weighed before: a false rejection
    with pytest.raises(Rejected):
        verify.check_traced_work("lstm", runtime_us=38_058.8, traced_us=span)


def test_a_runtime_below_the_floor_is_impossible():
    verify.check_physics("big", runtime_us=100.0, floor=80.0)
    with pytest.raises(Rejected, match="impossible"):
        verify.check_physics("big", runtime_us=10.0, floor=80.0)


def test_the_floor_counts_a_template_ops_inputs_and_the_outputs_beyond_the_l2():
    op = get_operation("softmax")
    case = op.cases[-1]
    no_l2 = verify.floor_bytes(op, case, l2_bytes=0)
    assert no_l2 == op.bytes_moved(case)
    assert verify.floor_bytes(op, case, l2_bytes=1 << 40) < no_l2
    assert verify.floor_us(op, case, peak_bandwidth_gbps=3350.0, peak_tflops=None) == pytest.approx(no_l2 / 3.35e6)


def test_replacing_a_timing_function_breaks_the_fingerprint():
    before = verify.harness_fingerprint()
    verify.check_integrity(before, "case a")
    saved = timing._quantile
    try:
        timing._quantile = lambda values, q: 0.0
        with pytest.raises(Rejected, match="_quantile"):
            verify.check_integrity(before, "case a")
    finally:
        timing._quantile = saved
    saved_code = timing.fastest.__code__
    try:
        timing.fastest.__code__ = (lambda timings: timings[0]).__code__
        with pytest.raises(Rejected, match="fastest"):
            verify.check_integrity(before, "case a")
    finally:
        timing.fastest.__code__ = saved_code
    import os

    saved_listdir = os.listdir  # what the host clock counts the candidate's threads and processes with
    try:
        os.listdir = lambda path=".": []
        with pytest.raises(Rejected, match="os.listdir"):
            verify.check_integrity(before, "case a")
    finally:
        os.listdir = saved_listdir
    verify.check_integrity(before, "case a")


def test_a_tensor_subclass_output_is_refused():
    class Lazy(torch.Tensor):
        pass

    plain_tensors((torch.zeros(2), torch.nn.Parameter(torch.zeros(2))))
    with pytest.raises(Rejected, match="not a plain tensor"):
        plain_tensors((torch.zeros(2).as_subclass(Lazy),))


SANITIZER_REPORT = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 16 bytes
=========     at _relu2p1+0x2a0 in /tmp/cand/candidate.py:22
=========     by thread (31,0,0) in block (32767,0,0)
=========     Address 0x7f3a00000010 is out of bounds
=========     and is 13 bytes after the nearest allocation at 0x7f3980000000 of size 134217724 bytes
=========
========= ERROR SUMMARY: 4 errors
"""


def test_a_sanitizer_report_names_the_kernel_the_access_and_the_buffer():
    found = memcheck.describe(SANITIZER_REPORT, [{"name": "output 0", "ptr": 0x7f3980000000}])
    assert "out-of-bounds write of 16 bytes" in found
    assert "_relu2p1" in found and "13 bytes after the end of output 0" in found
    assert memcheck.describe("========= ERROR SUMMARY: 0 errors\n", []) is None


def test_memcheck_applies_to_imported_candidates_but_not_to_references():
    assert memcheck.applies("auto", imported=True, is_reference=False)
    assert not memcheck.applies("auto", imported=False, is_reference=False)
    assert not memcheck.applies("all", imported=True, is_reference=True)
    assert not memcheck.applies("off", imported=True, is_reference=False)


def test_precision_classes_follow_the_size_of_the_error():
    assert precision.class_of(1e-7) == "float32"
    assert precision.class_of(3e-4) == "tf32/fp16"
    assert precision.class_of(4e-3) == "bf16"
    assert precision.class_of(0.1) == precision.LOWEST


def test_a_half_precision_answer_to_a_float32_task_is_flagged_lower():
    op = get_operation("softmax")
    case = op.interpret_cases[0]
    gen = torch.Generator()
    gen.manual_seed(1)
    inputs = op.make_inputs(case, gen, "cpu")
    exact = op.reference(*inputs)
    same = precision.errors(op, case, inputs, exact)
    assert not same["precision"].startswith("lower")
    half = tuple(t.half().float() for t in exact)
    flagged = precision.errors(op, case, inputs, half)
    assert flagged["precision"].startswith("lower") and flagged["error_rel"] > 8 * flagged["reference_error_rel"]


def test_the_formats_timing_protocols_are_known_to_the_worker():
    from kernelcast.kernels.hardware import INTERPRETER
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.records import HardwareSpec

    assert timing.PROTOCOLS == ("kernelcast", "kernelbench", "gpumode")
    assert set(timing.FORMAT_PROTOCOLS) == {"kernelbench", "gpumode"}
    with pytest.raises(ValueError, match="unknown timing protocol 'kb'; known: kernelcast, kernelbench, gpumode"):
        MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="cpu"), WorkerConfig(mode="interpreter",
                                                                                         protocol="kb"))


@pytest.mark.gpu
def test_every_adversarial_kernel_is_caught_or_timed_truthfully():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from benchmarks import adversarial

    rows = adversarial.run()
    wrong = [(r["name"], r["status"], r.get("error", "")[:200]) for r in rows if not r["verdict_right"]]
    assert not wrong, wrong
    for r in rows:  # no kernel accepted is charged less than 0.9 of its work on the device, any stream
        if r["status"] == "ok" and r["name"] != "reference":
            assert r["vs_true_runtime"] >= 0.9, r
    half = next(r for r in rows if r["name"] == "half_precision")
    assert is_lower(half["precision"]), half["precision"]
    assert not math.isnan(half["runtime_us"][0])


def test_a_cheat_is_judged_right_only_when_caught_or_charged_at_least_nine_tenths_of_its_true_runtime():
    from benchmarks.adversarial import verdict_right

    cheat = {"expect": "caught", "status": "ok"}
    assert verdict_right({**cheat, "status": "rejected"})
    assert verdict_right({**cheat, "vs_true_runtime": 1.08})  # its work was all timed
    assert not verdict_right({**cheat, "vs_true_runtime": 0.61})  # hidden_stream on the busy host of 2026-11-26
    assert not verdict_right({**cheat, "vs_true_runtime": 0.89})
    assert verdict_right({**cheat, "vs_true_runtime": 1.2})  # charged more than its work: not a fooled timer
    assert not verdict_right(cheat)  # accepted, and no true runtime to hold it to
    assert verdict_right({"expect": "ok", "status": "ok"}) and not verdict_right({"expect": "ok", "status": "timeout"})


def test_device_busy_time_counts_overlapping_streams_once_and_idle_gaps_not_at_all():
    from kernelcast.kernels.harness.verify import busy_us

    assert busy_us([]) == 0.0
    kernels = [Activity("a", 7, 0, 100_000), Activity("b", 9, 50_000, 150_000),  # overlap: 150 us together
               Activity("c", 7, 400_000, 490_000),  # after 250 us of idle device: 90 us more
               Activity("d", 9, 410_000, 420_000)]  # inside c
    assert busy_us(kernels) == 240.0
    assert busy_us(list(reversed(kernels))) == 240.0


def test_work_that_ran_while_the_timed_stream_was_held_never_waited_for_it():
    gate = Activity("spin_kernel", 7, 0, 2_000_000)
    acts = [gate, Activity("_relu2p1", 17, 400_000, 496_000), _mark(7, 2_000_100), _mark(7, 2_001_200)]
    assert "while the timed stream was held" in verify.outside_window(acts)
    honest = [gate, _mark(7, 2_000_100), Activity("_relu2p1", 13, 2_001_300, 2_090_000), _mark(7, 2_091_000)]
    assert verify.outside_window(honest) is None


def test_a_host_bound_call_is_judged_against_a_call_that_leaves_the_device_idle_before_the_sync():
    # a 45 us call of host work: the device idles before the host synchronises, and the synchronisation's
    # own cost (9 us) is the gap; a paced call's wake-up is shorter (1 us)
    calls = [Window(45.0, 54.0)] * 6
    paced = [Window(45.0, 46.0)] * 6
    idle = [Window(45.0, 53.5)] * 3
    assert "stayed busy" in verify.hidden_work(calls, paced, 0.1)
    assert verify.hidden_work(calls, paced, 0.1, idle) is None
    # work left behind still shows beyond the larger baseline
    assert "stayed busy" in verify.hidden_work([Window(45.0, 95.0)] * 6, paced, 0.1, idle)


def test_a_call_of_seconds_is_verified_and_warmed_with_fewer_calls_and_not_traced_again():
    # linalg/eigh's reference on an H100: 9.7 s a call; its verification alone had held the device 255 s
    assert verify.fresh_calls_for(9.7e6, 3) == 1 and verify.fresh_calls_for(150_000.0, 3) == 3
    assert not timing.warmed_up([12.0], 3, max_seconds=1.0)  # the first call may build and load things
    assert timing.warmed_up([12.0, 9.7], 3, max_seconds=1.0)
    assert not timing.warmed_up([0.3, 0.2], 3, max_seconds=1.0) and timing.warmed_up([0.3, 0.2, 0.2], 3, 1.0)
    # the gate doubles while a doubling can still outlast the host's call, never for a call of seconds
    assert verify.gate_again(host_us=2500.0, gate_us=2000.0, tries_left=3)
    assert not verify.gate_again(host_us=1000.0, gate_us=2000.0, tries_left=3)  # the gate held it
    assert not verify.gate_again(host_us=9.7e6, gate_us=2000.0, tries_left=3)
    assert not verify.gate_again(host_us=2500.0, gate_us=2000.0, tries_left=0)


def test_a_short_gpu_bound_case_gets_windows_until_two_agree_and_a_long_one_a_single_window():
    t = lambda us: timing.Timing(us, 0.1, 20)  # noqa: E731 - a window of this median
    # pmpp/matmul's 256^3 case on a busy host: one window at 36.7 us, the same code elsewhere at 7.7 us
    assert timing.time_again([t(36.7)], host_bound=False, most=5)
    assert timing.time_again([t(36.7), t(7.7)], host_bound=False, most=5)
    assert not timing.time_again([t(36.7), t(7.7), t(7.75)], host_bound=False, most=5)  # three at most
    assert not timing.time_again([t(7.7), t(7.72)], host_bound=False, most=5)  # the two agree
    assert not timing.time_again([t(221.0)], host_bound=False, most=5)  # a long GPU-bound call: its window stands
    assert timing.time_again([t(900.0), t(800.0), t(850.0)], host_bound=True, most=5)
    assert not timing.time_again([t(900.0)] * 5, host_bound=True, most=5)
    # a call of seconds (amd/moe's reference: 8.1-9.6 s, windows 5-15% apart) is one window, host-bound or not
    assert not timing.time_again([t(9.2e6)], host_bound=True, most=5)
    assert not timing.time_again([t(2.1e5)], host_bound=False, most=5)
    assert timing.time_again([t(1.9e5)], host_bound=True, most=5)


def test_a_long_gpu_bound_window_above_its_fastest_verification_call_is_timed_again():
    t = lambda us: timing.Timing(us, 0.1, 20)  # noqa: E731 - a window of this median
    # level1/4's reference on an H200: one window at 2,718 us, its fastest verification call 2,404 us
    assert timing.disturbed([t(2718.0)], 2404.0) and timing.time_again([t(2718.0)], False, 5, fastest_call_us=2404.0)
    # the second window came out near the calls: it stands (the fastest counts)
    assert not timing.time_again([t(2718.0), t(2410.0)], False, 5, fastest_call_us=2404.0)
    # still above them and apart: a third, and no more
    assert timing.time_again([t(2718.0), t(2650.0)], False, 5, fastest_call_us=2404.0)
    assert not timing.time_again([t(2718.0), t(2650.0), t(2600.0)], False, 5, fastest_call_us=2404.0)
    # two windows that agree above the calls are the case's own time (level1/97 on an H200: 24.7-25.1 ms, calls 23.0)
    assert not timing.time_again([t(24739.0), t(24679.0)], False, 5, fastest_call_us=22995.0)
    # within 5% of the calls, or no calls known (no verification), or a call of seconds: one window
    assert not timing.time_again([t(2500.0)], False, 5, fastest_call_us=2404.0)
    assert not timing.time_again([t(2718.0)], False, 5)
    assert not timing.time_again([t(2.5e5)], False, 5, fastest_call_us=1.0e5)
    # a window below its calls (the usual: a median 0.978 of the fastest call) stands
    assert not timing.disturbed([t(2300.0)], 2404.0) and not timing.disturbed([], 2404.0)
