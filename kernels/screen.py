"""Cheap static checks on a written kernel, before a forecaster or a GPU ever sees it.

A language model's rewrite fails in many ways that need no GPU to find: it does not parse,
it forgets the entry point the harness calls, its ``launch`` cannot take the call the
harness makes, it calls a helper it dropped while rewriting (a ``NameError`` on the GPU),
it calls the torch function it should replace, or it is the parent again with other
comments. ``screen`` names the first of these; each reason is counted per
generation, so a search shows where its model's answers go.

Duplicates are found up to formatting: two sources with the same normalised syntax tree
(comments, blank lines, quoting, docstrings and line breaks ignored) and the same launch
parameters are one kernel, whatever their candidate ids say.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
from typing import Mapping

from kernelcast.kernels.records import Candidate, canonical_params

# Why a written child is dropped before it is forecast, in the order they are checked.
# no_code and request_failed come from the generator (no code block in the answer; no answer).
SCREEN_REASONS = ("request_failed", "no_code", "unparsable", "no_entry", "signature", "undefined", "forbidden",
                  "duplicate")

# Names a module may read without binding them: the builtins and what the import system sets.
_ALWAYS_BOUND = frozenset(dir(builtins)) | {"__name__", "__file__", "__builtins__", "__doc__", "__spec__",
                                            "__loader__", "__package__", "__class__"}


def fingerprint(source: str, params: Mapping | None = None) -> str | None:
    """A hash of the source's normalised syntax tree and its launch parameters, or None if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: null bytes in the source
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]
    h = hashlib.sha256(ast.dump(tree, annotate_fields=False, include_attributes=False).encode())
    h.update(b"\0" + canonical_params(params or {}).encode())
    return h.hexdigest()[:16]


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


# Reasons a caller may choose to measure rather than drop: the kernel can still be run (and fails
# there, as the check foresees). A corpus measures them, so that forecasters learn from real failures
# and the check's own precision is measured; a search drops them, since running them buys nothing.
MEASURABLE = frozenset({"undefined"})


def screen(op, child: Candidate, code: str, seen: set[str],
           measure_anyway: frozenset[str] = frozenset()) -> tuple[str | None, str]:
    """(reason, detail) when ``child`` is dropped before forecasting, else (None, "").

    ``code`` is what the model wrote (for an imported task, the submission before the
    harness's wrapper); ``seen`` holds the fingerprints of every kernel the run already
    knows, and this child's is added when it passes. Checks named in ``measure_anyway``
    (a subset of ``MEASURABLE``) let a child through.
    """
    if not measure_anyway <= MEASURABLE:
        raise ValueError(f"only {sorted(MEASURABLE)} may be measured anyway, got {sorted(measure_anyway)}")
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return "unparsable", f"line {exc.lineno}: {exc.msg}"
    except ValueError as exc:
        return "unparsable", str(exc)
    entry = getattr(op, "entry", "launch")
    defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    if entry not in defined:
        return "no_entry", f"defines no top-level {entry}"
    if entry == "launch":
        problem = _signature_problem(defined[entry], op, child.params)
        if problem:
            return "signature", problem
    missing = undefined_name(code) if "undefined" not in measure_anyway else None
    if missing:
        return "undefined", f"uses {missing}, which the module never defines or imports"
    from kernelcast.kernels.harness.anticheat import scan_source  # torch-heavy; only once the cheap checks pass

    refused = scan_source(child, op)
    if refused:
        return "forbidden", refused
    mark = fingerprint(code, child.params)
    if mark in seen:
        return "duplicate", "the same kernel as one the run already has, up to formatting"
    seen.add(mark)
    return None, ""


def undefined_name(source: str) -> str | None:
    """The first name ``source`` reads that nothing in it binds and Python does not provide, else None.

    A rewrite that drops a helper it still calls (``_vec``, ``_programs``) dies with a
    ``NameError`` on the GPU; this finds it from the text. It is conservative on purpose: a
    binding anywhere in the module (any scope, any kind) counts for every read, so scoping
    subtleties can miss a bad name but never flag a good one. A star import binds unknown
    names, so it turns the check off; so does a source that does not parse (that is
    another reason's to report). Annotations are not reads under ``from __future__ import
    annotations``.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    bound = set(_ALWAYS_BOUND)
    skipped: set[int] = set()  # ids of annotation nodes that are never evaluated
    lazy_annotations = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                           and any(a.name == "annotations" for a in n.names) for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)  # assignment, for, with, comprehension and walrus targets; del
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)  # every kind of parameter, lambdas' too
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif getattr(ast, "TypeVar", None) and isinstance(node, (ast.TypeVar, ast.ParamSpec, ast.TypeVarTuple)):
            bound.add(node.name)  # Python 3.12 type parameters
        if lazy_annotations:
            for note in _annotations(node):
                skipped.update(id(n) for n in ast.walk(note))
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
             and n.id not in bound and id(n) not in skipped]
    if not reads:
        return None
    return min(reads, key=lambda n: (n.lineno, n.col_offset)).id


def _annotations(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.arg):
        return [node.annotation] if node.annotation else []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.returns] if node.returns else []
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []


def _signature_problem(fn: ast.AST, op, params: Mapping) -> str:
    """Why ``launch(*inputs, *outputs, **params)`` cannot bind to ``fn``'s parameters ('' if it can)."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "launch is a class, not a function"
    a = fn.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    n_call = len(op.input_names()) + len(op.output_specs(op.interpret_cases[0]))
    if a.vararg is None and len(positional) < n_call:
        return f"launch takes {len(positional)} positional arguments; the harness passes {n_call} tensors"
    n_required = len(positional) - len(a.defaults)
    keyword_names = set(positional[n_call:]) | {p.arg for p in a.kwonlyargs}
    unknown = [k for k in params if k not in keyword_names]
    if unknown and a.kwarg is None:
        return f"launch takes no keyword argument {unknown[0]!r}, which the harness passes"
    missing = [p for p in positional[n_call:n_required] if p not in params]
    missing += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None and p.arg not in params]
    if missing:
        return f"launch requires {missing[0]!r}, which the harness does not pass"
    return ""
