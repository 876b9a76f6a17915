"""A code language model's reading of a kernel pair as features of the gradient-boosted forecasters
(``kernelcast.surrogate.embeddings``): the projection is fit on training pairs only, a pair without a vector is absent,
vectors that carry what the source features miss raise the source forecaster's ranking, and the CUDA-L1
benchmark reads a table that ``benchmarks/cudal1_embed.py`` wrote with the tiny test model.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from kernelcast.kernels.records import Candidate
from kernelcast.surrogate.dataset import HARDWARE_FIELDS
from kernelcast.surrogate.embeddings import PairEmbeddings, pair_key
from kernelcast.surrogate.forecast import ForecastRequest
from tests.test_cudal1_forecast import H100


def _request(anchor: str, candidate: str) -> ForecastRequest:
    op = "problem"
    return ForecastRequest(anchor=Candidate(op=op, backend="torch", source=anchor, params={}, origin="seed"),
                           candidate=Candidate(op=op, backend="torch", source=candidate, params={}, origin="import"),
                           op=op, hardware=H100, case_names=("c",), anchor_runtime_us=(10.0,), anchor_speedup=1.0)


def test_the_key_is_the_pair_and_the_projection_is_fit_on_the_training_pairs_only():
    assert pair_key("ab", "c") != pair_key("a", "bc")  # the boundary between the two sources counts
    train = [_request("ref", f"k{i}") for i in range(6)]
    held = _request("ref", "held out")
    rng = np.random.default_rng(0)
    vectors = {pair_key("ref", f"k{i}"): rng.normal(size=5) * [10, 1, 0.1, 0.1, 0.1] for i in range(6)}
    vectors[pair_key("ref", "held out")] = np.array([1000.0, 0, 0, 0, 0])  # far off: must not move the axes
    fitted = PairEmbeddings(vectors, dims=2).fit(train)
    again = PairEmbeddings({k: v for k, v in vectors.items() if k != pair_key("ref", "held out")}, dims=2).fit(train)
    np.testing.assert_allclose(np.abs(fitted.axes), np.abs(again.axes))  # the held-out vector took no part
    m = fitted.matrix([*train, held, _request("ref", "never read")])
    assert m.shape == (8, 2) and np.isfinite(m[:7]).all() and np.isnan(m[7]).all()
    assert abs(m[6, 0]) > 100 * np.abs(m[:6, 0]).max() / 10  # read through the training axes, not refit to it


def test_too_few_vectors_or_vectors_of_two_widths_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="differ in width"):
        PairEmbeddings({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="vectors for 0 of the 2 training kernels"):
        PairEmbeddings({"a": np.zeros(3)}).fit([_request("x", "y"), _request("x", "z")])
    pd.DataFrame({"key": ["a"], "op": ["p"]}).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="lacks vector"):
        PairEmbeddings.read(str(tmp_path / "t.parquet"))


OPS = ("softmax", "layernorm", "rmsnorm", "cross_entropy", "bias_gelu", "row_sum", "transpose", "fp8_quant",
       "matmul", "attention")  # the template operations: their features need an operation that exists


def _pairs(per_problem: int = 8, seed: int = 0):
    """Source pairs whose speed is set by a hidden number that only the stored vectors carry: every candidate's
    source is alike but for a name, so the source features cannot tell them apart."""
    from kernelcast.kernels.ops import get_operation

    rng = np.random.default_rng(seed)
    rows, vectors = [], {}
    for p, op in enumerate(OPS):
        anchor = f"import torch\n\ndef launch(x):\n    return x * {p + 2}  # problem {p}\n"
        case = get_operation(op).cases[0].name
        for i in range(per_problem):
            hidden = rng.normal()
            source = f"import torch\n\ndef launch(x):\n    return x * {p + 2}  # kernel_{p}_{i}\n"
            vectors[pair_key(anchor, source)] = np.concatenate([[hidden], rng.normal(size=7) * 0.05])
            rows.append({"op": op, "candidate_id": f"{p}-{i}", "source": source, "anchor_source": anchor,
                         "status": "ok", "speedup": math.exp(0.5 * hidden), "case_names": (case,)})
    return pd.DataFrame(rows), vectors


def _source_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """``source_pairs``-shaped rows of the synthetic pairs."""
    n = len(frame)
    return frame.assign(backend="torch", params=[{}] * n, template=None, origin="import", anchor_backend="torch",
                        anchor_params=[{}] * n, anchor_template=None, anchor_origin="seed",
                        anchor_runtime_us=[(10.0,)] * n, anchor_speedup=1.0, failed=False,
                        **{f: getattr(H100, f) for f in HARDWARE_FIELDS}, gpu_type="h100")


def test_vectors_that_carry_what_the_source_misses_raise_the_source_forecasters_ranking():
    from kernelcast.surrogate.dataset import source_requests
    from kernelcast.surrogate.source import SourceForecaster

    frame, vectors = _pairs()
    rows = _source_rows(frame)
    train, test = rows[rows["op"].isin(OPS[:6])], rows[rows["op"].isin(OPS[6:])]
    table = PairEmbeddings(vectors, dims=4)
    plain = SourceForecaster(max_iter=60, folds=3).fit(train)
    read = SourceForecaster(max_iter=60, folds=3, embeddings=table).fit(train)
    assert "-emb4-" in read.version and "emb" not in plain.version
    requests = source_requests(test)
    truth = np.log(test["speedup"].to_numpy())
    rho_plain = spearmanr(plain.predict(requests)[1], truth).correlation
    rho_read = spearmanr(read.predict(requests)[1], truth).correlation
    assert rho_read > 0.8 and (math.isnan(rho_plain) or rho_plain < 0.3), (rho_read, rho_plain)


def _pool_and_tiny_model(tmp_path, monkeypatch):
    """The forecast benchmark's small pool and the tests' tiny code model (a GGUF written here)."""
    pytest.importorskip("peft")
    pytest.importorskip("gguf")
    from tests.test_cudal1_forecast import _pool
    from tests.test_engine import write_tiny_qwen2_gguf

    pool = _pool(tmp_path, monkeypatch)
    model = tmp_path / "tiny.gguf"
    write_tiny_qwen2_gguf(model)
    return pool, model


def test_the_benchmark_reads_a_table_the_embed_script_wrote_with_a_real_model(tmp_path, monkeypatch):
    from benchmarks import cudal1_embed, cudal1_forecast

    pool, model = _pool_and_tiny_model(tmp_path, monkeypatch)
    table = tmp_path / "emb.parquet"
    assert cudal1_embed.main(["--pool", str(pool), "--model", str(model), "--out", str(table), "--max-tokens", "64",
                              "--device", "cpu"]) == 0
    stored = pd.read_parquet(table)
    meta = json.loads(table.with_suffix(".json").read_text())
    # one vector a distinct (reference, implementation) source pair: this pool's problems share their sources
    assert len(stored) == meta["pairs"] == stored["key"].nunique() >= 2
    assert len(stored["vector"].iloc[0]) == meta["width"] == 128 and meta["max_tokens"] == 64
    out = tmp_path / "out" / "forecast"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "source", "--embeddings", str(table), "--embedding-dims", "4",
                                 "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    rows = pd.DataFrame(result["rows"])
    assert set(rows["forecaster"]) == {"source", "learned+emb", "source+emb"} and result["embeddings"] == str(table)
    assert rows["top1_within_10pct"].between(0, 1).all()


def test_the_lmhead_benchmark_trains_every_fold_and_its_forecasts_are_scored_beside_the_others(tmp_path, monkeypatch):
    """The training script reads the pool as the forecast benchmark does (with ``--spaces`` too): a fold's run
    writes forecasts of its held-out kernels, and the benchmark scores the folder only when every fold is in."""
    from benchmarks import cudal1_forecast, cudal1_lmhead
    from tests.test_cudal1_forecast import PROBLEMS

    pool, model = _pool_and_tiny_model(tmp_path, monkeypatch)
    spaces = tmp_path / "spaces"
    spaces.mkdir()  # a folder of spaces holding none of this pool's problems: read, and nothing joins
    out = tmp_path / "lmhead"
    score = ["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path), "--forecasters", "random",
             "--forecasts", f"lmhead={out}", "--out", str(tmp_path / "scored" / "forecast")]
    for fold in range(3):
        assert cudal1_lmhead.main(["--pool", str(pool), "--model", str(model), "--fold", str(fold), "--folds", "3",
                                   "--spaces", str(spaces), "--max-tokens", "64", "--batch", "4", "--epochs", "1",
                                   "--calibrate-on", "kb.cudal1-", "--gradient-checkpointing", "--out", str(out)]) == 0
        written = pd.read_parquet(out / f"forecasts-{fold}.parquet")
        assert written["p_fail"].between(0, 1).all() and (written["expected"] > 0).all()
        if fold < 2:  # folds missing: scoring refuses rather than score a part of the pool
            with pytest.raises(ValueError):
                cudal1_forecast.main(score)
    held = pd.concat(pd.read_parquet(f) for f in sorted(out.glob("forecasts-*.parquet")))
    assert held["op"].nunique() == len(PROBLEMS) and not held.duplicated(["op", "candidate_id"]).any()
    assert cudal1_forecast.main(score) == 0
    rows = pd.DataFrame(json.loads((tmp_path / "scored" / "forecast.json").read_text())["rows"])
    assert set(rows["forecaster"]) == {"random", "lmhead"}


def test_the_lmhead_benchmark_deals_the_development_folds_and_forecasts_the_sealed_problems_once(tmp_path, monkeypatch):
    """``--problems dev`` trains on folds dealt among the development problems only (the sealed one never
    read), ``--problems sealed`` fits on every development problem and forecasts the sealed one: each is scored
    by the forecast benchmark under the same ``--problems``, and a sealed run given a fold is refused."""
    from benchmarks import cudal1_forecast, cudal1_lmhead
    from kernelcast.surrogate import ranking

    pool, model = _pool_and_tiny_model(tmp_path, monkeypatch)
    train = ["--pool", str(pool), "--model", str(model), "--folds", "3", "--max-tokens", "64", "--batch", "4",
             "--epochs", "1", "--calibrate-on", "kb.cudal1-"]
    dev, sealed = tmp_path / "dev", tmp_path / "sealed"
    for fold in range(3):
        assert cudal1_lmhead.main([*train, "--problems", "dev", "--fold", str(fold), "--out", str(dev)]) == 0
    assert cudal1_lmhead.main([*train, "--problems", "sealed", "--out", str(sealed)]) == 0
    with pytest.raises(ValueError, match="give no --fold"):
        cudal1_lmhead.main([*train, "--problems", "sealed", "--fold", "0", "--out", str(tmp_path / "x")])
    held = pd.concat(pd.read_parquet(f) for f in sorted(dev.glob("forecasts-*.parquet")))
    shut = ranking.sealed_problems(held["op"].tolist() + pd.read_parquet(sealed / "forecasts-sealed.parquet")["op"]
                                   .tolist())
    assert shut and not held["op"].isin(shut).any() and held["op"].nunique() == 9 - len(shut)
    only = pd.read_parquet(sealed / "forecasts-sealed.parquet")
    assert set(only["op"]) == set(shut) and (only["fold"] == "sealed").all()
    for problems, folder, count in (("dev", dev, 9 - len(shut)), ("sealed", sealed, len(shut))):
        out = tmp_path / "scored" / problems
        assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                     "--forecasters", "random", "--problems", problems,
                                     "--forecasts", f"lmhead={folder}", "--out", str(out)]) == 0
        rows = pd.DataFrame(json.loads(out.with_suffix(".json").read_text())["rows"])
        assert (rows.loc[rows["forecaster"] == "lmhead", "problems"] == count).all()
    with pytest.raises(ValueError, match="other folds"):  # the dev folds are not the folds over every problem
        cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                              "--forecasters", "random", "--forecasts", f"lmhead={dev}",
                              "--out", str(tmp_path / "scored" / "all")])


def test_the_reading_benchmark_says_what_a_cut_keeps_and_how_far_forecasts_spread(tmp_path, monkeypatch):
    """A cut long enough reads every pair whole, a short one does not; forecasts equal to the measured speedups
    spread exactly as the measurements do (ratio 1), and a constant forecast not at all."""
    from benchmarks import cudal1_forecast, lmhead_reading

    pool, model = _pool_and_tiny_model(tmp_path, monkeypatch)

    def measured():
        args = cudal1_forecast.parse(["--pool", str(pool), "--corpus", str(tmp_path)])
        return cudal1_forecast._measured(args)[0]

    kernels = cudal1_forecast.with_pool_tasks(measured)
    for name, expected in (("truth", kernels["speedup"].fillna(1.0)), ("flat", pd.Series(1.3, index=kernels.index))):
        (tmp_path / name).mkdir()
        kernels.assign(expected=expected)[["op", "candidate_id", "expected"]].to_parquet(
            tmp_path / name / "forecasts-0.parquet")
    out = tmp_path / "reading.json"
    assert lmhead_reading.main(["--pool", str(pool), "--model", str(model), "--corpus", str(tmp_path),
                                "--max-tokens", "24,4096", "--forecasts", str(tmp_path / "truth"),
                                "--forecasts", str(tmp_path / "flat"), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    short, long = got["cuts"]
    assert long["read_whole"] == 1.0 and long["candidate_read_median"] == 1.0
    assert short["read_whole"] < 1.0 and short["candidate_read_p10"] < 1.0
    assert short["problems_reading_two_alike"] >= long["problems_reading_two_alike"]
    truth, flat = got["spread"]
    assert truth["ratio_median"] == pytest.approx(1.0) and flat["forecast_sd_median"] == pytest.approx(0.0)
