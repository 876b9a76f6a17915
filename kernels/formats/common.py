"""What the task formats share: op names, the manifest, reading task files, wrapped submissions.

The format modules (``kernelbench``, ``gpumode``, ``operation``) import from here, and
``kernelcast.kernels.formats`` (the tasks directory and name resolution) re-exports it; keeping these
below both is what lets the package resolve a name to its format module without an import
cycle.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Mapping

FORMATS = {"kb": "kernelbench", "gpumode": "gpumode"}  # op-name prefix -> module under kernelcast.kernels.formats
FORMAT_PREFIX = {module: prefix for prefix, module in FORMATS.items()}
MANIFEST = "manifest.json"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
# Marks the harness's calling convention appended to an imported submission; what precedes
# it is the submission exactly as written (what an LLM is shown, and asked to rewrite).
WRAPPER_MARK = "# ---- kernelcast: the harness calls launch(*inputs) ----"


class TaskFormatError(ValueError):
    """A task or submission file that does not follow its format; the message names what is missing."""


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


# Number formats whose arithmetic needs a GPU of at least this compute capability, named in the task's code,
# and whether torch's CPU build runs them (the interpreter then checks such a task as any other).
# FP8 matrix multiplies run from 8.9 (Ada, Hopper); block-scaled FP4 ones from 10.0 (Blackwell), never on a CPU.
CAPABILITY_FORMATS = (
    (re.compile(r"\bfloat4_e2m1fn(_x2)?\b"), "10.0", False, "FP4 (torch.float4_e2m1fn_x2) block-scaled matrix multiplies"),
    (re.compile(r"\bfloat8_e[45]m[23]fn(uz)?\b|\bfloat8_e8m0fnu\b"), "8.9", True, "FP8 (torch.float8_*) matrix multiplies"),
)


def device_requirement(*sources: str) -> dict | None:
    """The compute capability a task's code needs, from the number formats it names: {"compute_capability",
    "on_cpu", "why"}, or None. The highest requirement any source names wins."""
    text = "\n".join(sources)
    for pattern, capability, on_cpu, what in CAPABILITY_FORMATS:  # highest first
        if pattern.search(text):
            return {"compute_capability": capability, "on_cpu": on_cpu,
                    "why": f"{what} need compute capability {capability} or newer"}
    return None


def unmet_requirement(requires: Mapping | None, capability: tuple[int, int] | None) -> str | None:
    """Why a task that ``requires`` a compute capability cannot run on a device of ``capability`` ((major,
    minor); None: the CPU interpreter), or None when it can."""
    if not requires:
        return None
    need = tuple(int(x) for x in str(requires["compute_capability"]).split("."))
    if capability is None:
        if requires.get("on_cpu", True):
            return None
        return (f"needs a CUDA GPU of compute capability {requires['compute_capability']} ({requires['why']}): "
                "the interpreter cannot run it")
    if tuple(capability) < need:
        return (f"needs compute capability {requires['compute_capability']} ({requires['why']}); this device is "
                f"{capability[0]}.{capability[1]}")
    return None


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


def submission_of(source: str) -> str:
    """The submission a wrapped candidate was made from (the source itself if it is not wrapped)."""
    head, mark, _ = source.partition("\n" + WRAPPER_MARK)
    return head.rstrip() + "\n" if mark else source
