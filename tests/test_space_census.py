"""headroom_search --census: how far each measured space's best kernel lies beyond what both sides measure first."""

from __future__ import annotations

import pytest

from benchmarks.headroom_search import main, space_census


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
