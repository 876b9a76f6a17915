"""Crash-resume drills: a search killed with SIGKILL and rerun with its run id ends with the archive of an unbroken run.

The search runs as a real child process (``benchmarks/drills.py child``: the Search core on
the replay backend against the committed pool, no Prefect). CI runs two drills, one killed
inside a measurement write of a chosen generation and one at seeded random points; the
drills script runs ten.
"""

from __future__ import annotations

import random
import shutil

import pytest

from benchmarks.drills import compare, drill, physical_rows, reference_run

CONFIG = dict(op="softmax", gpu_type="h100", budget=24, generations=6, children=32, surrogate="roofline",
              seed=7, backend="replay", run_id="drill")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("drills")
    data, events, result = reference_run(workdir, CONFIG)
    assert result["budget_used"] == 24 and result["generations"] == 6
    return workdir, data, events


def test_search_killed_inside_a_measurement_write_resumes_to_the_same_archive(reference):
    workdir, data, events = reference
    result = drill(1, workdir, CONFIG, data, events, random.Random(0), max_kills=1,
                   kill_on=("generation-begin 2", "write-begin measurements"))
    assert result.kills and result.kills[0].startswith("generation 2"), result.kills
    assert result.problems == [] and result.passed
    assert result.counts["duplicated"] == 0 and result.counts["missing"] == 0 and result.counts["broken_files"] == 0


def test_search_killed_at_random_points_resumes_to_the_same_archive(reference):
    workdir, data, events = reference
    result = drill(2, workdir, CONFIG, data, events, random.Random(5), max_kills=1)
    assert len(result.kills) == 1 and result.runs == 2
    assert result.problems == [], result.problems


def test_the_comparison_catches_a_duplicated_a_missing_and_a_torn_measurement_file(reference, tmp_path):
    _, data, _ = reference
    assert compare(data, data, CONFIG)[0] == []
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    files = sorted(p for p in (copy / "measurements").rglob("part-*.parquet"))
    shutil.copy(files[-1], files[-1].with_name("part-racing-writer.parquet"))
    problems, counts = compare(data, copy, CONFIG)
    assert counts["duplicated"] > 0 and any("duplicated" in p for p in problems)

    files[-1].with_name("part-racing-writer.parquet").unlink()
    files[-1].write_bytes(files[-1].read_bytes()[: 100])  # a torn, visible file
    rows, broken = physical_rows(copy, "measurements")
    assert len(broken) == 1
    problems, _ = compare(data, copy, CONFIG)
    assert any("does not read whole" in p for p in problems)
    assert any("drilled data root does not read" in p for p in problems)  # the readers refuse it too
