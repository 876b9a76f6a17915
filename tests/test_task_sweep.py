"""The task sweep end to end on tiny tasks, under Triton's interpreter: import, measure, resume, report; through the
benchmark script (torch and triton alone) and through ``kernelcast sweep``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.formats_for_tests import KB_ROW_SUM, write_gpumode, write_kernelbench
from tests.test_real_size import GPUMODE_ADD_INTO

REPO = Path(__file__).resolve().parents[1]

SMALL_SPECS = '''
tests:
  - {"size": 16, "seed": 1}
benchmarks:
  - {"size": 64, "seed": 2}
'''

# Packages the measuring machine does not have: the sweep must not need them.
ABSENT = ("prefect", "ray", "mlflow", "s3fs", "httpx", "jinja2", "yaml", "sklearn", "fsspec", "pydantic", "boto3",
          "requests")

RUN = f'''
import sys


class Absent:
    """Makes the packages a measuring machine lacks unimportable here."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed on the measuring machine)")
        return None


sys.meta_path.insert(0, Absent())
sys.argv = ["task_sweep.py"] + sys.argv[1:]
sys.path.insert(0, {str(REPO)!r})
import runpy
try:
    runpy.run_path({str(REPO / "benchmarks" / "task_sweep.py")!r}, run_name="__main__")
except SystemExit as exit:
    code = exit.code
print("IMPORTED", sorted({{m.split(".")[0] for m in sys.modules}} & set({ABSENT!r})))
sys.exit(code)
'''


def _sweep(tasks: Path, out: Path, *extra: str) -> tuple[str, list[dict]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, "--tasks", str(tasks), "--out", str(out), "--mode",
                           "interpreter", "--concurrency", "2", *extra], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    return done.stdout, rows


def _tasks(folder: Path) -> Path:
    write_kernelbench(folder / "kernelbench" / "level1", reference=KB_ROW_SUM.replace("batch_size = 64", "batch_size = 3")
                      .replace("dim = 4096", "dim = 40"))
    (folder / "kernelbench" / "level1" / "broken.py").write_text(
        "import torch\n\nclass Model:\n    pass\n\ndef get_inputs():\n    return [3.0]\n\ndef get_init_inputs():\n"
        "    return []\n")
    write_gpumode(folder / "gpumode" / "add_into_py", reference=GPUMODE_ADD_INTO, specs=SMALL_SPECS)
    return folder


def test_the_sweep_imports_measures_resumes_and_reports(tmp_path):
    tasks = _tasks(tmp_path / "tasks")
    out = tmp_path / "out"
    stdout, rows = _sweep(tasks, out)
    by_task = {r["task"]: r for r in rows}
    assert set(by_task) == {"kernelbench/level1/row_sum.py", "kernelbench/level1/broken.py", "gpumode/add_into_py"}
    broken = by_task["kernelbench/level1/broken.py"]
    assert not broken["imported"] and "Model is not a torch.nn.Module subclass" in broken["import_error"]
    for key in ("kernelbench/level1/row_sum.py", "gpumode/add_into_py"):
        r = by_task[key]
        assert r["imported"] and r["measured"], r
        assert r["reference_status"] == r["null_status"] == "ok"
        assert r["null_speedup"] is None  # the interpreter times nothing
    assert by_task["kernelbench/level1/row_sum.py"]["op"] == "kb.l1_row_sum"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fit"] == summary["measured"] == 2 and summary["measured_share"] == 1.0
    assert summary["not_imported"] == 1 and summary["out_of_memory_verdicts"] == 0
    assert "| gpumode/add_into_py | yes | ok |" in (out / "sweep.md").read_text()
    # the KernelBench task's cases are of known size: its children's checks shared the lock; GPU MODE's inputs only
    # its own code makes, so its children held the lock alone throughout
    kb, gm = by_task["kernelbench/level1/row_sum.py"], by_task["gpumode/add_into_py"]
    assert kb["reference_checks_shared"] is kb["null_checks_shared"] is True
    assert gm["reference_checks_shared"] is gm["null_checks_shared"] is False
    assert summary["checks_shared"] == 2 and summary["checks_alone"] == 2
    assert "IMPORTED []" in stdout  # torch and triton were enough: PyYAML, Prefect, Ray, MLflow... stayed absent

    stdout, again = _sweep(tasks, out)  # resumed: nothing measured twice
    assert "3 tasks, 3 done before, 0 to go" in stdout and len(again) == 3


def test_the_sweep_stops_starting_chunks_after_its_time_and_goes_on_next_call(tmp_path):
    tasks = _tasks(tmp_path / "tasks")
    out = tmp_path / "out"
    stdout, rows = _sweep(tasks, out, "--chunk", "1", "--max-minutes", "0")
    # every task is imported first: the one that cannot be has its row; nothing was measured
    assert "stopping after 0 minutes" in stdout and [r["task"] for r in rows] == ["kernelbench/level1/broken.py"]
    stdout, rows = _sweep(tasks, out, "--chunk", "1", "--checks-alone")
    assert len(rows) == 3 and len({r["task"] for r in rows}) == 3
    # told so, every child held the lock alone, the KernelBench task's too
    measured = [r for r in rows if r["imported"]]
    assert len(measured) == 2 and all(r[f"{role}_checks_shared"] is False for r in measured
                                      for role in ("reference", "null"))
    assert json.loads((out / "summary.json").read_text())["checks_shared"] == 0


def test_discover_finds_the_same_tasks_from_a_relative_folder(tmp_path, monkeypatch):
    from kernelcast.kernels.harness.sweep import discover

    root = _tasks(tmp_path / "tasks")
    (root / "kernelbench" / ".hidden").mkdir()
    (root / "kernelbench" / ".hidden" / "copy.py").write_text((root / "kernelbench" / "level1" / "broken.py").read_text())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # "../tasks": a path that starts with a dot-dot part
    absolute, relative = discover(root), discover(Path("..") / "tasks")
    assert [t.key for t in relative] == [t.key for t in absolute]
    assert {t.format for t in absolute} == {"kernelbench", "gpumode"} and len(absolute) == 3
    assert not any(".hidden" in t.key for t in absolute)


def test_kernelcast_sweep_takes_the_folder_and_resumes_what_the_script_began(tmp_path):
    tasks = _tasks(tmp_path / "tasks")
    out = tmp_path / "out"
    _sweep(tasks, out, "--match", "row_sum")  # the script sweeps one task; the command goes on from there
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", "sweep", str(tasks), "--out", str(out), "--mode",
                           "interpreter", "--concurrency", "2"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "3 tasks, 1 done before, 2 to go" in done.stdout
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert sorted(r["task"] for r in rows) == sorted({r["task"] for r in rows}) and len(rows) == 3
    assert json.loads((out / "summary.json").read_text())["measured"] == 2


def test_kernelcast_sweep_of_a_missing_folder_says_so(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", "sweep", str(tmp_path / "nowhere"), "--out",
                           str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"no task folder at {tmp_path / 'nowhere'}" in done.stderr


def test_the_table_names_an_import_refusals_reason_not_the_staging_folder():
    from kernelcast.kernels.harness.sweep_report import reason

    staged = ("TaskFormatError: /tmp/kernelcast-gpumode-i_2yhj0l/mixed-mla/reference.py failed to import: "
              "ModuleNotFoundError: No module named 'aiter'")
    assert reason(staged) == "reference.py failed to import: ModuleNotFoundError: No module named 'aiter'"
    assert reason("case 7168x1-fp32: AssertionError: boom") == "case 7168x1-fp32: AssertionError: boom"


def test_the_sweep_measures_the_smallest_tasks_first_and_journals_each_childs_phases(tmp_path):
    tasks = _tasks(tmp_path / "tasks")
    out = tmp_path / "out"
    stdout, rows = _sweep(tasks, out, "--chunk", "1")
    measured = [r["task"] for r in rows if r["imported"]]
    # the KernelBench problem's size is known from the meta device; the GPU MODE task's inputs only its own
    # code makes (unknown size): last
    assert measured == ["kernelbench/level1/row_sum.py", "gpumode/add_into_py"]
    assert f"  {measured[0]} reference: ok after" in stdout
    events = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    for task in measured:
        phases = {e["phase"] for e in events if e["task"] == task}
        assert {"started", "finished"} <= phases or {"started"} <= phases, phases
    assert {e["role"] for e in events if e["task"]} == {"reference", "null"}


def test_two_shards_sweep_every_task_once_and_say_their_anchor(tmp_path):
    tasks = _tasks(tmp_path / "tasks")
    keys = []
    for index in (0, 1):
        out = tmp_path / f"shard{index}"
        stdout, rows = _sweep(tasks, out, "--shard", f"{index}/2", "--anchor", "all")
        keys += [r["task"] for r in rows]
        assert json.loads((out / "summary.json").read_text())["anchor"] == "all"
    assert sorted(keys) == sorted({"kernelbench/level1/row_sum.py", "kernelbench/level1/broken.py",
                                   "gpumode/add_into_py"})


def test_shards_resuming_from_the_same_rows_split_what_is_left(tmp_path):
    import shutil

    tasks = _tasks(tmp_path / "tasks")
    first = tmp_path / "first"
    _sweep(tasks, first, "--match", "broken")  # one task done; the rest would all fall in shard 0 of the full list
    new = {}
    for index in (0, 1):
        out = tmp_path / f"shard{index}"
        out.mkdir()
        shutil.copy(first / "sweep.jsonl", out / "sweep.jsonl")
        stdout, rows = _sweep(tasks, out, "--shard", f"{index}/2", "--shard-pending")
        new[index] = [r["task"] for r in rows[1:]]
        assert "1 tasks, 0 done before, 1 to go" in stdout, stdout[-1500:]
    assert sorted(new[0] + new[1]) == ["gpumode/add_into_py", "kernelbench/level1/row_sum.py"]


def test_a_malformed_shard_is_refused_by_name(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, "--tasks", str(_tasks(tmp_path / "tasks")), "--out",
                           str(tmp_path / "out"), "--shard", "2/2"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "--shard '2/2'" in done.stdout + done.stderr


def test_tasks_the_device_cannot_run_come_first_then_the_smallest():
    from types import SimpleNamespace

    from kernelcast.kernels.harness.sweep import order

    fp4 = {"compute_capability": "10.0", "on_cpu": False, "why": "FP4 matrix multiplies need compute capability 10.0"}
    items = [(300.0, "big", SimpleNamespace(requires=None), 0.1), (10.0, "small", SimpleNamespace(requires=None), 0.1),
             (float("inf"), "fp4", SimpleNamespace(requires=fp4), 0.1), (50.0, "mid", SimpleNamespace(requires=None), 0.1)]
    assert [i[1] for i in order(items, (9, 0))] == ["fp4", "small", "mid", "big"]  # an H100: refused at once
    assert [i[1] for i in order(items, (10, 0))] == ["small", "mid", "big", "fp4"]  # a B200 runs it, by its size
    assert [i[1] for i in order(items, None)][0] == "fp4"  # the interpreter cannot run it either


def test_tasks_imported_by_worker_processes_get_the_same_verdicts(tmp_path):
    tasks = _tasks(tmp_path / "tasks")
    stdout, rows = _sweep(tasks, tmp_path / "out", "--import-workers", "2")
    by_task = {r["task"]: r for r in rows}
    assert "Model is not a torch.nn.Module subclass" in by_task["kernelbench/level1/broken.py"]["import_error"]
    for key in ("kernelbench/level1/row_sum.py", "gpumode/add_into_py"):
        assert by_task[key]["imported"] and by_task[key]["measured"], by_task[key]
    assert by_task["kernelbench/level1/row_sum.py"]["op"] == "kb.l1_row_sum"
    assert "IMPORTED []" in stdout  # the workers needed no more than torch and triton either


def test_tasks_of_unknown_size_are_measured_in_small_chunks_of_their_own():
    from kernelcast.kernels.harness.sweep import chunks

    inf = float("inf")
    items = [(inf, "nvfp4"), (1.0, "a"), (2.0, "b"), (3.0, "c"), (4.0, "d"), (5.0, "e"), (inf, "moe"), (inf, "eigh"),
             (inf, "vectoradd"), (inf, "qr")]
    got = [(first, [name for _, name in chunk]) for first, chunk in chunks(items, 4)]
    # the refusal first (sorted there by the sweep), then known sizes four at a time, then the rest one at a time
    assert got == [(0, ["nvfp4"]), (1, ["a", "b", "c", "d"]), (5, ["e"]), (6, ["moe"]), (7, ["eigh"]),
                   (8, ["vectoradd"]), (9, ["qr"])]
    assert [name for _, c in chunks(items, 30) for _, name in c] == [name for _, name in items]
    assert [len(c) for _, c in chunks(items, 30)] == [1, 5, 4]  # 30 // 4 = 7 at a time: the last four together


class _Worker:
    """Stands in for the measurement worker in the sweep's own bookkeeping: every candidate asked for comes back
    ok at 10 us a case (the reference first, as the worker orders them), and what was asked is recorded."""

    def __init__(self):
        self.reference_us, self.reference_host_bound, self.timeline, self.asked = {}, {}, [], []

    def measure(self, cands):
        from kernelcast.kernels.records import Measurement

        for c in cands:
            self.asked.append(c.candidate_id)
            self.timeline.append((c.candidate_id, 1, "timed", 0.0, None))
            if c.origin == "seed":
                self.reference_host_bound[c.op] = ("1x8",)
            ref = self.reference_us.get(c.op)
            yield Measurement(candidate_id=c.candidate_id, op=c.op, gpu_type="h100", status="ok", mode="gpu",
                              runtime_us_median=(10.0,), speedup=(ref[0] / 10.0) if ref else None)


def test_a_reference_measured_before_its_null_is_kept_and_a_later_call_times_only_the_null(tmp_path):
    from kernelcast.kernels.harness.sweep import Task, _Kept, _measure_chunks
    from kernelcast.kernels.null import null_candidate
    from kernelcast.kernels.ops import get_operation

    op = get_operation("softmax")
    task = Task("kernelbench/level1/softmax.py", "kernelbench", tmp_path / "softmax.py", "softmax")
    reference, null = op.seed_candidates()[0], null_candidate(op)
    names = {reference.candidate_id: (task.key, "reference"), null.candidate_id: (task.key, "null")}
    rows = []

    def sweep_once(device: str) -> _Worker:
        worker = _Worker()
        _measure_chunks(worker, [(1.0, task, op, 0.1)], names, 8, None, None, "gpu", rows.append,
                        _Kept(tmp_path / "references.jsonl", device))
        return worker

    first = sweep_once("NVIDIA H100 80GB HBM3")
    assert first.asked == [reference.candidate_id, null.candidate_id]
    (kept,) = [json.loads(line) for line in (tmp_path / "references.jsonl").read_text().splitlines()]
    assert kept["task"] == task.key and kept["us"] == [10.0] and kept["host_sensitive_cases"] == ["1x8"]
    assert "reference_measured_in" not in rows[-1]
    # the call was cut before the null: the next one on the same device measures the null alone, against it
    later = sweep_once("NVIDIA H100 80GB HBM3")
    assert later.asked == [null.candidate_id]
    assert later.reference_us[op.name] == (10.0,) and later.reference_host_bound[op.name] == ("1x8",)
    assert rows[-1]["reference_status"] == "ok" and rows[-1]["reference_us"] == [10.0]
    assert rows[-1]["null_speedup"] == 1.0 and "an earlier call" in rows[-1]["reference_measured_in"]
    assert rows[-1]["reference_timing_windows"] == 1 and rows[-1]["null_timing_windows"] == 1
    # on another device the reference is measured again
    assert sweep_once("NVIDIA H200").asked == [reference.candidate_id, null.candidate_id]


def test_the_lock_breakdown_splits_the_checks_by_seed_and_gives_the_verifications_share():
    from kernelcast.kernels.harness.sweep_report import lock_breakdown

    def child(cid, first_check, other_check, timed, verify):
        t = [0.0]

        def at(phase, dt, detail=None):
            t[0] += dt
            return (cid, 1, phase, t[0], detail)
        return [at("started", 0), at("ahead_done", 1.0), at("locked", 0.5), at("checks", 0.1),
                at("check", 0.0, {"case": "a", "seed": 1}), at("first_inputs", 0.01),
                at("calling", 0.04, {"case": "a"}), at("call", 0.05, {"case": "a", "seconds": 0.05}),
                at("check", first_check - 0.1, {"case": "a", "seed": 2}),
                at("check", other_check, {"case": "a", "seed": 3}), at("timing", other_check, "a"),
                at("timed", timed, {"case": "a"}), at("traced", 0.1, {"case": "a"}),
                at("verified", verify, {"case": "a"}),
                at("timing", 0.05, "b"), at("timed", timed, {"case": "b"}), at("recheck", 0.02, {"case": "a"}),
                at("releasing", 0.01), at("released", 0.01)]

    timeline = child("x", 0.30, 0.10, 0.2, 0.4) + child("y", 0.50, 0.20, 0.2, 0.6)
    got = lock_breakdown(sorted(timeline, key=lambda e: e[3]))  # the two children's marks interleaved in time
    # the first seed's check runs from its mark to the next check, past the marks of its inputs and its call
    assert got["check, first seed"]["total_s"] == 0.8 and got["check, first seed"]["median_s"] == 0.4
    assert got["check, other seeds"]["total_s"] == 0.6  # seeds 2 and 3 of each child
    assert got["verification: trace"]["total_s"] == 0.2  # 0.1 a child
    assert got["verification: unseen inputs"]["total_s"] == 1.0
    assert got["checks"]["total_s"] == 1.4  # the three checks of each, from "checks" to the first "timing"
    assert got["timed calls"]["total_s"] == 0.8
    assert got["between windows"]["total_s"] == 1.3  # 0.1 + 0.4 + 0.05 and 0.1 + 0.6 + 0.05
    # the comparison after the first case's first call: until the next check's mark
    assert got["comparison, first case"]["total_s"] == 0.6 and "comparison, later cases" not in got


def test_the_lock_breakdown_tells_the_first_cases_comparison_from_the_later_cases():
    """A fresh child's first comparison pays for the first launches of its kernels; the later cases' do not."""
    from kernelcast.kernels.harness.sweep_report import lock_breakdown

    timeline, t = [], 0.0
    for cid, cold in (("x", 0.2), ("y", 0.25)):
        for case, took in (("a", cold), ("b", 0.005), ("c", 0.01)):
            for phase, dt in (("check", 0.0), ("calling", 0.01), ("call", 0.002)):
                t += dt
                timeline.append((cid, 1, phase, t, {"case": case, "seed": 1}))
            t += took
        timeline.append((cid, 1, "timing", t, "a"))
    got = lock_breakdown(timeline)
    assert got["comparison, first case"]["total_s"] == 0.45 and got["comparison, first case"]["children"] == 2
    assert got["comparison, later cases"]["total_s"] == 0.03 and got["comparison, later cases"]["median_s"] == 0.015


def test_a_rows_anchored_cases_carry_both_estimates_of_each_pair():
    from kernelcast.kernels.harness.sweep import anchored_fields

    timeline = [("null", 1, "timed", 1.0, {"case": "a"}),
                ("null", 1, "anchored", 2.0, {"case": "a", "ratio": 1.00012, "ratio_of_medians": 1.13738}),
                ("other", 1, "anchored", 2.5, {"case": "a", "ratio": 2.0, "ratio_of_medians": 2.0}),
                ("null", 1, "anchored", 3.0, {"case": "b", "ratio": 0.99}),  # an older timeline: one estimate
                ("null", 1, "released", 4.0, None)]
    assert anchored_fields(timeline, "null") == {"null_anchored": {"a": 1.0001, "b": 0.99},
                                                 "null_anchored_ratio_of_medians": {"a": 1.1374, "b": 0.99}}
    assert anchored_fields(timeline, "nobody") == {"null_anchored": {}, "null_anchored_ratio_of_medians": {}}


def test_the_summary_scores_the_nulls_under_both_estimators_of_their_pairs():
    """A null whose paired case came out 1.00 by the per-round ratios and 1.137 by the ratio of medians: within 2%
    as measured, outside by the other estimator; a row of an earlier sweep (no case names) leaves that figure out."""
    from kernelcast.kernels.harness.sweep_report import null_speedup_by_ratio_of_medians, summarize

    def row(task, used, other, null_us):
        return {"task": task, "imported": True, "reference_status": "ok", "null_status": "ok", "fits": True,
                "measured": True, "import_s": 1.0, "wall_s": 2.0, "chunk": "c", "case_names": ["small", "big"],
                "reference_us": [100.0, 6709.0], "null_us": null_us,
                "null_speedup": math.sqrt(100.0 / null_us[0] * 6709.0 / null_us[1]),
                "null_anchored": {"big": used}, "null_anchored_ratio_of_medians": {"big": other}}

    swin = row("swin", 1.001, 1.137, [100.0, 6709.0 * 1.001])
    calm = row("calm", 0.999, 1.002, [100.5, 6709.0 * 0.999])
    assert null_speedup_by_ratio_of_medians(swin) == pytest.approx(1 / math.sqrt(1.137))
    assert null_speedup_by_ratio_of_medians(calm) == pytest.approx(math.sqrt(100 / 100.5 / 1.002))
    summary = summarize([swin, calm])
    assert summary["null_within_2pct_share"] == 1.0
    assert summary["null_within_2pct_share_by_ratio_of_medians"] == 0.5
    earlier = {k: v for k, v in swin.items() if k not in ("case_names", "null_anchored_ratio_of_medians")}
    assert null_speedup_by_ratio_of_medians(earlier) is None
    assert "null_within_2pct_share_by_ratio_of_medians" not in summarize([earlier, calm])


# ---- a task swept in parts of its cases (kernelcast.kernels.harness.case_parts) ----------------------------------------------

THREE_TESTS = '''
tests:
  - {"size": 8, "seed": 1}
  - {"size": 24, "seed": 2}
  - {"size": 16, "seed": 3}
benchmarks:
  - {"size": 64, "seed": 4}
'''


def test_cases_are_dealt_heaviest_first_each_to_the_lightest_part():
    from kernelcast.kernels.harness.case_parts import deal

    # linalg/eigh's reference on an H200, ms a call per case: three parts, none above 20 s of 56
    eigh = [0.2, 120.1, 303.5, 9215.5, 623.1, 195.9, 10558.3, 621.6, 10798.1, 14010.4, 615.0, 8231.0, 641.6]
    parts = deal(eigh, 3)
    assert sorted(k for p in parts for k in p) == list(range(13)) and all(list(p) == sorted(p) for p in parts)
    assert max(sum(eigh[k] for k in p) for p in parts) < 20000  # dealt by index, one part would get 34,000
    assert deal(eigh, 3) == parts
    assert deal([5.0, 1.0], 4) == [(0,), (1,)]  # no empty part
    assert deal([1.0, 1.0, 1.0, 1.0], 2) == [(0, 2), (1, 3)]
    with pytest.raises(ValueError, match="at least one part"):
        deal([1.0], 0)


def _part_row(task: str, i: int, n: int, cases: list[str], ref_us: list[float], null_us: list[float],
              null_status: str = "ok", error: str = "") -> dict:
    ratios = [r / t for r, t in zip(ref_us, null_us)]
    return {"task": f"{task} [part {i}/{n}]", "format": "gpumode", "op": f"gpumode.t-part{i}of{n}", "mode": "gpu",
            "imported": True, "import_error": "", "import_s": 1.0, "chunk": f"c{i}", "cases": len(cases),
            "case_bytes_max": None, "case_names": cases, "reference_status": "ok", "reference_error": "",
            "reference_us": ref_us, "reference_gpu_s": 2.0, "reference_wall_s": 3.0, "null_status": null_status,
            "null_error": error, "null_us": null_us if null_status == "ok" else [], "null_gpu_s": 2.0,
            "null_wall_s": 3.0, "reference_timing_windows": 2, "null_timing_windows": 2, "fits": True,
            "refused": None, "measured": null_status == "ok",
            "null_speedup": math.exp(sum(map(math.log, ratios)) / len(ratios)) if null_status == "ok" else None,
            "wall_s": 7.0, "null_anchored": {cases[0]: ratios[0]}, "null_anchored_ratio_of_medians": {}}


def test_a_tasks_row_from_its_parts_is_the_row_one_measurement_over_every_case_gives():
    from kernelcast.kernels.harness.case_parts import complete

    one = _part_row("gpumode/t", 1, 2, ["a", "c"], [10.0, 30.0], [11.0, 24.0])
    two = _part_row("gpumode/t", 2, 2, ["b"], [20.0], [25.0])
    assert complete([one]) == []  # a part missing: no row for the task yet
    (row,) = complete([two, one])
    ratios = [10 / 11, 30 / 24, 20 / 25]
    assert row["task"] == "gpumode/t" and row["op"] == "gpumode.t" and row["measured"] and row["fits"]
    assert row["null_speedup"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 3))
    assert row["case_names"] == ["a", "c", "b"] and row["reference_us"] == [10.0, 30.0, 20.0]
    assert row["null_us"] == [11.0, 24.0, 25.0] and row["cases"] == 3
    assert row["reference_us_geomean"] == pytest.approx((10 * 30 * 20) ** (1 / 3))
    assert row["null_gpu_s"] == 4.0 and row["wall_s"] == 14.0 and row["null_timing_windows"] == 4
    assert row["null_anchored"] == {"a": 10 / 11, "b": 20 / 25}
    assert row["parts"] == ["gpumode/t [part 1/2]", "gpumode/t [part 2/2]"]
    assert complete([one, two, row]) == []  # written once
    other = _part_row("gpumode/t", 2, 2, ["c"], [30.0], [24.0])  # another partition's part 2: case c twice, b never
    assert complete([one, other]) == []
    short = {**two, "part_of": {"op": "gpumode.t", "part": 2, "parts": 2, "cases": 4}}  # a case of four missing
    assert complete([one, short]) == []

    failed = _part_row("gpumode/t", 2, 2, ["b"], [20.0], [25.0], null_status="timeout", error="timing case b")
    (row,) = complete([one, failed])
    assert row["null_status"] == "timeout" and row["null_error"] == "part 2: timing case b"
    assert not row["measured"] and row["null_speedup"] is None and row["reference_status"] == "ok"


def test_a_reference_kept_for_the_whole_task_is_counted_once_in_the_tasks_row():
    from kernelcast.kernels.harness.case_parts import complete

    kept = "an earlier call of the sweep (2026-11-28T12:48:11+00:00)"
    one = {**_part_row("gpumode/t", 1, 2, ["a", "c"], [10.0, 30.0], [11.0, 24.0]), "reference_measured_in": kept}
    two = {**_part_row("gpumode/t", 2, 2, ["b"], [20.0], [25.0]), "reference_measured_in": kept}
    (row,) = complete([one, two])  # each part row carries the whole reference's 2 s, 3 s and 2 windows
    assert row["reference_gpu_s"] == 2.0 and row["reference_wall_s"] == 3.0 and row["reference_timing_windows"] == 2
    assert row["null_gpu_s"] == 4.0 and row["wall_s"] == 11.0 and row["reference_measured_in"] == kept
    (fresh,) = complete([one, {**two, "reference_measured_in": "another call"}])  # two measurements: both count
    assert fresh["reference_wall_s"] == 6.0 and fresh["wall_s"] == 14.0
    assert fresh["reference_measured_in"] == f"{kept}; another call"


def test_a_reference_kept_for_the_whole_task_serves_each_part_with_its_cases_alone():
    from kernelcast.kernels.harness.case_parts import sliced_reference
    from kernelcast.kernels.harness.sweep import _stored_reference

    class Part:
        name = "gpumode.t-part2of2"

        def seed_candidates(self):
            from kernelcast.kernels.records import Candidate
            return [Candidate(op=self.name, backend="torch", source="x = 1\n", origin="seed")]

    kept = {"device": "NVIDIA H200", "op": "gpumode.t", "candidate_id": "0" * 16, "gpu_type": "h200", "mode": "gpu",
            "us": [1.0, 2.0, 3.0], "gpu_s": 9.0, "wall_s": 9.5, "host_sensitive_cases": ["a", "c"], "windows": 7,
            "measured_at": "2026-11-28T12:48:11+00:00"}
    part = sliced_reference(kept, (1, 2), ["a", "b", "c"], Part())
    assert part["us"] == [2.0, 3.0] and part["host_sensitive_cases"] == ["c"] and part["op"] == Part.name
    assert part["windows"] is None and part["sliced_from"] == "gpumode.t" and kept["us"] == [1.0, 2.0, 3.0]
    assert _stored_reference(part).runtime_us_median == (2.0, 3.0)


def test_a_task_swept_in_parts_gets_a_row_a_part_then_its_own_once_all_are_in(tmp_path):
    tasks = tmp_path / "tasks"
    write_gpumode(tasks / "gpumode" / "add_into_py", reference=GPUMODE_ADD_INTO, specs=THREE_TESTS)
    out = tmp_path / "out"
    stdout, rows = _sweep(tasks, out, "--case-parts", "2", "--part", "2")
    assert [r["task"] for r in rows] == ["gpumode/add_into_py [part 2/2]"]
    assert "gpumode/add_into_py: parts 2 of 2 in" in stdout
    assert json.loads((out / "summary.json").read_text())["tasks_done"] == 0  # a part is not the task
    parts = json.loads((out / "parts.json").read_text())["gpumode/add_into_py"]
    assert len(parts["cases"]) == 3 and sorted(k for p in parts["parts"] for k in p) == [0, 1, 2]

    stdout, rows = _sweep(tasks, out, "--case-parts", "2")  # the rest: part 1, then the task's own row
    assert [r["task"] for r in rows] == ["gpumode/add_into_py [part 2/2]", "gpumode/add_into_py [part 1/2]",
                                         "gpumode/add_into_py"]
    whole = rows[-1]
    assert whole["measured"] and whole["reference_status"] == whole["null_status"] == "ok"
    assert sorted(whole["case_names"]) == sorted(parts["cases"]) and whole["op"] == "gpumode.add_into"
    assert rows[0]["op"] == "gpumode.add_into-part2of2" and rows[0]["cases"] == len(parts["parts"][1])
    assert rows[0]["part_of"] == {"op": "gpumode.add_into", "part": 2, "parts": 2, "cases": 3}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks_done"] == summary["measured"] == 1
    assert "| gpumode/add_into_py | yes | ok |" in (out / "sweep.md").read_text()

    stdout, again = _sweep(tasks, out, "--case-parts", "3")  # done: another number of parts measures nothing
    assert "1 tasks, 1 done before, 0 to go" in stdout and len(again) == 3


def test_parts_measured_on_gpus_elsewhere_are_gathered_into_the_tasks_row_by_a_report(tmp_path):
    tasks = tmp_path / "tasks"
    write_gpumode(tasks / "gpumode" / "add_into_py", reference=GPUMODE_ADD_INTO, specs=THREE_TESTS)
    out = tmp_path / "all"
    out.mkdir()
    parts = [_part_row("gpumode/add_into_py", 1, 2, ["a", "c"], [10.0, 30.0], [10.1, 30.3]),
             _part_row("gpumode/add_into_py", 2, 2, ["b"], [20.0], [19.9])]
    (out / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in parts))  # two GPUs' folders, concatenated
    stdout, rows = _sweep(tasks, out, "--case-parts", "2", "--report-only")
    assert [r["task"] for r in rows][-1] == "gpumode/add_into_py" and len(rows) == 3 and rows[-1]["measured"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks_done"] == summary["measured"] == 1
    assert summary["mode"] == "gpu"  # the rows' mode, not that of the machine writing the report
    _sweep(tasks, out, "--case-parts", "2", "--report-only")  # a second report writes the task's row no more
    assert len((out / "sweep.jsonl").read_text().splitlines()) == 3


def test_parts_that_would_not_add_up_are_refused_by_name(tmp_path):
    tasks = tmp_path / "tasks"
    write_gpumode(tasks / "gpumode" / "add_into_py", reference=GPUMODE_ADD_INTO, specs=THREE_TESTS)
    out = tmp_path / "out"
    _sweep(tasks, out, "--case-parts", "2", "--part", "1")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    for extra, said in ((["--case-parts", "3"], "gpumode/add_into_py was split into 2 parts by an earlier call"),
                        (["--case-parts", "2", "--part", "3"], "bad --part 3: give a part from 1 to --case-parts"),
                        (["--case-parts", "0"], "bad --case-parts 0")):
        done = subprocess.run([sys.executable, "-c", RUN, "--tasks", str(tasks), "--out", str(out), "--mode",
                               "interpreter", *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and said in done.stderr, done.stderr[-2000:]
    assert len((out / "sweep.jsonl").read_text().splitlines()) == 1  # the part measured before is still there


def _shared_child(cid, start, check_s, wait_s, alone_s, again=None):
    """A child that checked with the lock shared for ``check_s``, waited ``wait_s`` for it alone, then held it so;
    with ``again`` (wait, recheck seconds), it then waited that long to share it again and rechecked shared."""
    marks = [("locked", 0.0, {"shared": True}), ("checks", 0.0, None), ("check", 0.0, {"case": "a", "seed": 1}),
             ("checked", check_s, None), ("exclusive_wait", 0.0, None), ("exclusive", wait_s, {"cpus": [0]}),
             ("timing", 0.0, "a"), ("timed", alone_s, {"case": "a"})]
    if again is not None:
        marks += [("share_wait", 0.0, None), ("shared_again", again[0], {"cpus": [1]}),
                  ("recheck", 0.0, {"case": "a"}), ("releasing", again[1], None)]
    else:
        marks.append(("releasing", 0.0, None))
    marks.append(("released", 0.0, None))
    t, out = start, []
    for phase, dt, detail in marks:
        t += dt
        out.append((cid, 1, phase, t, detail))
    return out


def test_the_lock_breakdown_ends_shared_checks_where_they_end_not_where_the_child_got_the_lock_alone():
    from kernelcast.kernels.harness.sweep_report import lock_breakdown

    got = lock_breakdown(_shared_child("x", 0.0, 0.4, 1.5, 0.2) + _shared_child("y", 0.1, 0.6, 2.0, 0.2))
    assert got["checks"]["total_s"] == pytest.approx(1.0)  # 0.4 + 0.6: the waits are not checks
    assert got["check, first seed"]["total_s"] == pytest.approx(1.0)
    assert got["waiting, alone"]["total_s"] == pytest.approx(3.5)
    assert got["timed calls"]["total_s"] == pytest.approx(0.4)


def test_the_lock_held_counts_overlapping_shared_checks_once_and_tells_alone_from_shared():
    from types import SimpleNamespace

    from kernelcast.kernels.harness.sweep_report import held_seconds
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig, _Running
    from kernelcast.kernels.hardware import INTERPRETER
    from kernelcast.kernels.null import null_candidate
    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.records import HardwareSpec

    # x checks over [0, 1], y over [0.5, 1.5] (shared, overlapping); x alone over [2, 3], y alone over [3, 4]
    timeline = _shared_child("x", 0.0, 1.0, 1.0, 1.0) + _shared_child("y", 0.5, 1.0, 1.5, 1.0)
    # a child that never shared: alone over [5, 6]
    timeline += [("z", 1, "locked", 5.0, {"shared": False}), ("z", 1, "releasing", 6.0, None),
                 ("z", 1, "released", 6.0, None)]
    # the worker hears each child's marks (as its children send them) and keeps their holds
    with MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="cpu"), WorkerConfig(mode="interpreter")) as w:
        cand = null_candidate(get_operation("softmax"))
        running = {}
        for cid, _, phase, t, detail in sorted(timeline, key=lambda e: e[3]):
            r = running.setdefault(cid, _Running(cand, SimpleNamespace(), None, "", started=0.0, limits=None))
            w._phase(r, phase, detail, t)
        got = held_seconds(w.holds)
        assert w.held_gpu_seconds == pytest.approx(got["held"])
    assert got == pytest.approx({"held": 1.5 + 2.0 + 1.0, "alone": 3.0, "shared": 1.5})


def test_a_recheck_shared_again_counts_as_shared_and_its_wait_as_neither():
    from types import SimpleNamespace

    from kernelcast.kernels.harness.sweep_report import held_seconds, lock_breakdown
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig, _Running
    from kernelcast.kernels.hardware import INTERPRETER
    from kernelcast.kernels.null import null_candidate
    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.records import HardwareSpec

    # checks [0, 1], alone [1, 2], waiting to share again [2, 2.5] (another child alone), recheck shared [2.5, 3]
    timeline = _shared_child("x", 0.0, 1.0, 0.0, 1.0, again=(0.5, 0.5))
    with MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="cpu"), WorkerConfig(mode="interpreter")) as w:
        r = _Running(null_candidate(get_operation("softmax")), SimpleNamespace(), None, "", started=0.0, limits=None)
        for _, _, phase, t, detail in timeline:
            w._phase(r, phase, detail, t)
        assert w.holds == [(0.0, 1.0, True), (1.0, 2.0, False), (2.5, 3.0, True)]
        assert held_seconds(w.holds) == pytest.approx({"held": 2.5, "alone": 1.0, "shared": 1.5})
    got = lock_breakdown(timeline)
    assert got["waiting, shared again"]["total_s"] == pytest.approx(0.5)
    assert got["recheck"]["total_s"] == pytest.approx(1.0)  # from the last timed call: the wait is within it


def test_repeat_spread_tells_cases_timed_beside_the_reference_from_those_timed_alone():
    from kernelcast.kernels.harness.sweep_report import anchored_in, repeat_spread

    assert anchored_in("float32; anchored: a, c; unseen-input control: x") == {"a", "c"}
    assert anchored_in("anchored: none") == set() and anchored_in("") == set()
    series = {"k1": {"op": "op", "runtime_us": [[10.0, 20.0, 30.0], [10.0, 22.0, 30.0], [10.0, 18.0, 30.3]],
                     "checks": ["anchored: none", "anchored: b", "anchored: none"]},
              "k2": {"op": "op", "runtime_us": [[5.0, 1.0, 1.0]], "checks": ["anchored: a"]}}  # one run: no spread
    got = repeat_spread(series, {"op": ["a", "b", "c"]})
    # b was anchored in one run of three: its spread is the anchored kind's; a and c stayed in their own windows
    assert got["anchored"] == [pytest.approx(0.1)]
    assert sorted(got["own"]) == [0.0, pytest.approx(0.00576, abs=1e-4)]
