"""Device memory and time budgets: footprints from meta tensors, refusals that name bytes, rotation sets, limits."""

from __future__ import annotations

import pytest

from kernelcast.kernels.harness import budget
from kernelcast.kernels.harness.budget import GIB, Footprint, limits_for, refusal, rotation_sets
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.null import null_candidate
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import HardwareSpec
from tests.formats_for_tests import KB_RELU  # at collection: the imported tasks' folder, before any fork server starts

CPU = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")


# ---- footprints ---------------------------------------------------------------------------------------


def test_a_footprint_counts_inputs_and_outputs_from_meta_tensors_at_full_size():
    op = get_operation("layernorm")
    case = op.cases[0]  # bf16 8192 x 4096: x, weight, bias in; one (M, N) out
    fp = budget.footprint(op, case)
    m, n = case["M"], case["N"]
    assert fp.input_bytes == 2 * (m * n + 2 * n) and fp.output_bytes == 2 * m * n
    assert fp.check_bytes == 2 * (fp.input_bytes + fp.output_bytes)


def test_every_operation_has_a_footprint_for_every_case():
    from kernelcast.kernels.ops import OPERATIONS

    for name in OPERATIONS:
        op = get_operation(name)
        for case in op.cases + op.interpret_cases:
            fp = budget.footprint(op, case)
            assert fp.input_bytes > 0 and fp.output_bytes > 0, (name, case.name)


# ---- refusal and rotation ------------------------------------------------------------------------------


def test_a_case_that_fits_is_not_refused():
    assert refusal(Footprint("small", 1 * GIB, 1 * GIB), total_bytes=80 * GIB) is None


def test_a_case_too_big_for_the_device_is_refused_naming_the_bytes_it_needs_and_has():
    fp = Footprint("4096x393216-fp32", input_bytes=24 * GIB, output_bytes=24 * GIB, parameter_bytes=GIB // 2)
    message = refusal(fp, total_bytes=80 * GIB)
    assert message.startswith("case 4096x393216-fp32 does not fit on the device")
    assert "needs 97.00 GiB" in message and "has 79.00 GiB usable" in message
    assert "inputs 24.00 GiB" in message and "parameters 0.50 GiB" in message


def test_the_refusal_depends_on_the_device_not_on_what_others_hold_now():
    fp = Footprint("c", 30 * GIB, 0)
    assert refusal(fp, total_bytes=80 * GIB) is None  # whatever is free at the moment
    assert refusal(fp, total_bytes=40 * GIB) is not None


@pytest.mark.parametrize("free, inputs, outputs, sets", [
    (80 * GIB, 1 << 20, 1 << 20, 8),         # small sets: eight, as many as rotation wants
    (80 * GIB, 300 << 20, 300 << 20, 3),     # 1 GiB of inputs in all
    (80 * GIB, 4 * GIB, 4 * GIB, 2),         # big sets: two, when the device holds them
    (10 * GIB, 4 * GIB, 4 * GIB, 1),         # ... one when it does not
    (1 * GIB + (200 << 20), 32 << 20, 32 << 20, 3),  # little free memory beyond the reserve
    (GIB // 2, 1 << 20, 0, 1),               # less than the reserve free: one set
])
def test_rotation_sets_follow_free_memory_and_set_size(free, inputs, outputs, sets):
    assert rotation_sets(free, inputs, outputs) == sets


# ---- limits --------------------------------------------------------------------------------------------


def _limits(case_bytes, reference_us=None, mode="gpu"):
    return limits_for(case_bytes, mode=mode, seeds=3, max_seconds_per_case=1.0, reference_us=reference_us)


def test_the_device_limit_grows_with_case_size():
    small, large, huge = (_limits([n]).device_s for n in (1 << 20, 4 * GIB, 32 * GIB))
    assert 60 <= small < large < huge
    assert huge > 300  # a 32 GiB case may take minutes to make, copy and compare at the floor rate


def test_the_device_limit_grows_with_the_references_runtime():
    unknown = _limits([1 << 20]).device_s
    fast, slow = (_limits([1 << 20], reference_us=[us]).device_s for us in (100.0, 2e6))
    assert unknown <= fast < slow and slow - unknown >= 2.0 * budget.CALLS_PER_CASE * budget.RUNTIME_SLACK * 0.99


def test_limits_are_a_function_of_the_op_alone_so_reference_and_candidate_get_the_same():
    op = get_operation("softmax")
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter")) as worker:
        reference, null = op.seed_candidates()[0], null_candidate(op)
        before = worker.limits(reference.op)
        assert before == worker.limits(null.op)
        worker.reference_us[op.name] = (50e3, 60e3, 70e3)  # once the reference is measured: for both again
        after = worker.limits(op.name)
    assert after.device_s > before.device_s and after.ahead_s == before.ahead_s


def test_a_case_too_big_for_the_device_is_refused_by_the_child_before_any_input_is_made():
    op = get_operation("softmax")
    cands = [op.seed_candidates()[0], null_candidate(op)]
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", concurrency=2, seeds=1, device_memory_gib=1.0)) as w:
        results = list(w.measure(cands))
        timeline = w.timeline
    assert [m.status for m in results] == ["rejected", "rejected"]
    assert all("does not fit on the device" in m.error and "0.00 GiB" in m.error for m in results)
    assert not [phase for _, _, phase, _, _ in timeline if phase in ("locked", "first_inputs")]


def test_the_same_code_gets_the_same_verdict_and_limits_in_the_worker():
    op = get_operation("softmax")
    reference, null = op.seed_candidates()[0], null_candidate(op)
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", concurrency=2, seeds=1)) as worker:
        results = {m.candidate_id: m for m in worker.measure([null, reference])}
        limits = {}  # the last limits each child ran under
        for cid, _, phase, _, detail in worker.timeline:
            if phase in ("started", "limits"):
                limits[cid] = detail
    assert results[reference.candidate_id].status == results[null.candidate_id].status == "ok"
    assert limits[reference.candidate_id] == limits[null.candidate_id]


# ---- out of memory -------------------------------------------------------------------------------------


@pytest.mark.parametrize("error, oom", [
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("RuntimeError: CUDA error: out of memory", True),
    ("RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)", True),
    ("candidate used 40.0 GiB of host memory, over its limit of 32 GiB; killed", False),
    ("MemoryError: ", False),
    ("output 0 differs from the reference", False),
])
def test_device_out_of_memory_is_recognised_from_the_error(error, oom):
    assert budget.is_out_of_memory(error) is oom


SLOW_REFERENCE = '''
import time

import torch
import torch.nn as nn


class Model(nn.Module):
    """Doubles its input, slowly."""

    def forward(self, x):
        time.sleep(0.4)
        return x * 2


batch_size = 4
dim = 8


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''


def test_a_slow_reference_is_not_cut_short_its_limit_grows_with_its_own_calls_and_its_twins_too(tmp_path):
    from kernelcast.kernels.formats import import_task

    path = tmp_path / "slow.py"
    path.write_text(SLOW_REFERENCE)
    op, _ = import_task("kernelbench", str(path), name="slow_double")
    reference, null = op.seed_candidates()[0], null_candidate(op)
    # a base limit shorter than the reference's device phase (four calls of 0.4 s, and their checks)
    cfg = WorkerConfig(mode="interpreter", concurrency=2, seeds=1, gpu_timeout_s=1.0, max_seconds_per_case=0.1)
    with MeasureWorker(CPU, cfg) as worker:
        before = worker.limits(op.name)
        results = {m.candidate_id: m for m in worker.measure([null, reference])}
        after = worker.limits(op.name)
        started = {cid: limits for cid, _, phase, _, limits in worker.timeline if phase == "started"}
    assert results[reference.candidate_id].status == "ok", results[reference.candidate_id].error
    assert results[null.candidate_id].status == "ok", results[null.candidate_id].error
    assert before.device_s < 1.5 and after.device_s > 100  # 400 times the reference's 0.4 s call
    assert started[null.candidate_id] == after  # the twin started after its reference, with its runtime
    (last,) = [d for cid, _, phase, _, d in worker.timeline if phase == "limits" and cid == reference.candidate_id][-1:]
    assert last == after  # and the reference itself ran under the same limits once its calls were seen


def test_a_slow_reference_holds_back_its_own_candidates_only(tmp_path):
    """Each op's candidates start once its own reference is in, not once every reference of the batch is: a
    reference of seconds a call (GPU MODE's linalg/eigh) held a whole sweep chunk's nulls for minutes. Here the slow
    reference's six calls of 1.5 s outlast the quick reference and its null (about a second each) several times."""
    from kernelcast.kernels.formats import import_task

    (tmp_path / "quick.py").write_text(KB_RELU)  # imported where the harness's children look (its fork server)
    (tmp_path / "slow.py").write_text(KB_RELU.replace("        return torch.relu(x)",
                                                      "        import time\n        time.sleep(1.5)\n"
                                                      "        return torch.relu(x)"))
    slow, _ = import_task("kernelbench", str(tmp_path / "slow.py"), name="budget-slowref")
    quick, _ = import_task("kernelbench", str(tmp_path / "quick.py"), name="budget-quickref")
    cands = [slow.seed_candidates()[0], quick.seed_candidates()[0], null_candidate(slow), null_candidate(quick)]
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", concurrency=2, seeds=1)) as worker:
        got = list(worker.measure(cands))
        order = [m.candidate_id for m in got]
        started = {cid: t for cid, _, phase, t, _ in worker.timeline if phase == "started"}
        ended = {cid: t for cid, _, phase, t, _ in worker.timeline if phase == "ended"}
    names = {c.candidate_id: n for c, n in zip(cands, ("slow reference", "quick reference", "slow null", "quick null"))}
    # Started, not finished, before the slow reference ends: the order of results depends on the host's speed, the
    # hold on the quick null does not (it waits for the quick reference alone).
    assert started[cands[3].candidate_id] < ended[cands[0].candidate_id], [names[c] for c in order]
    assert [m.status for m in got] == ["ok"] * 4
    assert started[cands[2].candidate_id] >= ended[cands[0].candidate_id]  # its own reference first, still


def test_a_task_imported_into_another_tasks_folder_is_found_by_the_children(tmp_path, monkeypatch):
    """The harness's children come from a fork server that keeps the environment it started with; one started before
    the tasks folder moved is started again, so the children find a task the caller installed in the new folder."""
    from kernelcast.kernels.formats import TASKS_ENV, import_task

    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", concurrency=1, seeds=1)) as worker:
        [first] = worker.measure(get_operation("row_sum").seed_candidates()[:1])  # the fork server is up
    assert first.status == "ok", first.error
    monkeypatch.setenv(TASKS_ENV, str(tmp_path / "elsewhere"))
    (tmp_path / "relu.py").write_text(KB_RELU)
    op, _ = import_task("kernelbench", str(tmp_path / "relu.py"), name="budget-moved-tasks")
    assert (tmp_path / "elsewhere" / op.name).is_dir()
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", concurrency=1, seeds=1)) as worker:
        got = list(worker.measure([op.seed_candidates()[0], null_candidate(op)]))
    assert [m.status for m in got] == ["ok", "ok"], [m.error for m in got]


def test_checks_share_the_device_only_when_small_known_and_not_autotuning():
    from kernelcast.kernels.harness.budget import SHARED_CHECKS_SHARE, shares_checks

    total = 80 * GIB
    assert shares_checks([64 << 20, 256 << 20], 15, total, "def launch(x, out): ...") is None
    # a case of unknown size (an imported task whose inputs only its own code makes)
    assert "not known" in shares_checks([64 << 20, None], 15, total, "")
    # fifteen children's largest checks past the share of the device
    big = int(SHARED_CHECKS_SHARE * total / 30) + 1
    assert "children would pass" in shares_checks([big], 15, total, "")
    assert shares_checks([big], 14, total, "") is None
    # a first call that benchmarks on the device: another child's kernels would skew its choice
    assert "autotune" in shares_checks([1 << 20], 4, total, "torch.compile(m, mode='max-autotune')")
    assert "autotune" in shares_checks([1 << 20], 4, total, "@triton.autotune(configs=[], key=['n'])")
    assert "cudnn.benchmark" in shares_checks([1 << 20], 4, total, "torch.backends.cudnn.benchmark = True")
    assert "do_bench" in shares_checks([1 << 20], 4, total, "ms = triton.testing.do_bench(lambda: k(x))")


def test_an_execution_variant_that_autotunes_cudnn_holds_the_device_alone_for_its_checks():
    from kernelcast.kernels.harness.budget import shares_checks
    from kernelcast.kernels.variants import variant_source

    model = ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
             "        return torch.relu(x)\n")
    assert shares_checks([1 << 20], 4, 80 * GIB, model) is None
    assert "benchmark on the device" in shares_checks([1 << 20], 4, 80 * GIB, variant_source(model, "cudnn-benchmark"))
    assert shares_checks([1 << 20], 4, 80 * GIB, variant_source(model, "cuda-graph")) is None
    # torch.compile in its default mode too: Inductor times a generated kernel's configs at its first run
    assert "torch.compile" in shares_checks([1 << 20], 4, 80 * GIB, variant_source(model, "compile-default"))


def test_waiting_for_the_lock_alone_after_shared_checks_counts_against_no_limit():
    from types import SimpleNamespace

    from kernelcast.kernels.harness.worker import _Running

    with MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="cpu"),
                       WorkerConfig(mode="interpreter")) as worker:
        limits = budget.Limits(ahead_s=10.0, first_calls_s=5.0, device_s=5.0, call_s=(5.0,))
        cand = null_candidate(get_operation("softmax"))
        r = _Running(cand, SimpleNamespace(), None, "", started=0.0, limits=limits)
        worker._phase(r, "waiting", None, 1.0)
        worker._phase(r, "locked", {"shared": True}, 2.0)
        worker._phase(r, "checks", None, 2.0)
        worker._phase(r, "exclusive_wait", None, 4.0)
        assert worker._over_limit(r, 100.0) is None  # 96 s after its checks began, but waiting
        assert worker._gpu_held(r, 100.0) == pytest.approx(2.0)
        worker._phase(r, "exclusive", {"cpus": [0]}, 100.0)
        assert worker._over_limit(r, 102.0) is None  # 2 s checked + 2 s alone: within 5 s
        assert "past its limit of 5 s" in worker._over_limit(r, 103.5)  # 2 + 3.5 held
        assert worker._gpu_held(r, 103.5) == pytest.approx(5.5)
        assert worker.stats.shared_checks == 1
        # sharing again for the recheck, after a rival took the lock alone in between: that wait counts as nothing
        worker._phase(r, "share_wait", None, 103.0)
        assert worker._over_limit(r, 200.0) is None and worker._gpu_held(r, 200.0) == pytest.approx(5.0)
        worker._phase(r, "shared_again", {"cpus": [1]}, 200.0)
        assert worker._gpu_held(r, 200.5) == pytest.approx(5.5)
        # the lock's holds: checks shared, timing alone, recheck shared again (the wait between them is none)
        worker._phase(r, "releasing", None, 201.0)
        assert worker.holds == [(2.0, 4.0, True), (100.0, 103.0, False), (200.0, 201.0, True)]
