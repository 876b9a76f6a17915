"""Imported operations: tasks written in the field's formats (KernelBench, GPU MODE), run as kernelcast ops.

An imported task is a folder of files: the task's own reference module (kept verbatim),
any helper modules it imports, the candidate files that came with it, and a
``manifest.json`` that says which format it is, its cases and tolerances. It is stored
under the data root (the record that travels with the data, local or on S3) and installed
as a folder in this machine's *tasks directory*, where ``get_operation`` finds it by name.
Under a data root each file is stored once, by content, in the root's ``sources`` table
(``kernelcast.storage.sources``: pools of one tree share it), and ``tasks/<op name>.json``
names the task's files by their SHA-256; roots written before then hold a folder of files,
``tasks/<op name>/``, which is still read.

Why a directory and not an in-memory registry: the measurement harness resolves an op
by name inside a fresh process forked from a fork server that started before the import
ran, so the op must be loadable from disk alone. The tasks directory is
``$KERNELCAST_TASKS`` when set (inherited by the fork server and its children), else
``~/.cache/kernelcast/tasks``.

Imported op names are ``<format>.<name>`` (``kb.relu``, ``gpumode.vectoradd``): lowercase
letters, digits, ``_``, ``-``, so they are valid Parquet partition values.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

# What the format modules share lives in ``common`` (below them); re-exported here for callers.
from kernelcast.kernels.formats.common import (FORMAT_PREFIX, FORMATS, MANIFEST, WRAPPER_MARK, TaskFormatError, backend_of,
                                    default_task_name, is_imported_name, load_module, op_name, read_required,
                                    read_source, require, submission_of, top_level_names)

__all__ = ["FORMAT_PREFIX", "FORMATS", "MANIFEST", "ROOT_FOLDER", "TASKS_ENV", "WRAPPER_MARK", "TaskFormatError",
           "backend_of", "default_task_name", "import_task", "install", "install_from_root", "installed",
           "is_imported_name", "load_module", "load_operation", "op_name", "read_required", "read_source", "require",
           "save_to_root", "stored_task", "stored_task_names", "submission_of", "task_files", "tasks_dir",
           "top_level_names"]

TASKS_ENV = "KERNELCAST_TASKS"
ROOT_FOLDER = "tasks"  # under a data root

# Fixed when this module is first imported (by ``kernelcast.kernels.ops``, which the harness's fork server
# preloads): a sandboxed child points HOME at its scratch directory, and must still find the tasks.
_DEFAULT_TASKS_DIR = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                          "kernelcast", "tasks")


def tasks_dir() -> Path:
    """Where this machine keeps imported tasks (see the module docstring for why it is on disk)."""
    configured = os.environ.get(TASKS_ENV)
    return Path(configured) if configured else _DEFAULT_TASKS_DIR


# ---- the tasks directory and the data root -------------------------------------------------------

def install(name: str, files: Mapping[str, bytes], directory: Path | None = None) -> Path:
    """Write a task's files into the tasks directory as one step (a reader never sees half a task).

    A task already installed with these very files is left in place: searches of one machine install the same
    tasks from the same pool, and replacing a folder leaves a moment in which a reader finds it gone."""
    base = directory or tasks_dir()
    base.mkdir(parents=True, exist_ok=True)
    if _installed_as(base / name, files):
        return base / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
    for rel, data in files.items():
        (staging / rel).write_bytes(data)
    final = base / name
    old = base / f".{name}-old-{os.getpid()}"
    # Processes that install the same task at once (two searches of one machine) take turns: between one's two
    # renames the other would find the folder gone, or a folder in the way of its own.
    with open(base / ".install.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.exists():
            os.replace(final, old)
        os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)
    _LOADED.pop(name, None)
    return final


def _installed_as(folder: Path, files: Mapping[str, bytes]) -> bool:
    """Whether ``folder`` holds exactly ``files``, byte for byte."""
    try:
        present = {p.name for p in folder.iterdir() if p.is_file()}
        return present == set(files) and all((folder / rel).read_bytes() == data for rel, data in files.items())
    except OSError:  # not there, or replaced while read
        return False


def task_files(name: str, directory: Path | None = None) -> dict[str, bytes]:
    folder = (directory or tasks_dir()) / name
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def save_to_root(root, name: str, files: Mapping[str, bytes]) -> None:
    """Store a task under the data root: its files once, by content, in the root's sources table, then
    ``tasks/<name>.json`` naming each by its SHA-256, written last as the commit mark."""
    names = sorted(files)
    hashes = root.put_sources(name, [bytes(files[rel]) for rel in names])
    index = {"name": name, "files": dict(zip(names, hashes))}
    root.put_object(f"{ROOT_FOLDER}/{name}.json", (json.dumps(index, indent=1, sort_keys=True) + "\n").encode())


def stored_task(root, name: str) -> dict[str, bytes] | None:
    """Task ``name``'s files as stored under the data root, or None if it is not there. A task stored by hash
    (``tasks/<name>.json``) is read before a folder of files (``tasks/<name>/``, as roots were written before)."""
    raw = root.get_object(f"{ROOT_FOLDER}/{name}.json")
    if raw is not None:
        hashes = json.loads(raw)["files"]
        contents = root.get_sources({name: list(hashes.values())})
        return {rel: contents[sha] for rel, sha in hashes.items()}
    raw = root.get_object(f"{ROOT_FOLDER}/{name}/{MANIFEST}")
    if raw is None:
        return None
    files = {MANIFEST: raw}
    for rel in json.loads(raw)["files"]:
        data = root.get_object(f"{ROOT_FOLDER}/{name}/{rel}")
        if data is None:
            raise TaskFormatError(f"task {name} under {root.uri} lists {rel} but the file is missing")
        files[rel] = data
    return files


def stored_task_names(root) -> list[str]:
    """Names of the tasks stored under the data root, in either layout."""
    names = set()
    for rel in root.list_objects(ROOT_FOLDER):
        folder, _, file = rel.rpartition("/")
        if not folder and file.endswith(".json"):
            names.add(file[:-len(".json")])
        elif folder and "/" not in folder and file == MANIFEST:
            names.add(folder)
    return sorted(n for n in names if is_imported_name(n))


def install_from_root(root, name: str) -> bool:
    """Install task ``name`` from the data root into this machine's tasks directory; False if it is not there."""
    files = stored_task(root, name)
    if files is None:
        return False
    install(name, files)
    return True


# ---- resolving an op name -----------------------------------------------------------------------

_LOADED: dict[str, tuple[str, object]] = {}  # op name -> (its folder and manifest digest, operation)


def installed() -> list[str]:
    base = tasks_dir()
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / MANIFEST).is_file() and is_imported_name(p.name))


def _format_module(fmt: str):
    """The module that reads format ``fmt`` ('kernelbench' or 'gpumode').

    Imported on first use, not with this package: a format module builds on the operation base
    (``kernelcast.kernels.ops.base``), and importing that runs ``kernelcast.kernels.ops``, which imports this package.
    """
    from kernelcast.kernels.formats import gpumode, kernelbench

    return {"kernelbench": kernelbench, "gpumode": gpumode}[fmt]


def load_operation(name: str):
    """The imported operation called ``name`` from the tasks directory (cached while its folder and manifest are
    unchanged: the same manifest installed in another tasks directory names files there, not in the first)."""
    folder = tasks_dir() / name
    try:
        raw = (folder / MANIFEST).read_bytes()
    except OSError:
        known = ", ".join(installed()) or "none"
        raise ValueError(f"unknown operation {name!r}: no imported task of that name in {tasks_dir()} "
                         f"(import it with `kernelcast import`); imported here: {known}") from None
    digest = f"{folder.resolve()}:{hashlib.sha256(raw).hexdigest()}"
    cached = _LOADED.get(name)
    if cached is not None and cached[0] == digest:
        return cached[1]
    manifest = json.loads(raw)
    op = _format_module(FORMATS[name.split(".", 1)[0]]).operation_from_manifest(folder, manifest)
    _LOADED[name] = (digest, op)
    return op


def import_task(fmt: str, reference: str, candidates=(), *, name: str | None = None, root=None, **options):
    """Import a task: check its files, install it here, store it under ``root`` (a DataRoot) when given.

    ``options`` go to the format's importer (``interpret_sizes`` for KernelBench, ``specs``
    for GPU MODE, ``tolerance`` for both). Returns the operation and its imported candidates.
    """
    if fmt not in FORMAT_PREFIX:
        raise TaskFormatError(f"unknown task format {fmt!r}; known: {', '.join(FORMAT_PREFIX)}")
    name, files = _format_module(fmt).import_task(reference, list(candidates), name=name, **options)
    install(name, files)
    if root is not None:
        save_to_root(root, name, files)
    op = load_operation(name)
    return op, op.imported_candidates()
