"""headroom_search --census: how far each measured space's best kernel lies beyond what both sides measure first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.headroom_search import main, space_census

REPO = Path(__file__).resolve().parents[1]


def _row(lines: list[str], problem: str) -> list[str]:
    return next(line for line in lines if line.startswith(f"| {problem} |")).strip("|").split("|")


def test_the_census_of_the_committed_spaces_names_the_best_beyond_the_roots():
    lines = space_census("data/pools/spaces")
    # l3-031: a CUDA graph of CUDA-L1's 13.10x kernel at 15.98x (data/pools/spaces/README.md)
    cells = [c.strip() for c in _row(lines, "kb.cudal1-l3-031")]
    assert cells[3] == "13.095" and cells[4] == "15.980" and cells[5] == "variant:cuda-graph" and cells[6] == "1.220"
    # its reference under torch.compile (default mode) ran at 1.42x eager in the same root: the best is 11.2x that
    assert cells[8:10] == ["1.422", "11.236"]
    # l2-089's space was measured without compile variants: no figure over torch.compile is made up for it
    assert [c.strip() for c in _row(lines, "kb.cudal1-l2-089")][8:10] == ["-", "-"]
    # beside it, torch.compile as CUDA-L1's published H100 scores imply it: 15.926 / 9.895 for l3-031
    assert cells[10:12] == [f"{15.926 / 9.895:.3f}", f"{15.980 / (15.926 / 9.895):.3f}"]
    # a GPU MODE task has no published figure
    assert [c.strip() for c in _row(lines, "gpumode.grayscale")][10:12] == ["-", "-"]
    # l2-096: the best is one of CUDA-L1's kernels, which both sides measure first
    cells = [c.strip() for c in _row(lines, "kb.cudal1-l2-096")]
    assert cells[5] == "import" and cells[6] == "1.000"
    # grayscale: nothing beats eager, so the reference is the best root and the best
    assert [c.strip() for c in _row(lines, "gpumode.grayscale")][3:7] == ["1.000", "1.000", "seed", "1.000"]
    assert "a kernel at least 1.10x beyond the roots in" in lines[-1]


def test_a_census_of_a_folder_without_spaces_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="no measured spaces"):
        space_census(str(tmp_path))
    assert main(["--census", str(tmp_path / "missing")]) == 2
    assert "no measured spaces" in capsys.readouterr().err


def test_the_cost_beyond_the_roots_leaves_out_what_both_sides_measure_first():
    from benchmarks.llm_search import beyond_roots, to_reach

    # three roots first (the best at 1.5x), then variants: one at 1.8x found fourth by one run, sixth by the other
    quick = {"trajectory": [1.0, 1.5, 0.9, 1.8, 1.2], "charges": [2.0, 3.0, 3.0, 5.0, 1.0],
             "costs": [2.0, 3.0, 3.0, 5.0, 1.0], "roots_first": 3}
    slow = dict(quick, trajectory=[1.0, 1.5, 0.9, 1.2, 1.1, 1.8], charges=[2.0, 3.0, 3.0, 1.0, 1.0, 5.0],
                costs=[2.0, 3.0, 3.0, 1.0, 1.0, 5.0])
    assert to_reach(quick, 1.8, "measurements") == 4 and beyond_roots(quick, 1.8, "measurements") == 1
    assert to_reach(slow, 1.8, "measurements") == 6 and beyond_roots(slow, 1.8, "measurements") == 3
    assert beyond_roots(quick, 1.8, "gpu-compile-seconds") == 5.0 and beyond_roots(slow, 1.8, "gpu-seconds") == 7.0
    assert beyond_roots(quick, 1.5, "measurements") == 0  # a root reached it: no search cost
    assert beyond_roots(quick, 2.0, "measurements") is None


def test_a_replayed_search_counts_its_roots_first(tmp_path, monkeypatch):
    """On a committed space: the roots (CUDA-L1's kernels of the pool) are the first measurements of both sides."""
    from benchmarks.headroom_search import parse, problem_settings
    from benchmarks.llm_search import BASELINE, run_one
    from kernelcast.kernels.formats import install_from_root
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.config import SearchConfig

    monkeypatch.setenv("KERNELCAST_TASKS", str(tmp_path / "tasks"))
    install_from_root(DataRoot("data/pools/cudal1/h100-2026-11-27/kernelcast"), "kb.cudal1-l2-075")

    args = parse(["--backend", "replay", "--replay-pool", "data/pools/spaces", "--gpu-type", "h100",
                  "--pool", "data/pools/cudal1/h100-2026-11-27", "--data", str(tmp_path / "runs")])
    base = problem_settings(args, "kb.cudal1-l2-075")
    space = DataRoot("data/pools/spaces/kb.cudal1-l2-075").read_candidates()
    assert (space["origin"] == "import").sum() == 2  # the pool holds two CUDA-L1 kernels of this problem: its roots
    for name in (BASELINE, "roofline"):  # a surrogate needing no prior fit: the roots come first for it as well
        run = run_one(SearchConfig(**base, seed=0, budget=8, surrogate=name))
        assert run["roots_first"] == 2, run
        # the baseline measures the space's seven children (the roots, then five variants); the surrogate fewer
        assert len(run["trajectory"]) == 7 if name == BASELINE else 2 < len(run["trajectory"]) <= 7


def test_a_summary_says_whether_its_searches_were_replayed_or_live():
    from benchmarks.headroom_search import summary

    rows = json.loads((REPO / "docs" / "measured" / "headroom_space" /
                       "headroom_space_replay_h200_depth2_heldout2_late_2026-11-28.json").read_text())["runs"][:8]
    assert summary([{**r, "backend": "replay"} for r in rows])[0].startswith("Replayed searches, generator variants")
    assert summary([{**r, "backend": "local"} for r in rows])[0].startswith("Live searches")
    assert summary(rows)[0].startswith("Searches, ")  # rows written before they said
    mixed = [{**r, "backend": "replay"} for r in rows[:4]] + [{**r, "backend": "local"} for r in rows[4:]]
    assert summary(mixed)[0].startswith("Searches, ")


def test_a_space_measured_over_two_calls_is_named_with_each_calls_reference_and_anchors(tmp_path):
    """A space resumed by a second call: the census says so, with each call's reference runtime and how far the
    anchors (the first call's children measured again) came out from their first speedups."""
    import shutil

    from benchmarks.headroom_search import CALLS
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.sources import share_sources

    space = REPO / "data" / "pools" / "spaces-h200" / "kb.cudal1-l2-076"
    shutil.copytree(space, tmp_path / "kb.cudal1-l2-076")
    share_sources(DataRoot(str(tmp_path / "kb.cudal1-l2-076")), DataRoot(str(space)))
    assert not any("several calls" in line for line in space_census(str(tmp_path)))  # one call: no note
    calls = [{"started": "2026-11-29T01:00:00+00:00", "measured": 20, "reference_us": [100.0, 300.0], "anchors": []},
             {"started": "2026-11-29T01:20:00+00:00", "measured": 8, "reference_us": [102.0, 306.0],
              "anchors": [{"candidate_id": "a", "ratio": 0.98}, {"candidate_id": "b", "ratio": 1.01},
                          {"candidate_id": "c", "status": "runtime_error", "ratio": None}]}]
    DataRoot(str(tmp_path / "kb.cudal1-l2-076")).put_object(CALLS, "".join(json.dumps(c) + "\n"
                                                                             for c in calls).encode())
    lines = space_census(str(tmp_path))
    [note] = [line for line in lines if line.startswith("- kb.cudal1-l2-076:")]
    assert note == ("- kb.cudal1-l2-076: call 1 2026-11-29T01:00: 20 children, reference 200.0 us; "
                    "call 2 2026-11-29T01:20: 8 children, reference 204.0 us, anchors at 0.980-1.010 of their "
                    "earlier speedups (the calls agree within 5%)")
    # an anchor 1.37x its earlier speedup (a graph-captured child on a faster machine): the rows are not one space
    calls[1]["anchors"][1]["ratio"] = 1.368
    DataRoot(str(tmp_path / "kb.cudal1-l2-076")).put_object(CALLS, "".join(json.dumps(c) + "\n"
                                                                             for c in calls).encode())
    [note] = [line for line in space_census(str(tmp_path)) if line.startswith("- kb.cudal1-l2-076:")]
    assert note.endswith("anchors at 0.980-1.368 of their earlier speedups (the calls do not agree within 5%: not "
                         "one space)")


def test_a_summary_names_the_roots_its_problems_were_searched_from():
    """GPU MODE tasks have no CUDA-L1 kernels: their searches start from the reference, and the summary says so."""
    from benchmarks.headroom_search import summary

    row = {"op": "gpumode.fp8_quant", "seed": 0, "mode": "measurements", "surrogate": "learned", "budget": 8,
           "backend": "replay", "generator": "variants", "model": "", "ratio": 1.0, "surrogate_best": 1.3,
           "baseline_best": 1.3, "torch_compile": None, "to_baseline_best": 3, "share_of_baseline_budget": 0.375,
           "baseline_to_its_best": 3, "surrogate_measurements": 8, "baseline_measurements": 8,
           "surrogate_gpu_seconds": 1.0, "surrogate_compile_seconds": 1.0, "baseline_gpu_seconds": 1.0,
           "baseline_compile_seconds": 1.0, "surrogate_best_candidate": "a", "surrogate_best_origin": "seed",
           "baseline_best_candidate": "a", "baseline_best_origin": "seed"}
    assert summary([row])[0].startswith("Replayed searches, generator variants from the reference, on 1 problems")
    both = summary([row, dict(row, op="kb.cudal1-l2-053")])[0]
    assert "from CUDA-L1's kernels (the reference for a task the pool lacks), on 2 problems" in both
    assert "from CUDA-L1's kernels, on 1 problems" in summary([dict(row, op="kb.cudal1-l2-053")])[0]


def test_a_calls_anchors_agree_only_within_the_tolerance_and_cannot_without_a_ratio():
    from benchmarks.headroom_search import ANCHOR_TOLERANCE, anchors_agree, calls_agree

    near = [{"ratio": 1.0 + ANCHOR_TOLERANCE * 0.9}, {"ratio": 1.0 - ANCHOR_TOLERANCE * 0.9}]
    assert anchors_agree(near) is True
    assert anchors_agree(near + [{"ratio": 1.0 + ANCHOR_TOLERANCE * 1.1}]) is False
    assert anchors_agree([{"ratio": None, "status": "ok"}]) is None and anchors_agree([]) is None
    first = {"anchors": []}
    assert calls_agree([first, {"anchors": near}]) is True
    assert calls_agree([first, {"anchors": near}, {"anchors": []}]) is False  # a later call with nothing to compare
