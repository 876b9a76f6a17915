"""Fault injection on the CPU: every interpreter-mode fault kind, interleaved with good candidates, through the worker."""

import pytest

from kernelcast.kernels.harness.anticheat import scan_source
from kernelcast.kernels.harness.faults import FAULTS, faults_for, get_fault, good_candidates
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.ops import OPERATIONS, get_operation
from kernelcast.kernels.records import Candidate, HardwareSpec
from kernelcast.kernels.spaces import get_space

CPU = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")
# Small limits keep the memory and log faults cheap on a shared CI machine, and the two endless
# loops short: each holds its slot until its limit; every other candidate here takes about a second, and
# the limits leave room for a CI machine several times slower.
CONFIG = WorkerConfig(mode="interpreter", concurrency=2, timeout_s=15, gpu_timeout_s=10, seeds=1, address_space_gib=1.5,
                      host_memory_gib=4.0, file_size_mib=16)
INTERPRETER_FAULTS = faults_for("interpreter")


@pytest.fixture(scope="module")
def suite():
    """Good candidates, then every fault each followed by a good one, then good ones again."""
    good = good_candidates(2 + len(INTERPRETER_FAULTS) + 2)
    order = good[:2]
    for i, fault in enumerate(INTERPRETER_FAULTS):
        order += [fault.candidate(), good[2 + i]]
    order += good[-2:]
    with MeasureWorker(CPU, CONFIG) as worker:
        results = {m.candidate_id: m for m in worker.measure(order)}
        stats = worker.stats
    return order, good, results, stats


def test_the_catalogue_covers_the_issue_kinds():
    kinds = {f.kind for f in FAULTS}
    assert len(kinds) >= 12
    assert {"compile_error", "python_exception", "segfault", "illegal_address", "infinite_loop", "gpu_out_of_memory",
            "host_out_of_memory", "nan_output", "wrong_result", "race", "cheat_calls_torch", "cheat_caches_output",
            "cheat_mutates_input", "cheat_returns_view", "cheat_other_stream", "cheat_first_call_only",
            "enormous_output"} <= kinds
    with pytest.raises(ValueError, match="unknown fault kind 'segfalt'; known: compile_error"):
        get_fault("segfalt")


@pytest.mark.parametrize("fault", INTERPRETER_FAULTS, ids=lambda f: f.kind)
def test_fault_gets_its_expected_status_and_cause(suite, fault):
    _, _, results, _ = suite
    m = results[fault.candidate().candidate_id]
    assert m.status == fault.expected_status("interpreter"), m.error
    assert fault.words in m.error.lower(), m.error


def test_good_candidates_interleaved_with_faults_all_come_back_ok(suite):
    _, good, results, _ = suite
    assert [results[c.candidate_id].status for c in good] == ["ok"] * len(good)


def test_no_result_is_lost_and_every_child_is_accounted_for(suite):
    order, _, results, stats = suite
    assert set(results) == {c.candidate_id for c in order}
    assert stats.children == len(order)
    crashed = sum(f.expected_status("interpreter") == "crashed" for f in INTERPRETER_FAULTS)
    timeouts = sum(f.expected_status("interpreter") == "timeout" for f in INTERPRETER_FAULTS)
    assert stats.crashed == crashed and stats.killed == timeouts


def test_error_messages_stay_bounded(suite):
    _, _, results, _ = suite
    assert max(len(m.error) for m in results.values()) < 5000


def test_every_child_entered_the_sandbox(suite):
    order, _, _, stats = suite
    assert sum(stats.sandboxes.values()) == len(order)


def test_cpu_time_limit_stops_a_spinning_child_as_a_timeout():
    cfg = WorkerConfig(mode="interpreter", concurrency=1, timeout_s=60, seeds=1, cpu_seconds=2)
    with MeasureWorker(CPU, cfg) as worker:
        (m,) = worker.measure([get_fault("infinite_loop").candidate()])
    assert m.status == "timeout" and "CPU-time limit of 2 s" in m.error and m.wall_seconds < 30


def test_host_memory_watchdog_kills_a_child_that_has_no_address_space_limit():
    """The GPU-mode guard (no RLIMIT_AS there), checked on the CPU by turning the limit off."""
    cfg = WorkerConfig(mode="interpreter", concurrency=1, timeout_s=60, seeds=1, address_space_gib=None,
                       host_memory_gib=1.5)
    with MeasureWorker(CPU, cfg) as worker:
        (m,) = worker.measure([get_fault("host_out_of_memory").candidate()])
        assert worker.stats.killed == 1
    assert m.status == "runtime_error" and "over its limit of 1.5 GiB" in m.error


def test_eager_baselines_call_torch_and_are_not_rejected():
    seeds = [op.seed_candidates()[0] for op in OPERATIONS.values()]
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", concurrency=2, timeout_s=30, seeds=1)) as worker:
        results = list(worker.measure(seeds))
    assert {m.op: m.status for m in results} == {op: "ok" for op in OPERATIONS}, [m.error for m in results]


def test_no_template_of_any_space_is_refused_by_the_static_scan():
    for name in OPERATIONS:
        for cand in get_space(name).spread_subset(15):
            assert scan_source(cand, get_operation(name)) is None, cand.template


def test_static_scan_ignores_triton_device_code_and_python_builtins():
    source = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N)
    tl.store(y_ptr + offs, tl.softmax(x), mask=offs < N)


def launch(x, out):
    block = max(16, triton.next_power_of_2(x.shape[1]))
    _k[(x.shape[0],)](x, out, x.shape[1], BLOCK=block)
'''
    cand = Candidate(op="softmax", backend="triton", source=source, origin="llm")
    assert scan_source(cand, get_operation("softmax")) is None
    imported = Candidate(op="softmax", backend="triton", origin="llm",
                         source="from torch.nn.functional import softmax as sm\n\ndef launch(x, out):\n"
                                "    return (sm(x, -1),)\n")
    assert "sm (torch's softmax)" in scan_source(imported, get_operation("softmax"))


def test_reliability_report_counts_faults_restarts_and_lost_records():
    from benchmarks.reliability import run

    cfg = WorkerConfig(mode="interpreter", concurrency=2, timeout_s=15, seeds=1, address_space_gib=1.5)
    report = run("interpreter", 1, ["segfault", "cheat_caches_output"], cfg)
    s = report["summary"]
    assert (s["fault_kinds"], s["classified_correctly"], s["records_lost"], s["duplicates"]) == (2, 2, 0, 0)
    assert s["good_ok"] == s["good_total"] == 4 and report["worker"]["crashed"] == 1
    assert s["good_per_min_before"] > 0 and s["good_per_min_after"] > 0


def test_stream_guard_refuses_new_streams_but_lets_the_current_streams_wrapper_through():
    """torch.cuda.current_stream() (which Triton's launcher calls) builds Stream(stream_id=...):
    refusing it would reject every kernel on a GPU. Checked in a fresh interpreter, since the
    guard patches torch.cuda for good."""
    import subprocess
    import sys

    code = """
import torch
from kernelcast.kernels.harness.anticheat import Rejected, install_stream_guard
install_stream_guard()
try:
    torch.cuda.Stream()
except Rejected as exc:
    print("new:", exc)
try:
    torch.cuda.Stream(stream_id=0, device_index=0, device_type=1)
    print("wrapper: allowed")
except Rejected as exc:
    print("wrapper:", exc)
except Exception as exc:  # no CUDA here: torch's own refusal, past the guard
    print("wrapper: allowed, then", type(exc).__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "new: created a CUDA stream (Stream)" in out
    assert "wrapper: allowed" in out
