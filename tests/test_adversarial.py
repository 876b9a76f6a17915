"""The adversarial suite's second problem set (``--suite conv_l2``): cheats of process-wide state, on a convolution
and a weight-bound matmul. What a CPU can check: the problems import, the kernels pass the static scan and compute
the right outputs through the real worker; how a row is judged. Their verdicts on timing need a GPU."""

from __future__ import annotations

import pytest
import torch

from benchmarks import adversarial


def test_the_conv_and_matmul_problems_import_as_kernelbench_operations_with_their_gpu_sizes(tmp_path):
    conv = adversarial.import_problem(tmp_path, adversarial.CONV)
    matmul = adversarial.import_problem(tmp_path, adversarial.MATMUL)
    assert conv.name == "kb.adversarial_conv" and [c.name for c in conv.cases] == ["16x128x64x3x128x128-fp32"]
    assert matmul.name == "kb.adversarial_matmul" and [c.name for c in matmul.cases] == ["128x4096x2048-bf16"]
    assert conv.interpret_cases[0].name != conv.cases[0].name  # scaled down for the interpreter


def test_the_default_suite_is_the_elementwise_one_unchanged():
    assert adversarial.chosen_kernels() == adversarial.SUITE
    assert {a.problem for a in adversarial.SUITE} == {adversarial.ELEMENTWISE}
    assert adversarial.ELEMENTWISE.name == "adversarial"  # its rows keep the op name kb.adversarial


def test_an_unknown_suite_or_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown suite 'conv'; known: elementwise, conv_l2"):
        adversarial.chosen_kernels("conv")
    with pytest.raises(ValueError, match="no kernel honest_fused in suite conv_l2; known: honest_conv"):
        adversarial.chosen_kernels("conv_l2", ["honest_fused"])


def test_every_conv_l2_kernel_computes_right_through_the_worker_in_interpreter_mode():
    rows = adversarial.run(suite="conv_l2", mode="interpreter", seeds=1)
    assert {r["name"] for r in rows} == {a.name for a in adversarial.CONV_L2}
    wrong = [(r["name"], r["status"], r["error"][:300]) for r in rows if r["status"] != "ok"]
    assert not wrong, wrong


def test_a_kernel_that_could_gain_from_process_state_is_right_when_ok_only_at_its_true_speed_and_within_its_cap():
    honest_speed = {"expect": "ok", "status": "ok", "max_speedup": 1.3, "speedup": 1.02, "vs_true_runtime": 1.01}
    assert adversarial.verdict_right(honest_speed)
    assert not adversarial.verdict_right({**honest_speed, "speedup": 5.24})  # cuDNN off beside the reference
    assert not adversarial.verdict_right({**honest_speed, "speedup": 1.51})  # its weight kept in L2
    assert not adversarial.verdict_right({**honest_speed, "vs_true_runtime": 0.66})  # timed below its work
    assert not adversarial.verdict_right({**honest_speed, "speedup": None})  # no reference to hold it to
    assert not adversarial.verdict_right({**honest_speed, "status": "rejected"})  # cuDNN's kernel does honest work


def test_an_l2_cheat_refused_is_right_unless_its_cheat_was_never_set_up():
    cheat = {"expect": "caught", "status": "rejected", "max_speedup": 1.3, "error": "case x: below the floor"}
    assert adversarial.verdict_right(cheat)
    assert not adversarial.verdict_right({**cheat, "status": "runtime_error", "error": "case x: RuntimeError: "
                                          f"{adversarial.CHEAT_FAILED}: cudaStreamSetAttribute: CUDA error 400"})
    assert not adversarial.verdict_right({**cheat, "status": "ok", "speedup": 1.51, "vs_true_runtime": 0.66})
    assert adversarial.verdict_right({**cheat, "status": "ok", "speedup": 1.01, "vs_true_runtime": 1.0})


@pytest.mark.gpu
def test_every_conv_l2_kernel_is_accepted_at_its_honest_speed():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rows = adversarial.run(suite="conv_l2")
    wrong = [(r["name"], r["status"], r.get("speedup"), r.get("vs_true_runtime"), r.get("error", "")[:200])
             for r in rows if not r["verdict_right"]]
    assert not wrong, wrong
