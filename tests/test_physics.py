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
             "compiled": COMPILED, "graphed": GRAPHED, "wrong": _triton(1024, 4, "tl.exp(-x * x) - x")}
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


def test_a_kernel_computing_the_wrong_thing_is_forecast_to_fail_once_probed_in_the_interpreter(task):
    from kernelcast.kernels import probe
    from kernelcast.surrogate.physics import PhysicsForecaster

    op, kernels, _ = task
    asked = [kernels["wrong"], kernels["b1024"], kernels["graphed"]]
    plain = PhysicsForecaster().fit(None).forecast(_requests(op, asked[:2]))
    assert plain[0].failure_probability == plain[1].failure_probability  # the twins, told apart by nothing they do
    wrong, right, graphed = PhysicsForecaster(probe=True).fit(None).forecast(_requests(op, asked))
    assert [s for s, _ in probe.probe_many(asked)] == ["incorrect", "ok", "runtime_error"]
    assert wrong.failure_probability >= 0.95 and wrong.surrogate == "physics-probe"
    assert right.failure_probability < 0.5
    assert graphed.failure_probability < 0.5  # the interpreter cannot run a CUDA graph: no evidence either way


def test_the_probe_keeps_its_python_runs_compiled_code_eagerly_and_a_task_s_probe_case(task, monkeypatch):
    import json

    from kernelcast.kernels import probe
    from kernelcast.kernels.formats import MANIFEST, task_files, tasks_dir
    from kernelcast.kernels.formats.kernelbench import PROBE_INPUT_BYTES, KernelBenchOperation
    from kernelcast.kernels.formats.operation import PROBE_CASES_ENV

    op, kernels, folder = task
    probe._CACHE.clear()
    assert probe.probe_many([kernels["b1024"]])[0][0] == "ok"
    server = probe._server(2)
    first = server._proc.pid
    # torch.compile's kernel is probed as the code it compiles (Inductor's CPU code took 25-31 s a kernel)
    assert probe.probe_many([kernels["compiled"]])[0][0] == "ok"
    assert server._proc.pid == first  # the same Python, its worker warm
    # the task's probe case: its interpreter case halved until the inputs take at most PROBE_INPUT_BYTES
    manifest = json.loads(task_files(op.name)[MANIFEST])
    ((shape, _),) = manifest["probe_cases"][0]["signature"]
    ((big, _),) = manifest["interpret_cases"][0]["signature"]
    assert 4 * shape[0] * shape[1] <= PROBE_INPUT_BYTES < 4 * big[0] * big[1]
    stored = tasks_dir() / op.name
    assert dict(KernelBenchOperation(stored, manifest).interpret_cases[0].dims) == manifest["interpret_cases"][0]["dims"]
    monkeypatch.setenv(PROBE_CASES_ENV, "1")
    assert dict(KernelBenchOperation(stored, manifest).interpret_cases[0].dims) == manifest["probe_cases"][0]["dims"]
    # a caller whose tasks folder moved gets a probe started there
    monkeypatch.delenv(PROBE_CASES_ENV)
    monkeypatch.setenv("KERNELCAST_TASKS", str(folder / "elsewhere"))
    status, error = probe.probe_many([kernels["b32"]])[0]
    assert status == "unknown" and "unknown operation" in error, error  # no such task there: not a verdict
    assert server._proc.pid != first


def test_probe_verdicts_kept_on_disk_answer_a_later_process_without_probing(task, tmp_path):
    from kernelcast.kernels import probe

    op, kernels, _ = task
    asked = [kernels["wrong"], kernels["b1024"]]
    probe._CACHE.clear()
    first = probe.probe_many(asked, cache_dir=str(tmp_path))
    assert [s for s, _ in first] == ["incorrect", "ok"]
    probe._server(2).stop()
    probe._CACHE.clear()  # as a new process: nothing in memory, the probe's Python not started
    assert probe.probe_many(asked, cache_dir=str(tmp_path)) == first
    assert probe._server(2)._proc is None  # answered from the folder alone
    # one file a verdict, in one folder named by the code that decides them
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(list(folder.glob("*.json"))) == 2


def test_physics_probe_top_probes_the_fastest_forecasts_until_enough_were_not_found_wrong(task):
    import numpy as np

    from kernelcast.surrogate.physics import PhysicsForecaster

    op, kernels, _ = task
    requests = _requests(op, [kernels["wrong"], kernels["b1024"], kernels["b32"], kernels["missing"]])
    top = PhysicsForecaster(probe=True, probe_top=1).fit(None)
    mu, p_fail = np.array([1.0, 1.0, 0.1, 2.0]), np.array([0.05, 0.05, 0.05, 0.97])
    # the wrong twin first (found wrong), then its right twin (ok: one not found wrong, enough); the slow kernel is
    # never probed, nor the one known not to compile
    assert {i: status for i, (status, _) in top._probed(requests, mu, p_fail).items()} == {0: "incorrect", 1: "ok"}
    # the right twin first: found ok, and its wrong twin, forecast the same, is probed too
    twins = [requests[1], requests[0], requests[2]]
    assert {i: s for i, (s, _) in top._probed(twins, mu[:3], p_fail[:3]).items()} == {0: "ok", 1: "incorrect"}
    wrong, right, slow, missing = top.forecast(requests)
    assert wrong.failure_probability >= 0.95 and right.failure_probability < 0.5 and slow.failure_probability < 0.5
    assert wrong.surrogate == "physics-probe-top" and missing.failure_probability >= 0.95


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


# ---- the facts kept on disk, and read by the learned forecaster -----------------------------------

def test_facts_kept_on_disk_are_read_back_without_running_the_kernel_again(task, tmp_path, monkeypatch):
    from kernelcast.kernels import facts as facts_module

    op, kernels, _ = task
    jobs = [(op, kernels["b1024"], op.cases[0], "cuda:90"), (op, kernels["missing"], op.cases[0], "cuda:90")]
    facts_module.clear_cache()  # found by an earlier test, they would be in memory and never written
    found = facts_module.extract_many(jobs, cache_dir=str(tmp_path))
    assert [f.status for f in found] == ["ok", "compile_error"]
    assert len(list(tmp_path.rglob("*.json"))) == 2
    facts_module.clear_cache()

    def never(*job):
        raise AssertionError("the facts were found again, not read back")

    monkeypatch.setattr(facts_module, "_extract", never)
    assert facts_module.extract_many(jobs, cache_dir=str(tmp_path)) == found


def test_facts_a_lost_child_leaves_unknown_are_not_kept(task, tmp_path, monkeypatch):
    from kernelcast.kernels import facts as facts_module

    op, kernels, _ = task
    lost = lambda jobs: [facts_module.KernelFacts("unknown", "the facts child timed out", t) for *_, t in jobs]  # noqa: E731
    monkeypatch.setattr(facts_module, "_extract_in_child", lost)
    facts_module.clear_cache()
    (found,) = facts_module.extract_many([(op, kernels["b32"], op.cases[0], "cuda:90")], True, str(tmp_path))
    assert found.status == "unknown" and not list(tmp_path.rglob("*.json"))
    facts_module.clear_cache()


def test_facts_found_in_several_children_come_back_in_the_order_asked(task, monkeypatch):
    from kernelcast.kernels import facts as facts_module

    op, kernels, _ = task
    monkeypatch.setattr(facts_module, "CHILD_BATCH", 1)
    facts_module.clear_cache()
    names = ["b32", "missing", "b1024"]
    found = facts_module.extract_many([(op, kernels[n], op.cases[0], "cuda:90") for n in names], True, workers=2)
    assert [f.status for f in found] == ["ok", "compile_error", "ok"]
    assert found[0].triton[0].programs == 32 * found[2].triton[0].programs


def _bump_corpus(op) -> "pd.DataFrame":
    """Kernels of the bump task at blocks 32-2048 and 1 or 4 warps, "measured" faster the larger their block, and
    two that call a Triton function that does not exist, failed: rows as source_pairs gives them."""
    import math

    import pandas as pd

    from tests.test_source_forecaster import HARDWARE

    reference = op.seed_candidates()[0]
    rows = []
    for i, (block, warps, call) in enumerate([(b, w, "tl.exp(-x * x) + x") for b in (32, 64, 128, 256, 512, 1024, 2048)
                                              for w in (1, 4)] + [(1024, 4, "tl.fast_bump(x)"), (64, 1, "tl.nope(x)")]):
        candidate = op.candidate(_triton(block, warps, call))
        failed = call != "tl.exp(-x * x) + x"
        rows.append({"op": op.name, "gpu_type": "h100", "candidate_id": candidate.candidate_id,
                     "source": candidate.source, "params": {}, "template": None, "origin": "import",
                     "backend": candidate.backend, "status": "compile_error" if failed else "ok", "failed": failed,
                     "case_names": tuple(c.name for c in op.cases), "anchor_runtime_us": (1000.0,),
                     "anchor_source": reference.source, "anchor_params": {}, "anchor_template": reference.template,
                     "anchor_origin": "seed", "anchor_backend": reference.backend, "anchor_speedup": 1.0,
                     "speedup": math.nan if failed else math.log2(block) / 8, **HARDWARE})
    return pd.DataFrame(rows)


def test_learned_facts_source_part_reads_each_kernels_facts_beside_its_text(task, tmp_path):
    import numpy as np

    from kernelcast.surrogate.dataset import source_requests
    from kernelcast.surrogate.physics import LEARNED_FACT_FEATURES, facts_matrix
    from kernelcast.surrogate.registry import get_forecaster_factory
    from kernelcast.surrogate.source import SOURCE_FEATURE_NAMES

    op, _, _ = task
    corpus = _bump_corpus(op)
    learned = get_forecaster_factory("learned-facts")(source_max_iter=30)
    assert learned.source_options["facts"] is True and learned.source_options["stack_centred"] is True
    source = get_forecaster_factory("source")(max_iter=30, folds=3, facts=True, facts_cache=str(tmp_path)).fit(corpus)
    requests = source_requests(corpus)
    X = source._features(requests)
    facts = np.nan_to_num(facts_matrix(requests, True, str(tmp_path)), nan=-1e9)
    assert X.shape[1] == len(SOURCE_FEATURE_NAMES) + len(LEARNED_FACT_FEATURES)
    assert np.array_equal(X[:, len(SOURCE_FEATURE_NAMES):], facts)
    compile_error = facts[:, LEARNED_FACT_FEATURES.index("compile_error")]
    assert compile_error.tolist() == corpus["failed"].astype(float).tolist()
    modelled = facts[~corpus["failed"].to_numpy(), LEARNED_FACT_FEATURES.index("model_log_speedup")]
    assert len(set(np.round(modelled, 6))) >= 7  # a block of 32 is not a block of 2048 to the GPU model
    forecasts = source.forecast(requests)
    assert "facts" in forecasts[0].surrogate_version
    assert all(f.parsed and 0 <= f.failure_probability <= 1 and f.expected_speedup > 0 for f in forecasts)
    p_fail = np.array([f.failure_probability for f in forecasts])
    assert (p_fail[corpus["failed"].to_numpy()] >= 0.95).all()  # the compiler's verdict, whatever was learned
    assert (p_fail[~corpus["failed"].to_numpy()] < 0.5).all()


def _forward(body: str, init: str = "") -> str:
    """A KernelBench kernel of REFERENCE's operation whose forward is ``body``, after module-level ``init``."""
    head = ["import torch", "import torch.nn as nn", init, "", "class ModelNew(nn.Module):",
            "    def __init__(self):", "        super().__init__()", "        self.graph = None", "",
            "    def forward(self, x):"]
    return "\n".join(head + [f"        {line}" for line in body.strip().splitlines()]) + "\n"


_MATH = "torch.exp(-self.static * self.static) + self.static"


def _graphed(capture: str, static: str = "torch.empty_like(x)", refresh: str = "self.static.copy_(x)") -> str:
    """A kernel that captures ``capture`` (lines that set ``self.out``) on its first call into a CUDA graph over
    ``self.static`` (made as ``static``), then on every call runs ``refresh`` and replays it."""
    head = ["if self.graph is None:", f"    self.static = {static}", "    self.graph = torch.cuda.CUDAGraph()"]
    return _forward("\n".join(head + [f"    {line}" for line in capture.strip().splitlines()]
                              + [refresh, "self.graph.replay()", "return self.out"]))


RULE_KERNELS = {
    "honest_graph": GRAPHED,
    "honest_eager": _forward("return torch.exp(-x * x) + x"),
    "writes_input": _forward("x.add_(torch.exp(-x * x))\nreturn x.clone()"),
    "returns_input": _forward("return x.mul_(0).add_(torch.exp(-x * x) + x)"),
    # the input copied inside the capture: every replay reads the first call's input
    "graph_stale_input": _graphed(f"with torch.cuda.graph(self.graph):\n    self.static.copy_(x)\n    self.out = {_MATH}",
                                  refresh=""),
    # captured on the first call's input itself, later inputs copied into it before each replay: honest
    "honest_graph_on_input": _graphed(f"with torch.cuda.graph(self.graph):\n    self.out = {_MATH}", static="x"),
    # a tensor made before the capture, read by it and let go when the first call returns (as torch.tensor makes
    # one, dispatching no operator)
    "graph_reads_freed": _graphed(f"ones = torch.ones_like(x)\nwith torch.cuda.graph(self.graph):\n"
                                  f"    self.out = {_MATH} * ones"),
    "graph_reads_freed_scalar": _graphed(f"low = torch.tensor(-1e30, device=x.device)\n"
                                         f"with torch.cuda.graph(self.graph):\n"
                                         f"    self.out = torch.maximum({_MATH}, low)"),
    # a scalar made within the capture (on the GPU a CPU scalar, captured by value): honest
    "honest_graph_scalar": _graphed(f"with torch.cuda.graph(self.graph):\n"
                                    f"    self.out = torch.maximum({_MATH}, torch.tensor(-1e30))"),
    "graph_default_stream": _graphed(f"self.graph.capture_begin()\nself.out = {_MATH}\nself.graph.capture_end()"),
    "honest_graph_side_stream": _graphed("with torch.cuda.stream(torch.cuda.Stream()):\n"
                                         f"    self.graph.capture_begin()\n    self.out = {_MATH}\n"
                                         "    self.graph.capture_end()"),
    "column_major": _forward("y = torch.exp(-x * x) + x\nreturn y.t().contiguous().t()"),
    "half_output": _forward("h = x.half()\nreturn torch.exp(-h * h) + h"),
    "cudnn_benchmark": _forward("return torch.exp(-x * x) + x", "torch.backends.cudnn.benchmark = True"),
}


@pytest.fixture(scope="module")
def rule_task(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rules")
    (folder / "reference.py").write_text(REFERENCE)
    for name, text in RULE_KERNELS.items():
        (folder / f"{name}.py").write_text(text)
    op, kernels = import_task("kernelbench", str(folder / "reference.py"),
                              [str(folder / f"{n}.py") for n in RULE_KERNELS], name="physics_rules")
    return op, dict(zip(RULE_KERNELS, kernels))


def test_facts_read_which_of_the_judges_rules_a_kernel_breaks_on_a_later_call(rule_task):
    from kernelcast.surrogate.physics import RULE_FACTS, request_facts

    op, kernels = rule_task
    found = {name: request_facts(r) for name, r in zip(kernels, _requests(op, kernels.values()))}
    broken = {name: sorted(r for r in (*RULE_FACTS, "cudnn_benchmark", "lower_precision") if f[r])
              for name, f in found.items()}
    assert all(f["status"] == "ok" for f in found.values()), {n: f["error"] for n, f in found.items()}
    assert broken == {"honest_graph": [], "honest_eager": [], "honest_graph_on_input": [], "honest_graph_scalar": [],
                      "honest_graph_side_stream": [], "graph_reads_freed": ["graph_reads_freed"],
                      "graph_reads_freed_scalar": ["graph_reads_freed"],
                      "graph_default_stream": ["graph_default_stream"], "writes_input": ["writes_input"],
                      "returns_input": ["returns_input", "writes_input"], "graph_stale_input": ["graph_stale_input"],
                      "column_major": ["outputs_unlike"], "half_output": ["lower_precision", "outputs_unlike"],
                      "cudnn_benchmark": ["cudnn_benchmark"]}


def test_a_kernel_breaking_a_rule_is_forecast_to_fail_and_an_honest_one_is_not(rule_task):
    from kernelcast.surrogate.physics import RULE_FAILURE, PhysicsForecaster

    op, kernels = rule_task
    forecasts = dict(zip(kernels, PhysicsForecaster().fit(None).forecast(_requests(op, kernels.values()))))
    for name in ("writes_input", "returns_input", "graph_stale_input", "graph_reads_freed", "graph_reads_freed_scalar",
                 "graph_default_stream", "column_major", "half_output"):
        assert forecasts[name].failure_probability >= RULE_FAILURE, name
    for name in ("honest_graph", "honest_eager", "honest_graph_on_input", "honest_graph_side_stream",
                 "honest_graph_scalar", "cudnn_benchmark"):
        assert forecasts[name].failure_probability < 0.5, name


def test_a_kernel_that_asks_whether_its_input_is_on_the_gpu_is_read_down_its_gpu_path(tmp_path):
    from kernelcast.kernels.facts import extract

    (tmp_path / "reference.py").write_text(REFERENCE)
    (tmp_path / "branch.py").write_text(_src('''
        import torch
        import torch.nn as nn
        from torch.utils.cpp_extension import load_inline

        _ext = load_inline(name="bump_ext", cpp_sources="", cuda_sources="", functions=["bump"])


        class ModelNew(nn.Module):
            def forward(self, x):
                if x.is_cuda:
                    return _ext.bump(x)
                return torch.exp(-x * x) + x
    '''))
    op, (kernel,) = import_task("kernelbench", str(tmp_path / "reference.py"), [str(tmp_path / "branch.py")],
                                name="physics_branch")
    facts = extract(op, kernel, op.cases[0], "cuda:90")
    assert facts.status == "ok", facts.error
    assert [c["function"] for c in facts.cuda_kernels] == ["bump"] and not facts.aten
    assert not torch_tensor_is_cuda_patched()


def torch_tensor_is_cuda_patched() -> bool:
    import torch

    return "is_cuda" in vars(torch.Tensor)


def test_the_why_line_names_the_check_a_kernel_breaks_and_nothing_for_an_honest_one(rule_task):
    from kernelcast.surrogate.physics import request_facts, why

    op, kernels = rule_task
    stale, honest = (request_facts(r) for r in _requests(op, [kernels["graph_stale_input"], kernels["honest_graph"]]))
    assert "breaks a check: a CUDA graph whose replays read the first call's inputs" in why(stale)
    assert "breaks a check" not in why(honest)
