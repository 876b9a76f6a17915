"""``kernelcast import`` and ``kernelcast measure`` on an imported KernelBench problem, on the CPU (interpreter)."""

import json

import pandas as pd
import pytest

from kernelcast.flows.cli import main
from kernelcast.kernels.formats import stored_task
from kernelcast.storage.dataset import DataRoot
from tests.formats_for_tests import KB_ROW_SUM, KB_ROW_SUM_NEW, write_kernelbench

# The problem at the size of KernelBench's level1/19_ReLU: 6.4 GB of fp32 inputs, far beyond a CPU's interpreter.
KB_ROW_SUM_BIG = KB_ROW_SUM.replace("batch_size = 64", "batch_size = 4096").replace("dim = 4096", "dim = 393216")


def test_an_imported_problem_too_big_for_the_interpreter_gets_a_scaled_down_case_and_says_how(tmp_path, capsys):
    ref, _ = write_kernelbench(tmp_path / "kb", reference=KB_ROW_SUM_BIG)
    root = tmp_path / "data"
    assert main(["import", "--format", "kernelbench", "--reference", str(ref), "--data", str(root)]) == 0
    out = capsys.readouterr().out
    assert "interpreter case scaled down from the problem's sizes: " in out and "(inputs 6.4 GB -> " in out
    manifest = json.loads(stored_task(DataRoot(str(root)), "kb.row_sum")["manifest.json"])
    (case,) = manifest["interpret_cases"]
    scaling = manifest["interpret_scaling"]
    (shape, dtype), = case["signature"]
    assert dtype == "torch.float32" and 4 * shape[0] * shape[1] == scaling["input_bytes"][1] <= 4 << 20
    assert manifest["cases"][0]["dims"] == {"batch_size": 4096, "dim": 393216}  # the GPU case keeps its size
    for name, (before, after) in scaling["sizes"].items():
        assert case["dims"][name] == after < before == manifest["cases"][0]["dims"][name]


def test_a_problem_that_fits_keeps_its_own_sizes_for_the_interpreter(tmp_path, capsys):
    ref, _ = write_kernelbench(tmp_path / "kb")
    root = tmp_path / "data"
    assert main(["import", "--format", "kernelbench", "--reference", str(ref), "--data", str(root)]) == 0
    assert "scaled down" not in capsys.readouterr().out
    manifest = json.loads(stored_task(DataRoot(str(root)), "kb.row_sum")["manifest.json"])
    assert manifest["interpret_cases"] == manifest["cases"] and "interpret_scaling" not in manifest


def test_measure_takes_the_candidates_stored_for_an_imported_operation(tmp_path, capsys):
    ref, (new,) = write_kernelbench(tmp_path / "kb", new=KB_ROW_SUM_NEW)
    root = tmp_path / "data"
    assert main(["import", "--format", "kernelbench", "--reference", str(ref), "--candidate", str(new),
                 "--data", str(root)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):  # argparse names the choices
        main(["measure", "--op", "kb.row_sum", "--data", str(root), "--model-build", "gpu"])
    assert "invalid choice: 'gpu'" in capsys.readouterr().err
    assert main(["measure", "--op", "kb.row_sum", "--data", str(root), "--concurrency", "1",
                 "--model-build", "host"]) == 0
    assert "measuring 2 candidates of kb.row_sum" in capsys.readouterr().err
    measured = pd.read_parquet(root / "measurements")
    assert len(measured) == 2 and set(measured["status"]) == {"ok"}
    assert measured["checks"].str.contains("models_built: host").all()
    origins = pd.read_parquet(root / "candidates").set_index("candidate_id")["origin"]
    assert set(origins[measured["candidate_id"]]) == {"seed", "import"}
    assert main(["measure", "--op", "kb.row_sum", "--data", str(root)]) == 0
    assert "nothing to measure" in capsys.readouterr().err


def test_measure_of_an_imported_name_nobody_imported_is_a_clear_error(tmp_path, capsys):
    assert main(["measure", "--op", "kb.never_imported", "--data", str(tmp_path / "data")]) == 2
    assert "kb.never_imported" in capsys.readouterr().err


def test_measure_times_by_a_formats_protocol_into_a_root_of_its_own(tmp_path, capsys):
    """--timing kernelbench is recorded with each row; the same root, already timed by kernelcast's protocol,
    refuses it before anything runs, naming the fix."""
    ref, (new,) = write_kernelbench(tmp_path / "kb", new=KB_ROW_SUM_NEW)
    roots = [tmp_path / "ours", tmp_path / "theirs"]
    for root in roots:
        assert main(["import", "--format", "kernelbench", "--reference", str(ref), "--candidate", str(new),
                     "--data", str(root)]) == 0
    assert main(["measure", "--op", "kb.row_sum", "--data", str(roots[0]), "--concurrency", "1"]) == 0
    assert main(["measure", "--op", "kb.row_sum", "--data", str(roots[1]), "--concurrency", "1",
                 "--timing", "kernelbench"]) == 0
    assert set(pd.read_parquet(roots[1] / "measurements")["protocol"]) == {"kernelbench"}
    capsys.readouterr()
    assert main(["measure", "--op", "kb.row_sum", "--data", str(roots[0]), "--timing", "gpumode"]) == 2
    err = capsys.readouterr().err
    assert "already holds kb.row_sum's measurements on interpreter timed by the kernelcast protocol" in err
    assert "another --data root" in err


KB_ROW_SUM_HALF = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """The row sum off by float16's rounding (2**-11 of each result, what half-precision arithmetic leaves): within the
    format's tolerance on any inputs. (Summed in float16, a row whose sum is near zero fell out of the tolerance's
    atol now and then: the inputs come from seeds drawn when used.)"""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        s = x.sum(dim=-1) * self.scale
        return s + s.abs() * 2.0 ** -11
'''


def test_a_kernel_of_lower_precision_is_flagged_by_default_and_fails_under_precision_strict(tmp_path, capsys):
    from kernelcast.kernels.records import is_lower

    ref, (new,) = write_kernelbench(tmp_path / "kb", new=KB_ROW_SUM_HALF)
    found = {}
    for setting in ("tolerance", "strict"):  # a root keeps a kernel's first verdict: one root each
        root = tmp_path / setting
        assert main(["import", "--format", "kernelbench", "--reference", str(ref), "--candidate", str(new),
                     "--data", str(root)]) == 0
        half = next(line.split()[1] for line in capsys.readouterr().out.splitlines() if "(import," in line)
        assert main(["measure", "--op", "kb.row_sum", "--data", str(root), "--concurrency", "1",
                     "--precision", setting]) == 0
        m = pd.read_parquet(root / "measurements").set_index("candidate_id")
        found[setting] = m.loc[half], m.drop(index=half).iloc[0]
    row, reference = found["tolerance"]
    assert row["status"] == "ok" and is_lower(row["precision"]), row["precision"]
    assert reference["status"] == "ok" and not is_lower(reference["precision"])
    row, reference = found["strict"]
    assert row["status"] == "incorrect" and "precision strict" in row["error"] and "tf32/fp16" in row["error"]
    assert reference["status"] == "ok"  # the reference's own float32 arithmetic is not lower than itself


def test_show_counts_a_lower_precision_kernel_the_interpreter_checked_but_did_not_time(tmp_path, capsys):
    from kernelcast.flows.report import best_table
    from kernelcast.storage.dataset import DataRoot

    ref, (new,) = write_kernelbench(tmp_path / "kb", new=KB_ROW_SUM_HALF)
    root = tmp_path / "root"
    assert main(["import", "--format", "kernelbench", "--reference", str(ref), "--candidate", str(new),
                 "--data", str(root)]) == 0
    assert main(["measure", "--op", "kb.row_sum", "--data", str(root), "--concurrency", "1"]) == 0
    row = best_table(DataRoot(str(root)), op="kb.row_sum").iloc[0]
    assert row["gpu_type"] == "interpreter" and row["lower_precision"] == 1
