"""Forecasters judged where ranking matters: per-problem yardsticks, problem-grouped folds, the CUDA-L1 benchmark."""

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelcast.kernels.records import Candidate, HardwareSpec, Measurement
from kernelcast.storage.dataset import DataRoot
from kernelcast.surrogate import crossgpu, ranking
from tests.formats_for_tests import KB_RELU as RELU

H100 = HardwareSpec(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", sm_count=132,
                    sm_clock_mhz=1980, mem_clock_mhz=2619, bus_width_bits=5120, memory_gib=79.2, l2_mib=50.0,
                    threads_per_sm=2048)
# Per KernelBench level, three problems; per problem, four implementations (speedup, or None: fails).
PROBLEMS = {f"cudal1-l{level}-{task:03d}": [2.0 * level / task, 1.0, 0.5 + 0.1 * task, None if task == 2 else 0.2]
            for level in (1, 2, 3) for task in (1, 2, 3)}
GPU_FACTORS = {"a100": 0.5, "l40": 0.8, "h20": 1.2, "3090": 0.6}  # published = our H100 speedup times this


def _forecasts(kernels, expected, p_fail):
    """A held-out forecasts frame (as ``held_out_forecasts`` gives) of given speedups and failure chances."""
    probs = np.full((len(kernels), 9), 1.0 / 9)
    return pd.DataFrame({"fold": "all", "p_fail": p_fail, "expected": expected, "probs": list(probs)},
                        index=kernels.index)


def _kernels():
    rows = [{"op": op, "speedup": np.nan if s is None else s, "failed": s is None,
             "true_bin": 0 if s is None else 5} for op, speedups in PROBLEMS.items() for s in speedups]
    return pd.DataFrame(rows)


def test_a_perfect_forecaster_ranks_every_problem_right_and_a_reversed_one_wrong():
    kernels = _kernels()
    failed = kernels["failed"].to_numpy()
    truth = kernels["speedup"].fillna(1.0).to_numpy()
    perfect = ranking.score(kernels, _forecasts(kernels, truth, failed.astype(float)), draws=50)
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["spearman_problems"] == 9
    assert perfect["top1_within_10pct"] == 1.0 and perfect["select_top30_within_20pct"] == 1.0
    assert perfect["failure_auroc"] == 1.0
    reversed_ = ranking.score(kernels, _forecasts(kernels, 1.0 / truth, np.where(failed, 0.0, 0.5)), draws=50)
    assert reversed_["spearman"] == pytest.approx(-1.0)
    assert reversed_["top1_within_10pct"] == 0.0 and reversed_["failure_auroc"] == 0.0


def test_the_selection_counts_a_pool_whose_top_fifth_finds_within_20_percent_of_its_best():
    problems = ["a"] * 5 + ["b"] * 5
    found = np.array([1.0, 0.85, 0.5, 0.2, 0.1, 1.0, 0.7, 0.5, 0.2, 0.1])
    score = np.array([4, 5, 3, 2, 0, 4, 5, 3, 2, 0], dtype=float)  # each ranks its second-best first, its best second
    within = ranking.found_within(score, found, problems, 0.20, 0.20)
    assert within.to_dict() == {"a": True, "b": False}
    assert ranking.found_within(score, found, problems, 0.40, 0.20).all()  # the top two hold the best


def test_a_problem_with_fewer_than_three_kernels_that_ran_has_no_spearman():
    rho = ranking.within_problem_spearman([1, 2, 3, 1, 2], [1, 2, 3, 2, 1], [True, True, True, True, True],
                                          ["a", "a", "a", "b", "b"])
    assert rho.to_dict() == {"a": 1.0}


def test_folds_never_share_a_problem_and_hold_each_out_once():
    problems = [f"kb.cudal1-l{lv}-{t:03d}" for lv in (1, 2, 3) for t in range(1, 8)]
    for folds in (ranking.problem_folds(problems, 5, seed=3), ranking.level_folds(problems)):
        held = [set(h) for _, h in folds]
        assert sum(len(h) for h in held) == len(problems) and set().union(*held) == set(problems)
    assert [sorted({ranking.problem_level(op) for op in h}) for _, h in ranking.level_folds(problems)] == [[1], [2], [3]]
    with pytest.raises(ValueError, match="names no KernelBench level"):
        ranking.problem_level("softmax")


def test_a_learned_ratio_carries_a_speedup_to_another_gpu_where_the_same_speedup_does_not():
    rows = pd.DataFrame({"op": [f"p{i}" for i in range(8)] * 2, "gpu_type": ["a100"] * 8 + ["l40"] * 8,
                         "source_speedup": np.tile(np.linspace(0.5, 4.0, 8), 2)})
    rows["target_speedup"] = rows["source_speedup"] * rows["gpu_type"].map({"a100": 0.5, "l40": 0.9})
    folds = ranking.problem_folds(sorted(rows["op"].unique()), 4)
    ratio = crossgpu.scores(crossgpu.held_out(rows, folds, "ratio"), rows["target_speedup"])
    same = crossgpu.scores(crossgpu.held_out(rows, folds, "same"), rows["target_speedup"])
    assert ratio["median_abs_log_error"] == pytest.approx(0.0, abs=1e-9) and ratio["within_20pct"] == 1.0
    assert same["within_20pct"] == 0.5 and same["median_abs_log_error"] > 0.1


_BUILT: list = []  # the pool's folder, built once per session: each test gets a copy it may change


def _pool(folder, monkeypatch):
    """A small measured pool as the CUDA-L1 pool is stored: tasks, candidates, measurements, side table; copied
    into ``folder``, its tasks installed under ``folder / "installed"``."""
    if not _BUILT:
        _BUILT.append(tempfile.TemporaryDirectory(prefix="cudal1-pool-"))
        with pytest.MonkeyPatch.context() as building:
            _build_pool(Path(_BUILT[0].name), building)
    shutil.copytree(_BUILT[0].name, folder, dirs_exist_ok=True)
    monkeypatch.setenv("KERNELCAST_TASKS", str(folder / "installed"))
    return folder / "pool"


def _needs_a_missing_package(root, op):
    """Store task ``op``'s reference under ``root`` again, importing a package no machine has."""
    from kernelcast.kernels.formats import save_to_root, stored_task

    files = stored_task(DataRoot(str(root)), op)
    save_to_root(DataRoot(str(root)), op, {**files, "reference.py": b"import a_package_this_machine_lacks\n"
                                           + files["reference.py"]})


def _build_pool(folder, monkeypatch):
    from kernelcast.kernels.formats import import_task

    monkeypatch.setenv("KERNELCAST_TASKS", str(folder / "installed"))
    root = DataRoot(str(folder / "pool" / "kernelcast"))
    (folder / "relu.py").write_text(RELU)
    candidates, measurements, side = [], [], []
    for name, speedups in PROBLEMS.items():
        op, _ = import_task("kernelbench", str(folder / "relu.py"), name=name, root=root)
        case = op.cases[0].name
        reference = op.seed_candidates()[0]
        candidates.append(reference)
        measurements.append(Measurement(reference.candidate_id, op.name, "h100", "ok", "gpu", case_names=(case,),
                                        runtime_us_median=(100.0,), speedup=1.0, hardware=H100))
        for i, (variant, s) in enumerate(zip(("custom", "cuda-graph", "cudnn", "null"), speedups)):
            body = "\n".join(f"    y = y * 1.0  # step {k}" for k in range(i + 1))
            c = Candidate(op=op.name, backend="torch", origin="import",
                          source=f"import torch\n\n\ndef forward(x):\n    y = torch.relu(x)\n{body}\n    return y\n")
            candidates.append(c)
            measurements.append(Measurement(c.candidate_id, op.name, "h100", "incorrect" if s is None else "ok", "gpu",
                                            case_names=(case,), runtime_us_median=() if s is None else (100.0 / s,),
                                            speedup=s, hardware=H100))
            side.append({"op": op.name, "variant": variant, "candidate_id": c.candidate_id,
                         **{f"published_speedup_{g}": None if s is None or variant == "null" else s * f
                            for g, f in GPU_FACTORS.items()},
                         **{f"same_code_{g}": True for g in GPU_FACTORS}})
    root.write_candidates(candidates)
    root.write_measurements(measurements)
    pd.DataFrame(side).to_parquet(folder / "pool" / "cudal1.parquet")


def test_the_baseline_s_best_is_the_mean_over_every_order_of_the_kernels_it_measures():
    import itertools

    found = np.array([0.0, 1.3, 0.8, 2.0, 1.1])
    for budget in (1, 2, 3, 5):
        brute = np.mean([max(found[list(o[:budget])]) for o in itertools.permutations(range(5))])
        assert ranking.baseline_best(found, budget) == pytest.approx(brute)


def test_a_replayed_search_reaches_the_ceiling_with_a_perfect_forecaster_and_falls_below_the_baseline_reversed():
    kernels = _kernels()
    failed = kernels["failed"].to_numpy()
    truth = kernels["speedup"].fillna(1.0).to_numpy()
    perfect = ranking.replayed_search(kernels, np.where(failed, 0.0, truth), draws=50)
    assert perfect["problems"] == 9 and perfect["to_best"] == 1.0
    for b in ranking.REPLAY_BUDGETS:
        assert perfect[f"best_at_{b}"] == pytest.approx(perfect[f"oracle_at_{b}"]) and perfect[f"best_at_{b}"] > 1.0
    reversed_ = ranking.replayed_search(kernels, np.where(failed, 9.0, 1.0 / truth), draws=50)
    assert reversed_["best_at_1"] < 1.0 and reversed_["to_best"] > reversed_["baseline_to_best"]
    tied = ranking.replayed_search(kernels, np.zeros(len(kernels)), draws=50)  # ties in random orders: the baseline
    assert tied["best_at_1"] == pytest.approx(1.0, abs=0.15)


def test_the_benchmark_runs_end_to_end_on_a_small_pool(tmp_path, monkeypatch, capsys):
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    out = tmp_path / "out" / "forecast"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "learned,source,roofline,random", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["kernels"] == 36 and result["failed"] == 3 and len(result["problems"]) == 9
    rows = pd.DataFrame(result["rows"])
    assert set(rows["forecaster"]) == {"learned", "source", "roofline", "random"}
    assert set(rows["split"]) == {"grouped 3-fold by problem", "leave one level out"}
    assert (rows["problems"] == 9).all() and rows["top1_within_10pct"].between(0, 1).all()
    assert result["not_run"] == ["lmhead (no trained folder given: --lmhead-folder, nor its forecasts: "
                                 "--forecasts lmhead=DIR)"]
    transfer = pd.DataFrame(result["cross_gpu"]).set_index(["gpu_type", "model"])
    assert transfer.loc[("all", "ratio"), "median_abs_log_error"] == pytest.approx(0.0, abs=1e-9)
    assert transfer.loc[("a100", "same"), "within_20pct"] == 0.0
    assert "Per forecaster, on held-out problems" in out.with_suffix(".txt").read_text()
    replays = pd.DataFrame(result["replayed_searches"]).set_index("forecaster")
    assert set(replays.index) == {"learned", "source", "roofline", "random"} and (replays["problems"] == 9).all()
    assert (replays["oracle_at_1"] >= replays["best_at_1"] - 1e-9).all()
    assert "learned" in capsys.readouterr().out


def test_the_rule_census_counts_every_kernel_by_its_verdict_and_its_facts(tmp_path, monkeypatch):
    from benchmarks import cudal1_forecast, rule_facts_census

    pool = _pool(tmp_path, monkeypatch)
    kernels, _ = cudal1_forecast._measured(rule_facts_census.parse(["--pool", str(pool), "--problems", "all"]))
    counts, flagged = rule_facts_census.census(kernels)
    assert counts[("kernels", "ok")] == 33 and counts[("kernels", "incorrect")] == 3
    # the pool's stand-in kernels define no launch: their facts cannot be found, and none is said to break a rule
    assert counts[("facts host_error", "")] == 36 and flagged == []
    out = tmp_path / "census.txt"
    assert rule_facts_census.main(["--pool", str(pool), "--problems", "all", "--out", str(out)]) == 0
    assert "36 kernels" in out.read_text().splitlines()[0]


def test_stored_forecasts_are_aligned_by_kernel_and_refused_under_other_folds_or_with_a_kernel_missing():
    kernels = _kernels().assign(candidate_id=lambda k: [f"c{i}" for i in range(len(k))])
    folds = ranking.problem_folds(sorted(PROBLEMS), 3, 0)
    fold_of = {op: name for name, held in folds for op in held}
    table = pd.DataFrame({"op": kernels["op"], "candidate_id": kernels["candidate_id"],
                          "fold": kernels["op"].map(fold_of), "p_fail": 0.1, "expected": kernels["speedup"].fillna(0.1),
                          "probs": [list(np.full(9, 1 / 9)) for _ in range(len(kernels))]})
    shuffled = table.sample(frac=1.0, random_state=0)
    got = ranking.stored_forecasts(kernels, [shuffled.iloc[:10], shuffled.iloc[10:]], folds)
    assert list(got["expected"]) == list(table["expected"]) and (got["fold"] == table["fold"]).all()
    assert ranking.score(kernels, got, draws=20)["spearman"] == pytest.approx(1.0)
    moved = table.assign(fold=table["fold"].where(table["op"] != "cudal1-l1-001", "elsewhere"))
    with pytest.raises(ValueError, match="cudal1-l1-001.*other folds|other folds.*cudal1-l1-001"):
        ranking.stored_forecasts(kernels, [moved], folds)
    with pytest.raises(ValueError, match="1 of 36 kernels have no stored forecast"):
        ranking.stored_forecasts(kernels, [table.iloc[1:]], folds)


def test_the_benchmark_scores_forecasts_made_elsewhere_under_the_folds_their_seed_dealt(tmp_path, monkeypatch):
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    args = cudal1_forecast.parse(["--pool", str(pool)])
    kernels, _ = cudal1_forecast.with_pool_tasks(lambda: cudal1_forecast._measured(args))
    folds = ranking.problem_folds(sorted(kernels["op"].unique()), 3, 7)
    fold_of = {op: name for name, held in folds for op in held}
    stored = tmp_path / "stored"
    stored.mkdir()
    for i, (name, held) in enumerate(folds):  # a perfect forecaster, one file a fold, dealt by seed 7
        rows = kernels[kernels["op"].isin(held)]
        pd.DataFrame({"op": rows["op"], "candidate_id": rows["candidate_id"], "fold": rows["op"].map(fold_of),
                      "fold_seed": 7, "p_fail": rows["failed"].astype(float),
                      "expected": rows["speedup"].fillna(0.01),
                      "probs": [list(np.full(9, 1 / 9)) for _ in range(len(rows))]}).to_parquet(stored / f"forecasts-{i}.parquet")
    out = tmp_path / "out" / "forecast"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "random", "--forecasts", f"lmhead-made-elsewhere={stored}",
                                 "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    row = next(r for r in result["rows"] if r["forecaster"] == "lmhead-made-elsewhere")
    assert row["spearman"] == pytest.approx(1.0) and row["failure_auroc"] == pytest.approx(1.0)
    assert result["not_run"] == []
    with pytest.raises(SystemExit):  # NAME=DIR or nothing
        cudal1_forecast.parse(["--pool", str(pool), "--forecasts", str(stored)])


def test_a_problem_whose_reference_does_not_load_here_is_left_out_by_name_and_the_rest_scored(tmp_path, monkeypatch,
                                                                                              capsys):
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    _needs_a_missing_package(pool / "kernelcast", "kb.cudal1-l2-003")
    out = tmp_path / "out" / "forecast"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "random", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert len(result["problems"]) == 8 and not any("l2-003" in p for p in result["problems"])
    assert "left out: kb.cudal1-l2-003 does not load here" in capsys.readouterr().out


def test_the_null_scatter_benchmark_measures_reference_and_null_under_both_anchor_settings(tmp_path, monkeypatch):
    from benchmarks import null_scatter

    pool = _pool(tmp_path, monkeypatch)
    monkeypatch.undo()  # the tasks directory the measuring children know: the benchmark installs there
    out = tmp_path / "scatter.json"
    assert null_scatter.main(["--root", str(pool / "kernelcast"), "--problems", "kb.cudal1-l1-001", "--repeats", "1",
                              "--mode", "interpreter", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert set(row["runs"]) == {"host-bound", "all"}
    assert all(r["status"] == "ok" and r["reference_status"] == "ok" for runs in row["runs"].values() for r in runs)
    with pytest.raises(ValueError, match="holds no task kb.cudal1-l9-999"):
        null_scatter.main(["--root", str(pool / "kernelcast"), "--problems", "kb.cudal1-l9-999", "--mode", "interpreter"])


def test_the_sealed_problems_are_a_fixed_fifth_that_a_new_problem_does_not_move():
    names = [f"kb.cudal1-l{level}-{task:03d}" for level in (1, 2, 3) for task in range(1, 101)]
    sealed = ranking.sealed_problems(names)
    assert 0.12 < len(sealed) / len(names) < 0.28
    assert sealed == ranking.sealed_problems(list(reversed(names)))  # the names alone decide
    more = ranking.sealed_problems(names + ["kb.cudal1-l4-001", "kb.cudal1-l4-002"])
    assert sealed == more - {"kb.cudal1-l4-001", "kb.cudal1-l4-002"}
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        ranking.sealed_problems(names, share=1.0)


def test_the_benchmark_develops_on_dev_problems_and_scores_the_sealed_ones_once(tmp_path, monkeypatch):
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    problems = sorted(f"kb.{op}" for op in PROBLEMS)
    sealed = ranking.sealed_problems(problems, share=0.2)
    monkeypatch.setattr(ranking, "sealed_problems", lambda names, share=0.2: frozenset(problems[:3]))
    out = tmp_path / "dev"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "learned", "--problems", "dev", "--out", str(out)]) == 0
    rows = pd.DataFrame(json.loads(out.with_suffix(".json").read_text())["rows"])
    assert (rows["problems"] == 6).all()  # the three sealed ones never reached a fold
    out = tmp_path / "sealed"
    assert cudal1_forecast.main(["--pool", str(pool), "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "learned", "--problems", "sealed", "--out", str(out)]) == 0
    rows = pd.DataFrame(json.loads(out.with_suffix(".json").read_text())["rows"])
    assert list(rows["split"]) == ["dev -> sealed (3 problems)"] and list(rows["problems"]) == [3]
    assert isinstance(sealed, frozenset)


def test_code_features_see_cuda_kernels_graphs_and_the_anchors_operators():
    from kernelcast.surrogate.features import CODE_FEATURES, _code_features, _operators

    cuda = ('from torch.utils.cpp_extension import load_inline\nsrc = """\n__global__ void k(float4* x) {\n'
            '  __shared__ float s[256];\n#pragma unroll\n  for (int i = 0; i < 4; ++i) {}\n  __syncthreads();\n'
            '  v = __shfl_down_sync(0xffffffff, v, 16);\n}\nvoid run() { k<<<1, 256>>>(x); }\n"""\n'
            'mod = load_inline(name="k", cpp_sources="", cuda_sources=src)\n')
    graph = ("import torch\ng = torch.cuda.CUDAGraph()\nwith torch.cuda.graph(g):\n    y = model(x)\ng.replay()\n"
             "torch.backends.cudnn.benchmark = True\nx = x.to(memory_format=torch.channels_last)\n")
    c, g = (dict(zip(CODE_FEATURES, _code_features(s))) for s in (cuda, graph))
    assert c["n_cuda_global"] == c["n_cuda_shared"] == c["n_cuda_launch"] == c["n_cuda_unroll"] == 1
    assert c["n_cuda_vector"] == c["n_cuda_warp"] == c["n_cuda_sync"] == 1 and c["n_cuda_extension"] >= 1
    assert c["n_graph"] == 0 and g["n_graph"] == 3 and g["n_backend_flags"] == 1 and g["n_channels_last"] == 1
    eager = "x = self.conv(x)\nx = F.relu(x)\nx = torch.sigmoid(x) * x\nreturn x.sum(dim=1)\n"
    assert _operators(eager) == 3 and _operators("return torch.randn(3)\n") == 0


def test_a_problems_variant_space_joins_its_pool_anchored_at_its_own_reference_and_a_kernel_counts_once(
        tmp_path, monkeypatch):
    from benchmarks import cudal1_forecast
    from kernelcast.kernels.ops import get_operation

    pool = _pool(tmp_path, monkeypatch)
    op_name = "kb.cudal1-l2-001"
    pool_root = DataRoot(str(pool / "kernelcast"))
    pooled = pool_root.read_candidates(op=op_name)
    again = Candidate(**{k: pooled[pooled["origin"] == "import"].iloc[0][k] for k in ("op", "backend", "origin", "source")})
    space = DataRoot(str(tmp_path / "spaces" / op_name))
    op = get_operation(op_name)
    reference = op.seed_candidates()[0]
    case = op.cases[0].name
    compiled = [Candidate(op=op_name, backend="torch", origin="variant:compile-default", parent_id=reference.candidate_id,
                          source=f"import torch\n\n\n@torch.compile\ndef forward(x):\n    return torch.relu(x) * {k}.0\n")
                for k in (1, 2)]
    space.write_candidates([reference, again, *compiled])
    # this root's reference ran at 200 us: its children's speedups are over that, not over the pool's 100 us
    space.write_measurements([Measurement(c.candidate_id, op_name, "h100", "ok", "gpu", case_names=(case,),
                                          runtime_us_median=(t,), speedup=200.0 / t, hardware=H100)
                              for c, t in ((reference, 200.0), (again, 1.0), (compiled[0], 50.0), (compiled[1], 400.0))])
    (tmp_path / "spaces" / "gpumode.grayscale").mkdir()  # a space of a task the pool does not hold: not joined
    args = cudal1_forecast.parse(["--pool", str(pool), "--spaces", str(tmp_path / "spaces")])
    kernels, cases = cudal1_forecast._measured(args)
    mine = kernels[kernels["op"] == op_name].set_index("candidate_id")
    assert len(kernels) == 36 + 2 and len(mine) == 6
    # the pool's measurement (its first kernel, 4x), not the space's (200x)
    assert mine.loc[again.candidate_id, "speedup"] == pytest.approx(PROBLEMS["cudal1-l2-001"][0])
    assert mine.loc[compiled[0].candidate_id, "speedup"] == pytest.approx(4.0)
    assert mine.loc[compiled[1].candidate_id, "speedup"] == pytest.approx(0.5)
    assert set(cases[cases["op"] == op_name]["candidate_id"]) == set(mine.index)
    with pytest.raises(ValueError, match="--spaces .*no such folder"):
        cudal1_forecast._measured(cudal1_forecast.parse(["--pool", str(pool), "--spaces", str(tmp_path / "nowhere")]))


def test_the_census_counts_references_and_implementations_and_sets_the_null_twins_apart(tmp_path, monkeypatch,
                                                                                        capsys):
    from benchmarks import cudal1_forecast
    from kernelcast.kernels.null import null_candidate
    from kernelcast.kernels.ops import get_operation

    pool = _pool(tmp_path, monkeypatch)
    args = cudal1_forecast.parse(["--pool", str(pool)])
    kernels = cudal1_forecast._measured(args)[0]
    found = cudal1_forecast.census(kernels)
    assert (found["problems"], found["implementations"], found["implementations_ok"], found["nulls"]) == (9, 36, 33, 0)
    assert found["with_references"] == 45 and found["by_origin"] == {"cuda-l1": 36}
    twin = kernels["op"].iloc[0]  # one problem's kernel is its reference's null twin: not an implementation of its own
    kernels.loc[kernels.index[0], "candidate_id"] = null_candidate(get_operation(twin)).candidate_id
    assert cudal1_forecast.census(kernels)["nulls"] == 1 and cudal1_forecast.census(kernels)["implementations"] == 35
    assert cudal1_forecast.main(["--pool", str(pool), "--census-only"]) == 0
    assert "45 H100-measured implementations of 9 problems" in capsys.readouterr().out


def test_torch_compile_of_a_reference_is_set_against_the_problems_best_cuda_l1_kernel(tmp_path, monkeypatch):
    from benchmarks import compile_vs_pool
    from kernelcast.kernels.ops import get_operation

    pool = _pool(tmp_path, monkeypatch)
    op = get_operation("kb.cudal1-l2-003")  # its CUDA-L1 kernels at 1.33 (custom), 1.0, 0.8; 0.2 is its null
    root = DataRoot(str(tmp_path / "compiled" / op.name))
    reference = op.seed_candidates()[0]
    default = Candidate(op=op.name, backend="torch", origin="variant:compile-default", source="# compiled default\n")
    tuned = Candidate(op=op.name, backend="torch", origin="variant:compile-max-autotune-no-cudagraphs",
                      source="# compiled max-autotune\n")
    root.write_candidates([reference, default, tuned])
    case = op.cases[0].name
    root.write_measurements([
        Measurement(reference.candidate_id, op.name, "h100", "ok", "gpu", case_names=(case,), runtime_us_median=(100.0,),
                    speedup=1.0, hardware=H100),
        Measurement(default.candidate_id, op.name, "h100", "ok", "gpu", case_names=(case,), runtime_us_median=(62.5,),
                    speedup=1.6, hardware=H100),
        Measurement(tuned.candidate_id, op.name, "h100", "timeout", "gpu", case_names=(case,), hardware=H100)])
    (row,) = compile_vs_pool.table(tmp_path / "compiled", pool, "h100", tmp_path / "no-report.json")
    assert row["default"] == pytest.approx(1.6) and row["best_mode"] == "compile-default"
    assert row["cudal1"] == pytest.approx(4.0 / 3.0) and row["cudal1_variant"] == "custom"
    assert row["failed_modes"] == ["compile-max-autotune-no-cudagraphs"] and not row["headroom"]
    out = tmp_path / "table.md"
    assert compile_vs_pool.main(["--compiled", str(tmp_path / "compiled"), "--pool", str(pool), "--markdown", str(out),
                                 "--report", str(tmp_path / "no-report.json")]) == 0
    text = out.read_text()
    assert "| l2-003 |  | 1.60 | 1.60 (default) | 1.33 (custom) | 1.00 |" in text
    assert "beats the best CUDA-L1 kernel on 1; geomean best compile / best CUDA-L1 1.200" in text
    assert compile_vs_pool.main(["--compiled", str(tmp_path / "nowhere"), "--pool", str(pool)]) == 2


def test_several_dealings_of_the_folds_give_their_rows_and_per_forecaster_the_mean_with_its_range(tmp_path,
                                                                                                  monkeypatch):
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    out = tmp_path / "out" / "forecast"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "learned,random", "--seed", "4", "--dealings", "3",
                                 "--out", str(out)]) == 0
    rows = pd.DataFrame(json.loads(out.with_suffix(".json").read_text())["rows"])
    dealt = [f"grouped 3-fold by problem, dealing {s}" for s in (4, 5, 6)]
    mean = "grouped 3-fold by problem, mean of 3 dealings"
    assert set(rows["split"]) == {*dealt, mean, "leave one level out"}
    for name in ("learned", "random"):
        mine = rows[rows["forecaster"] == name].set_index("split")
        figures = mine.loc[dealt, "top1_within_10pct"]
        assert mine.loc[mean, "top1_within_10pct"] == pytest.approx(figures.mean())
        assert (mine.loc[mean, "top1_within_10pct_lo"], mine.loc[mean, "top1_within_10pct_hi"]) == \
            (figures.min(), figures.max())
    # the dealings differ: the learned forecaster, fit on other problems each time, is not scored alike three times
    learned = rows[rows["split"].isin(dealt) & (rows["forecaster"] == "learned")]
    assert len(learned[["spearman", "top1_within_10pct", "failure_auroc", "ece", "aurc"]].drop_duplicates()) > 1
    assert "mean of 3 dealings" in out.with_suffix(".txt").read_text()
    with pytest.raises(SystemExit):
        cudal1_forecast.parse(["--dealings", "0"])


def test_another_measurement_of_the_kernels_is_scored_as_a_ranker_beside_the_forecasters(tmp_path, monkeypatch):
    """The pool's measurement under its other protocol ranks the same kernels: here every speedup reversed there,
    so its within-problem Spearman is -1 and its top-1 is each problem's slowest kernel that ran."""
    from benchmarks import cudal1_forecast
    from kernelcast.storage.schema import measurements_from_frame

    pool = _pool(tmp_path, monkeypatch)
    ours = DataRoot(str(pool / "kernelcast"))
    theirs = DataRoot(str(pool / "kernelbench"))
    theirs.write_candidates(__import__("kernelcast.storage.schema", fromlist=["x"]).candidates_from_frame(ours.read_candidates()))
    frame = ours.read_measurements()
    reversed_ = 1.0 / frame["speedup"]
    frame["speedup"] = reversed_
    frame["runtime_us_median"] = [[] if not np.isfinite(s) else [100.0 / s] for s in reversed_]
    theirs.write_measurements(measurements_from_frame(frame))
    side = pd.read_parquet(pool / "cudal1.parquet")
    side["published_speedup_h100"] = side["published_speedup_a100"] / GPU_FACTORS["a100"]
    side.to_parquet(pool / "cudal1.parquet")
    out = tmp_path / "out"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "learned,random", "--out", str(out)]) == 0
    rows = pd.DataFrame(json.loads(out.with_suffix(".json").read_text())["measured_rankers"])
    rankers = ("CUDA-L1's published h100 speedup", "our measurement under the kernelbench protocol")
    assert set(zip(rows["ranker"], rows["judged_against"], rows["kind"])) == {
        (r, j, k) for r in rankers for j in (r, "the pool's measurement")
        for k in ("measurement", "forecaster learned", "forecaster random")}
    assert (rows["problems"] == 9).all()
    # the other way round: the reversed measurement as the truth, the pool's own measurement ranks it reversed too
    back = rows[(rows["kind"] == "measurement") & (rows["judged_against"] == rankers[1])].iloc[0]
    assert back["ranked_by"] == "the pool's measurement" and back["spearman"] == pytest.approx(-1.0)
    assert back["top1_within_10pct"] == 0.0
    rows = rows[rows["judged_against"] == "the pool's measurement"]
    other = rows[(rows["kind"] == "measurement") & rows["ranker"].str.contains("kernelbench")].iloc[0]
    assert other["spearman"] == pytest.approx(-1.0)
    # each problem's slowest kernel that ran: within 10% of its best only where they tie
    assert other["top1_within_10pct"] == 0.0
    published = rows[(rows["kind"] == "measurement") & rows["ranker"].str.startswith("CUDA-L1")].iloc[0]
    assert published["top1_within_10pct"] > other["top1_within_10pct"]
    assert "Rankers that are measurements" in out.with_suffix(".txt").read_text()
    # a second measurement by the same protocol, identical to the first: it ranks every problem right
    retest = tmp_path / "retest"
    again = DataRoot(str(retest / "kernelcast"))
    again.write_candidates(__import__("kernelcast.storage.schema", fromlist=["x"]).candidates_from_frame(ours.read_candidates()))
    again.write_measurements(measurements_from_frame(ours.read_measurements()))
    out = tmp_path / "with_retest"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "random", "--retest", str(retest), "--out", str(out)]) == 0
    rows = pd.DataFrame(json.loads(out.with_suffix(".json").read_text())["measured_rankers"])
    same = rows[(rows["kind"] == "measurement") & rows["ranker"].str.contains("second measurement")]
    assert len(same) == 2 and (same["problems"] == 9).all() and np.allclose(same["spearman"], 1.0)
    assert (same["top1_within_10pct"] == 1.0).all()
    # a forecaster judged against an identical second measurement scores as against the pool, ECE and AUROC too
    twice = rows[(rows["kind"] == "forecaster random") & rows["ranker"].str.contains("second measurement")]
    assert len(twice) == 2 and twice["ece"].notna().all()
    for key in ("spearman", "top1_within_10pct", "failure_auroc", "ece"):
        assert twice[key].iloc[0] == pytest.approx(twice[key].iloc[1])
    quiet = tmp_path / "quiet"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "random", "--no-measured-rankers", "--out", str(quiet)]) == 0
    assert json.loads(quiet.with_suffix(".json").read_text())["measured_rankers"] == []


def test_a_recalibrated_forecaster_is_calibrated_on_its_training_problems_only_and_ranks_as_before(tmp_path,
                                                                                                 monkeypatch):
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    fitted_on = []  # the problems each fold's calibrator learned from
    real = ranking.calibrated_on_training

    def spy(name, kernels, *args, **kwargs):
        fitted_on.append(frozenset(kernels["op"]))
        return real(name, kernels, *args, **kwargs)

    monkeypatch.setattr(ranking, "calibrated_on_training", spy)
    out = tmp_path / "out"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "source", "--calibrator", "platt", "--calibrator", "temperature",
                                 "--no-measured-rankers", "--out", str(out)]) == 0
    problems = sorted(f"kb.{op}" for op in PROBLEMS)
    folds = ranking.problem_folds(problems, 3, 0) + ranking.level_folds(problems)
    # per split, each calibrator fit once per fold (a calibrator's folds, then the next's), never on a held-out problem
    assert len(fitted_on) == 2 * len(folds)
    for (_, held), seen in zip(ranking.problem_folds(problems, 3, 0) * 2 + ranking.level_folds(problems) * 2,
                               fitted_on):
        assert seen == frozenset(problems) - held
    rows = pd.DataFrame(json.loads(out.with_suffix(".json").read_text())["rows"]).set_index(["split", "forecaster"])
    for split in ("grouped 3-fold by problem", "leave one level out"):
        plain, platt = rows.loc[(split, "source")], rows.loc[(split, "source+platt")]
        for key in ("spearman", "top1_within_10pct", "select_top10_within_20pct", "failure_auroc"):
            assert platt[key] == pytest.approx(plain[key], nan_ok=True)  # the ranking is the same forecasts'
        assert (split, "source+temperature") in rows.index
    assert any(rows.loc[(s, "source+platt"), "ece"] != rows.loc[(s, "source"), "ece"]
               for s in ("grouped 3-fold by problem", "leave one level out"))


def test_recalibration_refuses_a_forecaster_read_from_a_folder_and_an_unknown_calibrator():
    kernels = _kernels().assign(candidate_id=lambda f: [f"c{i}" for i in range(len(f))])
    folds = ranking.problem_folds(sorted(PROBLEMS), 3, 0)
    forecasts = _forecasts(kernels, 1.0, 0.1)
    with pytest.raises(ValueError, match="lmhead is read from a trained folder"):
        ranking.recalibrated(forecasts, kernels, pd.DataFrame({"op": []}), "lmhead", folds, "platt")
    with pytest.raises(ValueError, match="unknown calibrator 'sigmoid'; known: temperature, isotonic, platt"):
        ranking.calibrated_on_training("random", kernels, pd.DataFrame({"op": []}), "sigmoid")


def _perfect_and_reversed(kernels):
    """(a forecaster that knows every speedup and failure, one that ranks every problem backwards) of ``kernels``."""
    failed = kernels["failed"].to_numpy()
    truth = kernels["speedup"].fillna(1.0).to_numpy()
    return (_forecasts(kernels, truth, failed.astype(float)),
            _forecasts(kernels, 1.0 / truth, np.where(failed, 0.0, 0.5)))


def test_a_paired_difference_resamples_the_same_problems_for_both_and_says_when_it_excludes_a_tie():
    kernels = _kernels()
    perfect, reversed_ = _perfect_and_reversed(kernels)
    better = ranking.paired_difference(kernels, perfect, reversed_, draws=200)
    assert better["problems"] == 9 and better["spearman"] == pytest.approx(2.0)
    assert better["spearman_lo"] > 0 and better["top1_within_10pct"] == 1.0 and better["top1_within_10pct_lo"] > 0
    assert better["failure_auroc"] == pytest.approx(1.0) and better["failure_auroc_lo"] > 0
    same = ranking.paired_difference(kernels, perfect, perfect.copy(), draws=200)
    for key in ("spearman", "top1_within_10pct", "select_top10_within_20pct", "failure_auroc", "ece", "aurc"):
        assert same[key] == 0.0 and same[f"{key}_lo"] == 0.0 and same[f"{key}_hi"] == 0.0
    # only the kernels both forecast count; none in common is an error
    half = perfect.copy()
    half.loc[kernels["op"].isin(sorted(PROBLEMS)[:4]), "fold"] = None
    assert ranking.paired_difference(kernels, half, reversed_, draws=50)["problems"] == 5
    nothing = perfect.assign(fold=None)
    with pytest.raises(ValueError, match="no kernel in common"):
        ranking.paired_difference(kernels, nothing, reversed_)


def test_the_benchmark_pairs_every_forecaster_against_the_one_named(tmp_path, monkeypatch):
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "learned,random,roofline", "--no-measured-rankers",
                                 "--out", str(out)]) == 0
    rows = pd.DataFrame(json.loads(out.with_suffix(".json").read_text())["versus"])
    assert sorted(rows["forecaster"]) == ["random", "roofline"] and set(rows["versus"]) == {"learned"}
    assert (rows["problems"] == 9).all()
    assert "Paired against learned" in out.with_suffix(".txt").read_text()
    alone = tmp_path / "alone"
    assert cudal1_forecast.main(["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path),
                                 "--forecasters", "random", "--no-measured-rankers", "--out", str(alone)]) == 0
    assert json.loads(alone.with_suffix(".json").read_text())["versus"] == []


def test_a_prior_holding_a_task_that_does_not_load_here_is_fit_on_the_rest_with_a_warning(tmp_path, monkeypatch):
    """A search's learned prior over the pool: a problem whose reference imports a package this machine lacks is
    left out of the fit by name (as source_pairs leaves it out), not the end of every search."""
    from kernelcast.kernels.formats import install_from_root
    from kernelcast.surrogate.dataset import case_pairs, loadable_rows
    from kernelcast.tasks.config import SearchConfig
    from kernelcast.tasks.setup import fit_prior, resolve

    pool = _pool(tmp_path, monkeypatch)
    root = DataRoot(str(pool / "kernelcast"))
    _needs_a_missing_package(pool / "kernelcast", "kb.cudal1-l2-003")
    for op in sorted(root.read_candidates()["op"].unique()):
        install_from_root(root, op)
    pairs = case_pairs(root)
    assert "kb.cudal1-l2-003" in set(pairs["op"])
    with pytest.warns(UserWarning, match="kb.cudal1-l2-003 left out of the source pairs: it does not load here"):
        kept = loadable_rows(pairs)
    assert set(kept["op"]) == set(pairs["op"]) - {"kb.cudal1-l2-003"}
    config = resolve(SearchConfig(op="kb.cudal1-l1-001", gpu_type="h100", backend="replay", replay_pool=root.uri,
                                  prior_data=root.uri, surrogate="learned", generator="variants",
                                  data=str(tmp_path / "data")))
    with pytest.warns(UserWarning, match="kb.cudal1-l2-003"):
        model = fit_prior(config, DataRoot(config.data))
    assert model.n_train_ == len(kept.query("op != 'kb.cudal1-l1-001' and speedup == speedup"))


def test_stored_forecasts_of_the_held_out_problems_only_leave_the_others_unforecast():
    """Forecasts of the sealed problems alone, scored where only those are held out: the other kernels are
    not forecast (fold NaN) rather than refused; a held-out kernel without a forecast is still refused."""
    kernels = _kernels().assign(candidate_id=lambda k: [f"c{i}" for i in range(len(k))])
    held = frozenset({"cudal1-l2-002", "cudal1-l3-001"})
    mine = kernels[kernels["op"].isin(held)]
    table = pd.DataFrame({"op": mine["op"], "candidate_id": mine["candidate_id"], "fold": "sealed", "p_fail": 0.1,
                          "expected": mine["speedup"].fillna(0.1), "probs": [list(np.full(9, 1 / 9))] * len(mine)})
    got = ranking.stored_forecasts(kernels, [table], [("sealed", held)])
    assert (got["fold"].notna() == kernels["op"].isin(held)).all()
    assert ranking.score(kernels, got, draws=20)["problems"] == 2
    with pytest.raises(ValueError, match=f"1 of {len(mine)} kernels have no stored forecast"):
        ranking.stored_forecasts(kernels, [table.iloc[1:]], [("sealed", held)])


def test_saved_forecasts_read_back_score_as_the_forecaster_did(tmp_path, monkeypatch):
    """--save-forecasts writes each forecaster's held-out forecasts as a GPU-trained forecaster's are stored;
    scored back with --forecasts they give the very figures the forecaster got in the run that saved them."""
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    saved = tmp_path / "saved"
    common = ["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path), "--no-measured-rankers"]
    assert cudal1_forecast.main([*common, "--forecasters", "learned", "--save-forecasts", str(saved),
                                 "--out", str(tmp_path / "first")]) == 0
    stored = pd.read_parquet(saved / "learned" / "forecasts-0.parquet")
    assert len(stored) == 36 and set(stored.columns) >= {"op", "candidate_id", "fold", "fold_seed", "probs"}
    assert cudal1_forecast.main([*common, "--forecasters", "random", "--forecasts", f"again={saved / 'learned'}",
                                 "--out", str(tmp_path / "again")]) == 0
    first = pd.DataFrame(json.loads((tmp_path / "first.json").read_text())["rows"]).set_index("forecaster")
    again = pd.DataFrame(json.loads((tmp_path / "again.json").read_text())["rows"]).set_index("forecaster")
    row = first[first["split"] == again.loc["again", "split"]].loc["learned"]
    for key in ("spearman", "top1_within_10pct", "failure_auroc", "ece", "aurc"):
        assert again.loc["again", key] == pytest.approx(row[key], nan_ok=True)


def test_scoring_on_the_spaces_judges_only_the_problems_that_have_one(tmp_path):
    import argparse

    from benchmarks.cudal1_forecast import scoped_score, spaced_problems

    spaces = tmp_path / "spaces"
    for op in ("cudal1-l2-001", "cudal1-l3-003", "kb.other-task"):
        (spaces / op).mkdir(parents=True)
    assert spaced_problems([str(spaces)], sorted(PROBLEMS)) == ["cudal1-l2-001", "cudal1-l3-003"]
    with pytest.raises(ValueError, match="needs --spaces"):
        spaced_problems([], sorted(PROBLEMS))
    with pytest.raises(ValueError, match="none of the problems"):
        spaced_problems([str(spaces)], ["cudal1-l1-002"])
    kernels = _kernels()
    truth = kernels["speedup"].fillna(0.0).to_numpy()
    # right on the two spaced problems, reversed on every other: scored on the spaces, the ranking is perfect
    spaced = kernels["op"].isin(["cudal1-l2-001", "cudal1-l3-003"]).to_numpy()
    forecasts = _forecasts(kernels, np.where(spaced, truth, -truth), kernels["failed"].astype(float))
    args = argparse.Namespace(draws=20, seed=0)
    on_spaces = scoped_score(kernels, forecasts, ["cudal1-l2-001", "cudal1-l3-003"], args)
    everywhere = scoped_score(kernels, forecasts, None, args)
    assert on_spaces["problems"] == 2 and everywhere["problems"] == 9
    assert on_spaces["spearman"] == pytest.approx(1.0) and everywhere["spearman"] < 0


def test_kernels_whose_verdicts_were_the_harnesss_fault_are_left_out_by_id(tmp_path, monkeypatch, capsys):
    """--drop-verdicts: the kernels a file names (a stored verdict known to be the harness's, not the kernel's) are
    neither trained on nor scored; a file that cannot be read or names nothing is refused by name."""
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    kernels = cudal1_forecast._measured(cudal1_forecast.parse(["--pool", str(pool)]))[0]
    failed = kernels.loc[kernels["status"] != "ok", "candidate_id"].tolist()
    listed = tmp_path / "faults.txt"
    listed.write_text("# verdicts of the harness's making\n\n" + "\n".join(f"{c}  # incorrect" for c in failed[:2]))
    args = cudal1_forecast.parse(["--pool", str(pool), "--drop-verdicts", str(listed)])
    kept = cudal1_forecast._measured(args)[0]
    assert len(kept) == len(kernels) - 2 and not set(failed[:2]) & set(kept["candidate_id"])
    assert "left out: 2 of the 2 kernels whose verdicts" in capsys.readouterr().out
    (tmp_path / "empty.txt").write_text("# nothing\n")
    for path, words in ((tmp_path / "empty.txt", "names no candidate id"), (tmp_path / "absent.txt", "cannot read")):
        with pytest.raises(ValueError, match=words):
            cudal1_forecast._measured(cudal1_forecast.parse(["--pool", str(pool), "--drop-verdicts", str(path)]))


def test_a_blend_mixes_two_forecasters_and_leaves_unforecast_what_either_leaves_and_refuses_other_folds():
    kernels = _kernels()
    failed = kernels["failed"].to_numpy()
    truth = kernels["speedup"].fillna(1.0).to_numpy()
    perfect, reversed_ = _perfect_and_reversed(kernels)
    reversed_["probs"] = [np.eye(9)[3]] * len(kernels)
    half = ranking.blended(perfect, reversed_, 0.5)
    assert np.allclose(half["expected"], 1.0) and np.allclose(half["p_fail"], np.where(failed, 0.5, 0.25))
    assert np.allclose(half["probs"].iloc[0], 0.5 / 9 + 0.5 * np.eye(9)[3])
    assert np.allclose(ranking.blended(perfect, reversed_, 0.0)["expected"], truth)
    assert np.allclose(ranking.blended(perfect, reversed_, 1.0)["expected"], 1.0 / truth)
    # weighted towards the right forecaster, it ranks as that one does; towards the wrong one, as that one
    assert ranking.score(kernels, ranking.blended(perfect, reversed_, 0.25), draws=20)["spearman"] == pytest.approx(1.0)
    assert ranking.score(kernels, ranking.blended(perfect, reversed_, 0.75), draws=20)["spearman"] == pytest.approx(-1.0)
    some = reversed_.copy()
    some.loc[kernels["op"] == sorted(PROBLEMS)[0], "fold"] = None
    assert ranking.blended(perfect, some)["fold"].isna().sum() == 4
    with pytest.raises(ValueError, match="different folds"):
        ranking.blended(perfect, reversed_.assign(fold="fold 2/5"))
    with pytest.raises(ValueError, match="weight"):
        ranking.blended(perfect, reversed_, 1.5)
    with pytest.raises(ValueError, match="aligned"):
        ranking.blended(perfect, reversed_.iloc[1:])


def test_the_benchmark_scores_a_blend_of_two_forecasters_and_pairs_it_against_the_one_named(tmp_path, monkeypatch):
    from benchmarks import cudal1_forecast

    pool = _pool(tmp_path, monkeypatch)
    out = tmp_path / "out"
    common = ["--pool", str(pool), "--folds", "3", "--draws", "20", "--corpus", str(tmp_path), "--no-measured-rankers"]
    assert cudal1_forecast.main([*common, "--forecasters", "learned,random", "--blend", "learned+random:0.25",
                                 "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    rows = pd.DataFrame(result["rows"])
    assert "learned+random:0.25" in set(rows["forecaster"])
    assert "learned+random:0.25" in set(pd.DataFrame(result["versus"])["forecaster"])
    with pytest.raises(ValueError, match="no held-out forecasts of source"):
        cudal1_forecast.main([*common, "--forecasters", "learned", "--blend", "learned+source",
                              "--out", str(tmp_path / "x")])
    for bad in ("learned", "learned+random:2", "learned+random:x"):
        with pytest.raises(SystemExit):
            cudal1_forecast.parse(["--blend", bad])
