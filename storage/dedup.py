"""``kernelcast dedup TREE``: rewrite a tree of data roots to keep every source once, in the tree's sources table.

The data roots under a folder (each pool, each run's root) are found by what they hold: imported tasks, a
candidates or sources table, a ``sources.json``. Each is loaded first (its tasks' files, its candidates rows with
their sources); then it is pointed at the tree's table, its tasks are stored by hash and its candidates' sources
moved (``storage/sources.py``); then it is loaded again and must be identical, before its task folders and its own
sources table are removed. Running it again changes nothing.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from kernelcast.storage.dataset import DataRoot, StorageError, parquet_bytes
from kernelcast.storage.schema import CANDIDATES, SOURCES
from kernelcast.storage.sources import POINTER, put_contents


def move_candidate_sources(root: DataRoot) -> int:
    """Move the inline sources of ``root``'s candidates files into its sources table, each file rewritten in place
    (same name, same rows, ``source`` null and ``source_sha256`` set); returns the files rewritten."""
    rewritten = 0
    for path in root._files(CANDIDATES, {}):
        rows = root._read_files(CANDIDATES, [path])
        sources = rows["source"].to_pylist()
        inline = [i for i, s in enumerate(sources) if s is not None]
        if not inline:
            continue
        ops = rows["op"].to_pylist()
        hashes = rows["source_sha256"].to_pylist()
        stored = put_contents(root, [ops[i] for i in inline], [sources[i].encode() for i in inline])
        for i, sha in zip(inline, stored):
            hashes[i] = sha
        rows = rows.set_column(rows.schema.get_field_index("source"), "source", pa.nulls(rows.num_rows, pa.string()))
        rows = rows.set_column(rows.schema.get_field_index("source_sha256"), "source_sha256",
                               pa.array(hashes, pa.string()))
        root._put(path, parquet_bytes(CANDIDATES, rows))
        rewritten += 1
    return rewritten


_ROOT_MARKS = (re.compile(r"^(?:(.*)/)?tasks/[^/]+\.json$"), re.compile(r"^(?:(.*)/)?tasks/[^/]+/manifest\.json$"),
               re.compile(r"^(?:(.*)/)?candidates/op=[^/]+/[^/]+\.parquet$"),
               re.compile(r"^(?:(.*)/)?sources/op=[^/]+/[^/]+\.parquet$"), re.compile(r"^(?:(.*)/)?sources\.json$"))


def data_roots(top: DataRoot) -> list[str]:
    """The data roots under ``top``, relative to it ('' for itself): folders holding imported tasks, a
    candidates or sources table, or a ``sources.json``."""
    found = set()
    for rel in top.list_objects(""):
        if any(part[:1] in (".", "_") for part in rel.split("/")):
            continue
        for mark in _ROOT_MARKS:
            matched = mark.match(rel)
            if matched:
                found.add(matched.group(1) or "")
    return sorted(found)


def loaded(root: DataRoot) -> tuple[dict[str, dict[str, bytes]], pa.Table]:
    """What ``root`` loads: each stored task's files, and its candidates rows (sorted, ``source_sha256`` aside)."""
    from kernelcast.kernels.formats import stored_task, stored_task_names

    tasks = {name: stored_task(root, name) for name in stored_task_names(root)}
    candidates = root.read_table(CANDIDATES.name).drop_columns(["source_sha256"]).sort_by("candidate_id")
    return tasks, candidates


@dataclass(frozen=True)
class StoreOnceReport:
    """What ``store_once`` did: the roots it found, the task folders and candidates files it rewrote, and the
    contents the shared table holds after."""

    roots: tuple[str, ...]
    task_folders: int
    candidate_files: int
    contents: int


def store_once(tree: str, storage_options: dict | None = None,
               log: Callable[[str], None] = lambda line: None) -> StoreOnceReport:
    """Rewrite every data root under ``tree`` to keep its sources once, by content, in ``tree``'s sources table.

    Each root is loaded first; then it points at ``tree``'s table, its tasks are stored by hash and its candidates'
    sources moved; then it is loaded again and must match, before task folders and a root's own sources table
    are removed. Running it again changes nothing."""
    from kernelcast.kernels.formats import ROOT_FOLDER, save_to_root

    top = DataRoot(tree, storage_options=storage_options)
    relatives = data_roots(top)
    open_root = lambda rel: DataRoot(posixpath.join(top.uri, rel) if rel else top.uri,  # noqa: E731
                                     storage_options=storage_options)
    before = {rel: loaded(open_root(rel)) for rel in relatives}
    log(f"{len(relatives)} data roots under {tree}")
    for rel in relatives:  # each points at the tree's table first: what it stores next goes there
        root = open_root(rel)
        if rel:
            pointer = {"sources": posixpath.relpath(top.path, root.path) if top.is_local else top.uri}
            root.put_object(POINTER, (json.dumps(pointer) + "\n").encode())
        else:
            root.remove_objects(POINTER)
    task_folders = candidate_files = 0
    for rel in relatives:
        root = open_root(rel)
        tasks, candidates = before[rel]
        for name, files in tasks.items():  # into the tree's table, whichever layout or table held them
            save_to_root(root, name, files)
        ops, sources = candidates["op"].to_pylist(), candidates["source"].to_pylist()  # every source it loaded
        kept = [(op, s.encode()) for op, s in zip(ops, sources) if s is not None]
        put_contents(root, [op for op, _ in kept], [content for _, content in kept])
        moved = move_candidate_sources(root)
        candidate_files += moved
        log(f"{rel or '.'}: {len(tasks)} tasks by hash, the sources of {moved} candidates files moved")
    for rel in relatives:
        if loaded(open_root(rel)) != before[rel]:
            raise StorageError(f"{open_root(rel).uri} does not load as it did before its sources moved; nothing "
                               f"old was removed (its task folders, its own sources table)")
    for rel in relatives:
        root = open_root(rel)
        folders = sorted({f.split("/")[0] for f in root.list_objects(ROOT_FOLDER) if "/" in f})
        for name in folders:
            stale = set(root.list_objects(f"{ROOT_FOLDER}/{name}")) - set(before[rel][0].get(name, {}))
            if stale:
                raise StorageError(f"{root.uri}/{ROOT_FOLDER}/{name} holds files its manifest does not list "
                                   f"({', '.join(sorted(stale))}); left as it is")
            root.remove_objects(f"{ROOT_FOLDER}/{name}")
        task_folders += len(folders)
        if rel and root.list_objects(SOURCES.name):
            root.remove_objects(SOURCES.name)
    top.compact(SOURCES.name)
    contents = top.read_table(SOURCES.name, columns=["sha256"]).num_rows
    log(f"{task_folders} task folders and {candidate_files} candidates files rewritten; {contents} contents "
        f"in {top.uri}/{SOURCES.name}")
    return StoreOnceReport(tuple(relatives), task_folders, candidate_files, contents)
