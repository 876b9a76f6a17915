"""Small tasks in the KernelBench and GPU MODE formats, written into a folder by the tests that need them.

Imported tasks are found through a tasks directory that the measurement harness's fork
server inherits from the environment; it is set here, when the test modules are
collected, before any test starts a fork server.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

from kernelcast.kernels.formats import TASKS_ENV

if not os.environ.get(TASKS_ENV):
    os.environ[TASKS_ENV] = tempfile.mkdtemp(prefix="kernelcast-test-tasks-")
    atexit.register(shutil.rmtree, os.environ[TASKS_ENV], True)


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


KB_ROW_SUM = _src('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Sum over the last dimension, scaled by a constant."""

        def __init__(self, scale: float):
            super().__init__()
            self.scale = scale

        def forward(self, x):
            return x.sum(dim=-1) * self.scale


    batch_size = 64
    dim = 4096


    def get_inputs():
        return [torch.randn(batch_size, dim)]


    def get_init_inputs():
        return [0.5]
    ''')

KB_ROW_SUM_NEW = _src('''
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def row_sum_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)
        tl.store(y_ptr + row, tl.sum(acc, axis=0) * scale)


    class ModelNew(nn.Module):
        def __init__(self, scale: float):
            super().__init__()
            self.scale = scale

        def forward(self, x):
            x = x.contiguous()
            y = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
            row_sum_kernel[(x.shape[0],)](x, y, x.shape[1], self.scale, BLOCK=128)
            return y
    ''')

# Forgets the scale: runs, but every output is off by a factor of two.
KB_ROW_SUM_WRONG = KB_ROW_SUM_NEW.replace("tl.sum(acc, axis=0) * scale", "tl.sum(acc, axis=0)")

GPUMODE_TASK = _src('''
    from typing import TypeVar

    import torch

    input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor])
    output_t = TypeVar("output_t", bound=torch.Tensor)
    ''')

GPUMODE_REFERENCE = _src('''
    import torch
    from task import input_t, output_t


    def generate_input(size: int, seed: int) -> input_t:
        gen = torch.Generator()
        gen.manual_seed(seed)
        a = torch.randn(size, generator=gen).to(torch.float16)
        b = torch.randn(size, generator=gen).to(torch.float16)
        return a, b


    def ref_kernel(data: input_t) -> output_t:
        a, b = data
        return a + b


    def check_implementation(data: input_t, output: output_t):
        expected = ref_kernel(data)
        if output.shape != expected.shape:
            return False, f"shape {tuple(output.shape)} where a + b has {tuple(expected.shape)}"
        if not torch.allclose(output.float(), expected.float(), rtol=1e-3, atol=1e-3):
            return False, "custom_kernel's sum differs from a + b"
        return True, ""
    ''')

GPUMODE_SPECS = _src('''
    description: |
      Element-wise addition of two fp16 vectors.
    tests:
      - {"size": 127, "seed": 4242}
      - {"size": 1000, "seed": 5236}
    benchmarks:
      - {"size": 4194304, "seed": 1}
    ''')

GPUMODE_SUBMISSION = _src('''
    import torch
    import triton
    import triton.language as tl
    from task import input_t, output_t


    @triton.jit
    def add_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        a = tl.load(a_ptr + offs, mask=mask)
        b = tl.load(b_ptr + offs, mask=mask)
        tl.store(c_ptr + offs, a + b, mask=mask)


    def custom_kernel(data: input_t) -> output_t:
        a, b = data
        c = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 256),)](a, b, c, a.numel(), BLOCK=256)
        return c
    ''')

# Subtracts instead of adding.
GPUMODE_WRONG = GPUMODE_SUBMISSION.replace("a + b, mask=mask", "a - b, mask=mask")


def write_kernelbench(folder: Path, reference: str = KB_ROW_SUM, **candidates: str) -> tuple[Path, list[Path]]:
    """(problem file, candidate files) written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ref = folder / "row_sum.py"
    ref.write_text(reference)
    paths = []
    for name, text in candidates.items():
        (folder / f"{name}.py").write_text(text)
        paths.append(folder / f"{name}.py")
    return ref, paths


def write_gpumode(folder: Path, reference: str = GPUMODE_REFERENCE, specs: str | None = GPUMODE_SPECS,
                  **submissions: str) -> tuple[Path, list[Path]]:
    """(reference.py, submission files) of a GPU MODE-style task folder (with task.py and task.yml)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.py").write_text(GPUMODE_TASK)
    (folder / "reference.py").write_text(reference)
    if specs is not None:
        (folder / "task.yml").write_text(specs)
    paths = []
    for name, text in submissions.items():
        (folder / f"{name}.py").write_text(text)
        paths.append(folder / f"{name}.py")
    return folder / "reference.py", paths


# A KernelBench problem as CUDA-L1 published its ref_code: ReLU over a (4, 64) input.
KB_RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Applies ReLU."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 4
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''
