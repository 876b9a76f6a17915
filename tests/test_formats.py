"""KernelBench and GPU MODE tasks imported as operations: resolved by name, measured, forecast; bad files refused."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.formats_for_tests import (GPUMODE_REFERENCE, GPUMODE_SUBMISSION, GPUMODE_WRONG, KB_ROW_SUM,
                                     KB_ROW_SUM_NEW, KB_ROW_SUM_WRONG, write_gpumode, write_kernelbench)

from kernelcast.kernels.formats import TaskFormatError, import_task, stored_task, submission_of, tasks_dir
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import HardwareSpec
from kernelcast.storage.dataset import DataRoot

H100 = HardwareSpec(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", sm_count=132,
                    sm_clock_mhz=1980, mem_clock_mhz=2619, bus_width_bits=5120, memory_gib=79.1, l2_mib=50.0,
                    threads_per_sm=2048)


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    """kb.row_sum with a correct Triton ModelNew and a wrong one, sized down for the interpreter."""
    folder = tmp_path_factory.mktemp("kernelbench")
    ref, cands = write_kernelbench(folder, new=KB_ROW_SUM_NEW, wrong=KB_ROW_SUM_WRONG)
    return import_task("kernelbench", str(ref), [str(c) for c in cands],
                       interpret_sizes=["batch_size=3,dim=300", "batch_size=5,dim=64"])


@pytest.fixture(scope="module")
def gm(tmp_path_factory):
    """gpumode.vadd with a correct Triton submission and a wrong one."""
    folder = tmp_path_factory.mktemp("vadd")
    ref, subs = write_gpumode(folder, good=GPUMODE_SUBMISSION, wrong=GPUMODE_WRONG)
    return import_task("gpumode", str(ref), [str(s) for s in subs], name="vadd")


def _measure(candidates):
    with MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter"),
                       WorkerConfig(mode="interpreter", concurrency=2, seeds=2)) as worker:
        return {m.candidate_id: m for m in worker.measure(candidates)}


# ---------------------------------------------------------------- KernelBench


def test_a_kernelbench_problem_becomes_an_operation_with_its_sizes_as_cases(kb):
    op, candidates = kb
    assert op.name == "kb.row_sum" and get_operation("kb.row_sum") is op
    assert "Sum over the last dimension" in op.summary
    assert [c.name for c in op.cases] == ["64x4096-fp32"]
    assert [c.name for c in op.interpret_cases] == ["3x300-fp32", "5x64-fp32"]
    assert op.bytes_moved(op.cases[0]) == 64 * 4096 * 4 + 64 * 4  # input and the (64,) output
    assert [(c.origin, c.backend) for c in candidates] == [("import", "triton")] * 2
    assert submission_of(candidates[0].source) == KB_ROW_SUM_NEW
    assert "import kernels" not in candidates[0].source and "from kernels" not in candidates[0].source


def test_the_kernelbench_reference_builds_model_with_its_init_inputs(kb):
    op, _ = kb
    gen = torch.Generator().manual_seed(3)
    (x,) = op.make_inputs(op.interpret_cases[0], gen, "cpu")
    assert x.shape == (3, 300)
    (y,) = op.reference(x)
    assert torch.allclose(y, x.sum(-1) * 0.5)


def test_kernelbench_candidates_are_measured_by_the_real_harness(kb):
    op, (good, wrong) = kb
    reference = op.seed_candidates()[0]
    found = _measure([reference, good, wrong])
    assert found[reference.candidate_id].status == "ok", found[reference.candidate_id].error
    assert found[good.candidate_id].status == "ok", found[good.candidate_id].error
    assert found[good.candidate_id].case_names == ("3x300-fp32", "5x64-fp32")
    assert found[wrong.candidate_id].status == "incorrect"
    assert "out of tolerance" in found[wrong.candidate_id].error
    assert "models_built: host" in found[good.candidate_id].checks  # the row says where its models were built


# A model that notes where it was built, with a parameter from the legacy constructor (which ignores the default
# device) initialised by hand, and a plain tensor attribute (neither parameter nor buffer).
_WHERE_BUILT = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.built_on = str(torch.empty(0).device)
        self.weight = nn.Parameter(torch.Tensor(dim, dim))
        nn.init.uniform_(self.weight)
        self.table = torch.arange(dim, dtype=torch.float32)

    def forward(self, x):
        return x @ self.weight + self.table.to(x.device)


batch_size = 4
dim = 8


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from kernelcast.kernels.formats import kernelbench

    path = tmp_path_factory.mktemp("where_built") / "7_WhereBuilt.py"
    path.write_text(_WHERE_BUILT)
    op, _ = import_task("kernelbench", str(path))
    yield op
    op.configure_models("auto", "kernelcast")


@pytest.mark.parametrize("build, protocol, limit, on, table", [
    ("auto", "kernelcast", None, "cpu", "meta"),  # on the CPU as KernelBench does; plain tensors moved too
    ("auto", "kernelbench", None, "cpu", "cpu"),  # KernelBench's eval: only parameters and buffers move
    ("auto", "kernelcast", 0, "meta", "meta"),  # parameters past the limit: built on the device
    ("auto", "kernelbench", 0, "cpu", "cpu"),  # under KernelBench's protocol, always on the CPU
    ("device", "kernelcast", None, "meta", "meta"),
    ("host", "kernelcast", 0, "cpu", "meta"),
])
def test_kernelbench_models_are_built_where_the_setting_says_and_moved(built, monkeypatch, build, protocol, limit,
                                                                       on, table):
    from kernelcast.kernels.formats import kernelbench

    if limit is not None:
        monkeypatch.setattr(kernelbench, "HOST_BUILD_BYTES", limit)
    built.configure_models(build, protocol)
    model = built.build(built.module.Model, built.cases[0], "meta")  # meta stands in for the GPU: no memory
    assert (model.built_on, model.weight.device.type, model.table.device.type) == (on, "meta", table)
    assert not model.training


def test_a_model_that_cannot_be_built_on_the_host_is_built_on_the_device_under_kernelcasts_protocol(built):
    """A class whose ``__init__`` needs the device (a GPU kernel run on its parameters, say) is built there, as
    before, and the setting says why; under KernelBench's protocol it fails as KernelBench's eval would fail it."""
    class NeedsDevice(built.module.Model):
        def __init__(self, dim):
            if torch.empty(0).device.type == "cpu":
                raise RuntimeError("Pointer argument cannot be accessed from Triton (cpu tensor?)")
            super().__init__(dim)

    case = built.cases[0]
    built.configure_models("auto", "kernelcast")
    model = built.build(NeedsDevice, case, "meta")
    assert model.built_on == "meta" and model.weight.device.type == "meta"
    assert built.built_where[(NeedsDevice, case)].startswith("device (not on the host: RuntimeError: Pointer")
    built.build(built.module.Model, case, "meta")
    assert built.built_where[(built.module.Model, case)] == "host"
    built.configure_models("auto", "kernelbench")
    with pytest.raises(RuntimeError, match="Pointer argument"):
        built.build(NeedsDevice, case, "meta")


def test_an_unknown_model_build_is_refused_by_name(built):
    with pytest.raises(ValueError, match="unknown model build 'gpu'; known: auto, host, device"):
        built.configure_models("gpu", "kernelcast")
    with pytest.raises(ValueError, match="unknown model build 'cpu'"):
        MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter"),
                      WorkerConfig(mode="interpreter", model_build="cpu"))


def test_models_built_on_the_host_start_no_thread_after_the_operation_is_configured(built):
    """A measuring child counts the threads started while its checks share the device: torch's own CPU pool, which
    a host build starts, must be running before (``configure_models``), or a reference is refused for it."""
    code = ("import os, torch\n"
            "from kernelcast.kernels.ops import get_operation\n"
            "op = get_operation(%r)\n"
            "threads = lambda: len(os.listdir('/proc/self/task'))\n"
            "op.configure_models('auto', 'kernelcast')\n"
            "before = threads()\n"
            "torch.tril(torch.ones(2048, 2048))\n"  # a mask made in __init__ (MinGPT's): a parallel loop on the host
            "print(before, threads())\n") % built.name
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    assert after == before


def test_a_loaded_candidate_finds_its_models_built_as_the_references_are(built):
    """``prepare`` builds each case's model of a loaded candidate as the reference's is built and puts it where
    the format's launch looks first: the same weights from the same seed, and no second build at its first call."""
    from kernelcast.kernels.harness.correctness import load_launch

    built.configure_models("auto", "kernelcast")
    candidate = built.candidate(built.null_submission())
    launch = load_launch(candidate.source)
    assert built.prepare(launch, candidate.source, "cpu") == "host"
    models = launch.__globals__["_KC_MODELS"]
    assert len(models) == len(built.interpret_cases)
    held = dict(models)
    for case in built.interpret_cases:
        (x,) = built.make_inputs(case, torch.Generator().manual_seed(1), "cpu")
        (got,) = launch(x)
        (want,) = built.reference(x)
        assert torch.equal(got, want)
    assert {k: id(v) for k, v in models.items()} == {k: id(v) for k, v in held.items()}
    # an entry that is a factory rather than a class is built the same way
    factory = built.candidate(built.reference_source + "\n\ndef ModelNew(dim):\n    return Model(dim)\n")
    launch = load_launch(factory.source)
    assert built.prepare(launch, factory.source, "cpu") == "host"
    (x,) = built.make_inputs(built.interpret_cases[0], torch.Generator().manual_seed(1), "cpu")
    assert torch.equal(launch(x)[0], built.reference(x)[0])
    # a launch that is not the format's (no table of models) is left to build as its own code says
    plain = load_launch("def launch(x):\n    return (x,)\n")
    assert built.prepare(plain, "def launch(x):\n    return (x,)\n", "cpu") == ""


# ---------------------------------------------------------------- GPU MODE


def test_a_gpumode_task_becomes_an_operation_with_benchmarks_and_tests_as_cases(gm):
    op, candidates = gm
    assert op.name == "gpumode.vadd" and get_operation("gpumode.vadd") is op
    assert op.summary == "GPU MODE task vadd: Element-wise addition of two fp16 vectors."
    assert [c.name for c in op.cases] == ["4194304-fp16"]
    assert [c.name for c in op.interpret_cases] == ["127-fp16", "1000-fp16"]
    assert sorted(json.loads((tasks_dir() / op.name / "manifest.json").read_text())["files"]) == \
        ["reference.py", "submission_0.py", "submission_1.py", "task.py"]
    assert [c.origin for c in candidates] == ["import", "import"]


def test_gpumode_submissions_are_measured_by_the_real_harness(gm):
    op, (good, wrong) = gm
    reference = op.seed_candidates()[0]
    found = _measure([reference, good, wrong])
    assert found[reference.candidate_id].status == "ok", found[reference.candidate_id].error
    assert found[good.candidate_id].status == "ok", found[good.candidate_id].error
    assert found[wrong.candidate_id].status == "incorrect"
    # the harness judged with the task's own check_implementation: its words are in the error
    assert "custom_kernel's sum differs from a + b" in found[wrong.candidate_id].error


def test_gpumode_correctness_is_the_tasks_own_check_implementation(gm):
    op, _ = gm
    case = op.interpret_cases[0]
    a, b = op.make_inputs(case, torch.Generator().manual_seed(1), "cpu")
    assert op.check(case, (a, b), (a + b,)) is None
    assert op.check(case, (a, b), (a - b,)) == "case 127-fp16: custom_kernel's sum differs from a + b"
    assert "shape (126,)" in op.check(case, (a, b), ((a + b)[:-1],))


def test_each_correctness_seed_gets_fresh_gpumode_inputs(gm):
    op, _ = gm
    case = op.interpret_cases[0]
    first = op.make_inputs(case, torch.Generator().manual_seed(1), "cpu")
    second = op.make_inputs(case, torch.Generator().manual_seed(2), "cpu")
    again = op.make_inputs(case, torch.Generator().manual_seed(1), "cpu")
    assert not torch.equal(first[0], second[0]) and torch.equal(first[0], again[0])


def test_the_gpumode_reference_runs_on_inputs_a_submission_cannot_have_changed(gm):
    op, _ = gm
    case = op.interpret_cases[1]
    a, b = op.make_inputs(case, torch.Generator().manual_seed(5), "cpu")
    expected = (a + b).clone()
    a.zero_()  # as a submission writing into its inputs would
    (got,) = op.reference(a, b)
    assert torch.equal(got, expected)


# ---------------------------------------------------------------- resolving by name


def test_an_imported_operation_resolves_in_a_fresh_process(kb):
    code = ("from kernelcast.kernels.ops import get_operation; op = get_operation('kb.row_sum'); "
            "print(op.interpret_cases[0].name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3x300-fp32"


def test_an_unknown_imported_name_says_where_it_looked():
    with pytest.raises(ValueError, match=r"unknown operation 'kb\.nope'.*kernelcast import"):
        get_operation("kb.nope")
    with pytest.raises(ValueError, match="unknown operation 'sofmax'; known: softmax"):
        get_operation("sofmax")


def test_a_search_config_installs_an_imported_task_from_the_data_root(tmp_path):
    from kernelcast.tasks.config import SearchConfig, validate

    ref, _ = write_kernelbench(tmp_path / "src")
    root = DataRoot(str(tmp_path / "data"))
    op, _ = import_task("kernelbench", str(ref), name="row_sum_elsewhere", root=root)
    shutil.rmtree(tasks_dir() / op.name)  # another machine: only the data root has it
    config = validate(SearchConfig(op=op.name, gpu_type="interpreter", generator="llm",
                                   generator_url="http://127.0.0.1:9/v1", generator_model="m",
                                   data=str(tmp_path / "data")))
    assert config.op == "kb.row_sum_elsewhere" and (tasks_dir() / op.name / "manifest.json").is_file()


def test_a_template_search_of_an_imported_task_is_refused(kb):
    from kernelcast.tasks.config import ConfigError, SearchConfig, validate

    with pytest.raises(ConfigError, match="no template space; search it with generator 'freeform' or 'llm'"):
        validate(SearchConfig(op="kb.row_sum", gpu_type="interpreter"))


def test_the_import_command_stores_the_task_and_writes_its_candidates(tmp_path, capsys):
    from kernelcast.flows.cli import main

    ref, subs = write_gpumode(tmp_path / "vadd_cli", good=GPUMODE_SUBMISSION)
    data = str(tmp_path / "data")
    assert main(["import", "--format", "gpumode", "--reference", str(ref), "--candidate", str(subs[0]),
                 "--data", data]) == 0
    assert "imported gpumode.vadd_cli" in capsys.readouterr().out
    table = DataRoot(data).read_candidates(op="gpumode.vadd_cli")
    assert sorted(table["origin"]) == ["import", "seed"]
    assert json.loads(stored_task(DataRoot(data), "gpumode.vadd_cli")["manifest.json"])["name"] == "gpumode.vadd_cli"


# ---------------------------------------------------------------- forecasts


def _requests(op, candidates):
    from kernelcast.surrogate.forecast import ForecastRequest

    anchor = op.seed_candidates()[0]
    return [ForecastRequest(anchor, c, op.name, H100, case_names=tuple(x.name for x in op.cases)) for c in candidates]


def test_roofline_and_learned_forecasters_forecast_imported_candidates(kb, gm):
    import pandas as pd

    from kernelcast.storage.dataset import DataRoot as Root
    from kernelcast.surrogate.baselines import RooflineForecaster
    from kernelcast.surrogate.dataset import case_pairs
    from kernelcast.surrogate.learned import LearnedForecaster
    from kernelcast.tasks.config import PACKAGED_POOL

    # A small prior (two ops, few trees) keeps the test quick; what matters is the imported op's features.
    pairs = pd.concat([case_pairs(Root(PACKAGED_POOL), gpu_type="h100", op=o) for o in ("softmax", "row_sum")])
    learned = LearnedForecaster(max_iter=30).fit(pairs)
    for op, candidates in (kb, gm):
        for forecaster in (RooflineForecaster().fit(), learned):
            forecasts = forecaster.forecast(_requests(op, candidates))
            assert len(forecasts) == len(candidates)
            for f in forecasts:
                assert len(f.probabilities) == 8 and math.isclose(sum(f.probabilities), 1.0)
                assert f.expected_speedup > 0


def test_the_llm_prompt_of_an_imported_candidate_shows_the_task_and_the_submission(kb):
    from kernelcast.surrogate.llm import build_messages

    op, (good, _) = kb
    _, user = build_messages(_requests(op, [good])[0])
    for text in ("kb.row_sum", "Sum over the last dimension", "class ModelNew", "class Model(nn.Module)",
                 "64x4096-fp32"):
        assert text in user["content"], text


# ---------------------------------------------------------------- bad files


@pytest.mark.parametrize("drop, missing", [
    ("def get_inputs", "no function 'get_inputs'"),
    ("def get_init_inputs", "no function 'get_init_inputs'"),
    ("class Model(", "no class 'Model'"),
])
def test_a_kernelbench_problem_missing_a_definition_is_refused_by_name(tmp_path, drop, missing):
    broken = KB_ROW_SUM.replace(drop, drop.replace(" ", " _renamed_") if drop.startswith("def") else "class Other(")
    ref, _ = write_kernelbench(tmp_path, reference=broken)
    with pytest.raises(TaskFormatError, match=missing):
        import_task("kernelbench", str(ref))


def test_a_kernelbench_candidate_without_modelnew_is_refused_by_name(tmp_path):
    ref, cands = write_kernelbench(tmp_path, new=KB_ROW_SUM_NEW.replace("class ModelNew", "class Faster"))
    with pytest.raises(TaskFormatError, match=r"candidate file .*new\.py defines no class 'ModelNew'.*Faster"):
        import_task("kernelbench", str(ref), [str(c) for c in cands])


def test_an_interpreter_size_the_problem_does_not_have_is_refused(tmp_path):
    ref, _ = write_kernelbench(tmp_path)
    with pytest.raises(TaskFormatError, match="bad size 'rows=3'.*batch_size, dim"):
        import_task("kernelbench", str(ref), interpret_sizes=["rows=3"])


@pytest.mark.parametrize("name", ["ref_kernel", "generate_input", "check_implementation"])
def test_a_gpumode_reference_missing_a_function_is_refused_by_name(tmp_path, name):
    ref, _ = write_gpumode(tmp_path, reference=GPUMODE_REFERENCE.replace(f"def {name}", f"def other_{name}"))
    with pytest.raises(TaskFormatError, match=f"no function '{name}'"):
        import_task("gpumode", str(ref))


def test_a_gpumode_submission_without_custom_kernel_is_refused_by_name(tmp_path):
    ref, subs = write_gpumode(tmp_path, sub=GPUMODE_SUBMISSION.replace("def custom_kernel", "def kernel"))
    with pytest.raises(TaskFormatError, match="defines no function 'custom_kernel'"):
        import_task("gpumode", str(ref), [str(s) for s in subs])


def test_a_gpumode_task_without_test_specs_is_refused(tmp_path):
    ref, _ = write_gpumode(tmp_path, specs=None)
    with pytest.raises(TaskFormatError, match="needs its test specs.*--specs"):
        import_task("gpumode", str(ref))


def test_a_file_that_does_not_parse_is_refused_with_its_line(tmp_path):
    ref, _ = write_kernelbench(tmp_path, reference=KB_ROW_SUM + "\ndef broken(:\n")
    with pytest.raises(TaskFormatError, match="does not parse: line"):
        import_task("kernelbench", str(ref))


_RNN = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.hidden = torch.randn(batch_size, hidden_size)
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)

    def forward(self, x{extra}):
{reset}        self.hidden = self.hidden.to(x.device)
        self.hidden = torch.tanh(self.i2h(torch.cat((x, self.hidden), dim=1)))
        return self.hidden


batch_size = 4
input_size = 8
hidden_size = 16


def get_inputs():
    return [torch.randn(batch_size, input_size){more}]


def get_init_inputs():
    return [input_size, hidden_size]
'''


def test_a_model_whose_output_depends_on_its_earlier_calls_is_refused_at_import_by_name(tmp_path):
    """A recurrent hidden state overwritten by every call (CUDA-L1's level3/33 VanillaRNN): its reference
    could not pass its own check, as the checker's calls and the reference's are not the same in number."""
    from kernelcast.kernels.formats import kernelbench

    stateful = tmp_path / "33_VanillaRNN.py"
    stateful.write_text(_RNN.format(extra="", reset="", more=""))
    with pytest.raises(TaskFormatError, match=r"output 0 differs between two calls on the same inputs .* keeps "
                                              r"state across calls"):
        kernelbench.import_task(str(stateful))
    # the same model with its state given as an input each call (today's KernelBench file) is stateless
    reset = tmp_path / "33_VanillaRNN_reset.py"
    reset.write_text(_RNN.format(extra=", h0", reset="        self.hidden = h0.clone()\n",
                                 more=", torch.randn(batch_size, hidden_size)"))
    name, files = kernelbench.import_task(str(reset))
    assert name == "kb.33_vanillarnn_reset" and "manifest.json" in files


def test_only_models_that_could_keep_state_are_run_twice_at_import():
    from kernelcast.kernels.formats.kernelbench import may_depend_on_history

    assert may_depend_on_history(_RNN.format(extra="", reset="", more=""))
    plain = _RNN.format(extra="", reset="", more="").replace("        self.hidden = self.hidden.to(x.device)\n", "").replace(
        "        self.hidden = torch.tanh(", "        return torch.tanh(")
    assert not may_depend_on_history(plain)
    assert may_depend_on_history(plain.replace("return torch.tanh(", "return torch.randn_like(x) + torch.tanh("))
    assert may_depend_on_history(plain.replace("    def forward(self, x):\n",
                                               "    def forward(self, x):\n        self.count.add_(1)\n"))


_SCALED = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Multiplies a matrix by a scalar."""

    def __init__(self):
        super().__init__()

    def forward(self, A, s):
        return A * s


M = 48
N = 40


def get_inputs():
    return [torch.randn(M, N), 3.5]


def get_init_inputs():
    return []
'''

_SCALED_NEW = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, s):
        assert isinstance(s, float), type(s)
        return A.mul(s)
'''


def test_a_number_among_get_inputs_is_a_constant_of_the_case_put_back_at_its_position(tmp_path):
    """KernelBench's level1/5 passes a float beside its matrix: once refused, now held at its value."""
    reference, candidate = tmp_path / "5_Matrix_scalar.py", tmp_path / "new.py"
    reference.write_text(_SCALED)
    candidate.write_text(_SCALED_NEW)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(_SCALED_NEW.replace("A.mul(s)", "A.mul(s + 1.0)"))
    op, (good, bad) = import_task("kernelbench", str(reference), [str(candidate), str(wrong)])
    assert op.info(op.cases[0])["constants"] == [[1, 3.5]]
    (a,) = op.make_inputs(op.interpret_cases[0], torch.Generator().manual_seed(1), "cpu")
    (y,) = op.reference(a)
    assert torch.equal(y, a * 3.5)
    assert "_KC_CONSTANTS = {(((48, 40), 'torch.float32'),): [[1, 3.5]]}" in good.source
    found = _measure([op.seed_candidates()[0], good, bad])
    assert [found[c.candidate_id].status for c in (op.seed_candidates()[0], good, bad)] == ["ok", "ok", "incorrect"]


def test_a_task_without_numbers_among_its_inputs_keeps_its_wrapper(kb):
    op, (good, _) = kb
    assert "_KC_CONSTANTS" not in good.source and "out = model(*inputs)" in good.source


def test_get_inputs_returning_no_tensor_or_an_object_is_refused_naming_what(tmp_path):
    from kernelcast.kernels.formats import kernelbench

    for body, words in (("[3.5]", "returned no tensor"), ("[torch.randn(M, N), 'x']", "returned a str at position 1")):
        path = tmp_path / "p.py"
        path.write_text(_SCALED.replace("[torch.randn(M, N), 3.5]", body))
        with pytest.raises(TaskFormatError, match=words):
            kernelbench.import_task(str(path))


def _install_many(directory: str, rounds: int) -> int:
    from kernelcast.kernels.formats import install

    for i in range(rounds):
        install("kb.same", {"manifest.json": b"{}", "reference.py": f"# {os.getpid()} {i}\n".encode()},
                Path(directory))
    return rounds


def _read_while_installed(directory: str, rounds: int) -> int:
    from kernelcast.kernels.formats import install

    files = {"manifest.json": b"{}", "reference.py": b"# the same task\n"}
    folder = Path(directory) / "kb.steady"
    read = 0
    for _ in range(rounds):
        install("kb.steady", files, Path(directory))
        read += (folder / "reference.py").read_bytes() == files["reference.py"]  # never found gone
    return read


def test_a_task_installed_again_with_the_same_files_never_disappears_for_a_reader(tmp_path):
    """Searches install the same tasks from the same pool while others read them: an install of files already
    there leaves the folder in place (a replace would leave a moment in which a reader finds it gone)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(6) as pool:
        assert pool.starmap(_read_while_installed, [(str(tmp_path), 200)] * 6) == [200] * 6


def test_processes_installing_the_same_task_at_once_all_succeed_and_leave_it_whole(tmp_path):
    """Two searches of one machine install the same tasks into one tasks directory: each install must succeed
    (without a lock between the renames one found the folder gone or another in its way) and leave the task
    whole, with no staging or old folders behind."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(6) as pool:
        done = pool.starmap(_install_many, [(str(tmp_path), 60)] * 6)
    assert done == [60] * 6
    assert sorted(p.name for p in (tmp_path / "kb.same").iterdir()) == ["manifest.json", "reference.py"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".install.lock") == ["kb.same"]


KB_NO_SIZES = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''


def test_a_kernelbench_problem_without_size_integers_is_measured(tmp_path):
    """Its case is named by its input count ({"inputs": 1}); loading the case sets no such size on the module (it
    failed with "module ... has no attribute 'inputs'" before)."""
    from kernelcast.kernels.null import null_candidate

    (tmp_path / "nosizes.py").write_text(KB_NO_SIZES)
    op, _ = import_task("kernelbench", str(tmp_path / "nosizes.py"), [], name="no_sizes")
    assert [dict(c.dims) for c in op.cases] == [{"inputs": 1}]
    results = _measure([op.seed_candidates()[0], null_candidate(op)])
    assert [m.status for m in results.values()] == ["ok", "ok"], [m.error for m in results.values()]
