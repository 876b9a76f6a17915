"""One import name: installing kernelcast adds ``kernelcast`` and nothing else, and lives beside Hugging Face's ``kernels``.

The design card's folders (kernels/, surrogate/, storage/, infra/, tasks/, flows/) sit at the repository's root and
are ``kernelcast``'s subpackages (pyproject's package-dir). They hold no ``__init__.py``, so a Python started in the
root, where ``sys.path`` begins with the root itself, still finds the ``kernels`` that transformers imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("kernels", "surrogate", "storage", "infra", "tasks", "flows")


def _listed() -> tuple[set[str], dict[str, str]]:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(settings["packages"]), settings["package-dir"]


def test_every_folder_of_modules_is_a_listed_subpackage_and_none_is_a_top_level_package():
    packages, mapped = _listed()
    found = {"kernelcast"}
    for folder in FOLDERS:
        assert mapped[f"kernelcast.{folder}"] == folder
        assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/__init__.py makes {folder} importable bare"
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.parent.relative_to(ROOT)
            found.add(".".join(("kernelcast", *rel.parts)))
    assert found == packages, f"unlisted: {sorted(found - packages)}; listed but absent: {sorted(packages - found)}"


def test_the_wheel_holds_one_top_level_name(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, timeout=600, capture_output=True)
    [wheel] = tmp_path.glob("kernelcast-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"kernelcast", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops
    for inside in ("kernelcast/kernels/harness/runner.py", "kernelcast/surrogate/prompts/system.j2",
                   "kernelcast/flows/cli.py", "kernelcast/autotune.py"):
        assert inside in names
    # Installed from the wheel alone (no checkout beside it), the package and its command line load.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, timeout=300, capture_output=True)
    code = ("import kernelcast, kernelcast.kernels.ops as ops; from kernelcast.flows.cli import build_parser; "
            "build_parser(); print(kernelcast.__file__, ops.get_operation('softmax').name)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(str(target)) and done.stdout.split()[-1] == "softmax"


# transformers imports Hugging Face's kernels; both must work in one process, with kernelcast's harness.
BOTH = """
import sys, kernels, transformers
from transformers.integrations import hub_kernels
from kernelcast.kernels.ops import get_operation
from kernelcast.tasks.config import SearchConfig
import kernelcast
assert getattr(kernels, "__file__", None), f"bare 'kernels' is a namespace package: {kernels.__path__}"
assert not kernels.__file__.startswith(sys.argv[1]), f"bare 'kernels' is the project's: {kernels.__file__}"
assert hasattr(kernels, "get_kernel"), dir(kernels)
print(kernels.__file__, transformers.__version__, get_operation("softmax").name, SearchConfig(op="softmax").op)
"""


@pytest.mark.parametrize("where", ["the repository's root", "elsewhere"])
def test_hugging_faces_kernels_and_kernelcast_import_in_one_process(where, tmp_path):
    cwd = ROOT if where == "the repository's root" else tmp_path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", BOTH, str(ROOT)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["softmax", "softmax"]


def test_a_candidate_may_not_import_the_project_but_may_import_hugging_faces_kernels():
    from kernelcast.kernels.harness.anticheat import scan_source
    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.records import Candidate

    op = get_operation("softmax")
    source = "import torch\n\ndef launch(x, out):\n    out.copy_(x)\n"
    ours = Candidate(op="softmax", backend="triton", origin="llm",
                     source="from kernelcast.kernels.harness import timing\n" + source)
    theirs = Candidate(op="softmax", backend="triton", origin="llm", source="import kernels\n" + source)
    assert "imports kernelcast.kernels.harness, the project's own code" in (scan_source(ours, op) or "")
    assert scan_source(theirs, op) is None
