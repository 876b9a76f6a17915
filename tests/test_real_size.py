"""Tasks at their real sizes: imported without allocating, output buffers writable, the null candidate correct."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.formats_for_tests import write_gpumode, write_kernelbench

from kernelcast.kernels.formats import import_task, submission_of
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.null import NULL_MARK, null_candidate
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import HardwareSpec

CPU = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")
REPO = Path(__file__).resolve().parents[1]
SHARED_TASKS = REPO.parent / "shared" / "tasks"

# KernelBench's ReLU at its shipped size: a 6 GiB input, a 6 GiB output.
KB_HUGE_RELU = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """ReLU of a large matrix."""

        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x)


    batch_size = 4096
    dim = 393216


    def get_inputs():
        return [torch.rand(batch_size, dim)]


    def get_init_inputs():
        return []
    ''')

KB_MLP = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.fc = nn.Linear(n_in, n_out)

        def forward(self, x):
            return torch.relu(self.fc(x))


    batch_size = 128
    n_in = 16384
    n_out = 8192


    def get_inputs():
        return [torch.randn(batch_size, n_in)]


    def get_init_inputs():
        return [n_in, n_out]
    ''')

# GPU MODE's vector addition as the task ships it: inputs made on CUDA with the task's own generator,
# and the output buffer carried in ``data``, written by the reference (and by a submission).
GPUMODE_ADD_INTO = textwrap.dedent('''
    import torch
    from task import input_t, output_t


    def generate_input(size: int, seed: int) -> input_t:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        a = torch.randn(size, size, device="cuda", dtype=torch.float16, generator=gen).contiguous()
        b = torch.randn(size, size, device="cuda", dtype=torch.float16, generator=gen).contiguous()
        c = torch.empty(size, size, device="cuda", dtype=torch.float16)
        return a, b, c


    def ref_kernel(data: input_t) -> output_t:
        a, b, out = data
        out[...] = a + b
        return out


    def check_implementation(data, output):
        expected = ref_kernel(data)
        if not torch.allclose(output.float(), expected.float(), rtol=1e-3, atol=1e-3):
            return False, "the sum differs from a + b"
        return True, ""
    ''')

GPUMODE_ADD_INTO_SPECS = textwrap.dedent('''
    description: |
      fp16 matrix addition into a buffer the task allocates.
    tests:
      - {"size": 31, "seed": 1}
      - {"size": 64, "seed": 2}
    benchmarks:
      - {"size": 16384, "seed": 3}
    ''')

ADD_INTO_SUBMISSION = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _add(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


    def custom_kernel(data):
        a, b, c = data
        _add[(triton.cdiv(a.numel(), 256),)](a, b, c, a.numel(), BLOCK=256)
        return c
    ''')

# Right answer, but computed in place in the input a (read-only) before copying to the buffer.
ADD_INTO_MUTATES_INPUT = textwrap.dedent('''
    def custom_kernel(data):
        a, b, c = data
        a.add_(b)
        c.copy_(a)
        return c
    ''')


def _measure(cands, **config):
    cfg = WorkerConfig(**{"mode": "interpreter", "concurrency": 2, "seeds": 2, "timeout_s": 60, **config})
    with MeasureWorker(CPU, cfg) as worker:
        return {m.candidate_id: m for m in worker.measure(cands)}


def _import_in_fresh_process(args: dict, tasks_dir: Path) -> dict:
    """Import in a new process; report the manifest's cases, the seconds taken and the peak resident memory."""
    script = textwrap.dedent(f'''
        import json, resource, time
        t0 = time.perf_counter()
        from kernelcast.kernels.formats import import_task
        t1 = time.perf_counter()
        op, _ = import_task(**{args!r})
        seconds = time.perf_counter() - t1
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        try:  # Linux keeps ru_maxrss across exec: the parent's size at fork; VmHWM is this process's own
            with open("/proc/self/status") as f:
                peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration):
            pass
        print(json.dumps({{"cases": [op.info(c) for c in op.cases], "seconds": seconds, "peak_rss": peak}}))
        ''')
    env = {**os.environ, "PYTHONPATH": str(REPO), "KERNELCAST_TASKS": str(tasks_dir)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- imports at real size ----------------------------------------------------------------------------------


def test_a_kernelbench_problem_of_gigabytes_imports_without_allocating_its_inputs(tmp_path):
    ref, _ = write_kernelbench(tmp_path / "relu", reference=KB_HUGE_RELU)
    report = _import_in_fresh_process({"fmt": "kernelbench", "reference": str(ref), "name": "huge_relu"},
                                      tmp_path / "tasks")
    (case,) = report["cases"]
    assert case["bytes"] == 2 * 4096 * 393216 * 4  # 12 GiB of input and output, found on the meta device
    assert report["peak_rss"] < 2 << 30 and report["seconds"] < 60


def test_a_gpumode_task_that_makes_gigabytes_on_cuda_imports_on_a_machine_without_one(tmp_path):
    ref, _ = write_gpumode(tmp_path / "add_into", reference=GPUMODE_ADD_INTO, specs=GPUMODE_ADD_INTO_SPECS)
    report = _import_in_fresh_process({"fmt": "gpumode", "reference": str(ref), "name": "add_into_big"},
                                      tmp_path / "tasks")
    (case,) = report["cases"]
    assert case["bytes"] == 3 * 16384 * 16384 * 2  # a, b and the buffer; the output is the buffer
    assert case["writable"] == [2] and case["signature"][2] == [[16384, 16384], "torch.float16"]
    assert report["peak_rss"] < 2 << 30


def test_a_kernelbench_models_parameters_are_counted_in_its_footprint(tmp_path):
    from kernelcast.kernels.harness.budget import footprint

    ref, _ = write_kernelbench(tmp_path / "mlp", reference=KB_MLP)
    op, _ = import_task("kernelbench", str(ref), name="mlp_params")
    fp = footprint(op, op.cases[0])
    assert op.parameter_bytes(op.cases[0]) == (16384 * 8192 + 8192) * 4 == fp.parameter_bytes
    assert fp.input_bytes == 128 * 16384 * 4 and fp.output_bytes == 128 * 8192 * 4


# ---- output buffers in data ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def add_into(tmp_path_factory):
    folder = tmp_path_factory.mktemp("add_into")
    ref, subs = write_gpumode(folder, reference=GPUMODE_ADD_INTO, specs=GPUMODE_ADD_INTO_SPECS,
                              good=ADD_INTO_SUBMISSION, mutates=ADD_INTO_MUTATES_INPUT)
    return import_task("gpumode", str(ref), [str(s) for s in subs], name="add_into")


def test_a_gpumode_output_buffer_in_data_is_declared_writable(add_into):
    op, _ = add_into
    assert [op.writable_inputs(c) for c in op.interpret_cases] == [(2,), (2,)]


def test_a_task_writing_its_output_buffer_is_measured_and_its_inputs_stay_read_only(add_into):
    op, (good, mutates) = add_into
    reference, null = op.seed_candidates()[0], null_candidate(op)
    found = _measure([reference, null, good, mutates])
    for c in (reference, null, good):
        assert found[c.candidate_id].status == "ok", found[c.candidate_id].error
    assert found[mutates.candidate_id].status == "rejected"
    assert "changed its input 0" in found[mutates.candidate_id].error


# GPU MODE's prefixsum: data carries an empty output buffer that the reference leaves alone (it returns a new
# tensor). The buffer's garbage cannot be made again, so it must not be held to "unchanged".
GPUMODE_RETURNS_NEW = textwrap.dedent('''
    import torch
    from task import input_t, output_t


    def generate_input(size: int, seed: int) -> input_t:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        x = torch.randn(size, device="cuda", dtype=torch.float32, generator=gen).contiguous()
        y = torch.empty(size, device="cuda", dtype=torch.float32).contiguous()
        return x, y


    def ref_kernel(data: input_t) -> output_t:
        data, output = data
        output = torch.cumsum(data.to(torch.float64), dim=0).to(torch.float64)
        return output


    def check_implementation(data, output):
        expected = ref_kernel(data)
        if not torch.allclose(output, expected, rtol=1e-4, atol=1e-4):
            return "mismatch"
        return ""
    ''')

GPUMODE_RETURNS_NEW_SPECS = textwrap.dedent('''
    tests:
      - {"size": 1000, "seed": 1}
    benchmarks:
      - {"size": 67108864, "seed": 3}
    ''')


def test_an_empty_buffer_in_data_is_writable_even_where_the_reference_returns_a_new_tensor(tmp_path):
    from kernelcast.kernels.formats.gpumode import Uninitialised
    from kernelcast.kernels.formats.operation import on_device

    ref, _ = write_gpumode(tmp_path / "prefix", reference=GPUMODE_RETURNS_NEW, specs=GPUMODE_RETURNS_NEW_SPECS)
    op, _ = import_task("gpumode", str(ref), name="prefix_new")
    assert {op.writable_inputs(c) for c in (*op.cases, *op.interpret_cases)} == {(1,)}
    with on_device("meta"), Uninitialised() as fresh:  # only unwritten empties count
        written = torch.empty(4)
        written.fill_(0)
        assert fresh.untouched([torch.randn(4), torch.empty(4), written, torch.zeros(4)]) == {1}
    found = _measure([op.seed_candidates()[0], null_candidate(op)])
    assert all(m.status == "ok" for m in found.values()), [m.error for m in found.values()]


# ---- the null candidate -------------------------------------------------------------------------------------


def test_the_null_candidate_is_the_reference_code_under_another_id(add_into):
    op, _ = add_into
    null = null_candidate(op)
    assert null.candidate_id != op.seed_candidates()[0].candidate_id and null.origin == "import"
    assert submission_of(null.source).startswith(op.reference_source.rstrip())
    assert "custom_kernel = ref_kernel" in null.source and NULL_MARK in null.source


def test_null_candidates_pass_through_the_interpreter_for_every_kind_of_op(tmp_path):
    ref, _ = write_kernelbench(tmp_path / "kb", reference=KB_MLP)
    kb, _ = import_task("kernelbench", str(ref), name="mlp_null", interpret_sizes=["batch_size=3,n_in=40,n_out=24"])
    ops = [kb, get_operation("softmax"), get_operation("layernorm")]
    nulls = [null_candidate(op) for op in ops]
    found = _measure(nulls)
    assert [found[n.candidate_id].status for n in nulls] == ["ok"] * 3, [m.error for m in found.values()]
    assert "ModelNew = Model" in nulls[0].source


def test_a_null_candidate_of_a_builtin_op_may_call_the_torch_function_it_replaces_and_no_other_may():
    op = get_operation("softmax")
    null = null_candidate(op)
    other = null.source.replace(NULL_MARK, "# not the null candidate")
    from kernelcast.kernels.records import Candidate

    cheat = Candidate(op="softmax", backend="torch", source=other, origin="import")
    found = _measure([null, cheat])
    assert found[null.candidate_id].status == "ok"
    assert found[cheat.candidate_id].status == "rejected"


# ---- GPU MODE's task.yml without PyYAML -----------------------------------------------------------------------


def test_the_task_yaml_subset_reader_agrees_with_pyyaml_on_the_shared_tasks():
    yaml = pytest.importorskip("yaml")
    from kernelcast.kernels.formats.gpumode import read_task_yaml

    files = sorted((SHARED_TASKS / "gpumode").glob("*/*/task.yml"))
    if not files:
        pytest.skip(f"no GPU MODE tasks under {SHARED_TASKS}")
    for path in files:
        text = path.read_text()
        ours, theirs = read_task_yaml(text), yaml.safe_load(text)
        for key in ("tests", "benchmarks", "description", "files"):
            assert ours.get(key) == theirs.get(key), (path, key)


def test_the_task_yaml_subset_reader_refuses_what_it_does_not_know():
    from kernelcast.kernels.formats.gpumode import read_task_yaml

    assert read_task_yaml('tests: [{size: 127, seed: 4242}]\n') == {"tests": [{"size": 127, "seed": 4242}]}
    with pytest.raises(ValueError, match="line 1: expected 'key: value'"):
        read_task_yaml("just words\n")



def test_the_import_command_adds_the_null_candidate_when_asked(tmp_path, capsys):
    from kernelcast.flows.cli import main
    from kernelcast.storage.dataset import DataRoot

    ref, _ = write_kernelbench(tmp_path / "kb_cli", reference=KB_MLP)
    data = str(tmp_path / "data")
    assert main(["import", "--format", "kernelbench", "--reference", str(ref), "--name", "mlp_cli", "--null",
                 "--data", data]) == 0
    table = DataRoot(data).read_candidates(op="kb.mlp_cli")
    assert sorted(table["origin"]) == ["import", "seed"]
    (source,) = table[table["origin"] == "import"]["source"]
    assert NULL_MARK in source and "ModelNew = Model" in source
