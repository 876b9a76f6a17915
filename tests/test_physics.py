"""Facts found on the CPU (kernelcast.kernels.facts), the GPU model (kernelcast.kernels.gpumodel) and the physics
forecaster (kernelcast.surrogate.physics): what a kernel makes the device do, without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.formats_for_tests import _src

from kernelcast.kernels.formats import import_task
from kernelcast.kernels.records import HardwareSpec

H100 = HardwareSpec(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", sm_count=132,
                    mem_clock_mhz=2619, bus_width_bits=5120, l2_mib=50.0)

REFERENCE = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return torch.exp(-x * x) + x


    M = 4096
    N = 4096


    def get_inputs():
        return [torch.randn(M, N)]


    def get_init_inputs():
        return []
''')


def _triton(block: int, warps: int, call: str = "tl.exp(-x * x) + x") -> str:
    return _src(f'''
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def _kernel(x_ptr, y_ptr, numel, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < numel
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, {call}, mask=mask)


    class ModelNew(nn.Module):
        def forward(self, x):
            x = x.contiguous()
            y = torch.empty_like(x)
            _kernel[(triton.cdiv(x.numel(), {block}),)](x, y, x.numel(), BLOCK={block}, num_warps={warps})
            return y
''')


COMPILED = _src('''
    import torch
    import torch.nn as nn


    def _math(x):
        return torch.exp(-x * x) + x


    _compiled = torch.compile(_math)


    class ModelNew(nn.Module):
        def forward(self, x):
            return _compiled(x)
''')

GRAPHED = _src('''
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.graph = None

        def forward(self, x):
            if self.graph is None:
                self.static = x.clone()
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.out = torch.exp(-self.static * self.static) + self.static
            self.static.copy_(x)
            self.graph.replay()
            return self.out
''')

MATMUL = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, a, b):
            return a @ b


    def get_inputs():
        return [torch.randn(512, 256), torch.randn(256, 1024)]


    def get_init_inputs():
        return []
''')


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    folder = tmp_path_factory.mktemp("physics")
    (folder / "reference.py").write_text(REFERENCE)
    files = {"b1024": _triton(1024, 4), "b32": _triton(32, 1), "missing": _triton(1024, 4, "tl.fast_bump(x)"),
             "compiled": COMPILED, "graphed": GRAPHED}
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    op, kernels = import_task("kernelbench", str(folder / "reference.py"), [str(folder / f"{n}.py") for n in files],
                              name="physics_bump")
    return op, dict(zip(files, kernels)), folder


def _requests(op, kernels):
    from kernelcast.surrogate.forecast import ForecastRequest

    reference = op.seed_candidates()[0]
    return [ForecastRequest(reference, k, op.name, H100, case_names=tuple(c.name for c in op.cases)) for k in kernels]


def test_triton_kernel_is_compiled_for_the_target_with_its_resources_and_grid(task):
    from kernelcast.kernels.facts import extract

    op, kernels, _ = task
    facts = extract(op, kernels["b1024"], op.cases[0], "cuda:90")
    assert facts.status == "ok", facts.error
    (launch,) = facts.triton
    assert launch.programs == 4096 * 4096 // 1024
    assert launch.num_warps == 4 and launch.registers > 0
    assert launch.load_bits == 128  # 8 fp32 per thread: vectorised loads
    assert launch.arg_bytes == 2 * 4096 * 4096 * 4


def test_reference_operators_are_counted_with_bytes_and_no_triton(task):
    from kernelcast.kernels.facts import extract

    op, _, _ = task
    facts = extract(op, op.seed_candidates()[0], op.cases[0], "cuda:90")
    names = [o.name for o in facts.aten]
    assert names.count("mul") == 1 and "exp" in names and "add" in names and not facts.triton
    assert all(o.bytes >= 2 * 4096 * 4096 * 4 for o in facts.aten)


def test_two_triton_kernels_differing_only_in_block_get_distinct_forecasts(task):
    from kernelcast.surrogate.physics import PhysicsForecaster

    op, kernels, _ = task
    big, small = PhysicsForecaster().fit(None).forecast(_requests(op, [kernels["b1024"], kernels["b32"]]))
    assert big.expected_speedup > 1.5 * small.expected_speedup
    assert big.probabilities != small.probabilities


def test_a_kernel_calling_a_triton_function_that_does_not_exist_is_forecast_to_fail(task):
    from kernelcast.surrogate.physics import PhysicsForecaster

    op, kernels, _ = task
    missing, fine = PhysicsForecaster().fit(None).forecast(_requests(op, [kernels["missing"], kernels["b1024"]]))
    assert missing.failure_probability >= 0.95
    assert fine.failure_probability < 0.5


def test_torch_compile_and_cuda_graphs_are_recognised_and_their_operators_counted(task):
    from kernelcast.kernels.facts import extract

    op, kernels, _ = task
    compiled = extract(op, kernels["compiled"], op.cases[0], "cuda:90")
    graphed = extract(op, kernels["graphed"], op.cases[0], "cuda:90")
    assert compiled.status == "ok" and compiled.compiled and len(compiled.aten) >= 3
    assert graphed.status == "ok" and graphed.graphed
    # the steady state: the input copied in and the captured operators replayed, not the capture itself
    assert [o.name for o in graphed.aten][0] == "copy" and len(graphed.aten) == 1 + 4


def test_matmul_flops_come_from_torch_flop_counter_and_run_on_cublas(tmp_path):
    from kernelcast.kernels.facts import extract

    (tmp_path / "reference.py").write_text(MATMUL)
    op, _ = import_task("kernelbench", str(tmp_path / "reference.py"), [], name="physics_mm")
    facts = extract(op, op.seed_candidates()[0], op.cases[0], "cuda:90")
    assert facts.flops == 2 * 512 * 256 * 1024
    assert facts.libraries() == {"cublas": 1}


def test_occupancy_falls_with_registers_and_latency_bounds_tiny_blocks():
    from kernelcast.kernels.facts import TritonLaunch
    from kernelcast.kernels.gpumodel import gpu_model, occupancy, triton_time

    gpu = gpu_model("h100")
    lean = TritonLaunch("k", 100000, 4, 1, 32, 0, 0, 128, 2, 1, False, 1 << 28)
    heavy = TritonLaunch("k", 100000, 4, 1, 255, 0, 0, 128, 2, 1, False, 1 << 28)
    assert occupancy(lean, gpu) == 16 and occupancy(heavy, gpu) == 2
    tiny = TritonLaunch("k", (1 << 26) // 32, 1, 1, 16, 0, 0, 32, 1, 1, False, 1 << 28)
    assert triton_time(tiny, gpu, 0.0, "float32")[1] == "latency"
    assert triton_time(lean, gpu, 0.0, "float32")[0] < triton_time(tiny, gpu, 0.0, "float32")[0]


def test_forecast_command_prints_why(task, tmp_path, capsys):
    from kernelcast.flows.cli import main

    op, _, folder = task
    files = [str(folder / "b1024.py"), str(folder / "b32.py")]
    code = main(["forecast", "--op", op.name, "--surrogate", "physics", "--data", str(tmp_path / "data"), *files])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("why:") == 2 and "launches" in out and "registers" in out and "-bound" in out


def test_language_model_prompt_carries_the_facts_beside_the_code_only_when_asked(task):
    from kernelcast.surrogate.llm import build_messages
    from kernelcast.surrogate.physics import request_facts, why

    op, kernels, _ = task
    (request,) = _requests(op, [kernels["b32"]])
    facts = why(request_facts(request))
    plain, with_facts = build_messages(request)[1]["content"], build_messages(request, facts)[1]["content"]
    assert "What the candidate makes the device do" not in plain
    section = with_facts.index("What the candidate makes the device do")
    assert with_facts.index(kernels["b32"].source.strip()[:60]) < section < with_facts.rindex("## Hardware")
    assert "latency-bound" in with_facts and with_facts.replace(with_facts[section - 3:with_facts.rindex(
        "## Hardware")], "") == plain


def test_isolated_facts_leave_what_a_candidate_patches_in_its_child(task, tmp_path):
    import torch

    from kernelcast.kernels.facts import extract
    from kernelcast.kernels.records import Candidate

    op, kernels, _ = task
    b1024 = kernels["b1024"]
    patching = Candidate(op=op.name, backend=b1024.backend, origin="import",
                         source=b1024.source + "\ntorch.backends.cudnn.deterministic = True\ntorch.nn.functional.gelu = print\n")
    gelu, deterministic = torch.nn.functional.gelu, torch.backends.cudnn.deterministic
    facts = extract(op, patching, op.cases[0], "cuda:90", isolated=True)
    assert facts.status == "ok" and len(facts.triton) == 1, facts.error
    assert torch.nn.functional.gelu is gelu and torch.backends.cudnn.deterministic == deterministic


def test_a_kernel_needing_more_shared_memory_than_the_target_has_is_a_failure_found_without_a_gpu():
    from kernelcast.kernels.facts import TritonLaunch, _over_limits

    huge = TritonLaunch("k", 132, 4, 4, 64, 300 * 1024, 0, 128, 2, 1, True, 1 << 20)
    fits = TritonLaunch("k", 132, 4, 4, 64, 100 * 1024, 0, 128, 2, 1, True, 1 << 20)
    assert "shared memory" in _over_limits(huge, "cuda:90") and not _over_limits(fits, "cuda:90")
    assert _over_limits(fits, "cuda:86")  # 100 KiB is over a consumer part's 99 KiB


def test_zero_shot_set_is_what_its_generator_writes_with_a_sealed_third(tmp_path):
    import json
    import math

    from benchmarks import zeroshot_tasks

    written = zeroshot_tasks.write(tmp_path)
    committed = Path(zeroshot_tasks.__file__).parent / "zeroshot"
    assert json.loads((committed / "manifest.json").read_text()) == json.loads(json.dumps(written))
    for problem in written["problems"]:
        for name in ["reference", *problem["kernels"]]:
            assert (committed / problem["name"] / f"{name}.py").read_text() == \
                (tmp_path / problem["name"] / f"{name}.py").read_text()
    assert len(written["problems"]) >= 30 and all(len(p["kernels"]) >= 4 for p in written["problems"])
    assert sum(p["sealed"] for p in written["problems"]) == math.ceil(len(written["problems"]) / 3)
