"""Execution variants of an imported KernelBench task (kernelcast.kernels.variants, the ``variants`` generator) and a
search's budget in seconds (``budget_kind``), on the CPU."""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from kernelcast.kernels.formats import import_task, submission_of
from kernelcast.kernels.formats.cudal1 import Problem, submission
from kernelcast.kernels.records import Measurement
from kernelcast.kernels.variants import VARIANTS, applied, variant_children
from kernelcast.storage.dataset import DataRoot
from kernelcast.tasks.config import ConfigError, SearchConfig
from kernelcast.tasks.generators import VariantGenerator, make_generator
from kernelcast.tasks.setup import resolve
from kernelcast.tasks.state import Archive
from tests.formats_for_tests import KB_ROW_SUM, KB_ROW_SUM_NEW, _src, write_kernelbench
from tests.test_llm_forecaster import LLAMA_CPP_PYTHON, server, tiny_model  # noqa: F401 (fixtures)
from tests.test_search import run

CONV = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """A 3x3 convolution and a ReLU."""

        def __init__(self, cin, cout):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x))


    batch_size = 2
    channels = 4
    size = 8


    def get_inputs():
        return [torch.randn(batch_size, channels, size, size)]


    def get_init_inputs():
        return [channels, 8]
    ''')
# Run on the CPU: everything but torch.compile (needs a C++ compiler, and is slow) and CUDA graphs (checked
# for building only: off the GPU the wrapper calls the model as it is).
CPU_RUNNABLE = ("channels-last", "cudnn-benchmark", "cuda-graph")


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    ref, _ = write_kernelbench(tmp_path_factory.mktemp("conv"), CONV)
    op, _ = import_task("kernelbench", str(ref), name="variants-conv")
    return op


@pytest.fixture(scope="module")
def row_sum(tmp_path_factory):
    ref, cands = write_kernelbench(tmp_path_factory.mktemp("rowsum"), KB_ROW_SUM, new=KB_ROW_SUM_NEW)
    op, _ = import_task("kernelbench", str(ref), cands, name="variants-row-sum")
    return op


def outputs(op, source: str):
    """The candidate's outputs and the reference's, on the op's interpreter case, on the CPU."""
    namespace: dict = {}
    exec(compile(source, "<variant>", "exec"), namespace)  # noqa: S102 - our own generated wrapper, under test
    inputs = op.make_inputs(op.interpret_cases[0], torch.Generator().manual_seed(0), "cpu")
    return namespace["launch"](*inputs), op.reference(*inputs)


def test_every_variant_of_a_conv_reference_is_a_child_with_its_parent_and_origin(conv):
    parent = conv.seed_candidates()[0]
    kids, skipped = variant_children(conv, parent)
    assert not skipped
    assert [k.origin for k in kids] == [f"variant:{name}" for name in VARIANTS]
    assert {k.parent_id for k in kids} == {parent.candidate_id} and len({k.candidate_id for k in kids}) == len(kids)
    for kid in kids:
        compile(kid.source, kid.origin, "exec")  # every wrapper parses, CUDA graph and cuDNN ones included
        assert submission_of(kid.source).startswith(conv.reference_source.rstrip())
        assert [v.name for v in applied(kid.source)] == [kid.origin.split(":")[1]]
    assert "mode='max-autotune-no-cudagraphs'" in kids[3].source and "cuda.graph(" in kids[4].source


@pytest.mark.parametrize("name", CPU_RUNNABLE)
def test_a_variant_runs_on_the_cpu_and_matches_the_reference(conv, name):
    kid = next(k for k in variant_children(conv, conv.seed_candidates()[0])[0] if k.origin == f"variant:{name}")
    got, want = outputs(conv, kid.source)
    assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_torch_compile_default_runs_on_the_cpu_and_matches_the_reference(conv):
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("torch.compile on the CPU needs a C++ compiler; none on PATH")
    kid = next(k for k in variant_children(conv, conv.seed_candidates()[0])[0] if k.origin == "variant:compile-default")
    got, want = outputs(conv, kid.source)
    assert torch.allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_a_variant_of_a_variant_is_never_of_the_same_kind_and_composes_otherwise(conv):
    compiled = variant_children(conv, conv.seed_candidates()[0])[0][1]  # compile-reduce-overhead
    kids, skipped = variant_children(conv, compiled)
    assert [k.origin for k in kids] == ["variant:channels-last", "variant:cudnn-benchmark"]
    reasons = {s.variant: s.reason for s in skipped}
    assert set(reasons) == {*(n for n in VARIANTS if n.startswith("compile-")), "cuda-graph"}
    assert "already runs as compile-reduce-overhead" in reasons["compile-default"]
    assert "replays CUDA graphs of its own" in reasons["cuda-graph"]
    twice = kids[0]
    assert [v.name for v in applied(twice.source)] == ["compile-reduce-overhead", "channels-last"]
    assert "variant:channels-last" not in [k.origin for k in variant_children(conv, twice)[0]]


def test_a_modelnew_parent_gets_variants_and_channels_last_needs_4d_inputs(row_sum):
    parent = row_sum.imported_candidates()[0]
    kids, skipped = variant_children(row_sum, parent)
    assert "channels-last" not in [k.origin.split(":")[1] for k in kids]
    assert [s.variant for s in skipped] == ["channels-last"] and "no 4-D input" in skipped[0].reason
    graph = next(k for k in kids if k.origin == "variant:cuda-graph")
    assert "_kc_cuda_graph_base = ModelNew" in graph.source  # it wraps the parent's ModelNew, not the reference
    compile(graph.source, "<cuda-graph>", "exec")


def test_cudal1_compile_variants_use_the_one_wrapper():
    ref = KB_ROW_SUM
    problem = Problem(1, 1, ref, {}, {}, {})
    code, why = submission(problem, "compile-reduce-overhead")
    assert why == "" and [v.name for v in applied(code)] == ["compile-reduce-overhead"]


def test_the_variants_generator_gives_the_references_variants_then_those_of_measured_parents(row_sum):
    config = SearchConfig(op=row_sum.name, generator="variants")
    generator = make_generator(config)
    assert isinstance(generator, VariantGenerator) and generator.name == "variants"
    archive = Archive()
    made = generator.children(row_sum.name, None, archive, 64, random.Random(0), 0.0, seed=0, run_id="r",
                              generation=0)
    reference = row_sum.seed_candidates()[0]
    assert {k.parent_id for k in made.children} == {reference.candidate_id}
    assert [s.variant for s in made.skipped] == ["channels-last"]
    parent = row_sum.imported_candidates()[0]
    archive.add_measured(parent, Measurement(parent.candidate_id, row_sum.name, "h100", "ok", "gpu", speedup=2.0))
    later = generator.children(row_sum.name, None, archive, 64, random.Random(0), 0.0, seed=0, run_id="r",
                               generation=1)
    assert later.children[0].parent_id == parent.candidate_id  # the best measured parent first
    assert not generator.exhausted(None, archive)
    for kid in later.children:
        archive.add_measured(kid, Measurement(kid.candidate_id, row_sum.name, "h100", "incorrect", "gpu"))
    assert generator.exhausted(None, archive)  # nothing measured ran, so no parent has a variant left


def test_variants_compose_with_a_model_generator_and_need_a_kernelbench_task(row_sum):
    composed = make_generator(SearchConfig(op=row_sum.name, generator="replay+variants"))
    assert composed.name == "replay+variants" and composed.base.name == "replay"
    with pytest.raises(ConfigError, match="not an imported KernelBench or GPU MODE task"):
        resolve(SearchConfig(op="softmax", generator="variants", gpu_type="h100", backend="replay"))
    with pytest.raises(ConfigError, match="known: template, llm, freeform, replay, variants, llm\\+variants"):
        resolve(SearchConfig(op=row_sum.name, generator="template+variants", gpu_type="h100", backend="replay"))


# ---- a budget in seconds -------------------------------------------------------------------------


def replay_config(tmp_path, **changes) -> SearchConfig:
    base = dict(op="softmax", gpu_type="h100", generations=4, children=16, generator="template", surrogate="none",
                seed=2, data=str(tmp_path / "data"), backend="replay", measure_wave=2)
    return SearchConfig(**{**base, **changes})


def test_a_gpu_plus_compile_seconds_budget_stops_when_the_recorded_seconds_are_spent(tmp_path):
    limit = 3.0
    search, result = run(replay_config(tmp_path, budget=limit, budget_kind="gpu_compile_seconds"))
    assert result.stop_reason == "gpu_compile_seconds"
    rows = DataRoot(str(tmp_path / "data")).read_measurements(op="softmax", gpu_type="h100").set_index("candidate_id")
    decided = DataRoot(str(tmp_path / "data")).read_run_rows("decisions", result.run_id, op="softmax")
    measured = decided.loc[decided["decision"] == "measure", "candidate_id"]
    spent = float((rows.loc[measured, "gpu_seconds"] + rows.loc[measured, "compile_seconds"]).sum())
    assert spent >= limit and (rows.loc[measured, "compile_seconds"] > 0).any()  # stored rows, both charged
    assert sum(search.spent_each[:-2]) < limit  # the last wave of two began under the limit
    last = result.generations[-1]
    assert last.budget_kind == "gpu_compile_seconds" and last.budget_spent == pytest.approx(spent)
    assert last.budget_remaining == 0.0 and last.compile_seconds_total > 0
    stored = DataRoot(str(tmp_path / "data")).read_run_rows("generations", result.run_id, op="softmax")
    assert stored["budget_spent"].max() == pytest.approx(spent)


def test_a_gpu_seconds_budget_charges_gpu_seconds_only(tmp_path):
    search, result = run(replay_config(tmp_path, budget=3.0, budget_kind="gpu_seconds"))
    assert result.stop_reason == "gpu_seconds"
    assert result.generations[-1].budget_spent == pytest.approx(result.gpu_seconds)


def test_budget_kinds_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="unknown budget_kind 'hours'"):
        resolve(replay_config(tmp_path, budget=3, budget_kind="hours"))
    with pytest.raises(ConfigError, match="budget must be a positive whole number"):
        resolve(replay_config(tmp_path, budget=2.5))
    with pytest.raises(ConfigError, match="gpu_seconds_budget caps a measurements budget"):
        resolve(replay_config(tmp_path, budget=2.5, budget_kind="gpu_seconds", gpu_seconds_budget=1.0))


def test_a_variants_search_from_a_pools_kernels_measures_them_first_then_runs_them_other_ways(row_sum, tmp_path):
    """generator_roots with ``variants``: the pool's imported kernels of the task come first (beside the
    reference's own variants), and their variants once they are measured; roots with a base generator belong
    to the base."""
    pool = DataRoot(str(tmp_path / "pool"))
    imported = row_sum.imported_candidates()[0]
    pool.write_candidates([imported])
    pool.write_measurements([Measurement(imported.candidate_id, row_sum.name, "h100", "ok", "gpu", speedup=1.7)])
    config = SearchConfig(op=row_sum.name, generator="variants", generator_roots=str(tmp_path / "pool"),
                          gpu_type="h100", backend="replay")
    resolve(config)  # accepted: roots from a pool for a variants search
    generator = make_generator(config)
    assert [c.candidate_id for c in generator.roots] == [imported.candidate_id]
    archive = Archive()
    first = generator.children(row_sum.name, None, archive, 64, random.Random(0), 0.0, seed=0, run_id="r",
                               generation=0)
    reference = row_sum.seed_candidates()[0]
    assert first.children[0].candidate_id == imported.candidate_id
    assert {k.parent_id for k in first.children[1:]} == {reference.candidate_id}
    assert not generator.exhausted(None, archive)
    archive.add_measured(imported, Measurement(imported.candidate_id, row_sum.name, "h100", "ok", "gpu", speedup=1.7))
    later = generator.children(row_sum.name, None, archive, 64, random.Random(0), 0.0, seed=0, run_id="r",
                               generation=1)
    assert later.children and later.children[0].parent_id == imported.candidate_id
    with pytest.raises(ValueError, match="belong to its base"):
        VariantGenerator(row_sum.name, make_generator(SearchConfig(op=row_sum.name, generator="replay")),
                         roots=[imported])
    with pytest.raises(ConfigError, match="generator_roots starts a free-form or variants search"):
        resolve(config.replace(generator="replay"))


def test_a_budget_in_seconds_of_any_value_gives_a_valid_run_id(tmp_path):
    config = replay_config(tmp_path, budget=27.514536035999953, budget_kind="gpu_compile_seconds")
    run_id = resolve(config).run_id
    assert "-b27.51s-" in run_id
    assert resolve(replay_config(tmp_path, budget=16)).run_id.count("-b16-") == 1


def test_a_task_with_a_long_name_gets_a_valid_run_id_that_still_tells_it_from_its_neighbours():
    """gpumode.gated_deltanet_recompute_w_u's searches were refused for a 69-character run id (2026-11-29)."""
    from kernelcast.tasks.config import SearchConfig, default_run_id

    ids = [default_run_id(SearchConfig(op=f"gpumode.gated_deltanet_recompute_w_u{tail}", gpu_type="h200",
                                       surrogate="learned", budget=81.23456, budget_kind="gpu_compile_seconds"))
           for tail in ("", "_two")]
    for run_id in ids:
        assert len(run_id) <= 64 and run_id.startswith("gpumode.gated-de") and "-h200-learned-b81.23s-s0-" in run_id
    assert ids[0].rsplit("-h200-", 1)[0] != ids[1].rsplit("-h200-", 1)[0]
    short = default_run_id(SearchConfig(op="softmax", gpu_type="h100", surrogate="none", budget=8))
    assert short.startswith("softmax-h100-none-b8-s0-")


def _committed_cudal1_pool(tmp_path, monkeypatch) -> str:
    """The committed CUDA-L1 pool's kernelcast data root, its tasks installed into a folder of this test's own."""
    from pathlib import Path

    from kernelcast.kernels.formats import TASKS_ENV, install_from_root

    pool = str(Path(__file__).resolve().parents[1] / "data" / "pools" / "cudal1" / "kernelcast")
    monkeypatch.setenv(TASKS_ENV, str(tmp_path / "tasks"))
    root = DataRoot(pool)
    for op in sorted(root.read_candidates()["op"].unique()):
        install_from_root(root, op)
    return pool


@pytest.mark.parametrize("surrogate", ["none", "source"])
def test_a_searchs_roots_are_measured_first_by_the_baseline_and_the_surrogate_alike(surrogate, tmp_path, monkeypatch):
    """On the committed CUDA-L1 pool, replayed: a variants search from a problem's imported kernels measures
    those kernels in its first generation whatever the surrogate forecasts of them, and weighs only the rest."""
    from kernelcast.tasks.generators import template_roots

    pool = _committed_cudal1_pool(tmp_path, monkeypatch)
    op = "kb.cudal1-l2-017"
    config = SearchConfig(op=op, gpu_type="h100", backend="replay", replay_pool=pool, prior_data=pool,
                          generator="variants", generator_roots=pool, surrogate=surrogate, budget=8, generations=2,
                          data=str(tmp_path / "data"), seed=1)
    search, result = run(config)
    roots = {c.candidate_id for c, _ in template_roots(pool, op, "h100")}
    decided = DataRoot(str(tmp_path / "data")).read_run_rows("decisions", result.run_id, op=op)
    first = decided[decided["generation"] == 0]
    assert roots <= set(first.loc[first["decision"] == "measure", "candidate_id"])
    assert len(first[first["decision"] == "measure"]) == 4  # the budget's share: the three roots and one more
    if surrogate != "none":
        assert len(first) > 4  # the surrogate weighed every other child of the generation
    assert result.best_speedup >= max(s for _, s in template_roots(pool, op, "h100")) - 1e-9


def test_with_weigh_roots_the_surrogate_weighs_the_roots_with_the_other_children(tmp_path, monkeypatch):
    """SearchConfig.weigh_roots: the roots are children like the rest for the surrogate (a random one here picks
    its four of the first generation among them all, not the three roots and one more); the baseline, which
    takes the generator's order, still meets them first."""
    from kernelcast.tasks.generators import template_roots

    pool = _committed_cudal1_pool(tmp_path, monkeypatch)
    op = "kb.cudal1-l2-017"
    roots = {c.candidate_id for c, _ in template_roots(pool, op, "h100")}
    measured = {}
    for surrogate in ("random", "none"):
        config = SearchConfig(op=op, gpu_type="h100", backend="replay", replay_pool=pool, prior_data=pool,
                              generator="variants", generator_roots=pool, surrogate=surrogate, budget=8,
                              generations=2, data=str(tmp_path / surrogate), seed=1, weigh_roots=True)
        _, result = run(config)
        decided = DataRoot(str(tmp_path / surrogate)).read_run_rows("decisions", result.run_id, op=op)
        first = decided[decided["generation"] == 0]
        measured[surrogate] = set(first.loc[first["decision"] == "measure", "candidate_id"])
        assert len(measured[surrogate]) == 4
    assert not roots <= measured["random"] and roots <= measured["none"]


CONV_NEW_OLD_SUPER = _src('''
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        """The convolution and ReLU, written with the two-argument super() that CUDA-L1's kernels use."""

        def __init__(self, cin, cout):
            super(ModelNew, self).__init__()
            self.conv = nn.Conv2d(cin, cout, 3, padding=1)

        def train(self, mode=True):  # as KernelBench level2/73's CUDA-L1 kernel does: called by .eval()
            result = super(ModelNew, self).train(mode)
            self.trained = mode
            return result

        def forward(self, x):
            return torch.relu(self.conv(x))
    ''')


def test_a_variant_of_a_class_that_names_itself_in_super_builds_and_matches(tmp_path):
    """Measured on an H100: every variant of such a CUDA-L1 kernel failed with 'super(type, obj): obj must be
    an instance or subtype of type', since the wrapper rebinds the name ModelNew before the class is built."""
    ref, cands = write_kernelbench(tmp_path, CONV, new=CONV_NEW_OLD_SUPER)
    op, _ = import_task("kernelbench", str(ref), cands, name="variants-conv-old-super")
    parent = op.imported_candidates()[0]
    kids = {k.origin: k for k in variant_children(op, parent)[0]}
    for name in CPU_RUNNABLE:
        got, want = outputs(op, kids[f"variant:{name}"].source)
        assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-5), name
    twice = {k.origin: k for k in variant_children(op, kids["variant:channels-last"])[0]}["variant:cudnn-benchmark"]
    got, want = outputs(op, twice.source)  # nested wrappers each build their model under the name it expects
    assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    # the constructor's two-argument super() is left as written (the wrapper lends it the name); a later method's is not
    assert "super(ModelNew, self).__init__()" in twice.source and "super(ModelNew, self).train" not in twice.source
    assert "result = super().train(mode)" in kids["variant:channels-last"].source


def test_no_cuda_graph_or_compile_variant_of_a_parent_that_captures_graphs_itself(conv):
    graphed = next(k for k in variant_children(conv, conv.seed_candidates()[0])[0] if k.origin == "variant:cuda-graph")
    kids, skipped = variant_children(conv, graphed)
    assert not [k for k in kids if k.origin.startswith("variant:compile-")]
    reasons = {s.variant: s.reason for s in skipped}
    assert "torch.compile around a capture fails" in reasons["compile-default"]
    own = _src('''
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def __init__(self, cin, cout):
                super().__init__()
                self.conv = nn.Conv2d(cin, cout, 3, padding=1)
                self.graph = torch.cuda.CUDAGraph()

            def forward(self, x):
                return torch.relu(self.conv(x))
        ''')
    from kernelcast.kernels.variants import reason_not, variant_named

    assert "captures CUDA graphs in its own code" in reason_not(variant_named("cuda-graph"), own)
    assert "torch.compile around a capture fails" in reason_not(variant_named("compile-max-autotune"), own)
    assert reason_not(variant_named("cudnn-benchmark"), own) == ""


def test_a_replayed_variants_search_offers_the_children_a_live_one_recorded_with_their_ids(row_sum, tmp_path):
    """variants_recorded: the recorded children of each parent, even where today's wrapper would write other
    text (and so another id); refused for a generator that makes no variants or a root with none."""
    from kernelcast.kernels.records import Candidate

    reference = row_sum.seed_candidates()[0]
    live = variant_children(row_sum, reference)[0][0]
    older = Candidate(op=live.op, backend=live.backend, source=live.source + "\n# as an older wrapper wrote it\n",
                      params=live.params, parent_id=live.parent_id, origin=live.origin)
    assert older.candidate_id != live.candidate_id
    pool = DataRoot(str(tmp_path / "pool"))
    pool.write_candidates([reference, older])
    config = SearchConfig(op=row_sum.name, generator="variants", variants_recorded=str(tmp_path / "pool"),
                          gpu_type="h100", backend="replay")
    resolve(config)
    made = make_generator(config).children(row_sum.name, None, Archive(), 64, random.Random(0), 0.0, seed=0,
                                           run_id="r", generation=0)
    assert [k.candidate_id for k in made.children] == [older.candidate_id]
    # a measured space's model rewrites are recorded beside the variants, and offered as their parent's children
    rewrite = Candidate(op=live.op, backend="torch", source=reference.source + "\n# rewritten\n",
                        parent_id=reference.candidate_id, origin="llm")
    pool.write_candidates([rewrite])
    made = make_generator(config).children(row_sum.name, None, Archive(), 64, random.Random(0), 0.0, seed=0,
                                           run_id="r", generation=0)
    assert sorted(k.candidate_id for k in made.children) == sorted([older.candidate_id, rewrite.candidate_id])
    with pytest.raises(ConfigError, match="generator 'replay' makes no variants"):
        resolve(config.replace(generator="replay"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no recorded variant children"):
        resolve(config.replace(variants_recorded=str(tmp_path / "empty")))
    with pytest.raises(ConfigError, match="missing does not exist"):
        resolve(config.replace(variants_recorded=str(tmp_path / "missing")))


def test_a_problems_variant_space_is_its_roots_then_their_and_the_references_variants(row_sum):
    """benchmarks/headroom_search.py --space: what it measures of a problem, each child once, parents first."""
    from benchmarks.headroom_search import variant_space

    root = row_sum.imported_candidates()[0]
    reference = row_sum.seed_candidates()[0]
    one, two = variant_space(row_sum.name, [root], 1), variant_space(row_sum.name, [root], 2)
    assert one[0].candidate_id == root.candidate_id
    assert {k.parent_id for k in one[1:]} == {reference.candidate_id, root.candidate_id}
    assert len({k.candidate_id for k in two}) == len(two) and [k.candidate_id for k in two[: len(one)]] == \
        [k.candidate_id for k in one]
    deeper = two[len(one):]
    assert deeper and {k.parent_id for k in deeper} <= {k.candidate_id for k in one[1:]}
    assert all(len(applied(k.source)) == 2 for k in deeper)


def test_a_gpu_mode_submission_runs_as_variants_of_its_function_and_the_harness_judges_them_ok(tmp_path):
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.hardware import INTERPRETER
    from kernelcast.kernels.records import HardwareSpec
    from tests.formats_for_tests import write_gpumode
    from tests.test_real_size import GPUMODE_ADD_INTO, GPUMODE_ADD_INTO_SPECS

    ref, _ = write_gpumode(tmp_path / "add_into_py", reference=GPUMODE_ADD_INTO, specs=GPUMODE_ADD_INTO_SPECS)
    op, _ = import_task("gpumode", str(ref), name="variants-add-into")
    seed = op.seed_candidates()[0]
    kids, skipped = variant_children(op, seed)
    assert [k.origin for k in kids] == [f"variant:{n}" for n in VARIANTS if n != "channels-last"]
    assert [(s.variant, s.reason) for s in skipped] == [
        ("channels-last", "a GPU MODE submission is a function of the task's data: no model whose layout to change")]
    for kid in kids:
        assert kid.parent_id == seed.candidate_id and "custom_kernel = ref_kernel" in submission_of(kid.source)
    graph = next(k for k in kids if k.origin == "variant:cuda-graph")
    again, why = variant_children(op, graph)  # a variant of a variant: no second graph, no compile around it
    assert [k.origin for k in again] == ["variant:cudnn-benchmark"]
    runnable = [k for k in kids if k.origin in ("variant:cuda-graph", "variant:cudnn-benchmark")]
    if shutil.which("g++") or shutil.which("c++"):
        runnable.append(next(k for k in kids if k.origin == "variant:compile-default"))
    cfg = WorkerConfig(mode="interpreter", concurrency=2, seeds=2, timeout_s=240)
    with MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter"), cfg) as worker:
        found = {m.candidate_id: m for m in worker.measure(runnable)}
    for kid in runnable:
        assert found[kid.candidate_id].status == "ok", (kid.origin, found[kid.candidate_id].error)

    # the variants generator takes the task, as it takes a KernelBench problem
    config = resolve(SearchConfig(op=op.name, generator="variants", gpu_type="h100", backend="replay"))
    made = make_generator(config).children(op.name, None, Archive(), 64, random.Random(0), 0.0, seed=0, run_id="r",
                                           generation=0)
    assert {k.origin for k in made.children} == {k.origin for k in kids}


def test_the_headroom_benchmark_takes_gpu_mode_tasks_searched_from_their_reference(tmp_path, monkeypatch):
    from benchmarks import headroom_search
    from tests.formats_for_tests import write_gpumode
    from tests.test_real_size import GPUMODE_ADD_INTO, GPUMODE_ADD_INTO_SPECS

    monkeypatch.setenv("KERNELCAST_TASKS", str(tmp_path / "installed"))
    write_gpumode(tmp_path / "add_into_py", reference=GPUMODE_ADD_INTO, specs=GPUMODE_ADD_INTO_SPECS)
    args = headroom_search.parse(["--problems", "none", "--gpumode", str(tmp_path / "add_into_py")])
    assert headroom_search.problems(args) == ["gpumode.add_into"]
    settings = headroom_search.problem_settings(args, "gpumode.add_into")
    assert settings["generator_roots"] == "" and settings["generator"] == "variants"
    assert headroom_search.problem_settings(args, "kb.cudal1-l2-017")["generator_roots"].endswith("kernelcast")
    space = headroom_search.variant_space("gpumode.add_into", [])
    assert [k.origin for k in space] == [f"variant:{n}" for n in VARIANTS if n != "channels-last"]
    with pytest.raises(ValueError, match="no reference.py there"):
        headroom_search.problems(headroom_search.parse(["--problems", "none", "--gpumode", str(tmp_path)]))


def test_the_headroom_prior_with_spaces_holds_the_pool_and_every_spaces_rows(tmp_path):
    from benchmarks import headroom_search
    from kernelcast.kernels.records import Candidate, Measurement
    from kernelcast.storage.dataset import DataRoot

    def root_with(path, op, n):
        kids = [Candidate(op=op, backend="torch", origin="import", source=f"def forward(x):\n    return x * {k}\n")
                for k in range(n)]
        DataRoot(str(path)).write_candidates(kids)
        DataRoot(str(path)).write_measurements([Measurement(k.candidate_id, op, "h100", "ok", "gpu", case_names=("c",),
                                                            runtime_us_median=(1.0,), speedup=1.0) for k in kids])

    root_with(tmp_path / "pool", "kb.cudal1-l1-001", 3)
    root_with(tmp_path / "spaces" / "kb.cudal1-l2-002", "kb.cudal1-l2-002", 2)
    root_with(tmp_path / "spaces" / "gpumode.grayscale", "gpumode.grayscale", 4)
    merged = DataRoot(headroom_search.prior_with_spaces(str(tmp_path / "pool"), str(tmp_path / "spaces"),
                                                        str(tmp_path / "prior")))
    assert merged.read_candidates()["op"].value_counts().to_dict() == \
        {"gpumode.grayscale": 4, "kb.cudal1-l1-001": 3, "kb.cudal1-l2-002": 2}
    assert len(merged.read_measurements()) == 9
    # built afresh: a second build does not double the rows
    headroom_search.prior_with_spaces(str(tmp_path / "pool"), str(tmp_path / "spaces"), str(tmp_path / "prior"))
    assert len(DataRoot(str(tmp_path / "prior")).read_measurements()) == 9
    with pytest.raises(ValueError, match="--prior-spaces .*no such folder"):
        headroom_search.prior_with_spaces(str(tmp_path / "pool"), str(tmp_path / "nowhere"), str(tmp_path / "p2"))
    assert headroom_search.main(["--prior-spaces", str(tmp_path / "nowhere"), "--problems", "none",
                                 "--pool", str(tmp_path / "pool"), "--data", str(tmp_path / "d")]) == 2


def test_a_space_of_the_references_compile_variants_only_and_an_unknown_variant_refused(tmp_path, capsys):
    from benchmarks import headroom_search
    from tests.formats_for_tests import write_gpumode
    from tests.test_real_size import GPUMODE_ADD_INTO, GPUMODE_ADD_INTO_SPECS

    ref, _ = write_gpumode(tmp_path / "add_into_py", reference=GPUMODE_ADD_INTO, specs=GPUMODE_ADD_INTO_SPECS)
    op, _ = import_task("gpumode", str(ref), name="space-add-into")
    modes = ("compile-default", "compile-reduce-overhead", "compile-max-autotune-no-cudagraphs")
    space = headroom_search.variant_space(op.name, [], 1, modes)
    assert [k.origin for k in space] == [f"variant:{m}" for m in modes]
    assert {k.parent_id for k in space} == {op.seed_candidates()[0].candidate_id}
    args = headroom_search.parse(["--space", "--space-reference-only", "--space-variants", *modes])
    assert args.space_reference_only and args.space_variants == list(modes)
    with pytest.raises(SystemExit):
        headroom_search.parse(["--space", "--space-variants", "compile-fastest"])
    assert "unknown variant(s) compile-fastest; known: compile-default" in capsys.readouterr().err


def test_every_problem_of_the_pool_in_order(tmp_path):
    from benchmarks import headroom_search
    from kernelcast.kernels.records import Candidate
    from kernelcast.storage.dataset import DataRoot

    DataRoot(str(tmp_path / "p" / "kernelcast")).write_candidates(
        [Candidate(op=op, backend="torch", origin="import", source=f"def forward(x):\n    return x  # {op}\n")
         for op in ("kb.cudal1-l2-002", "gpumode.other", "kb.cudal1-l1-001")])
    args = headroom_search.parse(["--pool", str(tmp_path / "p"), "--problems", "all", "--shard", "0/1"])
    assert headroom_search.problems(args) == ["kb.cudal1-l1-001", "kb.cudal1-l2-002"]


def test_a_live_headroom_search_has_the_model_rewrite_the_pools_kernels_beside_their_variants(server, tmp_path,  # noqa: F811,E501
                                                                                               monkeypatch):
    """``headroom_search --live URL``: generator freeform+variants from the problem's kernels in the CUDA-L1 pool,
    the model behind the endpoint asked for rewrites of them; refused with a fixed space or a replayed backend."""
    from pathlib import Path

    from benchmarks import headroom_search
    from kernelcast.kernels.formats import TASKS_ENV, install_from_root
    from kernelcast.tasks.config import validate
    from kernelcast.tasks.generators import template_roots

    pool = str(Path(__file__).resolve().parents[1] / "data" / "pools" / "cudal1" / "kernelcast")
    monkeypatch.setenv(TASKS_ENV, str(tmp_path / "tasks"))
    op = "kb.cudal1-l2-017"
    install_from_root(DataRoot(pool), op)
    live = ["--live", server.base_url, "--live-model", "tiny", "--model-sha256", "ab" * 32, "--max-tokens", "64",
            "--concurrency", "2"]
    with pytest.raises(SystemExit):
        headroom_search.parse(live + ["--backend", "replay"])
    with pytest.raises(SystemExit):
        headroom_search.parse(live + ["--space", "--space-rewrites", "-1"])
    args = headroom_search.parse(live + ["--problems", "l2-017", "--data", str(tmp_path / "data")])
    settings = headroom_search.problem_settings(args, op)
    assert settings["generator"] == "freeform+variants" and settings["generator_url"] == server.base_url
    assert settings["generator_model_sha256"] == "ab" * 32 and settings["generator_roots"] == pool
    # The same settings, measured from the pool's own timings here (no GPU): the model is asked for rewrites of the
    # pool's kernels, which the search measured first.
    config = validate(SearchConfig(**(settings | dict(backend="replay", replay_pool=pool, gpu_type="h100",
                                                       generator_children=2, generations=4)),
                                   surrogate="none", budget=12, seed=0))
    search, result = run(config)
    assert search.generator.name == "freeform+variants"
    roots = {c.candidate_id for c, _ in template_roots(pool, op, "h100")}
    # the pool's kernels first, with no request; then the model is asked (the tiny model's answers are noise)
    assert result.generations[0].generator_asked == 0 and sum(g.generator_asked for g in result.generations) > 0
    made = DataRoot(config.data).read_candidates(op)
    assert roots <= set(made["candidate_id"])
    variants = made[made["origin"].str.startswith("variant:")]
    assert len(variants) and set(variants["parent_id"]) & roots  # the pool's kernels run other ways too


def test_a_headroom_replay_names_the_generator_and_the_origin_of_each_best_kernel(tmp_path, monkeypatch):
    """The committed headroom pool replayed for one problem: each row names its generator and where each side's
    best kernel came from (as the data root records it), and the summary says both."""
    import json
    from pathlib import Path

    from benchmarks import headroom_search

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    out = tmp_path / "rows.json"
    md = tmp_path / "summary.md"
    assert headroom_search.main(["--problems", "l2-096", "--backend", "replay", "--replay-pool", "data/pools/headroom",
                                 "--gpu-type", "h100", "--seeds", "1", "--budgets", "4", "--modes", "measurements",
                                 "--data", str(tmp_path / "data"), "--json", str(out), "--markdown", str(md)]) == 0
    [row] = json.loads(out.read_text())["runs"]
    assert row["generator"] == "variants" and row["model"] == ""
    made = DataRoot(str(tmp_path / "data" / "kb.cudal1-l2-096")).read_candidates("kb.cudal1-l2-096")
    origin = dict(zip(made["candidate_id"], made["origin"]))
    assert row["baseline_best_origin"] == origin[row["baseline_best_candidate"]] != ""
    assert row["surrogate_best_origin"] == origin[row["surrogate_best_candidate"]] != ""
    text = md.read_text()
    assert "generator variants from CUDA-L1's kernels" in text
    side = "surrogate" if row["surrogate_best"] >= row["baseline_best"] else "baseline"
    assert f"{row[f'{side}_best_candidate']} ({row[f'{side}_best_origin']})" in text


def test_a_space_with_a_live_model_asks_it_for_k_rewrites_of_each_root_and_records_who_wrote_them(
        server, tmp_path, monkeypatch):  # noqa: F811
    """``headroom_search --space --live``: the model behind the real endpoint is asked ``--space-rewrites`` times for
    each of the problem's roots (CUDA-L1's best, median and poor kernel); every child that passes the static checks
    is a child of the root it rewrote, with its provenance in the space's root (the tiny model's answers are noise,
    so the count asked is what is checked); a summary counts how the rewrites fared against their parents."""
    import types
    from pathlib import Path

    from benchmarks import headroom_search
    from kernelcast.kernels.formats import TASKS_ENV, install_from_root
    from kernelcast.tasks.config import validate
    from kernelcast.tasks.generators import template_roots

    pool = str(Path(__file__).resolve().parents[1] / "data" / "pools" / "cudal1" / "kernelcast")
    monkeypatch.setenv(TASKS_ENV, str(tmp_path / "tasks"))
    op = "kb.cudal1-l2-017"
    install_from_root(DataRoot(pool), op)
    args = headroom_search.parse(["--live", server.base_url, "--live-model", "tiny", "--max-tokens", "32",
                                  "--concurrency", "3", "--space", "--space-rewrites", "2", "--problems", "l2-017",
                                  "--data", str(tmp_path / "data")])
    settings = headroom_search.problem_settings(args, op) | dict(generator_schema_style=LLAMA_CPP_PYTHON)
    config = validate(SearchConfig(**(settings | dict(gpu_type="h100", backend="replay", replay_pool=pool,
                                                       generations=1)),
                                   surrogate="none", budget=1, seed=0, run_id="space-rewrites"))
    roots = template_roots(pool, op, "h100")
    search = types.SimpleNamespace(config=config, root=DataRoot(str(tmp_path / "root")))
    asked: list = []
    from kernelcast.tasks.llm_generator import LLMGenerator

    propose = LLMGenerator.propose

    def noting(self, op_name, parents, *a, **kw):  # the real model is asked; this notes for which parents
        asked.extend(p.candidate.candidate_id for p in parents)
        return propose(self, op_name, parents, *a, **kw)

    monkeypatch.setattr(LLMGenerator, "propose", noting)
    kids = headroom_search.model_rewrites(search, op, roots, [], 2)
    assert sorted(asked) == sorted([c.candidate_id for c, _ in roots] * 2)
    assert all(k.origin == "llm" and k.parent_id in {c.candidate_id for c, _ in roots} for k in kids)
    if kids:
        assert set(search.root.read("provenance")["candidate_id"]) == {k.candidate_id for k in kids}
    # How the rewrites fared: one ran 1.2x faster than its parent, one failed, one was never measured.
    import datetime as dt

    parent = roots[0][0]
    a, b, c = (types.SimpleNamespace(candidate_id=f"k{i}", parent_id=parent.candidate_id) for i in range(3))
    start = dt.datetime(2026, 11, 27, 20, tzinfo=dt.timezone.utc)
    now, earlier = start + dt.timedelta(minutes=1), start - dt.timedelta(days=1)
    found = {parent.candidate_id: types.SimpleNamespace(status="ok", speedup=2.0, measured_at=now),
             "k0": types.SimpleNamespace(status="ok", speedup=2.4, measured_at=now),
             "k1": types.SimpleNamespace(status="incorrect", speedup=None, measured_at=now)}
    summary = headroom_search.rewrite_summary([a, b, c], found, 1.5, start)
    assert summary["rewrites"] == 3 and summary["rewrites_ok"] == 1
    assert summary["rewrite_statuses"] == {"ok": 1, "incorrect": 1, "unmeasured": 1}
    assert summary["rewrite_best"] == 2.4 and summary["rewrite_best_over_parent"] == pytest.approx(1.2)
    assert summary["rewrites_faster_than_parent"] == 1 and summary["rewrites_10pct_faster"] == 1
    # a parent measured in an earlier call of the space (another reference measurement) is not set against
    found[parent.candidate_id] = types.SimpleNamespace(status="ok", speedup=0.5, measured_at=earlier)
    summary = headroom_search.rewrite_summary([a, b, c], found, 1.5, start)
    assert summary["rewrite_best_over_parent"] is None and summary["rewrites_10pct_faster"] == 0
    assert summary["rewrites_with_parent_measured_earlier"] == 1 and summary["rewrite_best"] == 2.4


def test_the_models_rewrites_join_a_space_measured_before_without_a_model(server, tmp_path, monkeypatch, capsys):  # noqa: F811,E501
    """A space measured by ``--space`` alone, then again with ``--live``: the second call is a run of its own in the
    same root (its model settings are not the first run's), reuses what the first measured, and reports the
    rewrites it asked for (on this machine's CPU, correctness only)."""
    import json
    from pathlib import Path

    from benchmarks import headroom_search
    from kernelcast.kernels.formats import TASKS_ENV

    monkeypatch.setenv(TASKS_ENV, str(tmp_path / "tasks"))
    pool = str(Path(__file__).resolve().parents[1] / "data" / "pools" / "cudal1")
    common = ["--space", "--space-reference-only", "--space-variants", "cudnn-benchmark", "--pool", pool,
              "--problems", "l2-096", "--backend", "local", "--gpu-type", "interpreter", "--data", str(tmp_path / "d")]
    live = ["--live", server.base_url, "--live-model", "tiny", "--max-tokens", "32", "--concurrency", "2",
            "--space-rewrites", "2"]
    assert headroom_search.main(common + ["--json", str(tmp_path / "a.json")]) == 0
    assert headroom_search.main(common + live + ["--json", str(tmp_path / "b.json")]) == 0
    assert "search failed" not in capsys.readouterr().out
    [first] = json.loads((tmp_path / "a.json").read_text())["runs"]
    [second] = json.loads((tmp_path / "b.json").read_text())["runs"]
    assert "rewrites" not in first and second["reused"] >= first["measured"] >= 1
    assert second["rewrites"] == second["children"] - first["children"]


def test_a_space_stopped_part_way_keeps_no_child_unmeasured_and_a_second_call_completes_it(tmp_path, monkeypatch,
                                                                                          capsys):
    """A space's call killed at its deadline left children written but never measured, which a replay then met as
    rejected (2026-11-28): the children are now written once measured, and a second call reuses what was."""
    import json
    from pathlib import Path

    from benchmarks import headroom_search
    from kernelcast.kernels.formats import TASKS_ENV
    from kernelcast.kernels.ops import get_operation
    from kernelcast.storage.dataset import DataRoot

    monkeypatch.setenv(TASKS_ENV, str(tmp_path / "tasks"))
    pool = str(Path(__file__).resolve().parents[1] / "data" / "pools" / "cudal1")
    common = ["--space", "--space-reference-only", "--space-variants", "cudnn-benchmark", "cuda-graph", "--pool", pool,
              "--problems", "l2-096", "--backend", "local", "--gpu-type", "interpreter", "--data", str(tmp_path / "d")]
    monkeypatch.setattr("kernelcast.tasks.search._FLUSH_EVERY", 1)
    real, written_ids = DataRoot.write_measurements, []

    def stopped(self, rows):  # the reference's measurement and one child's are written, then the call is stopped
        real(self, rows)
        written_ids.extend(r.candidate_id for r in rows)
        # by the ids written so far, not by the count of writes: the reference may be written more than once, and
        # in an order that depends on which of the children finishes first (one write a measurement here)
        if len(set(written_ids)) >= 2:
            raise KeyboardInterrupt("the deadline")

    monkeypatch.setattr(DataRoot, "write_measurements", stopped)
    with pytest.raises(KeyboardInterrupt):
        headroom_search.main(common + ["--json", str(tmp_path / "a.json")])
    root = DataRoot(str(tmp_path / "d" / "kb.cudal1-l2-096"))
    written = set(root.read_candidates()["candidate_id"])
    measured = set(root.read_measurements()["candidate_id"])
    assert written and written <= measured  # nothing a replay would meet unmeasured
    monkeypatch.setattr(DataRoot, "write_measurements", real)
    assert headroom_search.main(common + ["--json", str(tmp_path / "b.json")]) == 0
    assert "search failed" not in capsys.readouterr().out
    [row] = json.loads((tmp_path / "b.json").read_text())["runs"]
    assert row["reused"] >= 1 and row["children"] == 2
    # the interpreter times nothing to compare, so the anchor's agreement is unknown
    assert len(row["anchors"]) == 1 and row["anchors_agree"] is None, (
        row["anchors"], root.read_measurements()[["candidate_id", "status", "error"]].to_dict("records"))
    assert set(root.read_candidates()["candidate_id"]) <= set(root.read_measurements()["candidate_id"])
    assert len(set(root.read_candidates()["candidate_id"])) == 3  # the reference and its two variants
    # Each call is logged, the stopped one too; the second measured the first call's child again as its anchor
    # (its row in the log, not among the measurements: the space keeps one row a child).
    first, second = headroom_search.space_calls(root)
    assert first["measured"] == 1 and first["anchors"] == [] and second["measured"] == 1
    [anchor] = second["anchors"]
    assert anchor["candidate_id"] in measured and anchor["status"] == "ok"
    kids = root.read_measurements()
    kids = kids[kids["candidate_id"] != get_operation("kb.cudal1-l2-096").seed_candidates()[0].candidate_id]
    assert len(kids) == kids["candidate_id"].nunique() == 2


def test_the_oracle_replayed_on_a_measured_space_finds_its_best_kernel_within_budget(tmp_path, monkeypatch):
    """``headroom_search --surrogates oracle --surrogate-folder data/pools/spaces/{op}``: the ceiling of a space.
    On KernelBench level2/35's space the oracle reaches the space's best (a CUDA graph at 2.53x) in 8 measurements;
    before a would-be best left over by a generation's budget waited for the next one, it was trusted unmeasured
    and the oracle ended at 2.10x."""
    import json
    from pathlib import Path

    from benchmarks import headroom_search
    from kernelcast.storage.schema import measurements_from_frame

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    op = "kb.cudal1-l2-035"
    space = DataRoot(f"data/pools/spaces/{op}")
    best = max(m.speedup for m in measurements_from_frame(space.read_measurements(op=op, gpu_type="h100"))
               if m.status == "ok" and m.speedup)
    out = tmp_path / "rows.json"
    assert headroom_search.main(["--problems", "l2-035", "--backend", "replay", "--replay-pool", "data/pools/spaces",
                                 "--gpu-type", "h100", "--seeds", "1", "--budgets", "8", "--modes", "measurements",
                                 "--surrogates", "oracle", "--surrogate-folder", "data/pools/spaces/{op}",
                                 "--data", str(tmp_path / "data"), "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())["runs"]
    assert row["surrogate"] == "oracle" and row["surrogate_best"] == pytest.approx(best)
    assert row["surrogate_best"] >= row["baseline_best"]


def test_a_child_passed_on_gets_its_own_variants_offered_in_the_next_generation(row_sum):
    """A search that is sure a variant is no better passes on it; its variants still come, after the measured
    parents' own, so that a variant that pays where its parent does not can be met without measuring the parent."""
    generator = make_generator(SearchConfig(op=row_sum.name, generator="variants"))
    reference = row_sum.seed_candidates()[0]
    archive = Archive()
    first = generator.children(row_sum.name, None, archive, 64, random.Random(0), 0.0, seed=0, run_id="r",
                               generation=0).children
    assert first and {k.parent_id for k in first} == {reference.candidate_id}
    measured, passed = first[0], first[1:]
    archive.add_measured(measured, Measurement(measured.candidate_id, row_sum.name, "h100", "ok", "gpu", speedup=0.9))
    later = generator.children(row_sum.name, None, archive, 64, random.Random(1), 0.0, seed=0, run_id="r",
                               generation=1).children
    parents = [k.parent_id for k in later]
    through_passed = [k for k in later if k.parent_id in {p.candidate_id for p in passed}]
    assert through_passed and all(len(applied(k.source)) == 2 for k in through_passed)
    # the passed children come again, with the measured parent's variants before any of theirs
    assert {p.candidate_id for p in passed} <= {k.candidate_id for k in later}
    assert max(i for i, p in enumerate(parents) if p in (reference.candidate_id, measured.candidate_id)) < \
        min(i for i, k in enumerate(later) if k in through_passed)
    for kid in later:
        archive.add_measured(kid, Measurement(kid.candidate_id, row_sum.name, "h100", "incorrect", "gpu"))
    assert generator.exhausted(None, archive) == (not generator.passed(archive))


def test_the_oracle_on_a_depth_two_space_meets_a_variant_of_a_kernel_it_passed_on(tmp_path, monkeypatch):
    """KernelBench level2/17's depth-2 space on an H200 (data/pools/spaces-h200): its best kernel (2.57x) is a CUDA
    graph of a cuDNN-autotuned CUDA-L1 kernel that runs at about 1.1x itself. The oracle, sure the parent is no
    new best, never measured it, so the best never came: it ended at 2.47x at budget 16 while the baseline found
    2.57x. Now a passed child's variants are offered, and the oracle reaches the space's best."""
    import json
    from pathlib import Path

    from benchmarks import headroom_search
    from kernelcast.storage.schema import measurements_from_frame

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    op = "kb.cudal1-l2-017"
    space = DataRoot(f"data/pools/spaces-h200/{op}")
    best = max(m.speedup for m in measurements_from_frame(space.read_measurements(op=op, gpu_type="h200"))
               if m.status == "ok" and m.speedup)
    out = tmp_path / "rows.json"
    assert headroom_search.main(["--problems", "l2-017", "--backend", "replay", "--replay-pool",
                                 "data/pools/spaces-h200", "--pool", "data/pools/cudal1/h100-2026-11-27",
                                 "--gpu-type", "h200", "--seeds", "1", "--budgets", "16", "--modes", "measurements",
                                 "--surrogates", "oracle", "--surrogate-folder", "data/pools/spaces-h200/{op}",
                                 "--data", str(tmp_path / "data"), "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())["runs"]
    assert row["surrogate"] == "oracle" and row["surrogate_best"] == pytest.approx(best)
