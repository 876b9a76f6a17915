"""The search in the LLM regime on a CPU: the replay generator walks the packaged corpus's recorded tree,
measured from the corpus's own measurements; the GPU-seconds budget and why a search stops."""

from __future__ import annotations

import pytest

from kernelcast.kernels.formats import submission_of
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.screen import screen
from kernelcast.storage.dataset import DataRoot
from kernelcast.tasks.config import PACKAGED_CORPUS, ConfigError, SearchConfig
from kernelcast.tasks.replay import ReplayModel, read_tree
from kernelcast.tasks.setup import resolve
from tests.test_search import FailingPool, run

OP = "softmax"  # 3 roots and their recorded children, three rounds deep; some pass today's static checks


def config(tmp_path, **changes) -> SearchConfig:
    base = dict(op=OP, gpu_type="h100", budget=64, generations=8, children=16, generator="replay",
                surrogate="none", seed=2, data=str(tmp_path / "data"), backend="replay")
    return SearchConfig(**{**base, **changes})




def passing_nodes() -> dict[str, str | None]:
    """Every node of the recorded tree a search can reach -> its parent id: it passes today's static checks,
    and so do its ancestors (the corpus measured some children those checks drop, and their children)."""
    tree = read_tree(PACKAGED_CORPUS, OP)
    op = get_operation(OP)
    passing = {c.candidate_id: c.parent_id for c in tree.nodes()
               if screen(op, c, submission_of(c.source), set())[0] is None}
    roots = {r.candidate_id for r in tree.roots}

    def reachable(cid: str) -> bool:
        return cid in roots or (cid in passing and reachable(passing[cid]))

    return {cid: parent for cid, parent in passing.items() if reachable(cid)}


def test_the_recorded_tree_runs_from_the_reference_through_its_roots_to_their_children():
    tree = read_tree(PACKAGED_CORPUS, OP)
    assert tree.reference_id == get_operation(OP).seed_candidates()[0].candidate_id
    assert [r.origin for r in tree.roots] == ["template"] * 3
    written = DataRoot(PACKAGED_CORPUS).read_candidates(OP)
    written = written[written["origin"] == "llm"]
    roots = {r.candidate_id for r in tree.roots}
    kids = [k for r in tree.roots for k in tree.children[r.candidate_id]]
    assert len(kids) == written["parent_id"].isin(roots).sum() and all(k.origin == "llm" for k in kids)
    deeper = [k for kid in kids for k in tree.children.get(kid.candidate_id, ())]
    assert deeper and all(k.origin == "llm" for k in deeper)  # children of children: later rounds
    nodes = tree.nodes()
    assert len(nodes) == len(roots) + len(written) and len({n.candidate_id for n in nodes}) == len(nodes)


def test_a_replay_search_walks_the_recorded_tree_exactly_and_replays_each_childs_status(tmp_path):
    search, result = run(config(tmp_path, budget=512, generations=32, children=64))  # room for the whole tree
    assert result.stop_reason == "no candidates"  # every recorded answer was given, none left
    root = DataRoot(str(tmp_path / "data"))
    decided = root.read_run_rows("decisions", result.run_id, op=OP)
    expected = passing_nodes()
    assert set(decided["candidate_id"]) == set(expected) and decided["candidate_id"].is_unique
    assert set(decided["decision"]) == {"measure"}  # the baseline measures every child it gets
    assert {cid: search.candidates[cid].parent_id for cid in decided["candidate_id"]} == expected
    corpus = DataRoot(PACKAGED_CORPUS).read_measurements(op=OP, gpu_type="h100").set_index("candidate_id")
    mine = root.read_measurements(op=OP, gpu_type="h100").set_index("candidate_id").loc[list(expected)]
    assert (mine["status"] == corpus.loc[list(expected), "status"]).all() and mine["replayed"].all()
    assert 0 < (mine["status"] != "ok").sum() < len(expected)  # some fail, as they did on the GPU, some run
    asked = sum(s.generator_asked for s in result.generations)
    refused = sum(s.generator_asked - s.generator_children for s in result.generations)
    tree = read_tree(PACKAGED_CORPUS, OP)
    roots = {r.candidate_id for r in tree.roots}
    offered = [n for n in tree.nodes() if n.candidate_id in roots or n.parent_id in expected]
    assert (asked, refused) == (len(offered), len(offered) - len(expected))  # every answer to a reached parent
    # asked once; the checks refuse the rest
    provenance = root.read("provenance", op=OP)
    provenance = provenance[provenance["run_id"] == result.run_id]
    assert set(provenance["candidate_id"]) == set(expected)
    llm = provenance[provenance["generator"] == "replay:llm-source"]
    assert len(llm) == sum(search.candidates[c].origin == "llm" for c in expected) and set(llm["model"]) == {"qwen2.5-coder-1.5b"}


def test_the_walk_is_fixed_by_the_seed(tmp_path):
    walks = []
    for seed, data in ((2, "a"), (2, "b"), (3, "c")):
        _, result = run(config(tmp_path, seed=seed, budget=8, generations=2, data=str(tmp_path / data)))
        rows = DataRoot(str(tmp_path / data)).read_run_rows("decisions", result.run_id, op=OP)
        walks.append(list(rows.sort_values(["generation", "decided_at"])["candidate_id"]))
    assert walks[0] == walks[1] and walks[0] != walks[2]


def test_a_resumed_replay_search_walks_the_same_tree_without_measuring_twice(tmp_path):
    from kernelcast.tasks.search import Search
    from kernelcast.tasks.setup import data_root, forecaster, measure_pool

    _, clean = run(config(tmp_path, run_id="clean", surrogate="roofline", budget=12, generations=3,
                          data=str(tmp_path / "clean")))
    cfg = resolve(config(tmp_path, run_id="crashy", surrogate="roofline", budget=12, generations=3))
    root = data_root(cfg)
    failing = FailingPool(measure_pool(cfg), allow=1 + 3 + 2)  # reference, generation 0's roots, part of 1
    with pytest.raises(RuntimeError, match="node lost"):
        Search(cfg, root, failing, forecaster(cfg, root)).start().run()
    counting = FailingPool(measure_pool(cfg), allow=10**6)
    resumed = Search(cfg, root, counting, forecaster(cfg, root)).start().run()
    assert not set(counting.asked) & set(failing.asked)
    decided = {name: DataRoot(str(tmp_path / d)).read_run_rows("decisions", name, op=OP)
               for name, d in (("clean", "clean"), ("crashy", "data"))}
    walk = {k: sorted(zip(v["generation"], v["candidate_id"], v["decision"])) for k, v in decided.items()}
    assert walk["crashy"] == walk["clean"]
    assert [g.best_candidate_id for g in resumed.generations] == [g.best_candidate_id for g in clean.generations]
    assert resumed.budget_used == clean.budget_used


def test_the_replay_backend_answers_from_the_corpus_and_a_missing_op_is_named(tmp_path):
    assert resolve(config(tmp_path)).replay_pool == PACKAGED_CORPUS
    model = ReplayModel(PACKAGED_CORPUS, "attention_nope")
    with pytest.raises(ValueError, match="holds no attention_nope candidates; it holds: attention, bias_gelu"):
        model.probe()
    with pytest.raises(ConfigError, match="unknown generator 'replayed'; known: template, llm, freeform, replay"):
        resolve(config(tmp_path, generator="replayed"))


# ---- budgets and why a search stops -------------------------------------------------------------


def test_the_gpu_seconds_budget_stops_a_search_at_the_wave_that_spends_it(tmp_path):
    limit = 2.0
    search, result = run(config(tmp_path, generator="template", surrogate="none", budget=64, generations=4,
                                gpu_seconds_budget=limit, measure_wave=2))
    assert result.stop_reason == "gpu_seconds"
    assert result.gpu_seconds >= limit and result.budget_used < 64
    assert sum(search.charges[:-2]) < limit  # the last wave started under the limit: at most one wave over it
    root = DataRoot(str(tmp_path / "data"))
    decided = root.read_run_rows("decisions", result.run_id, op=OP)
    assert (decided["decision"] == "measure").sum() == result.budget_used  # what was not measured is dropped
    assert result.gpu_seconds == pytest.approx(sum(search.charges))


@pytest.mark.parametrize("changes, reason", [
    (dict(generator="template", budget=8, generations=4), "budget"),
    (dict(budget=64, generations=2), "generations"),  # the replayed tree has more, the budget is not spent
])
def test_a_search_says_why_it_stopped(tmp_path, changes, reason):
    _, result = run(config(tmp_path, **changes))
    assert result.stop_reason == reason


def test_the_cli_summary_names_the_stop_reason(tmp_path):
    from kernelcast.tasks.report import summary_lines

    _, result = run(config(tmp_path, generator="template", budget=8, generations=4))
    assert "stopped: budget" in summary_lines(result, "data", "sqlite://", None)[0]


def test_a_strict_search_counts_a_kernel_of_lower_precision_as_incorrect_and_its_report_agrees(tmp_path):
    """The same replayed pool, where every kernel above the median speedup was computed (say) in fp16 for an fp32
    task: under tolerance the search's best is one of them; under strict they fail, measured or reused, and the
    run comparison rebuilds the strict run's curve as the run counted it."""
    import dataclasses

    import numpy as np

    from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
    from kernelcast.tasks.config import PACKAGED_POOL
    from kernelcast.tasks.report import compare_runs

    source = DataRoot(PACKAGED_POOL)
    rows = source.read_measurements(op=OP, gpu_type="h100")
    cut = float(np.nanmedian(rows.loc[rows["status"] == "ok", "speedup"]))
    flagged = [dataclasses.replace(m, precision="case x: lower: tf32/fp16 (5.0e-04) where the reference is float32 "
                                                "(2.0e-08)") if m.status == "ok" and (m.speedup or 0) > cut else m
               for m in measurements_from_frame(rows)]
    pool = DataRoot(str(tmp_path / "pool"))
    pool.write_candidates(candidates_from_frame(source.read_candidates(OP)))
    pool.write_measurements(flagged)
    best = {}
    for mode in ("tolerance", "strict"):
        cfg = config(tmp_path, generator="template", surrogate="none", budget=64, generations=4, children=64,
                     replay_pool=str(pool.path), precision=mode, data=str(tmp_path / "data"),
                     run_id=f"softmax-{mode}")  # two runs in one second would share a default id
        _, result = run(cfg)
        best[mode] = (result.run_id, result.best_speedup)
    assert best["tolerance"][1] > cut >= best["strict"][1] > 0
    traces = {t.run_id: t for t in compare_runs(DataRoot(str(tmp_path / "data")), OP, "h100").traces}
    assert traces[best["strict"][0]].best == pytest.approx(best["strict"][1])
    assert traces[best["tolerance"][0]].best == pytest.approx(best["tolerance"][1])
    with pytest.raises(ConfigError, match="unknown precision 'exact'; known: tolerance, strict"):
        resolve(config(tmp_path, precision="exact"))
