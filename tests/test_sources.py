"""Sources stored once (storage/sources.py): tasks by hash, ``kernelcast dedup`` (storage/dedup.py), and pools
written before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kernelcast.flows.cli import main
from kernelcast.kernels.formats import (MANIFEST, import_task, install_from_root, save_to_root, stored_task,
                                        stored_task_names, task_files)
from kernelcast.kernels.records import Candidate
from kernelcast.storage.dataset import DataRoot, StorageError
from kernelcast.storage.schema import candidates_from_frame, candidates_to_table
from kernelcast.storage.dedup import data_roots, loaded, store_once
from kernelcast.storage.sources import POINTER
from tests.formats_for_tests import KB_ROW_SUM, write_kernelbench

OLD_POOLS = ("pool/kernelcast", "pool/kernelbench", "retest/kernelcast")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """An imported task's name, files and candidates (its reference and two kernels)."""
    ref, _ = write_kernelbench(tmp_path_factory.mktemp("kb"))
    op, _ = import_task("kernelbench", str(ref), name="row_sum_sources")
    kernels = [Candidate(op=op.name, backend="torch", origin="import",
                         source=f"import torch\n\n\ndef forward(x):\n    return x.sum(dim=-1) * 0.5  # {i}\n")
               for i in range(2)]
    return op.name, task_files(op.name), op.seed_candidates() + kernels


def write_old_pool(folder: Path, name: str, files: dict, candidates: list) -> None:
    """A pool as roots were written before sources were stored once: the task a folder of its files, the
    candidates' sources inline in files that have no source_sha256 column."""
    (folder / "tasks" / name).mkdir(parents=True)
    for rel, data in files.items():
        (folder / "tasks" / name / rel).write_bytes(data)
    partition = folder / "candidates" / f"op={name}"
    partition.mkdir(parents=True)
    old_columns = candidates_to_table(candidates).drop_columns(["op", "source_sha256"])
    pq.write_table(old_columns, partition / "part-old.parquet")


def loads(tree: Path) -> dict:
    """What every data root under ``tree`` loads: its tasks' files and its candidates rows."""
    return {rel: loaded(DataRoot(str(tree / rel))) for rel in data_roots(DataRoot(str(tree))) if rel}


def files_under(tree: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


@pytest.fixture
def tree(tmp_path, task):
    """Three pools in the old layout holding one task and its candidates, and one written since (its own table)."""
    name, files, candidates = task
    for rel in OLD_POOLS:
        write_old_pool(tmp_path / "data" / rel, name, files, candidates if "retest" not in rel else candidates[:2])
    fresh = DataRoot(str(tmp_path / "data" / "fresh"))
    save_to_root(fresh, name, files)
    fresh.write_candidates(candidates)
    return tmp_path / "data"


def test_a_pool_written_before_sources_were_stored_once_loads_as_written(tmp_path, task):
    name, files, candidates = task
    write_old_pool(tmp_path / "old", name, files, candidates)
    root = DataRoot(str(tmp_path / "old"))
    assert stored_task_names(root) == [name] and stored_task(root, name) == files
    assert install_from_root(root, name) and task_files(name) == files
    frame = root.read_candidates(op=name)
    assert frame["source_sha256"].isna().all()
    assert sorted(candidates_from_frame(frame), key=lambda c: c.candidate_id) == \
        sorted(candidates, key=lambda c: c.candidate_id)


def test_an_imported_task_is_its_hashes_under_the_root_and_its_files_once_in_the_sources_table(tmp_path, task):
    name, files, _ = task
    root = DataRoot(str(tmp_path / "data"))
    save_to_root(root, name, files)
    save_to_root(root, name, files)  # stored again: nothing added
    index = json.loads((tmp_path / "data" / "tasks" / f"{name}.json").read_text())
    assert sorted(index["files"]) == sorted(files) and not (tmp_path / "data" / "tasks" / name).exists()
    assert root.read_table("sources", columns=["sha256"]).num_rows == len(files)
    assert stored_task(root, name) == files and stored_task(root, "kb.absent") is None


def test_dedup_keeps_every_pool_loading_as_before_and_stores_each_source_once(tree, task, capsys):
    name, files, candidates = task
    before, sizes = loads(tree), files_under(tree)
    assert len(before) == 4 and sum(p.endswith(".py") for p in sizes) == 3

    assert main(["dedup", str(tree)]) == 0
    assert "4 data roots share" in capsys.readouterr().out

    assert loads(tree) == before
    after = files_under(tree)
    assert not any(p.endswith(".py") for p in after)  # every task file in the tree's table, once
    assert sum(map(len, after.values())) < sum(map(len, sizes.values()))
    distinct = {*(files.values()), *(c.source.encode() for c in candidates)}
    assert DataRoot(str(tree)).read_table("sources", columns=["sha256"]).num_rows == len(distinct)
    for rel in (*OLD_POOLS, "fresh"):
        assert json.loads(after[f"{rel}/{POINTER}"])["sources"] == ("../.." if "/" in rel else "..")
        assert not (tree / rel / "sources").exists() and not (tree / rel / "tasks" / name).exists()
    assert pq.read_table(tree / "pool/kernelcast/candidates" / f"op={name}" / "part-old.parquet")["source"].null_count \
        == len(candidates)


def test_dedup_run_again_changes_nothing(tree):
    first = store_once(str(tree))
    after_first = files_under(tree)
    again = store_once(str(tree))
    assert files_under(tree) == after_first
    assert (first.task_folders, first.candidate_files) == (3, 4)
    assert (again.task_folders, again.candidate_files) == (0, 0)


def test_a_task_stored_into_a_pool_of_a_deduplicated_tree_goes_to_the_trees_table(tree, tmp_path):
    store_once(str(tree))
    ref, _ = write_kernelbench(tmp_path / "other", reference=KB_ROW_SUM.replace("* self.scale", "* self.scale * 2"))
    op, _ = import_task("kernelbench", str(ref), name="row_sum_twice", root=DataRoot(str(tree / "pool/kernelcast")))
    save_to_root(DataRoot(str(tree / "pool/kernelbench")), op.name, task_files(op.name))
    assert not (tree / "pool/kernelcast/sources").exists()
    stored = DataRoot(str(tree)).read_table("sources", op=op.name)
    assert stored.num_rows == 2 and stored_task(DataRoot(str(tree / "pool/kernelbench")), op.name)[MANIFEST]


def test_a_pool_copied_away_from_its_trees_table_fails_naming_what_it_lacks(tree, tmp_path):
    store_once(str(tree))
    shutil.copytree(tree / "pool/kernelcast", tmp_path / "elsewhere" / "copy")
    with pytest.raises(StorageError, match="not in .*sources"):
        DataRoot(str(tmp_path / "elsewhere" / "copy")).read_candidates()
