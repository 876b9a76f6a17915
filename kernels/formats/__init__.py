"""Imported operations: tasks written in the field's formats (KernelBench, GPU MODE), run as kernelcast ops.

An imported task is a folder of files: the task's own reference module (kept verbatim),
any helper modules it imports, the candidate files that came with it, and a
``manifest.json`` that says which format it is, its cases and tolerances. The folder is
stored twice: under the data root (``tasks/<op name>/``, the record that travels with
the data, local or on S3) and in this machine's *tasks directory*, where
``get_operation`` finds it by name.

Why a directory and not an in-memory registry: the measurement harness resolves an op
by name inside a fresh process forked from a fork server that started before the import
ran, so the op must be loadable from disk alone. The tasks directory is
``$KERNELCAST_TASKS`` when set (inherited by the fork server and its children), else
``~/.cache/kernelcast/tasks``.

Imported op names are ``<format>.<name>`` (``kb.relu``, ``gpumode.vectoradd``): lowercase
letters, digits, ``_``, ``-``, so they are valid Parquet partition values.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Mapping

TASKS_ENV = "KERNELCAST_TASKS"
FORMATS = {"kb": "kernelbench", "gpumode": "gpumode"}  # op-name prefix -> module under kernels.formats
FORMAT_PREFIX = {module: prefix for prefix, module in FORMATS.items()}
MANIFEST = "manifest.json"
ROOT_FOLDER = "tasks"  # under a data root
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
# Marks the harness's calling convention appended to an imported submission; what precedes
# it is the submission exactly as written (what an LLM is shown, and asked to rewrite).
WRAPPER_MARK = "# ---- kernelcast: the harness calls launch(*inputs) ----"


class TaskFormatError(ValueError):
    """A task or submission file that does not follow its format; the message names what is missing."""


# Fixed when this module is first imported (by ``kernels.ops``, which the harness's fork server
# preloads): a sandboxed child points HOME at its scratch directory, and must still find the tasks.
_DEFAULT_TASKS_DIR = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                          "kernelcast", "tasks")


def tasks_dir() -> Path:
    """Where this machine keeps imported tasks (see the module docstring for why it is on disk)."""
    configured = os.environ.get(TASKS_ENV)
    return Path(configured) if configured else _DEFAULT_TASKS_DIR


def is_imported_name(name: str) -> bool:
    prefix, _, rest = name.partition(".")
    return prefix in FORMATS and bool(rest)


def op_name(fmt: str, name: str) -> str:
    """The op name of task ``name`` in format ``fmt`` ('kernelbench' or 'gpumode'), checked."""
    if fmt not in FORMAT_PREFIX:
        raise TaskFormatError(f"unknown task format {fmt!r}; known: {', '.join(FORMAT_PREFIX)}")
    if not _NAME.fullmatch(name):
        raise TaskFormatError(f"bad task name {name!r}: use up to 48 lowercase letters, digits, '_' or '-'")
    return f"{FORMAT_PREFIX[fmt]}.{name}"


def default_task_name(path: str | os.PathLike) -> str:
    """A task name from a file name: '19_ReLU.py' -> '19_relu'; a GPU MODE 'reference.py' takes its folder's name."""
    p = Path(path)
    stem = p.parent.name if p.stem in ("reference", "ref") and p.parent.name else p.stem
    return re.sub(r"[^a-z0-9_-]+", "_", stem.lower()).strip("_-")[:48] or "task"


# ---- reading task files -------------------------------------------------------------------------

def read_source(path: str | os.PathLike, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise TaskFormatError(f"cannot read the {what} {path}: {exc.strerror}") from None


def top_level_names(source: str, where: str) -> dict[str, str]:
    """Top-level definitions of a Python file: name -> 'class' | 'function' | 'value'."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TaskFormatError(f"{where} does not parse: line {exc.lineno}: {exc.msg}") from None
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = "class"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = "function"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names[t.id] = "value"
    return names


def require(source: str, where: str, needed: Mapping[str, str]) -> None:
    """Fail naming every missing top-level definition (``needed``: name -> 'class' | 'function')."""
    found = top_level_names(source, where)
    missing = [f"{kind} {name!r}" for name, kind in needed.items() if found.get(name) not in (kind, "value")]
    if missing:
        raise TaskFormatError(f"{where} defines no {' and no '.join(missing)} at top level; "
                              f"it defines: {', '.join(sorted(found)) or 'nothing'}")


def read_required(path: str | os.PathLike, what: str, needed: Mapping[str, str]) -> str:
    """The source of ``path`` after checking it defines everything in ``needed`` (see ``require``)."""
    source = read_source(path, what)
    require(source, f"{what} {path}", needed)
    return source


def backend_of(source: str) -> str:
    """The candidate's backend as the candidates table records it, read from what the source uses."""
    if re.search(r"\btriton\b", source):
        return "triton"
    if re.search(r"load_inline|cpp_extension|\bcupy\b|\bcuda\.core\b", source):
        return "cuda"
    return "torch"


def load_module(path: Path, module_name: str):
    """Execute a task file as a module, with its folder importable for its helper modules.

    Helper modules (GPU MODE's ``task.py``, ``utils.py``) stay in ``sys.modules`` under their
    own names, because a submission imports them by those names when it runs in the same process.
    """
    folder = str(path.parent)
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    module = importlib.util.module_from_spec(spec)
    for helper in path.parent.glob("*.py"):
        loaded = sys.modules.get(helper.stem)
        if loaded is not None and getattr(loaded, "__file__", None) and Path(loaded.__file__).parent != path.parent:
            del sys.modules[helper.stem]  # another task's helper of the same name
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise TaskFormatError(f"{path} failed to import: {type(exc).__name__}: {exc}") from exc
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    return module


# ---- the tasks directory and the data root -------------------------------------------------------

def install(name: str, files: Mapping[str, bytes], directory: Path | None = None) -> Path:
    """Write a task's files into the tasks directory as one step (a reader never sees half a task)."""
    base = directory or tasks_dir()
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
    for rel, data in files.items():
        (staging / rel).write_bytes(data)
    final = base / name
    old = base / f".{name}-old-{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)
    _LOADED.pop(name, None)
    return final


def task_files(name: str, directory: Path | None = None) -> dict[str, bytes]:
    folder = (directory or tasks_dir()) / name
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def save_to_root(root, name: str, files: Mapping[str, bytes]) -> None:
    """Store a task's files under the data root; the manifest last, as the commit mark."""
    for rel, data in files.items():
        if rel != MANIFEST:
            root.put_object(f"{ROOT_FOLDER}/{name}/{rel}", data)
    root.put_object(f"{ROOT_FOLDER}/{name}/{MANIFEST}", files[MANIFEST])


def install_from_root(root, name: str) -> bool:
    """Install task ``name`` from the data root into this machine's tasks directory; False if it is not there."""
    raw = root.get_object(f"{ROOT_FOLDER}/{name}/{MANIFEST}")
    if raw is None:
        return False
    manifest = json.loads(raw)
    files = {MANIFEST: raw}
    for rel in manifest["files"]:
        data = root.get_object(f"{ROOT_FOLDER}/{name}/{rel}")
        if data is None:
            raise TaskFormatError(f"task {name} under {root.uri} lists {rel} but the file is missing")
        files[rel] = data
    install(name, files)
    return True


# ---- resolving an op name -----------------------------------------------------------------------

_LOADED: dict[str, tuple[str, object]] = {}  # op name -> (manifest digest, operation)


def installed() -> list[str]:
    base = tasks_dir()
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / MANIFEST).is_file() and is_imported_name(p.name))


def load_operation(name: str):
    """The imported operation called ``name`` from the tasks directory (cached while its manifest is unchanged)."""
    import importlib

    folder = tasks_dir() / name
    try:
        raw = (folder / MANIFEST).read_bytes()
    except OSError:
        known = ", ".join(installed()) or "none"
        raise ValueError(f"unknown operation {name!r}: no imported task of that name in {tasks_dir()} "
                         f"(import it with `kernelcast import`); imported here: {known}") from None
    digest = hashlib.sha256(raw).hexdigest()
    cached = _LOADED.get(name)
    if cached is not None and cached[0] == digest:
        return cached[1]
    manifest = json.loads(raw)
    module = importlib.import_module(f"kernels.formats.{FORMATS[name.split('.', 1)[0]]}")
    op = module.operation_from_manifest(folder, manifest)
    _LOADED[name] = (digest, op)
    return op


def submission_of(source: str) -> str:
    """The submission a wrapped candidate was made from (the source itself if it is not wrapped)."""
    head, mark, _ = source.partition("\n" + WRAPPER_MARK)
    return head.rstrip() + "\n" if mark else source


def import_task(fmt: str, reference: str, candidates=(), *, name: str | None = None, root=None, **options):
    """Import a task: check its files, install it here, store it under ``root`` (a DataRoot) when given.

    ``options`` go to the format's importer (``interpret_sizes`` for KernelBench, ``specs``
    for GPU MODE, ``tolerance`` for both). Returns the operation and its imported candidates.
    """
    import importlib

    if fmt not in FORMAT_PREFIX:
        raise TaskFormatError(f"unknown task format {fmt!r}; known: {', '.join(FORMAT_PREFIX)}")
    module = importlib.import_module(f"kernels.formats.{fmt}")
    name, files = module.import_task(reference, list(candidates), name=name, **options)
    install(name, files)
    if root is not None:
        save_to_root(root, name, files)
    op = load_operation(name)
    return op, op.imported_candidates()
