"""The search loop end to end on the replay backend: budgets, journal, resume, bad input, S3, MLflow."""

from __future__ import annotations

import pickle
import time

import pandas as pd
import pytest

from kernelcast.kernels.records import Candidate
from kernelcast.storage.dataset import DataRoot, StorageError
from kernelcast.storage.schema import measurements_from_frame
from kernelcast.storage.tracking import TrackingError
from kernelcast.tasks.config import PACKAGED_POOL, ConfigError, SearchConfig, validate
from kernelcast.tasks.setup import open_search, resolve


def config(tmp_path, **changes) -> SearchConfig:
    base = dict(op="softmax", gpu_type="h100", budget=8, generations=2, children=16, surrogate="roofline",
                seed=1, data=str(tmp_path / "data"), backend="replay")
    return SearchConfig(**{**base, **changes})


def run(cfg: SearchConfig, track: bool = False):
    search = open_search(cfg, track=track)
    try:
        return search, search.run()
    finally:
        search.pool.close()


class FailingPool:
    """A real measurement pool that dies after ``allow`` measurements, as a lost GPU node would."""

    def __init__(self, inner, allow: int):
        self.inner, self.allow, self.asked = inner, allow, []

    def prepare(self, op, gpu_type):
        return self.inner.prepare(op, gpu_type)

    def measure(self, candidates, gpu_type):
        for m in self.inner.measure(candidates, gpu_type):
            if self.allow <= 0:
                raise RuntimeError("measurement node lost")
            self.allow -= 1
            self.asked.append(m.candidate_id)
            yield m

    def close(self):
        self.inner.close()


def test_surrogate_search_charges_exactly_its_budget_and_reports_a_measured_best(tmp_path):
    search, result = run(config(tmp_path))
    assert result.budget_used == 8
    assert [g.measured for g in result.generations] == [4, 4]
    assert all(g.generated == 16 and g.forecast == 16 for g in result.generations)
    root = DataRoot(str(tmp_path / "data"))
    measured = root.read_measurements(op="softmax", gpu_type="h100")
    best = measured[measured["candidate_id"] == result.best_candidate_id]
    assert len(best) == 1 and best["status"].iloc[0] == "ok" and bool(best["replayed"].iloc[0])
    assert best["speedup"].iloc[0] == pytest.approx(result.best_speedup)
    assert result.best_speedup == max(m.speedup for m in measurements_from_frame(measured)
                                      if m.status == "ok" and m.candidate_id != search.surrogate.reference.candidate_id)


def test_every_child_gets_one_decision_and_trusted_forecasts_are_flagged_not_measured(tmp_path):
    _, result = run(config(tmp_path, trust_threshold=0.3))
    root = DataRoot(str(tmp_path / "data"))
    decisions = root.read_run_rows("decisions", result.run_id, op="softmax")
    assert len(decisions) == sum(g.generated for g in result.generations)
    assert set(decisions["decision"]) <= {"measure", "trust", "drop"}
    measured_ids = set(root.read_measurements(op="softmax", gpu_type="h100")["candidate_id"])
    trusted = decisions[decisions["decision"] == "trust"]
    assert not set(trusted["candidate_id"]) & (measured_ids - set(decisions.loc[decisions["decision"] == "measure",
                                                                               "candidate_id"]))
    assert result.best_candidate_id not in set(trusted["candidate_id"]) - measured_ids


def test_equal_budget_baseline_measures_every_child(tmp_path):
    _, result = run(config(tmp_path, surrogate="none", budget=9, generations=3))
    assert [(g.generated, g.measured, g.forecast, g.dropped) for g in result.generations] == [(3, 3, 0, 0)] * 3
    assert result.budget_used == 9 and result.best_speedup > 0


def test_same_seed_gives_the_same_search(tmp_path):
    _, a = run(config(tmp_path, run_id="a"))
    _, b = run(config(tmp_path, run_id="b", data=str(tmp_path / "other")))
    assert [g.best_candidate_id for g in a.generations] == [g.best_candidate_id for g in b.generations]


def test_rerun_after_a_crash_resumes_without_measuring_anything_twice(tmp_path):
    from kernelcast.tasks.search import Search
    from kernelcast.tasks.setup import data_root, forecaster, measure_pool

    _, uninterrupted = run(config(tmp_path, run_id="clean", budget=12, generations=3, data=str(tmp_path / "clean")))

    cfg = resolve(config(tmp_path, run_id="crashy", budget=12, generations=3))
    root = data_root(cfg)
    failing = FailingPool(measure_pool(cfg), allow=1 + 4 + 2)  # reference, generation 0, half of generation 1
    with pytest.raises(RuntimeError, match="node lost"):
        Search(cfg, root, failing, forecaster(cfg, root)).start().run()
    assert len(root.read_run_rows("generations", "crashy", op="softmax")) == 1
    kept = set(root.read_measurements(op="softmax", gpu_type="h100")["candidate_id"])
    assert set(failing.asked) <= kept  # what was measured before the crash is stored

    counting = FailingPool(measure_pool(cfg), allow=10**6)
    result = Search(cfg, root, counting, forecaster(cfg, root)).start().run()
    assert not set(counting.asked) & set(failing.asked)  # nothing measured twice
    assert [g.best_candidate_id for g in result.generations] == [g.best_candidate_id for g in uninterrupted.generations]
    assert result.budget_used == uninterrupted.budget_used == 12
    rows = root.read_measurements(op="softmax", gpu_type="h100")
    assert rows["candidate_id"].is_unique
    assert len(root.read_run_rows("generations", "crashy", op="softmax")) == 3


def test_a_finished_run_reruns_from_its_journal_without_measuring(tmp_path):
    from kernelcast.tasks.search import Search
    from kernelcast.tasks.setup import data_root, forecaster, measure_pool

    _, first = run(config(tmp_path, run_id="done"))
    cfg = resolve(config(tmp_path, run_id="done"))
    root = data_root(cfg)
    counting = FailingPool(measure_pool(cfg), allow=0)  # any measurement would fail the test
    again = Search(cfg, root, counting, forecaster(cfg, root)).start().run()
    assert again.generations == first.generations and counting.asked == []


def test_a_run_id_of_another_operation_is_refused_before_measuring(tmp_path):
    run(config(tmp_path, run_id="mine"))
    with pytest.raises(ConfigError, match="belongs to a search of softmax on h100"):
        open_search(config(tmp_path, run_id="mine", op="layernorm"), track=False)


@pytest.mark.parametrize("changes, message", [
    ({"op": "sofmax"}, "unknown operation 'sofmax'"),
    ({"gpu_type": "h999"}, "unknown GPU type 'h999'"),
    ({"surrogate": "psychic"}, "unknown surrogate 'psychic'"),
    ({"budget": 0}, "budget must be a positive whole number"),
    ({"budget": -4}, "budget must be a positive whole number"),
    ({"generations": 0}, "generations must be a positive whole number"),
    ({"policy": "yolo"}, "unknown policy 'yolo'"),
    ({"acquisition": "ucb"}, "unknown acquisition 'ucb'; known: thompson, ei, ei-per-second"),
    ({"prior_scope": "everything"}, "unknown prior_scope 'everything'; known: other-ops, other-gpus, all"),
    ({"surrogate": "llm"}, "needs llm_url"),
    ({"generator": "evolve"}, "unknown generator 'evolve'; known: template, llm"),
    ({"generator": "llm"}, "generator 'llm' needs generator_url"),
    ({"run_id": "Bad Id!"}, "bad run id"),
])
def test_bad_search_settings_fail_with_a_clear_error(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(config(tmp_path, **changes))


def test_unknown_setting_in_a_config_file_is_an_error():
    with pytest.raises(ConfigError, match=r"unknown search settings \['budgett'\]"):
        SearchConfig.from_mapping({"op": "softmax", "budgett": 3})


def test_a_gpu_type_missing_from_the_replay_pool_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="has no measurements on a100"):
        open_search(config(tmp_path, gpu_type="a100"), track=False)


def test_unreachable_s3_endpoint_fails_before_any_measurement(tmp_path, aws_credentials):
    from tests.conftest import free_port

    cfg = config(tmp_path, data="s3://kernelcast/runs",
                 storage_options={"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
                                  "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}})
    t0 = time.monotonic()
    with pytest.raises(StorageError, match="s3://kernelcast/runs"):
        open_search(cfg, track=False)
    assert time.monotonic() - t0 < 60


def test_unreachable_mlflow_server_fails_before_any_measurement(tmp_path):
    from tests.conftest import free_port

    cfg = config(tmp_path, tracking_uri=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TrackingError, match="127.0.0.1"):
        open_search(cfg, track=True)
    assert not (tmp_path / "data" / "measurements").exists()


def test_search_on_s3_through_a_real_s3_server(tmp_path, s3_root):
    cfg = config(tmp_path, data="s3://kernelcast/search",
                 storage_options={"client_kwargs": {"endpoint_url": s3_root.endpoint}})
    _, result = run(cfg)
    root = DataRoot("s3://kernelcast/search", storage_options={"client_kwargs": {"endpoint_url": s3_root.endpoint}})
    assert len(root.read_run_rows("generations", result.run_id, op="softmax")) == 2
    assert result.best_candidate_id in set(root.read_measurements(op="softmax")["candidate_id"])


def test_mlflow_gets_one_run_per_search_with_per_generation_metrics_and_artifacts(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _, surrogate = run(config(tmp_path, run_id="with-surrogate", tracking_uri=uri), track=True)
    _, baseline = run(config(tmp_path, run_id="baseline", surrogate="none", tracking_uri=uri), track=True)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("kernelcast")
    runs = {r.data.tags["kernelcast.run_id"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"with-surrogate", "baseline"}
    mine = runs["with-surrogate"]
    assert mine.data.params["budget"] == "8" and mine.data.tags["surrogate"] == "roofline"
    assert runs["baseline"].data.tags["baseline"] == "true" and mine.data.tags["baseline"] == "false"
    history = client.get_metric_history(mine.info.run_id, "best_speedup")
    assert [m.step for m in history] == [0, 1]
    assert history[-1].value == pytest.approx(surrogate.best_speedup)
    names = {a.path for a in client.list_artifacts(mine.info.run_id)}
    assert {"best_kernel.py", "generations.csv", "search_curve.png"} <= names
    assert mine.info.status == "FINISHED"


@pytest.mark.parametrize("scope, seen", [
    ("other-ops", {("rmsnorm", "h100")}),
    ("other-gpus", {("rmsnorm", "h100"), ("rmsnorm", "h200"), ("softmax", "h200")}),
    ("all", {("rmsnorm", "h100"), ("softmax", "h100")}),
])
def test_the_prior_scope_decides_what_the_prior_sees_of_the_searched_op(tmp_path, scope, seen):
    from kernelcast.surrogate.dataset import case_pairs
    from kernelcast.tasks.setup import prior_pairs

    pool = DataRoot(PACKAGED_POOL)
    pairs = pd.concat([case_pairs(pool, op=op) for op in ("softmax", "rmsnorm")])
    assert set(zip(pairs["op"], pairs["gpu_type"])) == {(o, g) for o in ("softmax", "rmsnorm") for g in ("h100", "h200")}
    chosen = prior_pairs(config(tmp_path, prior_scope=scope), pairs)
    assert set(zip(chosen["op"], chosen["gpu_type"])) == seen


def test_porting_a_prior_from_other_gpus_needs_the_op_measured_on_one(tmp_path):
    from kernelcast.surrogate.dataset import case_pairs
    from kernelcast.tasks.setup import prior_pairs

    pairs = case_pairs(DataRoot(PACKAGED_POOL), op="softmax", gpu_type="h100")
    with pytest.raises(ConfigError, match="prior_scope other-gpus: .* has no measurements of softmax on a GPU "
                                          "type other than h100"):
        prior_pairs(config(tmp_path, prior_scope="other-gpus"), pairs)


def test_learned_prior_never_sees_the_searched_op_and_is_cached(tmp_path):
    from kernelcast.surrogate.dataset import case_pairs
    from kernelcast.tasks.setup import fit_prior, model_path

    prior = DataRoot(str(tmp_path / "prior"))
    pool = DataRoot(PACKAGED_POOL)
    for op in ("softmax", "rmsnorm"):
        prior.write_candidates(__import__("kernelcast.storage.schema", fromlist=["x"]).candidates_from_frame(pool.read_candidates(op)))
        prior.write_measurements(measurements_from_frame(pool.read_measurements(op=op, gpu_type="h100")))
    cfg = resolve(config(tmp_path, surrogate="learned", prior_data=prior.uri))
    root = DataRoot(cfg.data)
    model = fit_prior(cfg, root)
    assert model.n_train_ == len(case_pairs(prior).query("op != 'softmax' and speedup == speedup"))
    # Cached, not fit again: what the second call returns is what the cache holds, marked here.
    path = model_path(cfg)
    stored = pickle.loads(root.get_object(path))
    assert stored.n_train_ == model.n_train_
    stored.marked_in_cache = True
    root.put_object(path, pickle.dumps(stored))
    assert getattr(fit_prior(cfg, root), "marked_in_cache", False)
    _, result = run(cfg)
    assert result.budget_used == 8 and result.best_speedup > 1.0


def test_a_run_id_resumed_with_other_settings_is_refused_naming_them(tmp_path):
    """Rerunning an id replays its journal; under other settings the replay would not be the run it records."""
    run(config(tmp_path, run_id="mine"))
    with pytest.raises(ConfigError, match=r"was started with other settings \(seed: 1 -> 5\)"):
        open_search(config(tmp_path, run_id="mine", seed=5), track=False)
    # where its data, tracking and endpoints are may change: the same search resumes (nothing left to do)
    _, again = run(config(tmp_path, run_id="mine", storage_retry_s=30.0))
    assert again.run_id == "mine"


def test_the_command_line_refuses_such_a_resume_before_the_flow_starts(tmp_path, capsys):
    from kernelcast.flows.cli import main

    run(config(tmp_path, run_id="mine"))
    assert main(["search", "--op", "softmax", "--gpu-type", "h100", "--budget", "8", "--generations", "2",
                 "--children", "16", "--surrogate", "roofline", "--seed", "5", "--backend", "replay",
                 "--run-id", "mine", "--data", str(tmp_path / "data")]) == 2
    out = capsys.readouterr()
    assert "was started with other settings (seed: 1 -> 5)" in out.err
    assert "Traceback" not in out.err + out.out and "Flow run" not in out.err + out.out  # refused before Prefect


class AdoptingPool(FailingPool):
    """The real pool, recording the stored reference it is given before each measurement of the op's candidates."""

    def __init__(self, inner):
        super().__init__(inner, allow=10**6)
        self.adopted = []

    def adopt_reference(self, m, gpu_type):
        self.adopted.append((m, gpu_type, len(self.asked)))
        return self.inner.adopt_reference(m, gpu_type)


def test_every_generation_adopts_the_reference_the_data_root_stored_from_a_gpu(tmp_path):
    import dataclasses

    from kernelcast.infra.measure import ReplayMeasurer
    from kernelcast.kernels.ops import get_operation

    # the root holds the reference as a live GPU measured it earlier (a replayed row of it is never adopted)
    root = DataRoot(str(tmp_path / "data"))
    seed = get_operation("softmax").seed_candidates()[0]
    (replayed,) = ReplayMeasurer(PACKAGED_POOL, "h100").measure([seed])
    live = dataclasses.replace(replayed, mode="gpu", replayed=False, checks="anchored: none; host-sensitive: none")
    root.write_candidates([seed])
    root.write_measurements([live])
    search = open_search(config(tmp_path), track=False)
    search.pool = pool = AdoptingPool(search.pool)
    try:
        result = search.run()
    finally:
        search.pool.close()
    # the search reused the stored reference; each generation's children were measured only after the pool was
    # given that row
    assert seed.candidate_id not in pool.asked and len(result.generations) == 2
    assert len(pool.adopted) == 2 and all(gpu == "h100" for _, gpu, _ in pool.adopted)
    assert [n for _, _, n in pool.adopted] == [0, result.generations[0].measured]
    assert all((m.candidate_id, m.mode, m.checks, m.runtime_us_median) == (seed.candidate_id, "gpu", live.checks,
                                                                          live.runtime_us_median)
               for m, _, _ in pool.adopted)
    # a replay keeps its rows' own reference: it says so and measures as before
    assert "replay" in pool.inner.adopt_reference(live, "h100")


def test_a_root_whose_reference_was_only_replayed_gives_the_pool_nothing_to_adopt(tmp_path):
    search = open_search(config(tmp_path), track=False)
    search.pool = pool = AdoptingPool(search.pool)
    try:
        search.run()
    finally:
        search.pool.close()
    assert pool.adopted == [] and pool.asked


def _count_setup(monkeypatch):
    """How often a search's config is validated (``validate``'s settings check) and each data root is opened."""
    import collections

    from kernelcast.tasks import config as config_module

    counts = {"validated": 0, "opened": collections.Counter()}
    check, init = config_module.check_settings, DataRoot.__init__

    def counted_check(cfg):
        counts["validated"] += 1
        return check(cfg)

    def counted_init(self, uri, *args, **kwargs):
        init(self, uri, *args, **kwargs)
        counts["opened"][self.uri] += 1

    monkeypatch.setattr(config_module, "check_settings", counted_check)
    monkeypatch.setattr(DataRoot, "__init__", counted_init)
    return counts


def test_a_search_validates_its_config_once_and_opens_its_data_root_once(tmp_path, monkeypatch):
    counts = _count_setup(monkeypatch)
    search, result = run(config(tmp_path, gpu_type="auto"))
    assert result.budget_used == 8
    assert counts["validated"] == 1
    assert counts["opened"][str(tmp_path / "data")] == 1
    assert search.context.config is search.config and search.context.root is search.root


def test_the_search_command_validates_once_at_its_edge_and_leaves_the_data_root_to_the_flow(tmp_path, monkeypatch):
    """`kernelcast search` checks its settings before Prefect starts; the flow (which deployments also call, with
    plain parameters) builds the one context its steps run on. Prefect itself is left out: the flow's body runs as
    ``prepare`` runs it."""
    import dataclasses

    from kernelcast.flows import search as flows
    from kernelcast.flows.cli import main

    def flow(options=None, **fields):
        search, result = run(SearchConfig.from_mapping({**fields, **(options or {})}))
        out = {**dataclasses.asdict(result), "data": search.config.data, "tracking_uri": ""}
        out["generations"] = [dataclasses.asdict(s) for s in result.generations]
        return out

    monkeypatch.setattr(flows, "kernel_search", flow)
    counts = _count_setup(monkeypatch)
    data = str(tmp_path / "data")
    assert main(["search", "--op", "softmax", "--budget", "4", "--generations", "2", "--children", "8",
                 "--surrogate", "roofline", "--backend", "replay", "--data", data]) == 0
    assert counts["validated"] == 2  # the command's edge, the flow's edge: neither twice
    assert counts["opened"][data] == 1
