"""CUDA-L1's corpus as a pool: reading it, the published figures, building each variant, classifying, a pool run."""

import json
import math

import pandas as pd
import pytest

from kernelcast.kernels.formats.common import TaskFormatError
from kernelcast.kernels.formats.cudal1 import (VARIANTS, compare_with_kernelbench, diff_summary, read_corpus, submission,
                                    variants_named)
from kernelcast.tasks import cudal1_pool as pool
from kernelcast.tasks import cudal1_report as report
from tests.formats_for_tests import KB_RELU as RELU

CLAMP = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.clamp(x, min=0.0)
'''

GRAPHED = RELU.split("\n\nbatch_size")[0] + "\n"  # a file defining Model only: mapped onto ModelNew
WRONG = CLAMP.replace("torch.clamp(x, min=0.0)", "x * 2.0")


def _row(level, task, **fields):
    row = {"level_id": level, "task_id": task, "ref_code": RELU, "custom_code": CLAMP, "cuda_graph_code": GRAPHED,
           "cudnn_code": WRONG, "score_default": 2.0, "score_torch_compile_default": 1.6,
           "score_torch_compile_reduce_overhead": "n/a", "score_cuda_graph": 4.0, "score_cudnn": None}
    row.update(fields)
    return row


def _corpus(folder, rows, other=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "h100.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if other is not None:
        (folder / "a100.jsonl").write_text("\n".join(json.dumps(r) for r in other) + "\n")
    return folder


def test_the_corpus_is_read_with_every_gpus_scores_and_bad_scores_become_none(tmp_path):
    other = [_row(1, 19, score_default=1.5, custom_code="changed")]
    problems = read_corpus(_corpus(tmp_path / "c", [_row(1, 19), _row(2, 7, custom_code="None")], other))
    assert [p.key for p in problems] == ["l1-019", "l2-007"]
    first, second = problems
    assert first.op_name == "kb.cudal1-l1-019"
    assert first.scores["h100"]["score_torch_compile_reduce_overhead"] is None  # "n/a"
    assert first.scores["a100"]["score_default"] == 1.5 and first.scores["h20"]["score_default"] is None
    assert first.same_code["a100"]["custom_code"] is False and first.same_code["a100"]["cuda_graph_code"] is True
    assert second.codes["custom_code"] is None  # the string "None" is no code
    assert second.scores["a100"]["score_default"] is None  # no row there


def test_a_corpus_that_is_missing_or_malformed_is_refused_naming_the_file_and_line(tmp_path):
    with pytest.raises(TaskFormatError, match="h100.jsonl is missing"):
        read_corpus(tmp_path)
    (tmp_path / "h100.jsonl").write_text(json.dumps(_row(1, 1)) + "\n{\"task_id\": 2}\n")
    with pytest.raises(TaskFormatError, match=r"h100.jsonl:2: not a CUDA-L1 row"):
        read_corpus(tmp_path)


def test_published_speedups_over_eager_follow_from_the_scores_over_custom_code(tmp_path):
    problem = read_corpus(_corpus(tmp_path, [_row(1, 1)]))[0]
    assert VARIANTS["custom"].published_speedup(problem, "h100") == 2.0
    assert VARIANTS["cuda-graph"].published_speedup(problem, "h100") == pytest.approx(0.5)  # 2.0 / 4.0
    assert VARIANTS["compile-default"].published_speedup(problem, "h100") == pytest.approx(1.25)
    assert VARIANTS["cudnn"].published_speedup(problem, "h100") is None  # score_cudnn null
    assert VARIANTS["compile-reduce-overhead"].published_speedup(problem, "h100") is None  # not a number
    assert VARIANTS["null"].published_speedup(problem, "h100") is None
    assert VARIANTS["custom"].published_speedup(problem, "l40") is None  # no l40 file


def test_each_variant_becomes_a_kernelbench_submission_or_a_reason(tmp_path):
    rows = [_row(1, 1), _row(1, 2, custom_code=None, cuda_graph_code="def f():\n    return 1\n",
                             cudnn_code="def broken(:\n")]
    good, bad = read_corpus(_corpus(tmp_path, rows))
    assert submission(good, "custom") == (CLAMP, "")
    mapped, why = submission(good, "cuda-graph")
    assert why == "" and mapped.rstrip().endswith("ModelNew = Model")
    compiled, _ = submission(good, "compile-max-autotune")
    assert compiled.startswith(RELU.rstrip()) and "mode='max-autotune-no-cudagraphs'" in compiled
    assert submission(good, "null")[0] is None
    code, why = submission(bad, "custom")
    assert code is None and "published no custom_code" in why and "score_default, 2" in why
    assert "defines no class ModelNew or Model (classes: none)" in submission(bad, "cuda-graph")[1]
    assert "as published" in submission(bad, "cudnn")[1]


def test_variants_and_problems_are_chosen_by_name_with_clear_errors(tmp_path):
    assert variants_named("all") == list(VARIANTS)
    assert variants_named("null, custom,null") == ["null", "custom"]
    with pytest.raises(ValueError, match="unknown variant bogus"):
        variants_named("custom,bogus")
    problems = read_corpus(_corpus(tmp_path, [_row(1, 1), _row(2, 17), _row(3, 5)]))
    assert [p.key for p in pool.select(problems, "l2-017,3/5")] == ["l2-017", "l3-005"]
    assert [p.key for p in pool.select(problems, "kb.cudal1-l1-001")] == ["l1-001"]
    assert [p.key for p in pool.select(problems, levels="2,3")] == ["l2-017", "l3-005"]
    assert len(pool.select(problems, sample=2, seed=3)) == 2
    with pytest.raises(ValueError, match="unknown problem 'l2-099'"):
        pool.select(problems, "l2-099")
    with pytest.raises(ValueError, match="bad --levels"):
        pool.select(problems, levels="4")
    with pytest.raises(ValueError, match="unknown protocol gpumode"):
        pool.protocols_named("kernelcast,gpumode")


def test_a_problem_is_compared_with_todays_kernelbench_file(tmp_path):
    (tmp_path / "kb" / "level1").mkdir(parents=True)
    problems = read_corpus(_corpus(tmp_path / "c", [_row(1, 19), _row(1, 20), _row(1, 21)]))
    (tmp_path / "kb" / "level1" / "19_ReLU.py").write_text(RELU)
    (tmp_path / "kb" / "level1" / "20_ReLU.py").write_text(RELU.replace("dim = 64", "dim = 16384"))
    same, other, missing = (compare_with_kernelbench(p, tmp_path / "kb") for p in problems)
    assert (same.status, same.file) == ("identical", "level1/19_ReLU.py")
    assert other.status == "differs" and other.summary == "sizes: dim 64->16384"
    assert missing.status == "missing"
    assert diff_summary(RELU, RELU.replace("torch.relu(x)", "torch.relu(x) + 0")) == "other lines -1 +1 in Model"


def _side(published):
    return pd.DataFrame([{"op": "kb.x", "level": 1, "task_id": i, "variant": "custom", "candidate_id": f"c{i}",
                          "published_speedup_h100": theirs, "kernelbench_status": "identical"}
                         for i, theirs in enumerate(published)])


def _measured(rows):
    return pd.DataFrame([{"candidate_id": c, "op": "kb.x", "protocol": p, "status": s, "speedup": v, "error": e,
                          "precision": None, "checks": None} for c, p, s, v, e in rows])


def test_each_disagreement_gets_one_class():
    side = _side([2.0, 2.0, 2.0, 2.0, 2.0, 2.0, None])
    table = _measured([
        ("c0", "kernelcast", "ok", 2.2, ""), ("c0", "kernelbench", "ok", 1.0, ""),  # agrees / protocol
        ("c1", "kernelcast", "incorrect", None, "output 0 differs"),  # verdict
        ("c2", "kernelcast", "ok", 1.0, ""), ("c2", "kernelbench", "ok", 1.1, ""),  # genuine, both
        ("c3", "kernelcast", "ok", 1.0, ""), ("c3", "kernelbench", "ok", 5.0, ""),  # protocols disagree
        ("c4", "kernelcast", "ok", None, ""),  # untimed (an interpreter's ok)
        ("c5", "kernelcast", "ok", 9.0, ""),  # genuine: no other protocol to blame
        ("c6", "kernelcast", "ok", 1.3, "")])  # unpublished
    rows = report.classify(side, table, ["kernelcast", "kernelbench"]).set_index(["candidate_id", "protocol"])
    assert rows.loc[("c0", "kernelcast"), "agrees"] is True and rows.loc[("c0", "kernelcast"), "cls"] == ""
    assert rows.loc[("c0", "kernelbench"), "cls"] == "protocol"
    assert rows.loc[("c1", "kernelcast"), "cls"] == "verdict"
    assert rows.loc[("c2", "kernelcast"), "cls"] == "genuine" and rows.loc[("c2", "kernelbench"), "cls"] == "genuine"
    assert rows.loc[("c3", "kernelcast"), "cls"] == "protocols disagree"
    assert rows.loc[("c4", "kernelcast"), "cls"] == "untimed"
    assert rows.loc[("c5", "kernelcast"), "cls"] == "genuine"
    assert rows.loc[("c6", "kernelcast"), "cls"] == "unpublished"
    stats = report.summary(rows.reset_index())
    assert stats["kernelcast/custom"]["agree"] == 1 and stats["kernelcast/custom"]["both_ok"] == 4
    assert stats["kernelcast/custom"]["classes"] == {"verdict": 1, "genuine": 2, "protocols disagree": 1,
                                                     "untimed": 1}
    assert math.isclose(stats["kernelbench/custom"]["geomean_ours_over_theirs"], (0.5 * 0.55 * 2.5) ** (1 / 3),
                        rel_tol=1e-9)
    assert "| kb.x | custom | kernelcast | verdict | - | 2.000 | incorrect: output 0 differs |" in report.markdown(
        rows.reset_index(), stats, "h100")
    assert report.agrees(1.2, 1.0) and not report.agrees(1.21, 1.0) and not report.agrees(None, 1.0)


def test_a_pool_run_imports_builds_measures_resumably_and_reports(tmp_path, capsys):
    import benchmarks.cudal1_pool as bench

    corpus = _corpus(tmp_path / "corpus", [_row(1, 19, score_cudnn=1.0), _row(1, 20, ref_code="import torch\n")])
    (tmp_path / "kb" / "level1").mkdir(parents=True)
    (tmp_path / "kb" / "level1" / "19_ReLU.py").write_text(RELU)
    args = ["--corpus", str(corpus), "--kernelbench", str(tmp_path / "kb"), "--root", str(tmp_path / "pool"),
            "--out", str(tmp_path / "out"), "--protocols", "kernelcast", "--variants", "custom,cuda-graph,cudnn,null",
            "--mode", "interpreter", "--concurrency", "2"]
    assert bench.main([*args, "--timeline", str(tmp_path / "timeline.jsonl")]) == 0
    first = capsys.readouterr().out
    events = [json.loads(line) for line in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    assert {(e["task"], e["role"]) for e in events} == {("kb.cudal1-l1-019", r)
                                                       for r in ("reference", "custom", "cuda-graph", "cudnn", "null")}
    assert {"started", "checks", "ended"} <= {e["phase"] for e in events}
    assert bench.timeline_path("t/x.jsonl", "kernelbench", 2).name == "x-kernelbench.jsonl"
    assert "kb.cudal1-l1-020: not imported" in first and "2 problems, 4 candidates built" in first
    root = pool.protocol_root(tmp_path / "pool", "kernelcast")
    stored = root.read_measurements().set_index("candidate_id")
    side = pool.read_side_table(pool.DataRoot(str(tmp_path / "pool")))
    ids = side.set_index(["op", "variant"])["candidate_id"]
    ok, wrong = ids[("kb.cudal1-l1-019", "custom")], ids[("kb.cudal1-l1-019", "cudnn")]
    assert stored.loc[ok, "status"] == "ok", stored.loc[ok, "error"]
    assert stored.loc[wrong, "status"] == "incorrect"
    assert ids[("kb.cudal1-l1-019", "cuda-graph")] in stored.index
    assert side.set_index(["op", "variant"]).loc[("kb.cudal1-l1-020", "custom"), "import_error"] != ""
    assert side.loc[side["op"] == "kb.cudal1-l1-019", "kernelbench_status"].eq("identical").all()
    rows = pd.read_csv(tmp_path / "out" / "rows.csv").set_index("variant")
    assert rows.loc["custom", "cls"] == "untimed" and rows.loc["cudnn", "cls"] == "verdict"
    assert "| kernelcast/custom |" in (tmp_path / "out" / "report.md").read_text()
    count = len(root.read_measurements())
    assert bench.main(args) == 0  # resumed: nothing left to measure
    assert len(root.read_measurements()) == count and "0 measurements in" in capsys.readouterr().out


def test_problems_imported_ahead_into_a_tasks_folder_are_not_imported_again(tmp_path, monkeypatch, capsys):
    import benchmarks.cudal1_pool as bench
    from kernelcast.kernels.formats import TASKS_ENV

    monkeypatch.setenv(TASKS_ENV, str(tmp_path / "tasks"))
    corpus = _corpus(tmp_path / "corpus", [_row(1, 19), _row(1, 20, ref_code="import torch\n")])
    (tmp_path / "kb").mkdir()
    assert bench.main(["--corpus", str(corpus), "--kernelbench", str(tmp_path / "kb"), "--import-only"]) == 0
    said = capsys.readouterr().out
    assert f"1 of 2 problems imported into {tmp_path / 'tasks'}" in said and "not imported: kb.cudal1-l1-020" in said
    assert (tmp_path / "tasks" / "kb.cudal1-l1-019" / "reference.py").read_text() == RELU
    # a later run finds it installed (the same reference) and loads it instead of importing it again
    calls = []
    monkeypatch.setattr(pool.kernelbench, "import_task", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(
        AssertionError("imported again")))
    [prepared] = pool.prepare(read_corpus(corpus)[:1], ["custom"], tmp_path / "kb")
    assert prepared.op is not None and prepared.op.name == "kb.cudal1-l1-019" and not calls
    assert bench.main(["--corpus", str(corpus)]) == 2  # measuring needs --root and --out
    assert "--root and --out are required" in capsys.readouterr().err


def test_shards_split_the_problems_and_their_side_rows_all_land(tmp_path):
    problems = read_corpus(_corpus(tmp_path / "c", [_row(1, t) for t in range(1, 8)]))
    parts = [pool.shard(problems, f"{i}/3") for i in range(3)]
    assert sorted(p.key for part in parts for p in part) == sorted(p.key for p in problems)
    assert pool.shard(problems, None) == problems
    with pytest.raises(ValueError, match="bad --shard '3/3'"):
        pool.shard(problems, "3/3")
    top = pool.DataRoot(str(tmp_path / "pool"))
    for part in parts:  # each shard merges its rows into the one table
        pool.write_side_table(top, [{"op": p.op_name, "level": p.level, "task_id": p.task_id, "variant": "custom"}
                                    for p in part])
    assert sorted(pool.read_side_table(top)["task_id"]) == list(range(1, 8))


def test_a_report_reads_the_published_figures_again_from_a_fuller_corpus(tmp_path):
    import benchmarks.cudal1_pool as bench

    (tmp_path / "kb").mkdir()
    common = ["--kernelbench", str(tmp_path / "kb"), "--root", str(tmp_path / "pool"), "--out", str(tmp_path / "out"),
              "--protocols", "kernelcast", "--variants", "custom,null", "--mode", "interpreter", "--concurrency", "1"]
    assert bench.main(["--corpus", str(_corpus(tmp_path / "h100only", [_row(1, 19)])), *common]) == 0
    top = pool.DataRoot(str(tmp_path / "pool"))
    assert pool.read_side_table(top)["published_speedup_a100"].isna().all()
    fuller = _corpus(tmp_path / "full", [_row(1, 19)], other=[_row(1, 19, score_default=1.7)])
    assert bench.main(["--corpus", str(fuller), *common, "--report-only", "--gpu-type", "interpreter"]) == 0
    side = pool.read_side_table(top).set_index("variant")
    assert side.loc["custom", "published_speedup_a100"] == 1.7 and side.loc["custom", "same_code_a100"]
    assert pd.isna(side.loc["null", "published_speedup_a100"])  # nothing of theirs to compare the null with
    assert len(pool.protocol_root(tmp_path / "pool", "kernelcast").read_measurements()) == 3  # untouched
    # a report from a corpus with the H100's file alone keeps the other GPUs' figures it cannot read again
    assert bench.main(["--corpus", str(tmp_path / "h100only"), *common, "--report-only", "--gpu-type",
                       "interpreter"]) == 0
    side = pool.read_side_table(top).set_index("variant")
    assert side.loc["custom", "published_speedup_a100"] == 1.7 and side.loc["custom", "same_code_a100"]


def test_a_shard_compiles_and_times_on_its_own_share_of_the_cores():
    import os

    import benchmarks.cudal1_pool as bench

    assert bench.shard_cpus(None) is None
    assert set(bench.shard_cpus("0/1")) == os.sched_getaffinity(0)
    try:
        first, second = bench.shard_cpus("0/2"), bench.shard_cpus("1/2")
    except ValueError:  # fewer than two whole cores here: nothing to share out
        pytest.skip("this machine has fewer than two whole cores")
    assert first and second and not set(first) & set(second)


def test_a_free_form_search_on_a_cudal1_problem_is_rooted_at_its_measured_kernels_not_its_reference_or_null():
    """generator_roots on data/pools/cudal1: CUDA-L1's kernels of the problem, best first, as measured on the H100."""
    from pathlib import Path

    import pandas as pd

    from kernelcast.kernels.null import NULL_MARK
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.generators import template_roots

    pool = str(Path(__file__).resolve().parents[1] / "data" / "pools" / "cudal1" / "kernelcast")
    op = "kb.cudal1-l2-017"
    roots = template_roots(pool, op, "h100")
    candidates = DataRoot(pool).read_candidates(op=op).set_index("candidate_id")
    measured = DataRoot(pool).read_measurements(op=op, gpu_type="h100").set_index("candidate_id")
    assert len(roots) == 3
    assert all(c.origin == "import" and NULL_MARK not in c.source for c, _ in roots)
    assert [s for _, s in roots] == sorted((s for _, s in roots), reverse=True)
    assert all(measured.loc[c.candidate_id, "speedup"] == pytest.approx(s) for c, s in roots)
    reference = candidates[candidates["origin"] == "seed"].index
    assert not set(reference) & {c.candidate_id for c, _ in roots} and len(pd.Index(reference)) == 1


def test_headroom_lists_level_2_and_3_problems_whose_fastest_kernel_ran_1_3x_eager_or_more():
    import pandas as pd

    from kernelcast.tasks.cudal1_report import headroom

    def row(op, level, variant, ours, status="ok", protocol="kernelcast"):
        return {"op": op, "level": level, "variant": variant, "ours": ours, "theirs": 2.0, "status": status,
                "protocol": protocol}

    rows = pd.DataFrame([row("a", 2, "custom", 1.8), row("a", 2, "cudnn", 1.1),
                         row("b", 3, "cuda-graph", 1.31), row("b", 3, "custom", 5.0, status="incorrect"),
                         row("c", 1, "custom", 9.0),  # level 1: not a search target here
                         row("d", 2, "null", 1.5),  # the null's speed is noise, not headroom
                         row("e", 2, "custom", 1.29), row("f", 3, "custom", 3.0, protocol="kernelbench")])
    room = headroom(rows)
    assert list(room["op"]) == ["a", "b"] and list(room["variant"]) == ["custom", "cuda-graph"]
    assert list(room["ours"]) == [1.8, 1.31]
    assert list(headroom(rows, protocol="kernelbench")["op"]) == ["f"]


def test_runs_of_one_pool_are_compared_verdict_by_verdict_and_speedup_by_speedup(tmp_path, capsys):
    """benchmarks/pool_runs_compare.py: a verdict that flipped, the spread of speedups ok in both runs and of the
    references' runtimes; a candidate one run never measured is not counted as changed."""
    from benchmarks import pool_runs_compare as compare
    from kernelcast.kernels.records import Candidate, Measurement
    from kernelcast.storage.dataset import DataRoot

    made = {name: Candidate(op="kb.x", backend="torch", source=f"# {name}\n", origin="seed" if name == "r" else "import")
            for name in ("r", "c1", "c2", "c3", "c4")}
    slowed = "anchored: a; anchored beside a slowed reference: a 150.0/110.0 us"

    def run(name, rows, checks=None):
        root = DataRoot(str(tmp_path / name / "kernelcast"))
        root.write_candidates([made[c] for c, *_ in rows])
        # c4: ok with no reference figure (its op's reference failed in that run): no speedup, and no crash
        root.write_measurements([Measurement(candidate_id=made[c].candidate_id, op=op, gpu_type="h200", status=status,
                                             mode="gpu", case_names=("a",),
                                             runtime_us_median=(t,) if status == "ok" else (),
                                             reference_us_median=(ref,) if status == "ok" and ref else (),
                                             speedup=ref / t if status == "ok" and ref else None,
                                             checks=(checks or {}).get(
                                                 c, "anchored: a" if c == "c3" else "anchored: none"))
                                 for c, op, status, t, ref in rows])
        return f"{name}={tmp_path / name}"

    first = run("one", [("r", "kb.x", "ok", 100.0, 100.0), ("c1", "kb.x", "incorrect", 0, 0),
                        ("c2", "kb.x", "ok", 50.0, 100.0), ("c3", "kb.x", "ok", 25.0, 100.0),
                        ("c4", "kb.x", "ok", 40.0, None)])
    second = run("two", [("r", "kb.x", "ok", 110.0, 110.0), ("c1", "kb.x", "ok", 55.0, 110.0),
                         ("c2", "kb.x", "ok", 55.0, 110.0), ("c3", "kb.x", "ok", 30.0, 110.0)], {"c3": slowed})
    assert compare.main([first, second, "--markdown", str(tmp_path / "out.md")]) == 0
    wide, (pair,) = compare.compare({n: compare.read_run(str(tmp_path / n), "kernelcast") for n in ("one", "two")},
                                    {"kb.x"})
    assert (pair["in_both"], pair["verdicts_changed"], pair["failed_then_ok"], pair["ok_then_failed"]) == (3, 1, 1, 0)
    assert pair["speedup"]["n"] == 2 and pair["speedup"]["median_abs_dev"] == pytest.approx((1 - 110 / 120) / 2)
    assert pair["reference_runtime"]["median_abs_dev"] == pytest.approx(0.1)
    assert "| one -> two | 3 | 1 | 1 | 0 |" in (tmp_path / "out.md").read_text()
    assert compare.main([first, second, "--runtimes", "--markdown", str(tmp_path / "out.md")]) == 0
    table = (tmp_path / "out.md").read_text()
    assert f"| kb.x | {made['c2'].candidate_id} | 50.0 / 100.0 | 55.0 / 110.0 |" in table
    assert f"| kb.x | {made['c3'].candidate_id} | 25.0 / 100.0 a | 30.0 / 110.0 a s |" in table
    assert f"| kb.x | {made['c4'].candidate_id} | 40.0 / nan | - |" in table
    assert compare.main([first]) == 2 and "two or more runs" in capsys.readouterr().err


def test_pool_runs_compare_sets_the_rules_for_a_reference_measured_in_several_processes_side_by_side(tmp_path):
    """``--processes``: per reference case, the figure each rule would store in each run that measured it in several
    processes (from the row's per-process figures), and the stored runtime's range where runs measured in one."""
    from benchmarks import pool_runs_compare as compare
    from kernelcast.kernels.records import Candidate, Measurement
    from kernelcast.storage.dataset import DataRoot

    ref = Candidate(op="kb.x", backend="torch", source="# r\n", origin="seed")

    def run(name, us, processes=None):
        root = DataRoot(str(tmp_path / name / "kernelcast"))
        root.write_candidates([ref])
        checks = "anchored: none; host-sensitive: a" + (
            f"; reference processes: {len(processes)} of {len(processes)} ok | a "
            + "/".join(f"{x:.1f}" for x in processes) + " us (host " + "/".join("1.0" for _ in processes) + " us)"
            if processes else "")
        root.write_measurements([Measurement(candidate_id=ref.candidate_id, op="kb.x", gpu_type="h200", status="ok",
                                             mode="gpu", case_names=("a",), runtime_us_median=(us,),
                                             reference_us_median=(us,), speedup=1.0, checks=checks)])
        return name, compare.read_run(str(tmp_path / name), "kernelcast")

    runs = dict([run("one", 40.0), run("two", 110.0), run("three", 40.0, [40.0, 90.0, 120.0]),
                 run("four", 100.0, [100.0, 42.0, 80.0])])
    found = compare.reference_processes(runs)
    rules = found["kb.x", "a"]
    assert rules["first process"] == {"three": 40.0, "four": 100.0}
    assert rules["median process"] == {"three": 90.0, "four": 80.0}
    assert rules["fastest process"] == {"three": 40.0, "four": 42.0}
    assert rules["one process"] == {"one": 40.0, "two": 110.0}
    lines = "\n".join(compare.processes_table(found))
    assert "| fastest process | 1 | 1.050x | 1 | 1 | 1.05x |" in lines
    assert "| one process | 1 | 2.750x | 0 | 0 | 2.75x |" in lines
    # a kernel timed alone: its speedup as stored where the reference took one process, over the fastest where several
    kernel = Candidate(op="kb.x", backend="torch", source="# k\n", origin="import")
    for name, ref_us in (("one", 40.0), ("two", 110.0), ("three", 40.0), ("four", 42.0)):
        root = DataRoot(str(tmp_path / name / "kernelcast"))
        root.write_candidates([kernel])
        root.write_measurements([Measurement(candidate_id=kernel.candidate_id, op="kb.x", gpu_type="h200",
                                             status="ok", mode="gpu", case_names=("a",), runtime_us_median=(20.0,),
                                             reference_us_median=(ref_us,), speedup=ref_us / 20.0,
                                             checks="anchored: none")])
        runs[name] = compare.read_run(str(tmp_path / name), "kernelcast")
    wide, _ = compare.compare(runs, set())
    lines = "\n".join(compare.alone_speedups(wide, compare.reference_processes(runs), list(runs)))
    assert f"| kb.x | {kernel.candidate_id} | 2.000 | 5.500 | 2.000 | 2.100 | 2.75x | 1.05x |" in lines
    assert "median range 2.750x as stored in one process, 1.050x over the fastest process" in lines
    # no reference measured in several processes: nothing to set side by side
    assert compare.reference_processes({k: runs[k] for k in ("one", "two")}) == {}


def test_anchored_pairs_counts_the_pairs_beside_a_slowed_reference_and_the_ranges_with_and_without_them(tmp_path,
                                                                                                       capsys):
    import gzip
    import json

    from benchmarks import anchored_pairs

    def run(name, pairs, gz=False):
        lines = []
        for task, here, stored, ratio, host in pairs:
            lines.append({"task": task, "role": "custom", "candidate": "c", "phase": "timed",
                          "detail": {"case": "a", "us": 10.0, "host_us": host, "flush_us": 90.0, "reference_us": here}})
            lines.append({"task": task, "role": "custom", "candidate": "c", "phase": "anchored",
                          "detail": {"case": "a", "ratio": ratio, "reference_us_here": here, "reference_us": stored}})
        lines.append({"task": "kb.x", "role": "reference", "candidate": "r", "phase": "timed", "detail": {"case": "a"}})
        path = tmp_path / (name + (".jsonl.gz" if gz else ".jsonl"))
        text = "\n".join(json.dumps(x) for x in lines) + "\n"
        path.write_bytes(gzip.compress(text.encode())) if gz else path.write_text(text)
        return str(path)

    # kb.x beside its reference at its stored runtime twice (speedups 2.0 and 2.2), then slowed 3x (speedup 4.0)
    runs = [run("one", [("kb.x", 20.0, 20.0, 0.5, 40.0)]), run("two", [("kb.x", 21.0, 20.0, 1 / 2.2, 41.0)], gz=True),
            run("three", [("kb.x", 60.0, 20.0, 0.25, 80.0)])]
    s = anchored_pairs.summary([anchored_pairs.anchored_figures(p) for p in runs], 1.25)
    assert (s["figures"], s["slowed"], s["cases_in_two_runs"]) == (3, 1, 1)
    assert s["median_range_all"] == pytest.approx(2.0) and s["median_range_unslowed"] == pytest.approx(1.1)
    assert s["host_us"] == {"kb.x": {"within_1.5x": [40, 41], "past_1.5x": [80]}}
    assert anchored_pairs.main(runs) == 0
    assert "3 anchored figures in 3 runs; beside a reference past 1.25x its stored runtime: 1" in capsys.readouterr().out
    assert anchored_pairs.main([runs[0], str(tmp_path / "none.jsonl")]) == 2
    assert "no timeline at" in capsys.readouterr().err
    assert anchored_pairs.main(runs + ["--slowed", "0.9"]) == 2
