"""The measurement harness on the CPU: Triton's interpreter checks correctness, children are isolated."""

import os

import pytest

from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.records import Candidate, HardwareSpec
from kernelcast.kernels.spaces import get_space
from tests.kernels_for_tests import candidate

CPU = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")


def measure(cands, **config):
    cfg = WorkerConfig(**{"mode": "interpreter", "concurrency": 2, "timeout_s": 10, "seeds": 1, **config})
    with MeasureWorker(CPU, cfg) as worker:
        return {m.candidate_id: m for m in worker.measure(cands)}


@pytest.fixture(scope="module")
def batch():
    """One batch mixing good template variants with every kind of bad candidate."""
    good = get_space("softmax").spread_subset(3)
    bad = {kind: candidate(kind) for kind in
           ("malformed", "no_launch", "raises", "segfault", "hangs", "wrong_values", "nans", "out_of_bounds")}
    results = measure(good + list(bad.values()))
    return good, bad, results


def test_good_variants_pass_under_the_interpreter_with_no_timing(batch):
    good, _, results = batch
    for c in good:
        m = results[c.candidate_id]
        assert m.status == "ok", m.error
        assert m.mode == "interpreter" and m.runtime_us_median == () and m.speedup is None


@pytest.mark.parametrize("kind,status,words", [
    ("malformed", "compile_error", "syntax error"),
    ("no_launch", "compile_error", "no callable 'launch"),
    ("raises", "runtime_error", "kernel exploded on purpose"),
    ("segfault", "crashed", "SIGSEGV"),
    ("hangs", "timeout", "time limit"),
    ("wrong_values", "incorrect", "out of tolerance"),
    ("nans", "incorrect", "NaN/Inf"),
    ("out_of_bounds", "incorrect", "out-of-bounds write"),
])
def test_bad_candidate_gets_its_status_and_a_clear_message(batch, kind, status, words):
    _, bad, results = batch
    m = results[bad[kind].candidate_id]
    assert m.status == status, m.error
    assert words in m.error


def test_worker_keeps_going_and_loses_no_result(batch):
    good, bad, results = batch
    assert len(results) == len(good) + len(bad)


def test_hang_costs_only_its_own_time_limit():
    results = measure([candidate("hangs")], timeout_s=3)
    (m,) = results.values()
    assert m.status == "timeout" and 3 <= m.wall_seconds < 15


def test_unknown_operation_is_refused_before_any_child_starts():
    bogus = Candidate(op="sofmax", backend="triton", source="def launch(): pass\n", origin="llm")
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter")) as worker:
        with pytest.raises(ValueError, match="unknown operation 'sofmax'; known: softmax"):
            list(worker.measure([bogus]))


def test_candidate_environment_has_no_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "planted-secret")
    monkeypatch.setenv("MY_API_TOKEN", "planted-token")
    from kernelcast.kernels.harness.runner import scrub_environment

    scrub_environment()
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ and "MY_API_TOKEN" not in os.environ


def test_the_fastest_timing_window_counts_with_every_windows_repetitions():
    from kernelcast.kernels.harness.timing import Timing, agree, fastest

    slow, quick = Timing(700.0, 40.0, 20, host_us_median=690.0), Timing(450.0, 10.0, 30, host_us_median=440.0)
    best = fastest([slow, quick, Timing(460.0, 12.0, 25, host_us_median=455.0)])
    assert (best.runtime_us_median, best.runtime_us_iqr, best.host_us_median) == (450.0, 10.0, 440.0)
    assert best.repetitions == 75 and best.windows == 3
    assert quick.host_bound(flush_us=80.0) and not Timing(8.0, 0.1, 20, host_us_median=25.0).host_bound(80.0)
    # pmpp/matmul's reference, 79 us of host time against a 102 us flush: its figure followed the host, so the
    # case is timed beside the reference, though not in more windows
    matmul = Timing(27.9, 1.0, 20, host_us_median=79.0)
    assert matmul.host_sensitive(102.0) and not matmul.host_bound(102.0)
    assert not Timing(27.9, 1.0, 20, host_us_median=55.0).host_sensitive(102.0)
    assert quick.host_sensitive(flush_us=80.0)  # host-bound is host-sensitive
    # windows are added until the two fastest agree within 1%: a slowed window does not hold it up
    assert not agree([slow]) and not agree([slow, quick])
    assert agree([slow, quick, Timing(453.0, 12.0, 25)])


def test_gpumode_protocol_ends_a_benchmark_by_its_own_rule():
    """GPU MODE's eval.py: at least three runs; then stop once the mean's standard error is under 0.1%, or the
    runs add up to the time budget, or the loop has run two minutes."""
    from kernelcast.kernels.harness.timing import gpumode_stop, mean_and_error

    assert mean_and_error([1.0, 2.0, 3.0]) == (2.0, pytest.approx(1.0 / 3 ** 0.5))
    steady = [1000.0] * 3
    assert not gpumode_stop(steady[:2], 0.0)  # two runs never end it
    assert gpumode_stop(steady, 0.0)  # no spread: the error is 0
    noisy = [1000.0, 2000.0, 1500.0]
    assert not gpumode_stop(noisy, 0.0)
    assert gpumode_stop(noisy, 0.0, max_time_ns=4000.0)  # 3 runs of a 1500 ns mean pass 4000 ns
    assert gpumode_stop(noisy, 121e9)  # past two minutes of wall time


def test_a_call_too_slow_for_its_window_gets_fewer_repetitions_five_under_a_second_three_above():
    from kernelcast.kernels.harness.timing import SECONDS_CALL_REPS, SLOW_CALL_REPS, repetitions_for

    assert repetitions_for(20e-6, 20, 1.0) == 20  # a template kernel: all twenty
    assert repetitions_for(0.05, 20, 1.0) == 20  # twenty fit in two windows' time
    assert repetitions_for(0.2, 20, 1.0) == 10
    assert repetitions_for(0.6, 20, 1.0) == SLOW_CALL_REPS == 5  # five, not twenty
    assert repetitions_for(9.2, 20, 1.0) == SECONDS_CALL_REPS == 3  # amd/moe's reference: the median of three
    assert repetitions_for(1.5, 2, 1.0) == 2  # never more than asked for
    assert repetitions_for(0.0, 20, 1.0) == repetitions_for(float("nan"), 20, 1.0) == 20


def test_a_pair_alternates_at_least_eight_times_before_its_median_stands():
    from kernelcast.kernels.harness.timing import PAIR_ROUNDS, round_size_for

    assert round_size_for(1, 20, 10) == 10  # one call: rounds as asked
    assert round_size_for(1, 5, 10) == 5
    assert round_size_for(2, 20, 10) == 2 and 20 // round_size_for(2, 20, 10) >= PAIR_ROUNDS
    assert round_size_for(2, 5, 10) == 1  # a slow pair: one call a round
    assert round_size_for(2, 400, 10) == 10  # never larger than asked


def test_a_pair_of_quick_calls_times_in_rounds_as_long_as_a_window_alone():
    """A pair's rounds each start on an idle device; in rounds of two half of a call's repetitions were a round's
    first (measured: a host-bound reference 1.1-1.6x its windows alone), so a pair of quick calls asks for enough
    repetitions that its rounds are as long as a window's alone, while a pair of slow calls keeps what fits."""
    from kernelcast.kernels.harness.timing import (PAIR_QUICK_CALL_S, PAIR_ROUNDS, pair_repetitions, repetitions_for,
                                        round_size_for)

    quick = pair_repetitions(repetitions_for(50e-6, 20, 1.0), 50e-6, 10)  # a pair of 50 us calls
    assert quick == PAIR_ROUNDS * 10 and round_size_for(2, quick, 10) == 10
    slow = pair_repetitions(repetitions_for(0.04, 20, 1.0), 0.04, 10)  # of 40 ms calls: as before, rounds of two
    assert slow == 20 and round_size_for(2, slow, 10) == 2
    assert pair_repetitions(20, PAIR_QUICK_CALL_S, 10) == 20 and pair_repetitions(20, float("nan"), 10) == 20
    assert pair_repetitions(400, 50e-6, 10) == 400  # never fewer than asked


def test_a_pair_is_judged_round_by_round_so_a_host_that_flips_between_stretches_cancels():
    """Identical code on a host that runs fast (1.0 ms) or slow (1.7 ms) for stretches of rounds: a change that
    falls between the two sides of one turn gives one side an extra slow round, which moves the median over all
    its repetitions to the slow stretch. Round by round, the two sides saw the same host."""
    from kernelcast.kernels.harness.timing import _rounds, _Series, paired_ratio

    # the host turns slow during turn 4: that turn's A round ran after the change, its B round before it
    mine = [[1.7, 1.7] if k >= 4 else [1.0, 1.0] for k in range(9)]
    theirs = [[1.7, 1.7] if k >= 5 else [1.0, 1.0] for k in range(9)]
    a, b = sorted(sum(mine, [])), sorted(sum(theirs, []))
    medians = a[len(a) // 2] / b[len(b) // 2]
    ratio, per_round = paired_ratio(mine, theirs)
    assert medians == pytest.approx(1.7) and ratio == pytest.approx(1.0) and len(per_round) == 9
    # a candidate 1.2x the anchor's cost on the same host comes out 1.2x, whichever stretch each round fell in
    ratio, _ = paired_ratio([[1.2 * t for t in r] for r in theirs], theirs)
    assert ratio == pytest.approx(1.2)
    with pytest.raises(ValueError, match="no round"):
        paired_ratio([[]], [[1.0]])
    # a series' repetitions come back round by round, as they were timed
    series = _Series(lambda i: None)
    series.times_ms, series.round_sizes = [1.0, 2.0, 3.0, 4.0, 5.0], [2, 2, 1]
    assert _rounds(series) == [[1.0, 2.0], [3.0, 4.0], [5.0]]


def test_a_paired_case_takes_the_median_of_round_ratios_and_records_both_estimates():
    from kernelcast.kernels.harness.anchoring import _anchored_timing
    from kernelcast.kernels.harness.timing import Timing

    phases = []
    paired = Timing(1700.0, 5.0, 18, 1600.0, paired_ratio=1.01, round_ratios=(1.0, 1.01, 1.7),
                    round_anchor_us=(1000.0, 990.0, 1001.0))
    got = _anchored_timing("c", paired, Timing(1000.0, 5.0, 18, 900.0), 500.0, lambda *p: phases.append(p))
    assert got.runtime_us_median == pytest.approx(505.0)  # the reference's 500 us times 1.01, not times 1.7
    (name, detail), = phases
    assert name == "anchored" and detail["ratio"] == 1.01 and detail["ratio_of_medians"] == pytest.approx(1.7)
    assert detail["round_ratios"] == [1.0, 1.01, 1.7] and detail["round_reference_us"] == [1000.0, 990.0, 1001.0]
    # a format's timers give no per-round ratio: the ratio of their figures
    got = _anchored_timing("c", Timing(1500.0, 5.0, 100, 0.0), Timing(1000.0, 5.0, 100, 0.0), 500.0, lambda *p: None)
    assert got.runtime_us_median == pytest.approx(750.0)


def test_a_pair_whose_reference_ran_well_past_its_stored_runtime_is_recorded_and_named_in_the_row():
    from kernelcast.kernels.harness.anchoring import ANCHOR_SLOWED, _anchored_timing
    from kernelcast.kernels.harness.timing import Timing
    from kernelcast.kernels.harness.rows import _anchoring, anchored_slowed_in

    slowed = {}
    beside = Timing(28.6, 1.0, 80, 62.8, paired_ratio=0.53)
    _anchored_timing("a", beside, Timing(64.3, 1.0, 80, 0.0), 21.6, lambda *p: None, slowed)
    _anchored_timing("b", beside, Timing(1.2 * 21.6, 1.0, 80, 0.0), 21.6, lambda *p: None, slowed)  # under 1.25x
    _anchored_timing("c", beside, Timing(64.3, 1.0, 80, 0.0), 21.6, lambda *p: None)  # no record asked
    assert ANCHOR_SLOWED == 1.25 and slowed == {"a": (64.3, 21.6)}
    checks = "; ".join(_anchoring({"anchored_cases": ["a", "b"], "anchored_slowed": slowed}))
    assert checks == "anchored: a, b; anchored beside a slowed reference: a 64.3/21.6 us"
    assert anchored_slowed_in(checks) == {"a": pytest.approx(64.3 / 21.6, rel=1e-3)}
    assert anchored_slowed_in("anchored: a, b") == {} and anchored_slowed_in("") == {}
    assert _anchoring({"anchored_cases": []}) == ["anchored: none"]


def test_warming_the_checks_runs_their_comparisons_on_four_elements_per_output_dtype_and_makes_no_case_data():
    """``warm_comparisons`` (WorkerConfig.warm_checks) touches nothing bigger than four elements, warms each output
    dtype of the cases once, skips a dtype the comparisons cannot take, and the config reaches the child's job."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from kernelcast.kernels.harness.anticheat import warm_comparisons
    from kernelcast.kernels.ops import get_operation

    class Largest(TorchDispatchMode):
        bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.bytes = max(Largest.bytes, t.numel() * t.element_size())
            return out

    for name in ("softmax", "layernorm", "matmul", "cross_entropy"):
        op = get_operation(name)
        dtypes = {str(d) for case in op.cases for _, d in op.output_specs(case)}
        with Largest():
            assert warm_comparisons(op, op.cases, "cpu") == len(dtypes) >= 1
        assert 0 < Largest.bytes <= 4 * 8  # four elements, in float64 at the most

    class Unjudged:  # outputs of a dtype the tolerance does not know
        def output_specs(self, case):
            return [((3,), torch.float32), ((3,), torch.complex64)]

        def tolerance(self, dtype):
            if dtype.is_complex:
                raise ValueError("no tolerance for complex outputs")
            return 1e-5, 1e-5

    case = get_operation("softmax").cases[0]
    assert warm_comparisons(Unjudged(), [case], "cpu") == 1

    from kernelcast.kernels.harness.runner import Job
    from kernelcast.kernels.harness.worker import WorkerConfig

    assert WorkerConfig().warm_checks is False and Job.__dataclass_fields__["warm_checks"].default is False


def test_an_imported_task_declaring_no_outputs_is_warmed_by_its_inputs_dtypes(tmp_path, monkeypatch):
    """A KernelBench task's candidates return their outputs, so it declares none: its inputs' dtypes, made on the
    meta device, stand for them, and still nothing larger than four elements is touched."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from kernelcast.kernels.formats import import_task
    from kernelcast.kernels.harness.anticheat import warm_comparisons
    from tests.formats_for_tests import KB_ROW_SUM, write_kernelbench

    monkeypatch.setenv("KERNELCAST_TASKS", str(tmp_path / "installed"))
    problem, _ = write_kernelbench(tmp_path, KB_ROW_SUM)
    op, _ = import_task("kernelbench", str(problem))
    assert all(op.output_specs(case) == () for case in op.cases)

    class Largest(TorchDispatchMode):
        bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    Largest.bytes = max(Largest.bytes, t.numel() * t.element_size())
            return out

    with Largest():
        assert warm_comparisons(op, op.cases, "cpu") == 1
    assert 0 < Largest.bytes <= 4 * 8
