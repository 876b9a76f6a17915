"""On a CPU, ``kernelcast measure`` passes honest kernels: every operation's reference and variants, and an
imported task's reference, its null and a correct submission, with correctness checks shared as by default, each
verdict the judge's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kernelcast.kernels.ops import OPERATIONS

REPO = Path(__file__).resolve().parents[1]


def _cli(*argv, env, cwd):
    return subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1200)


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELCAST_", "CUDA_VISIBLE"))}
    e.update(KERNELCAST_TASKS=str(tmp_path / "tasks"), PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return e


def test_every_operations_reference_and_variants_and_an_imported_task_pass_on_a_cpu(tmp_path, env):
    data = str(tmp_path / "data")
    done = _cli("import", "--format", "kernelbench", "--reference", str(REPO / "examples/kernelbench/row_sum.py"),
                "--candidate", str(REPO / "examples/kernelbench/row_sum_new.py"), "--null", "--data", data,
                env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    done = _cli("measure", "--op", "all", "--limit", "1", "--data", data, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    done = _cli("measure", "--op", "kb.row_sum", "--data", data, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_parquet(Path(data) / "measurements")
    assert set(OPERATIONS) | {"kb.row_sum"} <= set(rows["op"])
    assert len(rows) >= 2 * len(OPERATIONS) + 3
    wrong = rows[rows["status"] != "ok"]
    assert wrong.empty, wrong[["op", "status", "error"]].to_string()[:3000]
    assert rows["checks"].str.contains("judged: ").all()
