"""The fault-injection catalogue: candidate sources that fail, or cheat, in one known way each.

Every ``Fault`` is a real candidate (a Python module defining ``launch``) with the status
the harness must give it in each mode and words its error must contain. The test suite
runs the interpreter-mode kinds through the worker on the CPU; benchmarks/reliability.py
runs every kind on a GPU, interleaved with good candidates, and reports what came back.

Kinds that behave differently off the GPU say so: an illegal address segfaults the
interpreter (``crashed``) but raises a CUDA error on the GPU (``runtime_error``); a
data race needs programs that really run at once, so the interpreter (which runs them
one after another) computes it correctly and the kind is GPU-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelcast.kernels.records import Candidate


@dataclass(frozen=True)
class Fault:
    kind: str
    op: str
    source: str
    expected: tuple[tuple[str, str], ...]  # (mode, status) for each mode the kind is a fault in
    words: str  # a fragment of the error (lower case; empty: any) that shows the right cause was found
    what: str  # one line for the report

    def expected_status(self, mode: str) -> str | None:
        return dict(self.expected).get(mode)

    def candidate(self) -> Candidate:
        return Candidate(op=self.op, backend="triton", source=self.source, origin="llm",
                         template=f"fault/{self.kind}")


def _both(status: str) -> tuple[tuple[str, str], ...]:
    return (("gpu", status), ("interpreter", status))


# A correct Triton row softmax that the cheats below wrap: they compute the right answer,
# but not in a way the harness may accept.
_SOFTMAX = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_rows(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * N + offs, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


def _softmax(x, out):
    M, N = x.shape
    _softmax_rows[(M,)](x, out, N, BLOCK=triton.next_power_of_2(N))
'''

GOOD_SOFTMAX = _SOFTMAX + '''

def launch(x, out):
    _softmax(x, out)
'''

_SOURCES = {
    "compile_error": "def launch(x, out:\n    pass\n",
    "triton_compile_error": '''
import triton
import triton.language as tl


@triton.jit
def _broken(y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, undefined_name + offs)


def launch(x, out):
    _broken[(1,)](out, BLOCK=64)
''',
    "python_exception": "def launch(x, out):\n    raise RuntimeError('kernel exploded on purpose')\n",
    "segfault": "import ctypes\n\n\ndef launch(x, out):\n    ctypes.string_at(0)\n",
    "illegal_address": '''
import triton
import triton.language as tl


@triton.jit
def _far(y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + 1_000_000_000_000 + offs, tl.zeros([BLOCK], tl.float32))


def launch(x, out):
    _far[(1,)](out, BLOCK=64)
''',
    "infinite_loop": "def launch(x, out):\n    while True:\n        pass\n",
    "gpu_infinite_loop": '''
import triton
import triton.language as tl


@triton.jit
def _spin(y_ptr):
    k = 0
    while k >= 0:  # never ends; the store keeps the compiler from deleting the loop
        k = (k + 1) % 7
        tl.store(y_ptr, k.to(tl.float32))


def launch(x, out):
    _spin[(1,)](out)
''',
    "gpu_out_of_memory": '''
import torch


def launch(x, out):
    hoard = torch.empty(1 << 40, dtype=torch.uint8, device=x.device)  # a terabyte on the kernel's device
    out.copy_(hoard[: out.numel()].view(out.shape).to(out.dtype))
''',
    "host_out_of_memory": '''
def launch(x, out):
    hoard = []
    for _ in range(4096):  # up to a terabyte of host memory, 256 MiB at a time, each page touched
        hoard.append(bytearray(256 << 20))
''',
    "nan_output": "def launch(x, out):\n    out.fill_(float('nan'))\n",
    "wrong_result": _SOFTMAX + '''

def launch(x, out):
    _softmax(x, out)
    out.mul_(1.5)
''',
    "race": '''
import triton
import triton.language as tl


@triton.jit
def _partial_sums(x_ptr, out_ptr, N, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    part = tl.sum(tl.load(x_ptr + row * N + offs, mask=offs < N, other=0.0).to(tl.float32), axis=0)
    total = tl.load(out_ptr + row)  # read-modify-write with no atomic: concurrent programs lose updates
    tl.store(out_ptr + row, total + part)


def launch(x, out):
    M, N = x.shape
    out.zero_()
    _partial_sums[(M, triton.cdiv(N, 128))](x, out, N, CHUNK=128)
''',
    "cheat_calls_torch": '''
import torch


def launch(x, out):
    op = getattr(torch, "soft" + "max")  # out of sight of a text scan; the call guard still sees it
    out.copy_(op(x.float(), dim=-1).to(x.dtype))
''',
    "cheat_calls_torch_directly": '''
import torch


def launch(x, out):
    return (torch.softmax(x, dim=-1),)
''',
    "cheat_calls_reference": '''
import importlib


def launch(x, out):
    ops = importlib.import_module("kernel" + "cast.kernels.ops")
    return ops.get_operation("softmax").reference(x)
''',
    "cheat_caches_output": _SOFTMAX + '''

_cache = {}


def launch(x, out):
    key = (tuple(x.shape), x.dtype)
    if key not in _cache:  # computes once per shape, then replays that answer
        _softmax(x, out)
        _cache[key] = out.clone()
    out.copy_(_cache[key])
''',
    "cheat_mutates_input": _SOFTMAX + '''

def launch(x, out):
    _softmax(x, x)  # in place in the input, then copied: right values, input destroyed
    out.copy_(x)
''',
    "cheat_returns_view": '''
import torch


def launch(x, out):
    M, N = x.shape
    view = x.new_empty(0).set_(x.untyped_storage(), x.storage_offset(), (N, M), (1, N))
    return (view,)  # the transpose as a strided view of the input: no work at all
''',
    "cheat_other_stream": _SOFTMAX + '''

def launch(x, out):
    side = torch.cuda.Stream()  # work on a side stream escapes the timer's events
    with torch.cuda.stream(side):
        _softmax(x, out)
''',
    "cheat_first_call_only": _SOFTMAX + '''

_seen = set()


def launch(x, out):
    key = (tuple(x.shape), x.dtype)
    if key not in _seen:  # only the first call per shape does any work
        _seen.add(key)
        _softmax(x, out)
''',
    "cheat_skips_after_checks": _SOFTMAX + '''

_calls = [0]


def launch(x, out):
    _calls[0] += 1
    if _calls[0] <= 40:  # enough to pass the correctness checks; nothing while being timed
        _softmax(x, out)
''',
    "enormous_log": '''
import os


def launch(x, out):
    chunk = b"x" * (1 << 20)
    for _ in range(1 << 16):  # up to 64 GiB of output into its log
        os.write(1, chunk)
''',
    "enormous_output": '''
import torch


def launch(x, out):
    return (torch.zeros(1 << 28, dtype=torch.uint8, device=x.device),)  # 256 MiB where an (M, N) was due
''',
    "enormous_error": "def launch(x, out):\n    raise RuntimeError('overflow ' * (8 << 20))\n",
}

FAULTS: tuple[Fault, ...] = (
    Fault("compile_error", "softmax", _SOURCES["compile_error"], _both("compile_error"), "syntax error",
          "source does not parse"),
    Fault("triton_compile_error", "softmax", _SOURCES["triton_compile_error"],
          (("gpu", "compile_error"), ("interpreter", "runtime_error")), "undefined_name",
          "Triton kernel uses an undefined name (the interpreter only finds it when it runs)"),
    Fault("python_exception", "softmax", _SOURCES["python_exception"], _both("runtime_error"),
          "exploded on purpose", "launch raises"),
    Fault("segfault", "softmax", _SOURCES["segfault"], _both("crashed"), "sigsegv", "dereferences NULL"),
    Fault("illegal_address", "softmax", _SOURCES["illegal_address"],
          (("gpu", "runtime_error"), ("interpreter", "crashed")), "",
          "stores a terabyte past its output"),
    Fault("infinite_loop", "softmax", _SOURCES["infinite_loop"], _both("timeout"), "limit", "host loop never ends"),
    Fault("gpu_infinite_loop", "softmax", _SOURCES["gpu_infinite_loop"], _both("timeout"), "limit",
          "device loop never ends"),
    Fault("gpu_out_of_memory", "softmax", _SOURCES["gpu_out_of_memory"], _both("runtime_error"), "memory",
          "allocates a terabyte on its device"),
    Fault("host_out_of_memory", "softmax", _SOURCES["host_out_of_memory"], _both("runtime_error"), "memory",
          "grows host memory without end"),
    Fault("nan_output", "softmax", _SOURCES["nan_output"], _both("incorrect"), "nan/inf", "writes NaN"),
    Fault("wrong_result", "softmax", _SOURCES["wrong_result"], _both("incorrect"), "out of tolerance",
          "a softmax scaled by 1.5"),
    Fault("race", "row_sum", _SOURCES["race"], (("gpu", "incorrect"),), "differs from the reference",
          "row sums accumulated with unsynchronised read-modify-write"),
    Fault("cheat_calls_torch", "softmax", _SOURCES["cheat_calls_torch"], _both("rejected"), "called torch's softmax",
          "calls torch.softmax through getattr"),
    Fault("cheat_calls_torch_directly", "softmax", _SOURCES["cheat_calls_torch_directly"], _both("rejected"),
          "torch.softmax", "calls torch.softmax in plain sight"),
    Fault("cheat_calls_reference", "softmax", _SOURCES["cheat_calls_reference"], _both("rejected"), "reference",
          "imports the harness's reference at run time"),
    Fault("cheat_caches_output", "softmax", _SOURCES["cheat_caches_output"], _both("rejected"), "caches",
          "replays its first answer"),
    Fault("cheat_mutates_input", "softmax", _SOURCES["cheat_mutates_input"], _both("rejected"), "changed its input",
          "computes in place in its input"),
    Fault("cheat_returns_view", "transpose", _SOURCES["cheat_returns_view"], _both("rejected"), "shares memory",
          "returns a strided view of its input as the transpose"),
    Fault("cheat_other_stream", "softmax", _SOURCES["cheat_other_stream"], _both("rejected"), "stream",
          "runs on a side CUDA stream"),
    Fault("cheat_first_call_only", "softmax", _SOURCES["cheat_first_call_only"], _both("rejected"),
          "first calls", "computes on its first call per shape only"),
    Fault("cheat_skips_after_checks", "softmax", _SOURCES["cheat_skips_after_checks"], (("gpu", "rejected"),),
          "first calls", "computes for 40 calls, then stops (GPU: stops inside the timing loop)"),
    Fault("enormous_log", "softmax", _SOURCES["enormous_log"], _both("runtime_error"), "file too large",
          "writes without end to its log"),
    Fault("enormous_output", "softmax", _SOURCES["enormous_output"], _both("incorrect"), "shape",
          "returns 256 MiB of the wrong shape"),
    Fault("enormous_error", "softmax", _SOURCES["enormous_error"], _both("runtime_error"), "overflow",
          "raises a 64 MiB error message"),
)

FAULT_KINDS = tuple(f.kind for f in FAULTS)


def get_fault(kind: str) -> Fault:
    for f in FAULTS:
        if f.kind == kind:
            return f
    raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")


def faults_for(mode: str) -> tuple[Fault, ...]:
    """The kinds that are faults in ``mode`` (the race and the timing-loop cheat need a GPU)."""
    return tuple(f for f in FAULTS if f.expected_status(mode) is not None)


def good_candidates(n: int) -> list[Candidate]:
    """``n`` distinct correct softmax candidates (the Triton softmax, told apart by a comment)."""
    return [Candidate(op="softmax", backend="triton", source=GOOD_SOFTMAX + f"\n# good candidate {i}\n",
                      origin="llm", template="fault/good") for i in range(n)]
