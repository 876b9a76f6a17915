"""Sources stored once: imported tasks' files and candidates' sources, kept by content in one ``sources`` table.

The same reference module or CUDA-L1 kernel measured in five pools, under two timing protocols, is one row of
the ``sources`` table (``storage/schema.py``: the content keyed by its SHA-256, partitioned by the operation it
belongs to). A data root keeps that table itself or names, in ``sources.json``, the root that keeps it for a
whole tree: every pool under ``data/`` shares ``data/sources``. What refers to a content does so by its hash:

- an imported task is ``tasks/<op>.json``, its file names and their hashes
  (``kernelcast.kernels.formats.save_to_root``); a root written before holds ``tasks/<op>/`` folders of files,
  which are still read;
- a candidates row whose source ``store_once`` moved keeps ``source`` null on disk and names it in
  ``source_sha256``; ``DataRoot.read_table`` puts the source back, so every reader sees the rows as written.
  A search writes its candidates with their sources inline (its own root holds each once already).

``store_once(tree)`` (``kernelcast dedup TREE``) rewrites every data root under a folder to share the folder's
table. It is idempotent, and it removes nothing old until each root's tasks and candidates load identical to
what they loaded before.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from kernelcast.storage.dataset import DataRoot, StorageError, _first_of_each_key, parquet_bytes
from kernelcast.storage.schema import CANDIDATES, SOURCES

POINTER = "sources.json"  # at a data root: {"sources": <the root keeping its sources table, relative or a URI>}


def sha256_of(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def resolve_sources_root(root: DataRoot) -> DataRoot:
    """The root ``root``'s ``sources.json`` names (a path relative to ``root``, or a URI), else ``root`` itself."""
    raw = root.get_object(POINTER)
    if raw is None:
        return root
    target = json.loads(raw)["sources"]
    if "://" not in target:
        path = posixpath.normpath(posixpath.join(root.path, target))
        target = path if root.is_local else root.fs.unstrip_protocol(path)
    return DataRoot(target, storage_options=root.storage_options, retry=root.retry)


def share_sources(root: DataRoot, holder: DataRoot) -> None:
    """Make ``root`` keep its sources where ``holder`` keeps its own (``root``'s ``sources.json`` names that root,
    by absolute path or URI): for a root made of partitions copied out of a deduplicated tree."""
    target = holder.sources_root()
    root.put_object(POINTER, (json.dumps({"sources": target.path if target.is_local else target.uri}) + "\n").encode())
    root._sources_root = None


def _put(root: DataRoot, ops: list[str], contents: list[bytes]) -> list[str]:
    hashes = [sha256_of(c) for c in contents]
    if hashes:
        rows = pa.table({"sha256": hashes, "op": ops, "content": contents}, schema=SOURCES.schema)
        root.sources_root().write(SOURCES.name, rows)
    return hashes


def put_sources(root: DataRoot, op: str, contents: list[bytes]) -> list[str]:
    """Store each content once in ``root``'s sources table, under ``op``; returns their SHA-256s."""
    return _put(root, [op] * len(contents), list(contents))


def _op_of(path: str) -> str:
    found = re.search(r"/op=([^/]+)/[^/]+$", path)
    return found.group(1) if found else ""


def get_sources(root: DataRoot, hashes_by_op: dict[str, list[str]]) -> dict[str, bytes]:
    """The contents of these hashes from ``root``'s sources table, each looked for under its op first, then
    anywhere in the table; one that is not there, or no longer hashes to its key, is a StorageError naming it."""
    wanted = {sha for hashes in hashes_by_op.values() for sha in hashes}
    if not wanted:
        return {}
    store = root.sources_root()
    files = store._files(SOURCES, {})
    found: dict[str, bytes] = {}
    for chosen in ([f for f in files if _op_of(f) in hashes_by_op], files):
        missing = wanted - set(found)
        if not missing or not chosen:
            continue
        rows = _first_of_each_key(store._read_files(SOURCES, chosen, ["sha256", "content"]), SOURCES.key)
        for sha, content in zip(rows["sha256"].to_pylist(), rows["content"].to_pylist()):
            if sha in missing:
                found[sha] = content
    missing = sorted(wanted - set(found))
    if missing:
        raise StorageError(f"{len(missing)} source(s) that {root.uri} refers to are not in {store.uri}/sources "
                           f"(first: {missing[0]})")
    for sha, content in found.items():
        if sha256_of(content) != sha:
            raise StorageError(f"source {sha} in {store.uri}/sources no longer hashes to its key")
    return found


def fill_candidate_sources(root: DataRoot, rows: pa.Table) -> pa.Table:
    """Candidates rows with each moved source (null, named by ``source_sha256``) put back from the sources table."""
    if rows.num_rows == 0 or rows["source"].null_count == 0:
        return rows
    sources, hashes, ops = (rows[c].to_pylist() for c in ("source", "source_sha256", "op"))
    need: dict[str, list[str]] = {}
    for source, sha, op in zip(sources, hashes, ops):
        if source is None and sha is not None:
            need.setdefault(op, []).append(sha)
    found = get_sources(root, need)
    filled = [found[sha].decode() if source is None and sha is not None else source
              for source, sha in zip(sources, hashes)]
    return rows.set_column(rows.schema.get_field_index("source"), "source", pa.array(filled, pa.string()))


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
        for i, sha in zip(inline, _put(root, [ops[i] for i in inline], [sources[i].encode() for i in inline])):
            hashes[i] = sha
        rows = rows.set_column(rows.schema.get_field_index("source"), "source", pa.nulls(rows.num_rows, pa.string()))
        rows = rows.set_column(rows.schema.get_field_index("source_sha256"), "source_sha256",
                               pa.array(hashes, pa.string()))
        root._put(path, parquet_bytes(CANDIDATES, rows))
        rewritten += 1
    return rewritten


# ---- the migration: a tree of data roots sharing one sources table -------------------------------------

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
        inline = [i for i, s in enumerate(candidates["source"].to_pylist()) if s is not None]
        _put(root, [candidates["op"][i].as_py() for i in inline],
             [candidates["source"][i].as_py().encode() for i in inline])
        moved = move_candidate_sources(root)
        candidate_files += moved
        log(f"{rel or '.'}: {len(tasks)} tasks stored by hash, {moved} candidates files' sources moved")
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
