"""CUDA extensions built before the GPU lock: which load_inline calls the text alone describes, and the build."""

import shutil
import textwrap
import time

import pytest

from kernelcast.kernels.harness import prebuild

IN_INIT = textwrap.dedent('''
    import torch
    from torch.utils.cpp_extension import load_inline as build

    FLAGS = ["-O3"]
    HEADER = "#include <torch/extension.h>\\n"

    class ModelNew(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cpp = HEADER + "torch::Tensor twice(torch::Tensor x) { return x * 2; }"
            if torch.cuda.is_available():
                self.ext = build(name="twice_ext", cpp_sources=[cpp], functions=["twice"],
                                 extra_cflags=FLAGS + ["-DKC_AHEAD=1"], verbose=True)
''')


def test_a_call_in_init_is_read_with_module_and_local_literals_and_an_imported_alias():
    plan = prebuild.plan(IN_INIT)
    assert plan.unknown == []
    [call] = plan.calls
    assert call["name"] == "twice_ext"
    assert call["cpp_sources"] == ["#include <torch/extension.h>\ntorch::Tensor twice(torch::Tensor x) { return x * 2; }"]
    assert call["extra_cflags"] == ["-O3", "-DKC_AHEAD=1"]
    assert call["functions"] == ["twice"]


def test_positional_arguments_are_bound_to_load_inlines_parameters():
    plan = prebuild.plan('import torch.utils.cpp_extension as ce\nm = ce.load_inline("e", "int f();", None)\n')
    assert plan.calls == [{"name": "e", "cpp_sources": "int f();", "cuda_sources": None}]


def test_a_call_whose_sources_are_not_literals_is_left_to_the_candidate_with_the_reason():
    text = textwrap.dedent('''
        from torch.utils.cpp_extension import load_inline
        class M:
            def load(self):
                return load_inline(name="e", cpp_sources=self.source, functions=[f"{self.fn}"])
        def make(src):
            code = src.upper()
            return load_inline(name="e2", cpp_sources=code)
    ''')
    plan = prebuild.plan(text)
    assert plan.calls == []
    assert [u.split(":")[0] for u in plan.unknown] == ["line 5", "line 8"]


def test_a_text_without_load_inline_plans_nothing():
    assert prebuild.plan("import torch\nx = 1\n").calls == []
    assert prebuild.build_ahead("import torch\n")["built"] == []


@pytest.mark.skipif(not (shutil.which("ninja") and shutil.which("c++")), reason="needs ninja and a C++ compiler")
def test_the_candidates_own_call_finds_the_build_made_ahead(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    source = IN_INIT.replace("twice_ext", f"twice_ext_{int(time.time())}")
    report = prebuild.build_ahead(source)
    assert report["failed"] == [] and len(report["built"]) == 1
    [call] = prebuild.plan(source).calls
    from torch.utils.cpp_extension import load_inline

    t0 = time.perf_counter()
    ext = load_inline(**call)  # as the candidate would call it, verbose and all
    assert time.perf_counter() - t0 < 0.25 * report["seconds"]  # loaded, not built again
    import torch

    assert ext.twice(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
