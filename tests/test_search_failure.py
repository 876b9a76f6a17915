"""The search sees failure: the prior's source model learns from the written corpus (the searched
operation's own children left out), and a replayed search drops the children it is sure will fail."""

from __future__ import annotations

import pytest

from kernelcast.storage.dataset import DataRoot
from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
from kernelcast.tasks.config import PACKAGED_CORPUS, PACKAGED_POOL, SearchConfig
from kernelcast.tasks.setup import fit_prior, model_path, open_search, prior_sources, resolve

OP = "bias_gelu"  # the operation with the most recorded children in the corpus
PRIOR_OPS = ("rmsnorm",)  # template variants the prior's rank models learn from


@pytest.fixture(scope="module")
def prior(tmp_path_factory) -> str:
    """A small template pool: the H100 variants of PRIOR_OPS and the searched op's (which scopes may hide)."""
    root = DataRoot(str(tmp_path_factory.mktemp("prior")))
    pool = DataRoot(PACKAGED_POOL)
    for op in (*PRIOR_OPS, OP):
        root.write_candidates(candidates_from_frame(pool.read_candidates(op)))
        root.write_measurements(measurements_from_frame(pool.read_measurements(op=op, gpu_type="h100")))
    return root.uri


def config(tmp_path, prior: str, **changes) -> SearchConfig:
    base = dict(op=OP, gpu_type="h100", budget=8, generations=4, children=16, generator="replay",
                surrogate="learned", seed=0, data=str(tmp_path / "data"), backend="replay", prior_data=prior)
    return resolve(SearchConfig(**{**base, **changes}))


def test_the_prior_learns_from_the_corpus_but_never_from_the_searched_ops_children(tmp_path, prior):
    corpus = DataRoot(PACKAGED_CORPUS).read_candidates()
    written = set(corpus.loc[corpus["origin"] == "llm", "candidate_id"])
    written_here = set(corpus.loc[(corpus["origin"] == "llm") & (corpus["op"] == OP), "candidate_id"])
    other_ops = prior_sources(config(tmp_path, prior))
    assert OP not in set(other_ops["op"])
    assert {"rmsnorm", "softmax", "transpose"} <= set(other_ops["op"])  # the corpus brings ops the pool lacks
    learned_from = set(other_ops["candidate_id"]) & written
    assert len(learned_from) > 200 and other_ops["failed"].sum() > 100  # the source model sees failures
    # prior_scope all sees the searched op's template variants, and still none of its written children
    everything = prior_sources(config(tmp_path, prior, prior_scope="all"))
    mine = everything[everything["op"] == OP]
    assert len(mine) > 200 and (mine["origin"] == "template").all()
    assert not set(everything["candidate_id"]) & written_here
    # a search that does not replay the corpus has no corpus of the op's to keep out: its prior's is
    # prior_data/llm, absent here
    template = prior_sources(config(tmp_path, prior, generator="template", prior_scope="all"))
    assert not set(template["candidate_id"]) & written


def test_the_cached_prior_is_keyed_by_the_corpus_and_the_op_it_leaves_out(tmp_path, prior):
    replayed = config(tmp_path, prior, prior_scope="all")
    assert model_path(replayed) != model_path(config(tmp_path, prior, prior_scope="all", op="rmsnorm"))
    assert model_path(replayed) != model_path(config(tmp_path, prior, prior_scope="all", generator="template"))
    assert model_path(replayed) == model_path(config(tmp_path, prior, prior_scope="all", seed=5))


def test_a_replayed_search_drops_the_children_its_source_model_is_sure_will_fail(tmp_path, prior):
    # Budget 8 over 4 generations: more children than measurements, so the policy chooses. On this
    # small prior the source model is at most ~0.88 sure a child fails: the threshold is set below.
    cfg = config(tmp_path, prior, trust_threshold=0.75)
    model = fit_prior(cfg, DataRoot(cfg.data))
    assert model.source_.n_train_ == len(prior_sources(cfg))
    search = open_search(cfg, track=False)
    try:
        result = search.run()
    finally:
        search.pool.close()
    root = DataRoot(cfg.data)
    decisions = root.read_run_rows("decisions", cfg.run_id, op=OP)
    forecasts = root.read_run_rows("forecasts", cfg.run_id, op=OP)
    rows = decisions.merge(forecasts[["generation", "candidate_id", "failure_probability", "anchor_id"]],
                           on=["generation", "candidate_id"])
    assert len(rows) == len(decisions) and rows["failure_probability"].notna().all()
    sure = rows[rows["failure_probability"] >= cfg.trust_threshold]
    assert len(sure) >= 2 and (sure["decision"] == "drop").all()  # never measured, never trusted
    # and the unsure are ranked by their chance to run too: the written children it measured were
    # likelier to run than those it deferred
    written = rows[rows["generation"] > 0]
    assert written.loc[written["decision"] == "measure", "failure_probability"].mean() < \
        written.loc[written["decision"] == "drop", "failure_probability"].mean() - 0.05
    assert (rows.loc[rows["decision"] == "measure", "failure_probability"] < cfg.trust_threshold).all()
    assert (rows["decision"] == "measure").sum() == result.budget_used
    # children of measured roots are forecast against their parent, and stored on the reference's scale
    assert (rows["anchor_id"] == search.surrogate.reference.candidate_id).all()
    assert any(search.surrogate._parent(search.candidates[c]) is not None for c in rows["candidate_id"])
