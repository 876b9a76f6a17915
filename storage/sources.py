"""Sources stored once: imported tasks' files and candidates' sources, kept by content in one ``sources`` table.

The same reference module or CUDA-L1 kernel measured in five pools, under two timing protocols, is one row of
the ``sources`` table (``storage/schema.py``: the content keyed by its SHA-256, partitioned by the operation it
belongs to). A data root keeps that table itself or names, in ``sources.json``, the root that keeps it for a
whole tree: every pool under ``data/`` shares ``data/sources``. What refers to a content does so by its hash:

- an imported task is ``tasks/<op>.json``, its file names and their hashes
  (``kernelcast.kernels.formats.save_to_root``); a root written before holds ``tasks/<op>/`` folders of files,
  which are still read;
- a candidates row whose source ``kernelcast dedup`` moved keeps ``source`` null on disk and names it in
  ``source_sha256``; ``DataRoot.read_table`` puts the source back, so every reader sees the rows as written.
  A search writes its candidates with their sources inline (its own root holds each once already).

``kernelcast dedup TREE`` (``storage/dedup.py``) rewrites every data root under a folder to share the folder's
table. It is idempotent, and it removes nothing old until each root's tasks and candidates load identical to
what they loaded before.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re

import pyarrow as pa

from kernelcast.storage.retry import StorageError
from kernelcast.storage.schema import SOURCES

POINTER = "sources.json"  # at a data root: {"sources": <the root keeping its sources table, relative or a URI>}


def sha256_of(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def resolve_sources_root(root):
    """The root ``root``'s ``sources.json`` names (a path relative to ``root``, or a URI), else ``root`` itself."""
    raw = root.get_object(POINTER)
    if raw is None:
        return root
    target = json.loads(raw)["sources"]
    if "://" not in target:
        path = posixpath.normpath(posixpath.join(root.path, target))
        target = path if root.is_local else root.fs.unstrip_protocol(path)
    return type(root)(target, storage_options=root.storage_options, retry=root.retry)


def share_sources(root, holder) -> None:
    """Make ``root`` keep its sources where ``holder`` keeps its own (``root``'s ``sources.json`` names that root,
    by absolute path or URI): for a root made of partitions copied out of a deduplicated tree."""
    target = holder.sources_root()
    root.put_object(POINTER, (json.dumps({"sources": target.path if target.is_local else target.uri}) + "\n").encode())
    root._sources_root = None


def put_contents(root, ops: list[str], contents: list[bytes]) -> list[str]:
    """Store each content once in ``root``'s sources table, under its op in ``ops``; returns their SHA-256s."""
    hashes = [sha256_of(c) for c in contents]
    if hashes:
        rows = pa.table({"sha256": hashes, "op": ops, "content": contents}, schema=SOURCES.schema)
        root.sources_root().write(SOURCES.name, rows)
    return hashes


def put_sources(root, op: str, contents: list[bytes]) -> list[str]:
    """Store each content once in ``root``'s sources table, under ``op``; returns their SHA-256s."""
    return put_contents(root, [op] * len(contents), list(contents))


def _op_of(path: str) -> str:
    found = re.search(r"/op=([^/]+)/[^/]+$", path)
    return found.group(1) if found else ""


def get_sources(root, hashes_by_op: dict[str, list[str]]) -> dict[str, bytes]:
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
        rows = store._read_files(SOURCES, chosen, ["sha256", "content"])
        for sha, content in zip(rows["sha256"].to_pylist(), rows["content"].to_pylist()):
            if sha in missing:  # a content stored twice (two writers racing) is the same bytes
                found[sha] = content
    missing = sorted(wanted - set(found))
    if missing:
        raise StorageError(f"{len(missing)} source(s) that {root.uri} refers to are not in {store.uri}/sources "
                           f"(first: {missing[0]})")
    for sha, content in found.items():
        if sha256_of(content) != sha:
            raise StorageError(f"source {sha} in {store.uri}/sources no longer hashes to its key")
    return found


def fill_candidate_sources(root, rows: pa.Table) -> pa.Table:
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
