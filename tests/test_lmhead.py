"""The lmhead forecaster (a code language model with LoRA and heads) on the CPU, with the tiny qwen2 GGUF
that the engine's tests write (random weights, byte-level tokens): training, its folder, the registry,
its embeddings as features, the errors it gives, and ``kernelcast pairs --also-data``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("peft")
pytest.importorskip("gguf")

from kernelcast.kernels.records import Candidate, HardwareSpec  # noqa: E402
from kernelcast.storage.dataset import DataRoot  # noqa: E402
from kernelcast.storage.sources import share_sources  # noqa: E402
from kernelcast.surrogate.forecast import ForecastRequest  # noqa: E402
from tests.test_engine import write_tiny_qwen2_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "data" / "pools" / "llm"
KINDS = {  # what a candidate does -> (fails, log speedup against its anchor)
    "tiles the loop with tl.dot": (False, 1.0), "unrolls by four": (False, 0.5),
    "loops one row at a time": (False, -1.0), "calls an undefined name": (True, math.nan),
}
TRAIN_FLAGS = ["--max-tokens", "96", "--batch", "8", "--folds", "3", "--device", "cpu"]  # default learning rates


def synthetic_pairs(problems: int = 6, per_kind: int = 3, seed: int = 0) -> pd.DataFrame:
    """Pairs whose outcome is written in the candidate's first line: a model that reads it can learn it."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(problems):
        anchor = f"def launch(x, out):\n    out.copy_(x * {p + 1})  # problem {p}\n"
        for kind, (fails, log_speedup) in KINDS.items():
            for i in range(per_kind):
                noisy = log_speedup + 0.1 * rng.standard_normal()
                rows.append({"op": f"problem{p}", "anchor_source": anchor,
                             "candidate_source": f"# {kind}\ndef launch(x, out):\n    out.copy_(x * {p + i})\n",
                             "status": "compile_error" if fails else "ok",
                             "speedup": math.nan if fails else math.exp(noisy)})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lmhead") / "tiny.gguf"
    write_tiny_qwen2_gguf(path)
    return path


@pytest.fixture(scope="module")
def trained(tiny_gguf, tmp_path_factory) -> Path:
    """A folder written by ``python -m kernelcast.surrogate.lmhead train`` (in process) on the synthetic pairs."""
    from kernelcast.surrogate.lmhead.__main__ import main

    folder = tmp_path_factory.mktemp("lmhead-trained")
    pairs = folder / "pairs.parquet"
    synthetic_pairs().to_parquet(pairs)
    assert main(["train", "--pairs", str(pairs), "--model", str(tiny_gguf), "--out", str(folder / "out"),
                 "--epochs", "3", *TRAIN_FLAGS]) == 0
    return folder / "out"


def requests(n: int = 6) -> list[ForecastRequest]:
    hardware = HardwareSpec(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3", sm_count=132)
    rows = synthetic_pairs(problems=1, per_kind=2).head(n).to_dict("records")
    return [ForecastRequest(anchor=Candidate(op="softmax", backend="triton", source=r["anchor_source"], origin="seed"),
                            candidate=Candidate(op="softmax", backend="triton", source=r["candidate_source"],
                                                origin="llm"),
                            op="softmax", hardware=hardware) for r in rows]


# ---------------------------------------------------------------------------------------- training


def test_grouped_folds_never_share_a_problem_and_cover_every_pair_once():
    from kernelcast.surrogate.lmhead.train import grouped_split

    groups = np.repeat([f"p{i}" for i in range(11)], np.arange(1, 12))
    tested = []
    for fold in range(5):
        train, calibration, test = grouped_split(groups, 5, fold, 0.25)
        sets = [set(groups[ix]) for ix in (train, calibration, test)]
        assert all(sets) and not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
        assert len(train) + len(calibration) + len(test) == len(groups)
        tested.extend(test)
    assert sorted(tested) == list(range(len(groups)))  # each pair is tested in exactly one fold


def test_the_calibration_split_can_be_drawn_from_one_pools_problems_only():
    from kernelcast.surrogate.lmhead.train import grouped_split

    groups = np.array([f"kb.cudal1-l1-{i:03d}" for i in range(10)] + [f"softmax-{i}" for i in range(30)])
    train, calibration, test = grouped_split(groups, 4, 0, 0.2, calibrate_on="kb.cudal1-")
    assert {str(g) for g in groups[calibration]} <= {f"kb.cudal1-l1-{i:03d}" for i in range(10)}
    eligible = {str(g) for g in groups if str(g).startswith("kb.cudal1-")} - {str(g) for g in groups[test]}
    assert len(set(groups[calibration])) == max(1, round(0.2 * len(eligible)))
    assert not set(groups[train]) & set(groups[calibration]) and len(train) + len(calibration) + len(test) == 40
    with pytest.raises(ValueError, match="calibrate on 'gpumode.': no training problem"):
        grouped_split(groups, 4, 0, 0.2, calibrate_on="gpumode.")


def test_named_held_out_problems_replace_the_fold_and_unknown_ones_are_refused():
    from kernelcast.surrogate.lmhead.train import grouped_split

    groups = np.repeat([f"p{i}" for i in range(8)], 3)
    train, calibration, test = grouped_split(groups, 4, 0, 0.25, held_out=("p2", "p5"))
    assert set(groups[test]) == {"p2", "p5"} and len(test) == 6
    assert not ({"p2", "p5"} & set(groups[train]) or {"p2", "p5"} & set(groups[calibration]))
    with pytest.raises(ValueError, match="p9"):
        grouped_split(groups, 4, 0, 0.25, held_out=("p2", "p9"))
    with pytest.raises(ValueError, match="nothing is left"):
        grouped_split(groups, 4, 0, 0.25, held_out=tuple(f"p{i}" for i in range(8)))


def test_training_a_few_steps_lowers_the_loss_below_the_base_rates(tiny_gguf):
    from kernelcast.surrogate.lmhead.model import HeadConfig, PairModel
    from kernelcast.surrogate.lmhead.train import TrainSettings, grouped_split, mean_loss, targets, train

    pairs = synthetic_pairs()
    head = HeadConfig(model=str(tiny_gguf), max_tokens=96)
    result = train(pairs, head, TrainSettings(folds=3, epochs=3, batch_size=8), device="cpu")
    failed, log_speedup, groups = targets(pairs)
    ix, _, _ = grouped_split(groups, 3, 0, 0.2)
    texts = [(pairs["anchor_source"][i], pairs["candidate_source"][i]) for i in ix]
    # The untrained network with the same starting answer: the training set's base rates, the best constant.
    start = PairModel(head, "cpu")
    ran = log_speedup[ix][np.isfinite(log_speedup[ix])]
    start.set_base_rates(float(failed[ix].mean()), float(ran.mean()), float(ran.var()))
    before = mean_loss(start, texts, failed[ix], log_speedup[ix], 8)
    after = mean_loss(result.forecaster.net_, texts, failed[ix], log_speedup[ix], 8)
    assert result.steps >= 6 and after < before - 0.5, (before, after)


def test_gradient_checkpointing_takes_the_same_steps(tiny_gguf):
    from kernelcast.surrogate.lmhead.model import HeadConfig
    from kernelcast.surrogate.lmhead.train import TrainSettings, train

    head = HeadConfig(model=str(tiny_gguf), max_tokens=96)
    plain, recomputed = (train(synthetic_pairs(), head, TrainSettings(folds=3, max_steps=3, gradient_checkpointing=g),
                               device="cpu") for g in (False, True))
    assert len(recomputed.losses) == 3 and recomputed.losses[0] != recomputed.losses[-1]
    np.testing.assert_allclose(recomputed.losses, plain.losses, rtol=1e-4)


def test_a_batch_whose_loss_overflows_is_skipped_not_stepped_into_the_weights(tiny_gguf, tmp_path, monkeypatch):
    """A 2,048-token run on a GPU once came out of training with NaN weights (one overflowing batch stepped into
    them), and its calibration failed. A non-finite loss or gradient is now skipped and counted."""
    from kernelcast.surrogate.lmhead import train as training
    from kernelcast.surrogate.lmhead.model import HeadConfig

    real, calls = training.pair_loss, []

    def overflowing_second_batch(*args):
        calls.append(1)
        loss = real(*args)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(training, "pair_loss", overflowing_second_batch)
    result = training.train(synthetic_pairs(), HeadConfig(model=str(tiny_gguf), max_tokens=96),
                            training.TrainSettings(folds=3, max_steps=4), out=str(tmp_path / "out"), device="cpu")
    assert result.steps == 4 and math.isnan(result.losses[1])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["training"]["skipped_steps"] == 1
    assert all(math.isfinite(v) for v in result.metrics.values() if isinstance(v, float) and v == v)
    got = result.forecaster.forecast(requests(3))
    assert all(math.isfinite(f.failure_probability) and math.isfinite(f.expected_speedup) for f in got)


def test_problem_batches_keep_each_problem_whole_and_every_row_once():
    from kernelcast.surrogate.lmhead.train import problem_batches

    groups = np.array([f"p{i % 5}" for i in range(23)] + ["big"] * 11)
    indices = np.arange(len(groups))
    batches = problem_batches(indices, groups, 8, np.random.default_rng(0))
    assert sorted(np.concatenate(batches).tolist()) == indices.tolist() and all(len(b) <= 8 for b in batches)
    for problem in {f"p{i}" for i in range(5)}:  # 4-5 rows each: always inside one batch
        assert sum(problem in set(groups[b]) for b in batches) == 1
    assert sum("big" in set(groups[b]) for b in batches) == 2  # 11 rows: a batch of its own and the rest
    again = problem_batches(indices, groups, 8, np.random.default_rng(0))
    assert all((a == b).all() for a, b in zip(batches, again))


def test_the_ranking_term_penalises_a_reversed_order_within_a_problem_only():
    import torch

    from kernelcast.surrogate.lmhead.train import rank_loss

    y = torch.tensor([0.0, 0.5, 1.0, float("nan"), 0.2])
    groups = torch.tensor([0, 0, 0, 0, 1])
    right, wrong = torch.tensor([0.0, 0.5, 1.0, 9.0, -5.0]), torch.tensor([1.0, 0.5, 0.0, 9.0, 5.0])
    assert rank_loss(right, y, groups) < 0.01 < 4.0 < rank_loss(wrong, y, groups)
    # a failed kernel, another problem's kernel and speedups within the margin order nothing
    assert rank_loss(right, torch.tensor([0.0, 0.01, float("nan"), 0.3, 0.3]), torch.tensor([0, 0, 0, 1, 2])) is None


def test_training_with_the_ranking_term_draws_whole_problems_and_records_its_weight(tiny_gguf, tmp_path,
                                                                                   monkeypatch):
    from kernelcast.surrogate.lmhead import train as training
    from kernelcast.surrogate.lmhead.model import HeadConfig

    real, seen = training.pair_loss, []

    def recording(net, texts, failed, log_speedup, groups=None, rank_weight=0.0):
        seen.append((groups.tolist(), rank_weight))
        return real(net, texts, failed, log_speedup, groups, rank_weight)

    monkeypatch.setattr(training, "pair_loss", recording)
    pairs = synthetic_pairs()
    training.train(pairs, HeadConfig(model=str(tiny_gguf), max_tokens=96),
                   training.TrainSettings(folds=3, epochs=2, max_steps=4, batch_size=16, rank_weight=0.5),
                   out=str(tmp_path / "out"),
                   device="cpu")
    assert len(seen) == 4 and all(w == 0.5 for _, w in seen)
    per_problem = pairs.groupby("op").size()
    codes = pd.factorize(pairs["op"].astype(str))[0]
    assert per_problem.max() <= 16
    for batch, _ in seen:  # a problem that fits a batch is never split across two
        for code in set(batch):
            assert batch.count(code) == int(per_problem[pairs["op"].astype(str).to_numpy()[list(codes).index(code)]])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["training"]["rank_weight"] == 0.5
    with pytest.raises(ValueError, match="rank_weight"):
        training.TrainSettings(rank_weight=-1.0)


def test_a_trained_folder_holds_its_config_metrics_and_calibration(trained):
    config = json.loads((trained / "config.json").read_text())
    metrics = json.loads((trained / "metrics.json").read_text())["held_out"]
    assert config["head"]["lora_rank"] == 8 and config["training"]["steps"] > 0
    assert not set(config["training"]["test_problems"]) & set(config["training"]["train_problems"])
    assert not set(config["training"]["calibration_problems"]) & set(config["training"]["train_problems"])
    for key in ("failure_auroc", "spearman", "within_problem_spearman", "ece"):
        assert key in metrics
    assert 0.0 <= metrics["ece"] <= 1.0 and metrics["n_pairs"] == config["training"]["test_pairs"]
    assert (trained / "adapter" / "adapter_config.json").exists() and (trained / "heads.pt").exists()


def test_max_seconds_stops_training_and_still_saves_a_usable_folder(tiny_gguf, tmp_path):
    from kernelcast.surrogate.lmhead import LMHeadForecaster
    from kernelcast.surrogate.lmhead.model import HeadConfig
    from kernelcast.surrogate.lmhead.train import TrainSettings, train

    result = train(synthetic_pairs(), HeadConfig(model=str(tiny_gguf), max_tokens=96),
                   TrainSettings(folds=3, epochs=1000, max_seconds=4.0), out=str(tmp_path / "out"), device="cpu")
    assert result.stopped_early and 1 <= result.steps < 1000 * 2
    assert json.loads((tmp_path / "out" / "config.json").read_text())["training"]["stopped_early"]
    assert len(LMHeadForecaster.load(str(tmp_path / "out")).forecast(requests(2))) == 2


# ---------------------------------------------------------------------------------------- the forecaster


def test_a_saved_folder_gives_the_same_forecasts_after_reload(trained, tiny_gguf, tmp_path):
    from kernelcast.surrogate.lmhead.model import Calibration, HeadConfig, LMHeadForecaster, PairModel

    first = LMHeadForecaster.load(str(trained)).predict(requests())
    again = LMHeadForecaster.load(str(trained), model=str(tiny_gguf)).predict(requests())
    for a, b in zip(first, again):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # and the trained weights are what it forecasts with: a fresh network answers otherwise
    fresh = LMHeadForecaster.of(PairModel(HeadConfig(model=str(tiny_gguf), max_tokens=96), "cpu"), Calibration(), 0)
    assert not np.allclose(fresh.predict(requests())[1], first[1])


def test_the_registered_forecaster_returns_well_formed_forecasts(trained):
    from kernelcast.surrogate.registry import fits_on_prior, get_forecaster_factory, load_trained, reads_folder

    assert reads_folder("lmhead") and not fits_on_prior("lmhead")
    with pytest.raises(ValueError, match="needs the folder of a trained one"):
        get_forecaster_factory("lmhead")().fit(None)
    forecaster = load_trained("lmhead", str(trained))
    reqs = requests()
    forecasts = forecaster.forecast(reqs)
    assert len(forecasts) == len(reqs)
    for req, f in zip(reqs, forecasts):
        assert f.surrogate == "lmhead" and f.candidate_id == req.candidate.candidate_id
        assert f.anchor_id == req.anchor.candidate_id and f.parsed
        assert len(f.probabilities) == 8 and math.isclose(sum(f.probabilities), 1.0, rel_tol=1e-9)
        assert 0.0 <= f.failure_probability <= 1.0 and f.expected_speedup > 0
        assert f.extra["log_speedup_sigma"] > 0
    assert forecaster.forecast([]) == []


def test_a_search_config_naming_lmhead_needs_its_folder():
    from kernelcast.tasks.config import ConfigError, SearchConfig, check_settings

    with pytest.raises(ConfigError, match="surrogate_folder"):
        check_settings(SearchConfig(op="softmax", surrogate="lmhead"))
    check_settings(SearchConfig(op="softmax", surrogate="lmhead", surrogate_folder="trained"))


def test_embeddings_append_to_the_source_forecasters_features_and_a_booster_fits_on_them(trained):
    from sklearn.ensemble import HistGradientBoostingRegressor

    from kernelcast.surrogate.lmhead import LMHeadForecaster, append_embeddings
    from kernelcast.surrogate.source import SourceFeatures

    forecaster = LMHeadForecaster.load(str(trained))
    reqs = requests()
    base = SourceFeatures().matrix(reqs)
    embeddings = forecaster.embed(reqs)
    both = append_embeddings(base, reqs, forecaster)
    assert embeddings.shape == (len(reqs), 2 * 64)  # mean and last token of the 64-wide tiny model
    assert both.shape == (len(reqs), base.shape[1] + embeddings.shape[1])
    np.testing.assert_array_equal(both[:, :base.shape[1]], base)
    np.testing.assert_allclose(both[:, base.shape[1]:], embeddings)
    assert np.ptp(embeddings, axis=0).max() > 0  # different kernels, different vectors
    HistGradientBoostingRegressor(max_iter=5, min_samples_leaf=1).fit(np.nan_to_num(both), np.arange(len(reqs)))
    with pytest.raises(ValueError, match="one feature row per request"):
        append_embeddings(base[:2], reqs, forecaster)


# ---------------------------------------------------------------------------------------- bad input


def test_pairs_missing_a_column_are_refused_by_name(tiny_gguf):
    from kernelcast.surrogate.lmhead.model import HeadConfig
    from kernelcast.surrogate.lmhead.train import train

    with pytest.raises(ValueError, match="lack the column.*candidate_source"):
        train(synthetic_pairs().drop(columns=["candidate_source"]), HeadConfig(model=str(tiny_gguf)))


def test_the_command_line_names_a_missing_column_and_a_missing_model(tiny_gguf, tmp_path, capsys):
    from kernelcast.surrogate.lmhead.__main__ import main

    pairs = tmp_path / "pairs.parquet"
    synthetic_pairs().drop(columns=["status"]).to_parquet(pairs)
    assert main(["train", "--pairs", str(pairs), "--model", str(tiny_gguf), "--out", str(tmp_path / "o")]) == 2
    assert "lacks the column(s) status" in capsys.readouterr().err
    synthetic_pairs().to_parquet(pairs)
    missing = tmp_path / "no-such-model.gguf"
    assert main(["train", "--pairs", str(pairs), "--model", str(missing), "--out", str(tmp_path / "o")]) == 2
    assert f"model '{missing}' does not exist" in capsys.readouterr().err


def test_too_few_problems_for_the_folds_are_refused_naming_them(tiny_gguf):
    from kernelcast.surrogate.lmhead.model import HeadConfig
    from kernelcast.surrogate.lmhead.train import TrainSettings, train

    with pytest.raises(ValueError, match=r"2 problem\(s\) \(problem0, problem1\) cannot be split into 5 folds"):
        train(synthetic_pairs(problems=2), HeadConfig(model=str(tiny_gguf)), TrainSettings(folds=5))


def test_a_folder_without_heads_or_a_model_is_refused_by_name(trained, tmp_path):
    from kernelcast.surrogate.lmhead import LMHeadForecaster

    with pytest.raises(ValueError, match="lacks config.json"):
        LMHeadForecaster.load(str(tmp_path))
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    (copy / "heads.pt").unlink()
    with pytest.raises(ValueError, match="lacks heads.pt"):
        LMHeadForecaster.load(str(copy))
    with pytest.raises(ValueError, match="model '/nowhere/model.gguf' does not exist"):
        LMHeadForecaster.load(str(trained), model="/nowhere/model.gguf")


# ---------------------------------------------------------------------------------------- kernelcast pairs


def test_pairs_from_two_data_roots_are_the_pairs_of_their_union(tmp_path):
    """The corpus split by operation into two roots gives, with --also-data, the corpus's own pairs."""
    from kernelcast.flows.cli import main
    from kernelcast.surrogate.lmhead.train import targets
    from kernelcast.surrogate.pairs import read_pairs

    ops = sorted(p.name.removeprefix("op=") for p in (CORPUS / "candidates").iterdir())
    for name, part in (("a", ops[::2]), ("b", ops[1::2])):
        for table in ("candidates", "measurements", "provenance"):
            for op in part:
                shutil.copytree(CORPUS / table / f"op={op}", tmp_path / name / table / f"op={op}")
        share_sources(DataRoot(str(tmp_path / name)), DataRoot(str(CORPUS)))
    common = ["--corpus", "--eval-ops", "softmax,transpose", "--max-failure-share", "1"]
    assert main(["pairs", "--data", str(CORPUS), "--out", str(tmp_path / "one.parquet"), *common]) == 0
    assert main(["pairs", "--data", str(tmp_path / "a"), "--also-data", str(tmp_path / "b"),
                 "--out", str(tmp_path / "two.parquet"), *common]) == 0
    one, two = read_pairs(str(tmp_path / "one.parquet")), read_pairs(str(tmp_path / "two.parquet"))
    key = ["anchor_id", "candidate_id"]
    pd.testing.assert_frame_equal(one.sort_values(key).reset_index(drop=True),
                                  two.sort_values(key).reset_index(drop=True))
    failed, log_speedup, groups = targets(two)  # what lmhead trains on: failures, speedups, problems
    assert failed.any() and np.isfinite(log_speedup).any() and set(groups) == set(ops)


def test_a_replay_search_forecasts_with_the_trained_folder_like_any_surrogate(trained, tmp_path):
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.config import SearchConfig
    from kernelcast.tasks.setup import open_search

    config = SearchConfig(op="softmax", gpu_type="h100", budget=4, generations=2, children=8, surrogate="lmhead",
                          surrogate_folder=str(trained), seed=1, data=str(tmp_path / "data"), backend="replay")
    search = open_search(config, track=False)
    try:
        result = search.run()
    finally:
        search.pool.close()
    assert result.budget_used == 4 and all(g.forecast == g.generated == 8 for g in result.generations)
    forecasts = DataRoot(str(tmp_path / "data")).read("forecasts")
    assert set(forecasts["surrogate"]) == {"lmhead"} and forecasts["failure_probability"].between(0, 1).all()


def test_kernelcast_forecast_reads_the_folder_and_asks_for_it_when_missing(trained, tmp_path, capsys):
    from kernelcast.flows.cli import main
    from tests.kernels_for_tests import SOURCES

    kernel = tmp_path / "mine.py"
    kernel.write_text(SOURCES["wrong_values"])  # runs, so it is forecast (its values are checked only on a GPU)
    data = str(tmp_path / "data")
    assert main(["forecast", "--op", "softmax", "--surrogate", "lmhead", "--data", data, str(kernel)]) == 2
    assert "surrogate 'lmhead' needs surrogate_folder" in capsys.readouterr().err
    assert main(["forecast", "--op", "softmax", "--surrogate", "lmhead", "--surrogate-folder", str(trained),
                 "--data", data, "--json", str(kernel)]) == 0
    (report,) = json.loads(capsys.readouterr().out)["kernels"]
    assert report["decision"] in ("measure", "trust", "drop") and 0 <= report["failure_probability"] <= 1


def test_template_pairs_from_two_data_roots_are_the_pairs_of_the_whole_pool(tmp_path):
    from kernelcast.surrogate.pairs import PairSettings, build_pairs

    pool = ROOT / "data" / "pools"
    ops = sorted(p.name.removeprefix("op=") for p in (pool / "candidates").iterdir())
    for name, part in (("a", ops[::2]), ("b", ops[1::2])):
        for table in ("candidates", "measurements"):
            for op in part:
                shutil.copytree(pool / table / f"op={op}", tmp_path / name / table / f"op={op}")
        share_sources(DataRoot(str(tmp_path / name)), DataRoot(str(pool)))
    settings = PairSettings(per_op=16, gpu_type="h100", eval_ops=("rmsnorm",))
    whole = build_pairs(DataRoot(str(pool)), settings)
    split = build_pairs(DataRoot(str(tmp_path / "a")), settings, also=[DataRoot(str(tmp_path / "b"))])
    pd.testing.assert_frame_equal(whole, split)
    assert set(whole["op"]) == set(ops)
    # the same root twice counts each kernel once
    pd.testing.assert_frame_equal(build_pairs(DataRoot(str(pool)), settings, also=[DataRoot(str(pool))]), whole)
