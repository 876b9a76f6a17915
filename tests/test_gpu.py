"""Measurement on a real GPU (skipped without one): timing, speedup, and faults that cost one candidate."""

import pytest

from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import detect
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.spaces import get_space
from tests.kernels_for_tests import candidate

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def results():
    good = get_space("softmax").spread_subset(4)
    bad = [candidate(k) for k in ("illegal_address", "out_of_bounds", "gpu_hang", "segfault", "wrong_values")]
    # The good ones come after the faults, so they prove the worker recovers.
    with MeasureWorker(detect(), WorkerConfig(mode="gpu", concurrency=3, timeout_s=60, gpu_timeout_s=30)) as w:
        out = {m.candidate_id: m for m in w.measure(bad + good)}
    return good, {c.source: c.candidate_id for c in bad}, out


def test_template_variants_are_timed_with_speedup_over_eager(results):
    good, _, out = results
    seed = get_operation("softmax").seed_candidates()[0]
    assert out[seed.candidate_id].status == "ok"
    for c in good:
        m = out[c.candidate_id]
        assert m.status == "ok", m.error
        assert len(m.runtime_us_median) == 3 and all(t > 0 for t in m.runtime_us_median)
        assert m.speedup and m.speedup > 0 and m.gpu_seconds > 0 and m.hardware.sm_count > 0


@pytest.mark.parametrize("kind,statuses", [
    ("illegal_address", {"runtime_error", "crashed"}),
    ("out_of_bounds", {"incorrect"}),
    ("gpu_hang", {"timeout"}),
    ("segfault", {"crashed"}),
    ("wrong_values", {"incorrect"}),
])
def test_gpu_fault_costs_one_candidate(results, kind, statuses):
    _, ids, out = results
    m = out[ids[candidate(kind).source]]
    assert m.status in statuses, m.error
    assert m.error


def test_a_host_bound_call_is_timed_in_several_windows_and_a_gpu_bound_one_in_one():
    import torch

    from kernelcast.kernels.harness.timing import flush_us, l2_flush_buffer, time_call

    flush = l2_flush_buffer()
    head_start = flush_us(flush)
    x = torch.randn(8192, 8192, device="cuda")
    small = torch.randn(64, 64, device="cuda")

    def host_bound(i):  # hundreds of tiny launches: the host outlasts the flush
        a = small
        for _ in range(200):
            a = a * 1.0001

    gpu = time_call(lambda i: torch.softmax(x, dim=1), flush)
    host = time_call(host_bound, flush)
    assert not gpu.host_bound(head_start) and host.host_bound(head_start)
    assert host.host_us_median > head_start > 0


def test_the_formats_timers_time_a_kernel_by_their_own_rules():
    """KernelBench's 100 trials and GPU MODE's adaptive runs, on a 64 MiB copy: a mean near the copy's time,
    the number of runs each rule allows."""
    import torch

    from kernelcast.kernels.harness.timing import l2_flush_buffer, time_gpumode, time_trials

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(16 << 20, device="cuda")
    y = torch.empty_like(x)
    flush = l2_flush_buffer()
    kb, gm = time_trials(lambda i: y.copy_(x), flush), time_gpumode(lambda i: y.copy_(x), flush)
    assert kb.repetitions == 100 and 3 <= gm.repetitions <= 100
    for t in (kb, gm):  # 128 MiB moved: more than 10 us on any GPU, far less than 100 ms
        assert 10 < t.runtime_us_median < 100_000 and t.runtime_us_iqr >= 0
    assert 0.5 < kb.runtime_us_median / gm.runtime_us_median < 2


def test_with_anchor_all_every_case_of_the_null_is_timed_beside_the_reference_and_comes_out_near_one():
    """anchor="all": each case of the null (the reference's own code) is paired with the reference, so the
    drift between the reference's measurement and the null's cancels: 1.00 within a few percent, each case."""
    from kernelcast.kernels.null import null_candidate

    op = get_operation("softmax")
    seed, null = op.seed_candidates()[0], null_candidate(op)
    with MeasureWorker(detect(), WorkerConfig(mode="gpu", concurrency=1, anchor="all")) as w:
        out = {m.candidate_id: m for m in w.measure([seed, null])}
        anchored = {d["case"]: d["ratio"] for cid, _, phase, _, d in w.timeline
                    if cid == null.candidate_id and phase == "anchored"}
    m = out[null.candidate_id]
    assert m.status == "ok", m.error
    assert sorted(anchored) == sorted(c.name for c in op.cases)
    assert all(0.95 < r < 1.05 for r in anchored.values()), anchored
    assert 0.97 < m.speedup < 1.03


def test_one_host_bound_call_timed_against_itself_in_a_pair_comes_out_alike():
    """time_pair of a call with itself: whichever is timed first in a round, the two medians agree. Before each
    round started on an idle device, the second call's launches queued behind the first's and its events saw
    less host time: the null of small problems came out 0-8% slower than the reference."""
    import torch

    from kernelcast.kernels.harness.timing import l2_flush_buffer, time_pair

    x = torch.randn(64, 64, device="cuda")
    flush = l2_flush_buffer()

    def call(i: int) -> None:  # many tiny launches: the host's issuing sets the pace
        y = x
        for _ in range(20):
            y = y * 1.0001 + 0.0001

    ratios, paired = [], []
    for _ in range(3):
        first, second = time_pair(call, call, flush, max_seconds=0.5)
        ratios.append(first.runtime_us_median / second.runtime_us_median)
        paired.append(first.paired_ratio)  # what the harness uses: the median of the per-round ratios
        assert len(first.round_ratios) >= 8 and second.paired_ratio == 0.0
        assert len(first.round_anchor_us) == len(first.round_ratios) and min(first.round_anchor_us) > 0
    assert sorted(ratios)[1] == pytest.approx(1.0, abs=0.03), ratios
    assert sorted(paired)[1] == pytest.approx(1.0, abs=0.03), paired


def test_with_warm_checks_each_child_warms_its_comparisons_before_the_lock_and_the_verdicts_stand():
    """WorkerConfig.warm_checks: a ``warmed_checks`` mark before each child waits for the lock, and the same
    candidates come out ok; the lock breakdown's first-case comparison is what it is meant to shrink."""
    from kernelcast.kernels.harness.sweep_report import lock_breakdown

    good = get_space("layernorm").spread_subset(4)
    with MeasureWorker(detect(), WorkerConfig(mode="gpu", concurrency=3, warm_checks=True)) as w:
        out = {m.candidate_id: m for m in w.measure(good)}
        timeline = list(w.timeline)
    assert all(out[c.candidate_id].status == "ok" for c in good), [out[c.candidate_id].error for c in good]
    for c in good:
        marks = [phase for cid, _, phase, _, _ in timeline if cid == c.candidate_id]
        assert "warmed_checks" in marks and marks.index("warmed_checks") < marks.index("waiting")
    assert lock_breakdown(timeline)["comparison, first case"]["children"] >= len(good)


KB_CHAIN = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """A chain of tiny elementwise launches: the host's issuing sets its pace."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        for _ in range(60):
            x = x * 1.0001 + 0.0001
        return x


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''


def test_a_host_bound_reference_is_measured_in_three_processes_and_keeps_the_fastest_ones_figure(tmp_path):
    from kernelcast.kernels.formats import import_task
    from kernelcast.kernels.harness.rows import REFERENCE_PROCESSES_MARK
    from kernelcast.kernels.null import null_candidate

    (tmp_path / "chain.py").write_text(KB_CHAIN)
    op, _ = import_task("kernelbench", str(tmp_path / "chain.py"), [], name="chain_processes")
    seed, null = op.seed_candidates()[0], null_candidate(op)
    with MeasureWorker(detect(), WorkerConfig(mode="gpu", concurrency=3, reference_processes=3)) as w:
        out = {m.candidate_id: m for m in w.measure([seed, null])}
        lives = {}
        for cid, attempt, phase, t, _ in w.timeline:
            lives.setdefault((cid, attempt), {})[phase] = t
    ref, m = out[seed.candidate_id], out[null.candidate_id]
    assert ref.status == "ok" and m.status == "ok", (ref.error, m.error)
    (said,) = [p for p in ref.checks.split("; ") if p.startswith(REFERENCE_PROCESSES_MARK)]
    assert said.startswith(f"{REFERENCE_PROCESSES_MARK}3 of 3 ok | "), said
    figures = [float(x) for x in said.split(" | ")[1].split()[1].split("/")]
    assert len(figures) == 3 and ref.runtime_us_median[0] == pytest.approx(min(figures), abs=0.05)
    assert {a for cid, a in lives if cid == seed.candidate_id} == {1, 3, 4}
    # the null starts once every process of its reference is done, and is timed beside it: about 1
    last_ref = max(v["ended"] for (cid, _), v in lives.items() if cid == seed.candidate_id)
    assert lives[null.candidate_id, 1]["started"] >= last_ref
    assert 0.9 < m.speedup < 1.1, m.speedup


def test_a_task_imported_into_another_tasks_folder_is_measured_on_the_gpu_by_the_restarted_fork_server(tmp_path,
                                                                                                     monkeypatch):
    """As tests/test_budget.py checks in the interpreter: a fork server started before the tasks folder moved is
    started again, here with GPU children, so a task installed in the new folder is found and timed."""
    from kernelcast.kernels.formats import TASKS_ENV, import_task
    from kernelcast.kernels.null import null_candidate
    from tests.formats_for_tests import KB_RELU

    with MeasureWorker(detect(), WorkerConfig(mode="gpu", concurrency=1)) as w:
        [first] = w.measure(get_operation("row_sum").seed_candidates()[:1])  # the fork server is up
    assert first.status == "ok", first.error
    monkeypatch.setenv(TASKS_ENV, str(tmp_path / "elsewhere"))
    (tmp_path / "relu.py").write_text(KB_RELU)
    op, _ = import_task("kernelbench", str(tmp_path / "relu.py"), name="gpu-moved-tasks")
    with MeasureWorker(detect(), WorkerConfig(mode="gpu", concurrency=1)) as w:
        got = list(w.measure([op.seed_candidates()[0], null_candidate(op)]))
    assert [m.status for m in got] == ["ok", "ok"], [m.error for m in got]
    assert 0.8 < got[1].speedup < 1.25, got[1].speedup
