"""benchmarks/zeroshot_llm.py: what it asks the language model, and what it never reads (the sealed third)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import tests.formats_for_tests  # noqa: F401  (a tasks folder of the tests' own, before any import)
from benchmarks import zeroshot_llm
from tests.test_zeroshot_score import _measurements, _small_set


def test_each_kernel_is_asked_against_its_reference_with_the_references_measured_runtimes(tmp_path):
    from kernelcast.kernels.records import HardwareSpec

    folder = _small_set(tmp_path)
    measured = pd.read_parquet(_measurements(folder, tmp_path / "gpu"))
    problem = zeroshot_llm.zs.problems_of(folder, "dev")[0]
    rows = zeroshot_llm.requests_of(folder, problem, measured, HardwareSpec(**zeroshot_llm.zs.H100))
    assert [r["kernel"] for r in rows] == list(problem["kernels"])
    assert all(r["request"].anchor_runtime_us == (100.0,) for r in rows)
    assert all(r["request"].anchor.source == rows[0]["request"].anchor.source for r in rows)


def test_only_development_problems_are_forecast(tmp_path):
    folder = _small_set(tmp_path)
    dev = zeroshot_llm.zs.problems_of(folder, "dev")
    sealed = [p["name"] for p in json.loads((folder / "manifest.json").read_text())["problems"] if p["sealed"]]
    assert sealed and not {p["name"] for p in dev} & set(sealed)
    with pytest.raises(SystemExit):  # the script has no way to ask for the sealed third
        zeroshot_llm.parse(["--measurements", "m.parquet", "--sealed"])
