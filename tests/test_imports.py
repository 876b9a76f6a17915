"""The import graph of kernels/: no cycle, no dynamic import that would hide one, no higher layer.

Every ``import`` and ``from ... import`` in every module under kernels/ counts, wherever it
stands (module level, inside a function, under ``if TYPE_CHECKING``): an import deferred into a
function is still a dependency, and deferring one is how a cycle usually hides. A package is
its ``__init__`` module, so ``from kernelcast.kernels.ops import Operation`` depends on ``kernels/ops/__init__.py``
and a re-exporting ``__init__`` is a node like any other; ``from kernelcast.kernels.ops import softmax``
(a submodule) depends on ``kernels/ops/softmax.py``. What is not counted is Python running a
package's ``__init__`` before any of its submodules: were that an edge, every package whose
``__init__`` imports its own submodules would be a cycle by construction.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
KERNELS = PROJECT / "kernels"
# Lowest first: a layer imports only those before it (STYLE rule 15); kernelcast/, the tools for a
# user's own code, sits on top. The orchestrators each layer may not use (DESIGN's package table).
LAYERS = ("kernels", "surrogate", "storage", "infra", "tasks", "flows", "kernelcast")
ORCHESTRATORS = {"kernels": {"prefect", "ray", "mlflow"}, "surrogate": {"prefect", "ray"},
                 "storage": {"prefect", "ray"}}
# The layers above kernels/ (kernels <- surrogate <- storage <- infra <- tasks <- flows), and the
# orchestrators that only those layers may use.
FORBIDDEN = {"prefect", "ray", "mlflow", "surrogate", "storage", "tasks", "flows", "infra"}


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``root`` (a package is its ``__init__``).

    The project's top-level folders are subpackages of ``kernelcast`` (pyproject's package-dir)."""
    names = {}
    prefix = ["kernelcast"] if root.parent == PROJECT and root.name in LAYERS[:-1] else []
    for path in sorted(root.rglob("*.py")):
        parts = prefix + list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def layer_of(module: str) -> str:
    """The layer (or outside package) a module name belongs to: ``kernelcast.tasks.search`` -> ``tasks``."""
    parts = module.split(".")
    if parts[0] == "kernelcast" and len(parts) > 1 and parts[1] in LAYERS[:-1]:
        return parts[1]
    return parts[0]


def imported(path: Path, name: str) -> tuple[set[str], list[str]]:
    """(every module name ``path`` imports, anywhere in it; its dynamic imports of project modules)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    dynamic: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            # ``from package import submodule`` imports the submodule too.
            out.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and _is_dynamic_import(node, name.split(".")[0]):
            dynamic.append(f"{path.name}:{node.lineno}")
    return out, dynamic


def _is_dynamic_import(call: ast.Call, project: str) -> bool:
    """``importlib.import_module(...)`` or ``__import__(...)`` of a module of ``project`` (or of one it cannot tell)."""
    func = call.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))
    if not named or not call.args:
        return False
    arg = call.args[0]
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        arg = arg.values[0]
    # A name built some other way (a variable, a concatenation) is not followed: flag it too.
    return not isinstance(arg, ast.Constant) or str(arg.value).split(".")[0] in (project, "")


def import_graph(*roots: Path) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """Module -> the modules under ``roots`` it imports; module -> where it imports dynamically."""
    modules = {name: path for root in roots for name, path in module_names(root).items()}
    graph, dynamic = {}, {}
    for name, path in modules.items():
        targets, dyn = imported(path, name)
        # ``from kernelcast.kernels.ops import Operation`` also lists ``kernelcast.kernels.ops.Operation``: only real modules stay.
        graph[name] = {t for t in targets if t in modules and t != name}
        if dyn:
            dynamic[name] = dyn
    return graph, dynamic


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_kernels_has_no_import_cycle():
    graph, _ = import_graph(KERNELS)
    assert len(graph) > 20 and "kernelcast.kernels.ops.softmax" in graph["kernelcast.kernels.ops"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in kernels/: " + " -> ".join(cycle)


def test_kernels_imports_its_own_modules_by_import_statements_only():
    _, dynamic = import_graph(KERNELS)
    assert dynamic == {}, f"dynamic imports hide edges from the cycle check: {dynamic}"


def test_kernels_imports_no_higher_layer_or_orchestrator():
    offending = {}
    for name, path in module_names(KERNELS).items():
        targets, _ = imported(path, name)
        bad = sorted(t for t in targets if layer_of(t) in FORBIDDEN)
        if bad:
            offending[name] = bad
    assert offending == {}


@pytest.mark.parametrize("layer", LAYERS[1:])
def test_no_layer_imports_a_higher_one_or_a_forbidden_orchestrator(layer):
    above = set(LAYERS[LAYERS.index(layer) + 1:]) | ORCHESTRATORS.get(layer, set())
    offending = {}
    for name, path in module_names(PROJECT / layer).items():
        targets, _ = imported(path, name)
        bad = sorted(t for t in targets if layer_of(t) in above)
        if bad:
            offending[name] = bad
    assert offending == {}


def test_the_project_has_no_import_cycle():
    graph, _ = import_graph(*(PROJECT / layer for layer in LAYERS))
    assert "kernelcast.surrogate.learned" in graph["kernelcast.surrogate.online"] or "kernelcast.surrogate.bins" in graph["kernelcast.surrogate.online"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("layer", ("surrogate", "storage", "infra"))
def test_a_layer_imports_its_own_modules_by_import_statements_only(layer):
    _, dynamic = import_graph(PROJECT / layer)
    assert dynamic == {}, f"dynamic imports hide edges from the cycle check: {dynamic}"


def test_the_operation_modules_sit_below_the_registry_and_the_spaces():
    graph, _ = import_graph(KERNELS)
    for name in graph["kernelcast.kernels.ops"]:
        if name.startswith("kernelcast.kernels.ops."):
            assert not {"kernelcast.kernels.ops", "kernelcast.kernels.spaces"} & graph[name], name
    assert "kernelcast.kernels.ops" in graph["kernelcast.kernels.spaces"]


# ---- the check itself finds what it is for --------------------------------------------------------

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_cycle_through_a_reexporting_init_and_a_lazy_import_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from pkg.core import Thing\n",          # re-exports
        "core.py": "def make():\n    from pkg.util import helper\n    return helper()\n",
        "util.py": "from pkg import Thing\n",                    # through the __init__
        "leaf.py": "import os\n",
    })
    graph, _ = import_graph(root)
    assert find_cycle(graph) == ["pkg", "pkg.core", "pkg.util", "pkg"]


def test_relative_imports_and_submodule_imports_resolve(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "sub/__init__.py": "from . import a\n",
        "sub/a.py": "from ..b import x\n",
        "b.py": "from pkg.sub import a\nx = 1\n",
    })
    graph, _ = import_graph(root)
    assert graph["pkg.sub"] == {"pkg.sub.a"} and graph["pkg.sub.a"] == {"pkg.b"}
    assert find_cycle(graph) == ["pkg.b", "pkg.sub", "pkg.sub.a", "pkg.b"]


def test_a_dynamic_import_of_a_project_module_is_reported(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "import importlib\n\ndef load(n):\n    return importlib.import_module(f'pkg.x.{n}')\n",
        "fine.py": "import importlib\nimportlib.import_module('json')\n",
    })
    _, dynamic = import_graph(root)
    assert dynamic == {"pkg": ["__init__.py:4"]}
