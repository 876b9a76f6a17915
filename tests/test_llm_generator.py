"""The LLM mutation generator: schema-constrained variants, fenced submissions, and searches that use it.

The model is served by llama.cpp's server on loopback (fixtures from test_llm_forecaster):
the tiny random-weight model has equal logits everywhere, so at temperature 1 it samples
uniformly among what the grammar allows: schema-constrained answers are random valid
variants, and free-text answers are noise that must be dropped and counted.
"""

from __future__ import annotations

import random

import pytest

from tests.formats_for_tests import KB_ROW_SUM_NEW, write_kernelbench
from tests.test_llm_forecaster import LLAMA_CPP_PYTHON, server, tiny_model  # noqa: F401 (fixtures)

from kernelcast.kernels.formats import import_task
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.spaces import get_space
from kernelcast.storage.dataset import DataRoot
from kernelcast.tasks.config import ConfigError, SearchConfig, validate
from kernelcast.tasks.llm_generator import (LLMGenerator, Parent, mixed_children, source_from_answer, variant_from_answer,
                                 variant_schema)
from kernelcast.tasks.state import Archive


def _generator(url, **kwargs) -> LLMGenerator:
    return LLMGenerator(url, "tiny", **{"schema_style": LLAMA_CPP_PYTHON, "temperature": 1.0, "concurrency": 2,
                                        **kwargs})


# ---------------------------------------------------------------- answers


def test_the_schema_names_every_algorithm_parameter_and_allowed_value():
    space = get_space("softmax")
    options = variant_schema(space)["properties"]["child"]["anyOf"]
    assert [o["properties"]["algorithm"]["enum"] for o in options] == [[a.name] for a in space.algorithms]
    for option, algo in zip(options, space.algorithms):
        assert {k: v["enum"] for k, v in option["properties"].items() if k != "algorithm"} == \
            {k: list(v) for k, v in algo.axes.items()}


def test_an_answer_naming_a_valid_variant_is_read_and_anything_else_is_not():
    space = get_space("softmax")
    algo = space.algorithms[0]
    params = dict(space.variants()[0].params)
    answer = '{"child": ' + str({"algorithm": algo.name, **params}).replace("'", '"') + "}"
    assert variant_from_answer(space, answer) == (algo.name, params, False)
    off_grid = answer.replace(f'"num_warps": {params["num_warps"]}', '"num_warps": 3')
    for bad in (off_grid, '{"child": {"algorithm": "bogus"}}', "bin five", ""):
        assert variant_from_answer(space, bad) is None, bad


def test_the_last_fenced_block_defining_the_entry_point_is_the_submission():
    answer = ("Here is a sketch:\n```python\nx = 1\n```\nAnd the kernel:\n```python\n" + KB_ROW_SUM_NEW +
              "```\nDone.")
    assert source_from_answer(answer, "ModelNew") == KB_ROW_SUM_NEW
    assert source_from_answer(answer, "custom_kernel") is None
    assert source_from_answer("```python\nclass ModelNew(:\n```", "ModelNew") is None  # does not parse
    assert source_from_answer("class ModelNew: pass", "ModelNew") is None  # not fenced


# ---------------------------------------------------------------- a real server


def test_schema_constrained_answers_are_valid_variants_with_origin_llm(server):  # noqa: F811
    space = get_space("row_sum")
    parent = space.variants()[7]
    generator = _generator(server.base_url)
    children = generator.propose("row_sum", [Parent(parent, 1.3, "ok")] * 6, space, seed=1)
    valid = {c.candidate_id for c in space.variants()}
    assert generator.counts_.invalid == 0 and generator.counts_.failed == 0
    # the same variant twice is one child: repeats are dropped as duplicates, and counted
    assert len(children) + generator.counts_.duplicate == 6 and len({c.candidate_id for c in children}) == len(children)
    assert all(c.candidate_id in valid and c.origin == "llm" and c.parent_id == parent.candidate_id
               for c in children)
    assert len({c.candidate_id for c in children}) > 1  # sampled, not one fixed answer


def test_free_text_that_is_not_a_submission_is_dropped_and_counted(server, tmp_path):  # noqa: F811
    ref, cands = write_kernelbench(tmp_path, new=KB_ROW_SUM_NEW)
    op, (imported,) = import_task("kernelbench", str(ref), [str(cands[0])], name="row_sum_gen",
                                  interpret_sizes=["batch_size=2,dim=40"])
    generator = _generator(server.base_url, max_tokens_source=48)
    assert generator.propose(op.name, [Parent(imported)] * 2, None) == []
    assert generator.counts_.asked == 2 and generator.counts_.invalid == 2
    assert generator.last_counts_.screened["no_code"] + generator.last_counts_.screened["unparsable"] + \
        generator.last_counts_.screened["no_entry"] == 2


def test_the_llm_gives_what_it_can_and_template_children_fill_the_generation(server):  # noqa: F811
    space = get_space("softmax")
    generator = _generator(server.base_url)
    children = mixed_children(generator, "softmax", space, Archive(), 12, 4, random.Random(0), 1.0, seed=3)
    origins = [c.origin for c in children]
    assert len(children) == 12 and len({c.candidate_id for c in children}) == 12
    assert 1 <= origins.count("llm") <= 4 and origins.count("template") == 12 - origins.count("llm")
    assert generator.counts_.asked == 4


# ---------------------------------------------------------------- searches


def _config(tmp_path, url, **changes) -> SearchConfig:
    base = dict(op="softmax", gpu_type="h100", budget=6, generations=2, children=8, surrogate="roofline",
                seed=1, data=str(tmp_path / "data"), backend="replay", generator="llm", generator_url=url,
                generator_model="tiny", generator_children=4, generator_schema_style=LLAMA_CPP_PYTHON)
    return SearchConfig(**{**base, **changes})


def test_a_replay_search_with_the_llm_generator_journals_llm_children(server, tmp_path):  # noqa: F811
    from kernelcast.tasks.setup import open_search

    search = open_search(_config(tmp_path, server.base_url), track=False)
    try:
        result = search.run()
    finally:
        search.pool.close()
    assert result.budget_used == 6 and result.best_speedup is not None
    table = DataRoot(str(tmp_path / "data")).read_candidates(op="softmax")
    llm = table[table["origin"] == "llm"]
    assert len(llm) >= 1 and llm["parent_id"].notna().any()  # the second generation's have measured parents
    assert set(table["origin"]) <= {"llm", "template", "seed"} and "template" in set(table["origin"])
    assert search.generator.model.counts_.asked == 8 and search.generator.model.counts_.failed == 0


def test_an_unreachable_generator_endpoint_fails_before_anything_is_measured(tmp_path):
    from tests.conftest import free_port
    from kernelcast.tasks.setup import open_search

    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ConnectionError, match=f"LLM server at {url} is unreachable"):
        open_search(_config(tmp_path, url), track=False)
    assert DataRoot(str(tmp_path / "data")).read_measurements().empty


@pytest.mark.parametrize("changes, message", [
    ({"generator_url": ""}, "generator 'llm' needs generator_url"),
    ({"generator_url": "localhost:8000"}, "malformed generator_url"),
    ({"generator_children": 0}, "generator_children must be a positive whole number"),
    ({"generator": "evolve"}, "unknown generator .evolve.; known: template, llm, freeform"),
    ({"generator": "freeform", "generator_url": ""}, "generator .freeform. needs generator_url"),
    ({"generator_temperature": 3.0}, "generator_temperature must lie in \\[0, 2\\]"),
    ({"generator_model_sha256": "abc"}, "generator_model_sha256 must be 64 lowercase hex digits"),
    ({"generator_max_tokens": 0}, "generator_max_tokens must be a positive whole number"),
    ({"generator_concurrency": 0}, "generator_concurrency must be a positive whole number"),
])
def test_bad_generator_settings_are_refused_by_name(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(_config(tmp_path, "http://127.0.0.1:9/v1", **changes))


class InterpreterPool:
    """This machine's CPU, through the real harness under Triton's interpreter (correctness only)."""

    def __init__(self):
        from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
        from kernelcast.kernels.records import HardwareSpec

        self.worker = MeasureWorker(HardwareSpec(gpu_type="interpreter", device_name="Triton CPU interpreter"),
                                    WorkerConfig(mode="interpreter", concurrency=2, seeds=1))

    def prepare(self, op, gpu_type):
        get_operation(op)
        return self.worker.hardware

    def measure(self, candidates, gpu_type):
        return self.worker.measure(candidates)

    def close(self):
        self.worker.close()


def test_an_imported_task_is_searched_its_own_candidates_first(server, tmp_path):  # noqa: F811
    from kernelcast.surrogate.baselines import RooflineForecaster
    from kernelcast.tasks.search import Search

    ref, cands = write_kernelbench(tmp_path / "src", new=KB_ROW_SUM_NEW)
    root = DataRoot(str(tmp_path / "data"))
    op, (imported,) = import_task("kernelbench", str(ref), [str(cands[0])], name="row_sum_search",
                                  interpret_sizes=["batch_size=2,dim=40"], root=root)
    config = validate(_config(tmp_path, server.base_url, op=op.name, gpu_type="interpreter", backend="local",
                              budget=2, generations=1, children=3, generator_children=2, run_id="imported-1"))
    search = Search(config, root, InterpreterPool(), RooflineForecaster().fit())
    search.generator.model.max_tokens_source = 48  # the tiny model writes noise; no need to read much of it
    try:
        result = search.start().run()
    finally:
        search.pool.close()
    [generation] = result.generations
    assert generation.generated == 1 and generation.measured == 1 and generation.failed == 0
    measured = root.read_measurements(op=op.name)
    assert imported.candidate_id in set(measured["candidate_id"])
    assert search.generator.model.counts_.asked == 2 and search.generator.model.counts_.invalid == 2
