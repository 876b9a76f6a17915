"""CUDA extensions a candidate builds with torch's ``load_inline``, built before the GPU lock where its text says what.

A KernelBench candidate usually calls ``load_inline`` in its model's ``__init__`` or first
``forward``, which the harness can only run on the device, so the build (nvcc and ninja, a
minute or more) would happen while the candidate holds the GPU lock and every other candidate
waits. The text alone often says everything the build needs: the sources and flags are string
literals, or names bound to literals at module level or in the function making the call. Those
calls are made here first, outside the lock; the candidate's own call later finds torch's build
up to date (same name, same sources, same flags, same folder) and only loads it.

Nothing is executed but ``load_inline`` itself on values read from literals: a call whose
arguments need anything else is left to happen where the candidate makes it.
"""

from __future__ import annotations

import ast
import inspect
import os
import time
from dataclasses import dataclass, field

_FUNCTION = "load_inline"


class _Unknown(Exception):
    """A value that literals alone do not give."""


def _value(node: ast.AST, names: dict):
    """The value of ``node`` from literals and the literal bindings in ``names``; raises ``_Unknown`` otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        raise _Unknown(node.id)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, names) for e in node.elts]
    if isinstance(node, ast.JoinedStr):
        if all(isinstance(v, ast.Constant) for v in node.values):
            return "".join(v.value for v in node.values)
        raise _Unknown("f-string")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, names), _value(node.right, names)
        if type(left) is type(right) and isinstance(left, (str, list)):
            return left + right
    raise _Unknown(type(node).__name__)


def _bindings(body: list[ast.stmt], before: int, names: dict) -> dict:
    """``names`` updated with the ``NAME = <literal>`` assignments within ``body`` (in blocks too) before line ``before``."""
    names = dict(names)
    assigns = sorted((n for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Assign)),
                     key=lambda n: n.lineno)
    for node in assigns:
        if node.lineno >= before:
            break
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = _value(node.value, names)
            except _Unknown:
                names.pop(node.targets[0].id, None)  # rebound to something unknown
    return names


def _aliases(tree: ast.Module) -> set[str]:
    """Names ``load_inline`` is imported under anywhere in the text."""
    found = {_FUNCTION}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("cpp_extension"):
            found |= {a.asname or a.name for a in node.names if a.name == _FUNCTION}
    return found


def _is_load_inline(call: ast.Call, aliases: set[str]) -> bool:
    f = call.func
    return (isinstance(f, ast.Name) and f.id in aliases) or (isinstance(f, ast.Attribute) and f.attr == _FUNCTION)


@dataclass
class Plan:
    """The ``load_inline`` calls of a text: those whose arguments are known (as keyword dicts), and the rest, why."""

    calls: list[dict] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def plan(source: str) -> Plan:
    """Every ``load_inline`` call in ``source``, with its arguments where literals give them."""
    from torch.utils.cpp_extension import load_inline

    out = Plan()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return out
    aliases = _aliases(tree)
    signature = inspect.signature(load_inline)
    module_names = _bindings(tree.body, 10**9, {})

    def visit(body: list[ast.stmt], names: dict) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(stmt.body, names)
                continue
            if isinstance(stmt, ast.ClassDef):
                visit(stmt.body, names)
                continue
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and _is_load_inline(node, aliases):
                    local = _bindings(body, node.lineno, names)
                    try:
                        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                            raise _Unknown("*args or **kwargs")
                        bound = signature.bind(*[_value(a, local) for a in node.args],
                                               **{k.arg: _value(k.value, local) for k in node.keywords})
                        out.calls.append(dict(bound.arguments))
                    except (_Unknown, TypeError) as exc:
                        out.unknown.append(f"line {node.lineno}: {exc}")

    visit(tree.body, module_names)
    return out


def build_ahead(source: str, arch: str = "") -> dict:
    """Make each known ``load_inline`` call of ``source`` now; returns what was built, skipped and failed, and how long.

    ``arch`` ('9.0') is the device's compute capability, so that torch need not ask the device for it.
    A failed build is no verdict: the candidate's own call fails the same way where it makes it."""
    planned = plan(source)
    report = {"built": [], "failed": [], "unknown": planned.unknown, "seconds": 0.0}
    if not planned.calls:
        return report
    from torch.utils.cpp_extension import load_inline

    if arch and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    t0 = time.perf_counter()
    for kwargs in planned.calls:
        try:
            load_inline(**{**kwargs, "verbose": False})
            report["built"].append(kwargs.get("name", "?"))
        except Exception as exc:  # noqa: BLE001 - the candidate's own call reports it
            report["failed"].append(f"{kwargs.get('name', '?')}: {type(exc).__name__}: {str(exc)[:200]}")
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report
