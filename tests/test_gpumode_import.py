"""GPU MODE tasks of shapes the first imported ones did not have: each imports and its reference passes its own
check in interpreter mode, or is refused before any device work with the reason named.

Each small task here reproduces one shape met in GPU MODE's reference-kernels (bioml, linalg, amd folders):
inputs drawn from a torch distribution, a task that names the CPU when no GPU is visible, named tuples,
dicts and numbers in the result, None in the data, data holding objects, a reference too slow for the
interpreter, a case too large for the interpreter's address space.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

import tests.formats_for_tests  # noqa: F401 - sets the tasks directory before any fork server starts

from kernelcast.kernels.formats import TaskFormatError, import_task, tasks_dir
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.null import null_candidate
from kernelcast.kernels.records import HardwareSpec

TASK_PY = "import torch\ninput_t = object\noutput_t = object\n"


def _task(folder, name: str, reference: str, tests: list[dict], benchmarks: list[dict] | None = None):
    """Import a GPU MODE-style task folder written from ``reference`` and the specs."""
    folder = folder / name
    folder.mkdir(parents=True)
    (folder / "task.py").write_text(TASK_PY)
    (folder / "reference.py").write_text(textwrap.dedent(reference))
    lines = ["tests:"] + [f"  - {json.dumps(t)}" for t in tests]
    if benchmarks:
        lines += ["benchmarks:"] + [f"  - {json.dumps(b)}" for b in benchmarks]
    (folder / "task.yml").write_text("\n".join(lines) + "\n")
    op, _ = import_task("gpumode", str(folder / "reference.py"), name=name)
    return op


def _measure(ops, **config):
    """Each op's reference and null candidate measured in interpreter mode: {(op name, role): Measurement}."""
    wanted = {}
    for op in ops:
        wanted[op.seed_candidates()[0].candidate_id] = (op.name, "reference")
        wanted[null_candidate(op).candidate_id] = (op.name, "null")
    settings = {"mode": "interpreter", "concurrency": 2, "seeds": 2, **config}
    with MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter"),
                       WorkerConfig(**settings)) as worker:
        cands = [c for op in ops for c in (op.seed_candidates()[0], null_candidate(op))]
        return {wanted[m.candidate_id]: m for m in worker.measure(cands)}


# Inputs from torch.distributions as GPU MODE's trimul draws its heavy-tailed cases (its parameters are
# checked when the distribution is made, which meta tensors cannot answer), in a tuple with a config dict.
DISTRIBUTION = '''
    import torch

    def generate_input(size: int, seed: int, distribution: str):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        if distribution == "cauchy":
            x = torch.distributions.Cauchy(0, 2).sample((size, 8)).to(device="cuda", dtype=torch.float32)
        else:
            x = torch.randn((size, 8), device="cuda", generator=gen)
        w = torch.randn((8, 4), device="cuda", generator=gen)
        return x, w, {"scale": 0.5}

    def ref_kernel(data):
        x, w, config = data
        return torch.tanh(x) @ w * config["scale"]

    def check_implementation(data, output):
        expected = ref_kernel(data)
        return torch.allclose(output, expected, rtol=1e-5, atol=1e-5), "differs from the reference"
    '''

# A linalg task: the device it names is the CPU when no GPU is visible; its benchmark is far too large to make.
NAMES_THE_CPU = '''
    import torch

    def generate_input(n: int, seed: int):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        a = torch.randn((n, n), device=device, dtype=torch.float32, generator=gen)
        return a @ a.T / n + torch.eye(n, device=device)

    def ref_kernel(data):
        return torch.linalg.cholesky(data)

    def check_implementation(data, output):
        ok = torch.allclose(output @ output.T, data, rtol=1e-4, atol=1e-4)
        return ok, "" if ok else "L @ L.T does not reconstruct A"
    '''

# Results as GPU MODE's qr returns them (torch.geqrf's named tuple) and a dict holding a number; the judge
# asks for the tuple itself and reads the number as a number.
STRUCTURED_RESULT = '''
    import torch

    def generate_input(n: int, seed: int):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        return torch.randn((2, n, n), device="cuda", generator=gen)

    def ref_kernel(data):
        return torch.geqrf(data), {"rank": int(data.shape[-1]), "trace": data.diagonal(dim1=-2, dim2=-1).sum(-1)}

    def check_implementation(data, output):
        factors, extra = output
        if not isinstance(factors, tuple) or len(factors) != 2:
            return False, "output must be a tuple (H, tau)"
        if not isinstance(extra["rank"], int) or extra["rank"] != data.shape[-1]:
            return False, f"rank must be the int {data.shape[-1]}, got {extra['rank']!r}"
        h, tau = factors
        q = torch.linalg.householder_product(h, tau)
        if not torch.allclose(q @ torch.triu(h), data, rtol=1e-4, atol=1e-4):
            return False, "Q @ R does not reconstruct A"
        return True, ""
    '''

# None in the data (an absent mask, an optional bias), as GPU MODE's attention tasks pass them.
NONE_IN_DATA = '''
    import torch

    def generate_input(size: int, seed: int):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        x = torch.randn((size,), device="cuda", generator=gen)
        return x, None, {"bias": None, "scale": 2.0}

    def ref_kernel(data):
        x, mask, config = data
        assert mask is None and config["bias"] is None
        return x * config["scale"]

    def check_implementation(data, output):
        return torch.allclose(output, ref_kernel(data)), "differs"
    '''

# Data holding a dataclass of weights and a module with a buffer, as GPU MODE's amd/mla-decode passes them.
OBJECTS_IN_DATA = '''
    from dataclasses import dataclass
    import torch

    @dataclass
    class Config:
        heads: int
        weight: torch.Tensor

    class Cache(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.register_buffer("data", torch.zeros(n))

    def generate_input(size: int, seed: int):
        return Config(heads=2, weight=torch.randn(size, device="cuda")), torch.randn(size, device="cuda"), Cache(size)

    def ref_kernel(data):
        config, x, cache = data
        return x * config.weight + cache.data

    def check_implementation(data, output):
        return True, ""
    '''

# A reference that takes far longer than its case's size allows on the second case's real data (as GPU MODE's
# amd/moe does on a CPU: float16 matrix products at a fraction of a GFLOP/s), instant on meta tensors.
SLOW = '''
    import time
    import torch

    def generate_input(size: int, seed: int):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        return torch.randn((size,), device="cuda", generator=gen)

    def ref_kernel(data):
        if data.numel() > 100 and not data.is_meta:
            time.sleep(600)
        return data * 2

    def check_implementation(data, output):
        return torch.allclose(output, data * 2), "differs"
    '''


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The tasks that must pass, imported and measured together (one worker: one fork server)."""
    folder = tmp_path_factory.mktemp("gpumode-shapes")
    ops = {
        "distribution": _task(folder, "distribution", DISTRIBUTION,
                              [{"size": 16, "seed": 1, "distribution": "normal"},
                               {"size": 16, "seed": 2, "distribution": "cauchy"},
                               {"size": 24, "seed": 3, "distribution": "cauchy"}]),
        "names_the_cpu": _task(folder, "names_the_cpu", NAMES_THE_CPU, [{"n": 16, "seed": 1}],
                               [{"n": 200_000, "seed": 2}]),
        "structured": _task(folder, "structured", STRUCTURED_RESULT, [{"n": 8, "seed": 1}, {"n": 12, "seed": 2}]),
        "none_in_data": _task(folder, "none_in_data", NONE_IN_DATA, [{"size": 32, "seed": 1}]),
    }
    return ops, _measure(ops.values())


@pytest.mark.parametrize("task", ["distribution", "names_the_cpu", "structured", "none_in_data"])
def test_the_reference_and_its_null_pass_the_tasks_own_check_in_interpreter_mode(measured, task):
    ops, found = measured
    for role in ("reference", "null"):
        m = found[(ops[task].name, role)]
        assert m.status == "ok", f"{task} {role}: {m.status}: {m.error}"


def test_inputs_drawn_from_a_distribution_keep_the_tasks_calling_convention(measured):
    ops, _ = measured
    op = ops["distribution"]
    rows = [op.info(c) for c in op.interpret_cases]
    assert all(r.get("structure") for r in rows), [r["spec"] for r in rows if not r.get("structure")]
    case = op.interpret_cases[2]
    x, w = op.make_inputs(case, torch.Generator().manual_seed(1), "cpu")
    assert x.shape == (24, 8) and op.check(case, (x, w), (torch.tanh(x) @ w * 0.5,)) is None


def test_a_task_naming_the_cpu_is_still_sized_on_meta_tensors(measured):
    ops, _ = measured
    op = ops["names_the_cpu"]
    (big,) = op.cases
    # 200,000 x 200,000 float32 in and out: found from meta tensors at import, never made on the host
    assert op.info(big)["bytes"] == 2 * 200_000 ** 2 * 4
    assert op.info(big)["signature"] == [[[200_000, 200_000], "torch.float32"]]


def test_named_tuples_dicts_and_numbers_reach_check_implementation_intact(measured):
    ops, _ = measured
    op = ops["structured"]
    case = op.interpret_cases[0]
    (a,) = op.make_inputs(case, torch.Generator().manual_seed(3), "cpu")
    h, tau = torch.geqrf(a)
    trace = a.diagonal(dim1=-2, dim2=-1).sum(-1)
    assert op.check(case, (a,), (h, tau, torch.tensor(8), trace)) is None
    # the candidate's own number is judged, not the reference's
    assert "rank must be the int 8, got 7" in op.check(case, (a,), (h, tau, torch.tensor(7), trace))


def test_data_holding_a_dataclass_or_a_module_is_refused_naming_them(tmp_path):
    with pytest.raises(TaskFormatError) as err:
        _task(tmp_path, "objects", OBJECTS_IN_DATA, [{"size": 8, "seed": 1}])
    text = str(err.value)
    assert "data[0] is Config, a dataclass holding tensors (weight)" in text
    assert "data[2] is Cache, a torch.nn.Module holding tensors (data)" in text


def test_a_slow_reference_times_out_naming_the_phase_and_case(tmp_path):
    op = _task(tmp_path, "slow", SLOW, [{"size": 8, "seed": 1}, {"size": 1000, "seed": 2}])
    slow_case = op.interpret_cases[1].name
    ref = _measure([op], gpu_timeout_s=3.0)[(op.name, "reference")]
    assert ref.status == "timeout"
    assert f"for the first call of case {slow_case}" in ref.error and "the task's reference itself" in ref.error
    assert ref.wall_seconds < 60


def test_a_case_too_large_for_the_interpreters_address_space_is_refused_before_it_is_made(tmp_path):
    op = _task(tmp_path, "huge", NONE_IN_DATA, [{"size": 16, "seed": 1}, {"size": 1 << 30, "seed": 2}])
    ref = _measure([op])[(op.name, "reference")]
    assert ref.status == "rejected"
    assert f"case {op.interpret_cases[1].name} does not fit in the interpreter's address-space limit" in ref.error
    assert ref.wall_seconds < 60
    assert (tasks_dir() / op.name / "manifest.json").is_file()


# Input code that reads a value (as eigh's "mixed" cases do with bool(...)): meta tensors cannot run it.
READS_A_VALUE = '''
    import torch

    def generate_input(size: int, seed: int):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        x = torch.randn((size,), device="cuda", generator=gen)
        if bool((x > 0).any()):
            x = x.abs()
        return x, {"scale": 2.0}

    def ref_kernel(data):
        x, config = data
        return x * config["scale"]

    def check_implementation(data, output):
        return torch.allclose(output, ref_kernel(data)), "differs"
    '''


def test_data_whose_structure_meta_tensors_could_not_find_is_named_when_made(tmp_path):
    op = _task(tmp_path, "reads_a_value", READS_A_VALUE, [{"size": 8, "seed": 1}])
    (case,) = op.interpret_cases
    with pytest.raises(TaskFormatError, match=r"case 8-fp32: generate_input\(\*\*\{.*\}\) could not run on meta "
                                              r"tensors at import \(RuntimeError: .*meta"):
        op.make_inputs(case, torch.Generator().manual_seed(1), "cpu")


# A task of GPU MODE's amd_distributed folder: each of world_size processes makes its rank's inputs.
DISTRIBUTED = '''
    import torch

    def generate_input(world_size: int, m: int, seed: int, rank: int):
        g = torch.Generator().manual_seed(seed + rank)
        return torch.randn(m // world_size, 16, generator=g)

    def ref_kernel(data):
        return data * 2

    def check_implementation(data, output):
        return torch.allclose(ref_kernel(data), output), ""
'''


def test_a_distributed_task_is_refused_at_import_naming_its_processes(tmp_path):
    with pytest.raises(TaskFormatError, match="distributed task .*takes a rank.*world_size=8 processes.*one device"):
        _task(tmp_path, "ag_gemm_like", DISTRIBUTED, [{"world_size": 8, "m": 64, "seed": 1}])


# A task of GPU MODE's nvidia folder: a block-scaled FP4 GEMM, which only a compute capability 10.0 GPU runs.
FP4 = '''
    import torch

    def generate_input(m: int, seed: int):
        return torch.randn(m, 16, generator=torch.Generator().manual_seed(seed))

    def ref_kernel(data):
        if data.is_cuda:  # the task's own path: operands viewed as torch.float4_e2m1fn_x2 for torch._scaled_mm
            raise RuntimeError("not reached in these tests")
        return data * 2

    def check_implementation(data, output):
        return torch.allclose(ref_kernel(data), output), ""
'''


def test_a_task_naming_a_newer_gpus_number_format_is_refused_before_running_naming_the_capability(tmp_path):
    from kernelcast.kernels.formats.common import device_requirement, unmet_requirement

    op = _task(tmp_path, "fp4_gemm_like", FP4, [{"m": 32, "seed": 1}])
    assert op.requires["compute_capability"] == "10.0" and op.requires["on_cpu"] is False
    got = _measure([op])
    for role in ("reference", "null"):
        m = got[(op.name, role)]
        assert m.status == "rejected" and "needs a CUDA GPU of compute capability 10.0" in m.error, m.error
    assert "this device is 9.0" in unmet_requirement(op.requires, (9, 0))
    assert unmet_requirement(op.requires, (10, 0)) is None
    fp8 = device_requirement("w = x.to(torch.float8_e4m3fn)")
    assert fp8["compute_capability"] == "8.9" and unmet_requirement(fp8, None) is None  # torch's CPU build runs FP8
    assert device_requirement("torch.float16", "torch.bfloat16") is None
