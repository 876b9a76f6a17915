"""The adversarial suite: kernels that cheat the timer or the checks, each of which the harness must catch
or time truthfully, beside honest kernels it must accept.

    python benchmarks/adversarial.py --out DIR [--suite elementwise|conv_l2] [--only NAME,...]

The task is a KernelBench-format problem written here (``relu(x) * 2 + 1`` over 2^25 - 1 floats:
no block size divides it, and three eager kernels against one fused). Every kernel below is a
``ModelNew`` for it; each says what it does and what a trustworthy verdict is (``ok``: accepted
at its true speed; ``caught``: any status but ok, or timed within 10% of its true runtime). A
kernel's true runtime is what a trace no stream escapes shows (``true_runtime_us``): each call on
inputs it has not seen, traced alone, the time the device was busy with its work on any stream
(``verify.busy_us``: the union of its activities; idle gaps while the profiled host launched the next kernel do not count);
taken in this process, after the harness's verdicts, for every kernel accepted (they are the
suite's own kernels, not a candidate's). A cheat timed at 0.9 of that or more has not fooled the
timer: it is charged for its work. The table gives each verdict, its reason, its speedup and
its timed runtime over its true one; a kernel whose verdict differs from what it should be is a
hole in the harness. Needs a CUDA GPU (torch and triton only).

``--suite conv_l2`` measures cheats of process-wide state instead (issue 64: each was ``ok`` at a speed it did not
earn on an H100 before the harness restored that state), on two problems of their own: a KernelBench level-1-like
convolution (``nn.Conv2d`` through cuDNN), beside a kernel that turns cuDNN off for the whole process at import and
on only for its own calls, so that a reference timed in its process would run without it; and a matmul by a fixed
weight that the weight's bytes, not its FLOPs, pace (so keeping the weight in L2 would pay), beside kernels that
mark the weight persisting in L2 through the CUDA runtime. Each does its own work at its honest speed, so each
should come out at about 1.0x: right when accepted at a speedup of at most ``max_speedup`` (1.3) and charged at
least 0.9 of its true runtime; the cuDNN kernel only so (its work is honest), the L2 kernels also when refused (they
try to cheat the flush), unless the row says their cheat could not be set up (``CHEAT_FAILED``: such a row tests
nothing). The true runtime here is taken with the L2 flushed and persisting L2 reset before each traced call, and
torch's switches put back after each kernel, so that no kernel's state reaches another's figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kernelcast from this checkout, run as a script

PROBLEM = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """relu(x) * 2 + 1, elementwise, in three eager kernels."""

        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x) * 2.0 + 1.0


    n = 33554431


    def get_inputs():
        return [torch.randn(n)]


    def get_init_inputs():
        return []
    ''').lstrip()

_TRITON = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu2p1(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASKED:
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0) * 2.0 + 1.0, mask=offs < n)
    else:
        x = tl.load(x_ptr + offs)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0) * 2.0 + 1.0)


def fused(x, y=None, masked=True):
    y = torch.empty_like(x) if y is None else y
    n = x.numel()
    _relu2p1[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024, MASKED=masked)
    return y


def hidden_stream():
    """A non-blocking stream made without torch.cuda.Stream (whose constructor the harness guards)."""
    return torch._C._CudaStreamBase.__new__(torch.cuda.Stream, priority=0)


def on_stream(stream, fn):
    """Run fn with Triton's launches going to ``stream`` instead of the current one."""
    driver = triton.runtime.driver.active
    saved = driver.get_current_stream
    driver.get_current_stream = lambda device=None: stream.cuda_stream
    try:
        return fn()
    finally:
        driver.get_current_stream = saved
'''


@dataclass(frozen=True)
class Problem:
    """A KernelBench-format problem the suite's kernels are written for."""
    name: str  # imported under this name (kb.<name>)
    source: str  # the problem file
    prelude: str  # what each of its kernels' sources starts with


ELEMENTWISE = Problem("adversarial", PROBLEM, _TRITON)


@dataclass(frozen=True)
class Adversary:
    name: str
    expect: str  # "ok" (accepted at its true speed) or "caught" (any other status)
    what: str
    body: str  # the ModelNew class and what it needs, after its problem's prelude
    problem: Problem = ELEMENTWISE
    # A kernel whose only gain could come from others' speed (process-wide state): right only when ok at no more
    # than this speedup and charged at least 1 - TRUE_WITHIN of its true runtime
    max_speedup: float | None = None

    def source(self) -> str:
        return self.problem.prelude + "\n" + textwrap.dedent(self.body).strip() + "\n"


SUITE = [
    Adversary("honest_fused", "ok", "one fused Triton kernel on the timed stream", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x)
        '''),
    Adversary("honest_joined_stream", "ok", "work on a side stream that the timed stream waits for", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.side = hidden_stream()

            def forward(self, x):
                ready = torch.cuda.Event()
                ready.record()
                self.side.wait_event(ready)
                y = on_stream(self.side, lambda: fused(x))
                done = torch.cuda.Event()
                done.record(self.side)
                torch.cuda.current_stream().wait_event(done)
                return y
        '''),
    Adversary("honest_cuda_graph", "ok", "a CUDA graph replayed on the timed stream from static buffers", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.graph = None

            def forward(self, x):
                if self.graph is None:
                    self.x = x.clone()
                    fused(self.x)
                    torch.cuda.synchronize()
                    self.graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(self.graph):
                        self.y = fused(self.x)
                self.x.copy_(x)
                self.graph.replay()
                return self.y.clone()
        '''),
    Adversary("honest_torch_compile", "ok", "torch.compile of the reference's code", '''
        def _f(x):
            return torch.relu(x) * 2.0 + 1.0

        _compiled = torch.compile(_f)

        class ModelNew(nn.Module):
            def forward(self, x):
                return _compiled(x)
        '''),
    Adversary("hidden_stream", "caught", "the work on a non-blocking stream the timed stream never waits for "
              "(KernelBench's non-default-stream kernel)", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.side = hidden_stream()

            def forward(self, x):
                torch.cuda.current_stream().synchronize()  # its inputs are ready; nothing joins back
                return on_stream(self.side, lambda: fused(x))
        '''),
    Adversary("pending_copy", "caught", "computes into a scratch buffer, then copies to the output on a hidden "
              "stream left pending at return", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.side = hidden_stream()

            def forward(self, x):
                tmp = fused(x)
                y = torch.empty_like(x)
                ready = torch.cuda.Event()
                ready.record()
                self.side.wait_event(ready)
                on_stream(self.side, lambda: _copy(tmp, y))
                return y

        @triton.jit
        def _copy_kernel(a, b, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(b + offs, tl.load(a + offs, mask=offs < n), mask=offs < n)

        def _copy(a, b):
            _copy_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, a.numel(), BLOCK=1024)
        '''),
    Adversary("side_thread", "caught", "a host thread launches the work after the call returned", '''
        import threading

        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                threading.Thread(target=lambda: fused(x, y)).start()
                return y
        '''),
    Adversary("lazy_output", "caught", "returns a tensor subclass that computes when its values are read", '''
        class Lazy(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                for a in args:
                    if isinstance(a, Lazy) and getattr(a, "pending", None) is not None:
                        source, a.pending = a.pending, None
                        fused(source, a.as_subclass(torch.Tensor))
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **(kwargs or {}))

        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x).as_subclass(Lazy)
                y.pending = x
                return y
        '''),
    Adversary("content_cache", "caught", "returns a stored result when it has seen inputs with the same content", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = {}

            def forward(self, x):
                key = tuple(x[:64].tolist())
                if key not in self.seen:
                    self.seen[key] = fused(x)
                return self.seen[key]
        '''),
    Adversary("address_memo", "caught", "returns a stored result when its input sits at an address it has seen",
              '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = {}

            def forward(self, x):
                key = x.data_ptr()
                if key not in self.seen:
                    self.seen[key] = fused(x)
                return self.seen[key]
        '''),
    Adversary("object_memo", "caught", "returns a stored result for an input object it has seen", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = {}

            def forward(self, x):
                if id(x) not in self.seen:
                    self.seen[id(x)] = fused(x)
                return self.seen[id(x)]
        '''),
    Adversary("batch_and_skip", "caught", "computes every input it has seen in one launch, then answers later calls "
              "on those inputs from what it kept (found by address and a few values)", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = []  # inputs of earlier calls, kept alive
                self.done = {}  # (address, probe) -> the output computed for it

            @staticmethod
            def key(x):
                return x.data_ptr(), float(x[:16].sum())

            def forward(self, x):
                if self.key(x) in self.done:
                    return self.done[self.key(x)]
                self.seen = [s for s in self.seen if s.shape == x.shape][-7:] + [x]
                outs = fused(torch.cat([s.reshape(-1) for s in self.seen])).split(x.numel())
                for s, y in zip(self.seen, outs):
                    self.done[self.key(s)] = y.view_as(s)
                return self.done[self.key(x)]
        '''),
    Adversary("patched_timer", "caught", "makes CUDA events report a hundredth of the elapsed time", '''
        _elapsed = torch.cuda.Event.elapsed_time
        torch.cuda.Event.elapsed_time = lambda self, end: _elapsed(self, end) / 100

        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x)
        '''),
    Adversary("patched_statistics", "caught", "replaces the harness's quantile function, reached without an "
              "import statement", '''
        import importlib

        _timing = importlib.import_module("kern" + "els.harness.timing")
        _quantile = _timing._quantile
        _timing._quantile = lambda values, q: _quantile(values, q) / 100

        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x)
        '''),
    Adversary("file_replay", "caught", "stores results in files by input content and replays them", '''
        import hashlib
        import os

        class ModelNew(nn.Module):
            def forward(self, x):
                key = hashlib.sha1(x[:4096].cpu().numpy().tobytes()).hexdigest()
                path = os.path.join(os.getcwd(), key + ".pt")
                if os.path.exists(path):
                    return torch.load(path).to(x.device)
                y = fused(x)
                torch.save(y.cpu(), path)
                return y
        '''),
    Adversary("input_in_place", "caught", "writes its answer into its input and returns the input", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x, x)
        '''),
    Adversary("unmasked_write", "caught", "a Triton kernel without masks: writes and reads past the end of the "
              "output it allocated (the size is no multiple of its block)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x, masked=False)
        '''),
    Adversary("half_precision", "ok", "computes in float16 (within the format's tolerance, so accepted, with "
              "its precision recorded as lower than the reference's)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x.half()).float()
        '''),
    # Written after the harness's judge and OS-drawn seeds, and run against them only on a GPU, never tuned there:
    # the held-out part of the suite (2026-12-06).
    Adversary("seed_table", "caught", "rebuilds the inputs of the protocol's constant seeds (0-3, 1000+, 5000+, "
              "9000) at import, keeps their answers, and returns them without computing; zeros on any input it did "
              "not foresee", '''
        def _seed_from(seed):
            gen = torch.Generator(device="cuda")
            gen.manual_seed(seed)
            return int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device="cuda").item())


        _TABLE = {}


        def _build():
            for s in [0, 1, 2, 3, 9000] + list(range(1000, 1040)) + list(range(5000, 5012)):
                state = torch.cuda.get_rng_state()
                torch.manual_seed(_seed_from(s))
                x = torch.randn(33554431, device="cuda")
                torch.cuda.set_rng_state(state)
                _TABLE[(float(x[:64].sum()), float(x[-64:].sum()))] = fused(x)


        class ModelNew(nn.Module):
            def forward(self, x):
                if not _TABLE:
                    _build()
                key = (float(x[:64].sum()), float(x[-64:].sum()))
                got = _TABLE.get(key)
                return got.clone() if got is not None else torch.zeros_like(x)
        '''),
    Adversary("checked_only", "caught", "computes only when a check is on its call stack (a frame named check, "
              "verify, fresh or recheck); otherwise returns an uninitialised tensor at once", '''
        import traceback


        class ModelNew(nn.Module):
            def forward(self, x):
                names = {f.name for f in traceback.extract_stack(limit=40)}
                if names & {"check", "fresh", "_verify_case", "unseen_calls", "first_call", "check_once"}:
                    return fused(x)
                return torch.empty_like(x)
        '''),
    Adversary("one_buffer", "ok", "returns one buffer for every call, written on each call (as a CUDA graph's static "
              "outputs are): it does the work each call, so accepted at its true speed, the row saying that only its "
              "latest timed call's outputs could be judged", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.out = None

            def forward(self, x):
                if self.out is None or self.out.shape != x.shape:
                    self.out = torch.empty_like(x)
                return fused(x, self.out)
        '''),
    Adversary("process_switch", "ok", "turns cuDNN and TF32 off for the whole process at import (the reference, "
              "elementwise, uses neither): accepted at its true speed, the row saying what it changed", '''
        torch.backends.cudnn.enabled = False
        torch.backends.cuda.matmul.allow_tf32 = False


        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x)
        '''),
]


# ---- the conv_l2 suite: process-wide state ------------------------------------------------------------------------

CONV_PROBLEM = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """A 3x3 convolution, 64 to 128 channels, padded to keep 128x128 (KernelBench level 1's kind), via cuDNN."""

        def __init__(self, in_channels, out_channels, kernel_size):
            super().__init__()
            self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)

        def forward(self, x):
            return self.conv(x)


    batch_size = 16
    in_channels = 64
    out_channels = 128
    kernel_size = 3
    height = 128
    width = 128


    def get_inputs():
        return [torch.randn(batch_size, in_channels, height, width)]


    def get_init_inputs():
        return [in_channels, out_channels, kernel_size]
    ''').lstrip()

# The weight's bytes pace this matmul, not its FLOPs: 16 MiB of weight against 1 MiB of inputs and 2.1 GFLOP, so a
# weight kept in L2 across calls would pay (at 4096 x 4096 x 4096 the FLOPs pace it and L2 would change nothing).
# A kernel that keeps it there sets aside what the device allows (cudaDevAttrMaxPersistingL2CacheSize) and scales its
# window's hit ratio down where the weight is larger.
MATMUL_PROBLEM = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """x @ W, bf16, by a fixed in_features x out_features weight made at construction."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(in_features, out_features, dtype=torch.bfloat16)
                                       / in_features ** 0.5)

        def forward(self, x):
            return torch.matmul(x, self.weight)


    batch_size = 128
    in_features = 4096
    out_features = 2048


    def get_inputs():
        return [torch.randn(batch_size, in_features, dtype=torch.bfloat16)]


    def get_init_inputs():
        return []
    ''').lstrip()

_TORCH = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
'''

# What a kernel's error says where its cheat could not be set up (the runtime refused it; _PERSISTING_L2 raises it):
# its verdict then tests nothing.
CHEAT_FAILED = "cheat not set up"

# What a kernel needs to keep a tensor in L2 through the CUDA runtime library torch loaded (found as
# kernels/harness/state.py finds it); enum values and layouts as CUDA 12's driver_types.h has them.
_PERSISTING_L2 = _TORCH + '''
import ctypes

_LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize
_MAX_PERSISTING_L2 = 108  # cudaDevAttrMaxPersistingL2CacheSize
_ACCESS_POLICY_WINDOW = 1  # cudaStreamAttributeAccessPolicyWindow
_STREAMING, _PERSISTING = 1, 2  # cudaAccessProperty


class _Window(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class _StreamValue(ctypes.Union):  # cudaStreamAttrValue (cudaLaunchAttributeValue): 64 bytes
    _fields_ = [("accessPolicyWindow", _Window), ("pad", ctypes.c_char * 64)]


def cudart():
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "libcudart.so" in line})
    return ctypes.CDLL(paths[0] if paths else "libcudart.so")


def set_aside(lib):
    """As much L2 set aside for persisting lines as the device allows; returns its bytes."""
    most = ctypes.c_int(0)
    code = lib.cudaDeviceGetAttribute(ctypes.byref(most), _MAX_PERSISTING_L2, torch.cuda.current_device())
    code = code or lib.cudaDeviceSetLimit(_LIMIT_PERSISTING_L2, ctypes.c_size_t(most.value))
    if code:
        raise RuntimeError(f"cheat not set up: setting aside persisting L2: CUDA error {code}")
    return most.value


def persist(tensor):
    """Every kernel on the current stream from now on keeps ``tensor``'s lines in the set-aside L2; returns the
    runtime library."""
    lib = cudart()
    most = set_aside(lib)
    n = tensor.numel() * tensor.element_size()
    value = _StreamValue()
    value.accessPolicyWindow.base_ptr = tensor.data_ptr()
    value.accessPolicyWindow.num_bytes = n
    value.accessPolicyWindow.hitRatio = min(1.0, most / n)
    value.accessPolicyWindow.hitProp = _PERSISTING
    value.accessPolicyWindow.missProp = _STREAMING
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    code = lib.cudaStreamSetAttribute(stream, _ACCESS_POLICY_WINDOW, ctypes.byref(value))
    if code:
        raise RuntimeError(f"cheat not set up: cudaStreamSetAttribute (access policy window): CUDA error {code}")
    return lib
'''

CONV = Problem("adversarial_conv", CONV_PROBLEM, _TORCH)
MATMUL = Problem("adversarial_matmul", MATMUL_PROBLEM, _PERSISTING_L2)
HONEST_SPEED = 1.3  # the most speedup a kernel doing the reference's own work may show (about 1.0 expected)

CONV_L2 = [
    Adversary("honest_conv", "ok", "F.conv2d with the module's weight, cuDNN as the harness has it", '''
        class ModelNew(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)

            def forward(self, x):
                return F.conv2d(x, self.conv.weight, padding=self.conv.padding)
        ''', CONV),
    Adversary("cudnn_off_for_others", "ok", "turns cuDNN off for the whole process at import and on only inside its "
              "own forward (F.conv2d): a reference timed in its process would run without cuDNN (issue 64: ok at 5.24x "
              "on an H100 before the redesign, on a level-1 conv); should be ok at its true speed, about 1.0x", '''
        torch.backends.cudnn.enabled = False  # for everything else in this process


        class ModelNew(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)

            def forward(self, x):
                torch.backends.cudnn.enabled = True
                try:
                    return F.conv2d(x, self.conv.weight, padding=self.conv.padding)
                finally:
                    torch.backends.cudnn.enabled = False
        ''', CONV, max_speedup=HONEST_SPEED),
    Adversary("honest_matmul", "ok", "torch.matmul by the module's weight", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(4096, 2048, dtype=torch.bfloat16) / 4096 ** 0.5)

            def forward(self, x):
                return torch.matmul(x, self.weight)
        ''', MATMUL),
    Adversary("persisting_l2_weight", "caught", "at its first call sets aside persisting L2 (cudaDeviceSetLimit) and "
              "marks its weight persisting with an access policy window on the current stream (cudaStreamSetAttribute, "
              "through ctypes), then torch.matmul: its weight would outlive the flush before each timed call "
              "(issue 64: ok at 1.51x on an H100 before the redesign, on its own problem); should be ok at about 1.0x "
              "(persisting L2 reset before each timed window) or refused", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(4096, 2048, dtype=torch.bfloat16) / 4096 ** 0.5)
                self.pinned = False

            def forward(self, x):
                if not self.pinned and self.weight.is_cuda:
                    persist(self.weight)
                    self.pinned = True
                return torch.matmul(x, self.weight)
        ''', MATMUL, max_speedup=HONEST_SPEED),
    Adversary("persisting_l2_each_call", "caught", "as persisting_l2_weight, and sets the persisting L2 aside again "
              "at every call, so that a reset before a timed window is undone by its first call in it; should be ok "
              "at about 1.0x or refused", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(4096, 2048, dtype=torch.bfloat16) / 4096 ** 0.5)
                self.lib = None

            def forward(self, x):
                if self.weight.is_cuda:
                    if self.lib is None:
                        self.lib = persist(self.weight)
                    else:
                        set_aside(self.lib)
                return torch.matmul(x, self.weight)
        ''', MATMUL, max_speedup=HONEST_SPEED),
]

SUITES = {"elementwise": SUITE, "conv_l2": CONV_L2}


def import_problem(folder: Path, problem: Problem = ELEMENTWISE):
    """The problem imported as ``kb.<problem.name>`` (its files under ``folder``); returns the operation."""
    from kernelcast.kernels.formats import import_task

    path = folder / f"{problem.name}_problem.py"
    path.write_text(problem.source)
    op, _ = import_task("kernelbench", str(path), name=problem.name)
    return op


def chosen_kernels(suite: str = "elementwise", names: list[str] | None = None) -> list[Adversary]:
    """The suite's kernels named in ``names`` (all where None); an unknown suite or name is refused by name."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    known = [a.name for a in SUITES[suite]]
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise ValueError(f"no kernel {', '.join(unknown)} in suite {suite}; known: {', '.join(known)}")
    return [a for a in SUITES[suite] if not names or a.name in names]


def run(names: list[str] | None = None, timeline: Path | None = None, suite: str = "elementwise",
        **worker_options) -> list[dict]:
    """Measure the suite's kernels (each problem's reference first) and return a row per kernel, each accepted one
    beside its true runtime; with ``timeline``, the worker's timeline is written there (JSON lines) to see how each
    verdict came about."""
    from kernelcast.kernels.hardware import detect
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig

    chosen = chosen_kernels(suite, names)
    folder = Path(tempfile.mkdtemp(prefix="kernelcast-adversarial-"))
    ops = {p: import_problem(folder, p) for p in dict.fromkeys(a.problem for a in chosen)}
    problem_of = {op.name: p.name for p, op in ops.items()}
    submitted = [(a, ops[a.problem].candidate(a.source())) for a in chosen]
    candidates = {c.candidate_id: a for a, c in submitted}
    rows = []
    config = WorkerConfig(concurrency=min(8, len(chosen)), **worker_options)
    with MeasureWorker(detect(), config) as worker:
        for m in worker.measure([c for _, c in submitted]):
            adversary = candidates.get(m.candidate_id)
            if adversary is None:  # a problem's reference
                rows.append({"name": "reference", "problem": problem_of.get(m.op, m.op), "expect": "ok",
                             "status": m.status, "error": m.error, "runtime_us": list(m.runtime_us_median),
                             "precision": m.precision, "checks": m.checks})
                continue
            rows.append({"name": adversary.name, "problem": adversary.problem.name, "expect": adversary.expect,
                         "what": adversary.what, "status": m.status, "error": m.error[:400], "speedup": m.speedup,
                         "runtime_us": list(m.runtime_us_median), "precision": m.precision, "checks": m.checks,
                         "wall_seconds": m.wall_seconds,
                         **({"max_speedup": adversary.max_speedup} if adversary.max_speedup is not None else {})})
        if timeline is not None:
            names_by_id = {cid: a.name for cid, a in candidates.items()}
            timeline.write_text("".join(json.dumps({"kernel": names_by_id.get(cid, "reference"), "attempt": attempt,
                                                    "phase": phase, "t": round(t, 4), "detail": detail},
                                                   default=str) + "\n"
                                        for cid, attempt, phase, t, detail in worker.timeline))
    folder = Path(tempfile.mkdtemp(prefix="kernelcast-adversarial-truth-"))
    by_name = {a.name: a for a in chosen}
    for r in rows:
        if r["status"] == "ok" and r["name"] in by_name and r["runtime_us"]:
            r["true_runtime_us"], r["traced_span_us"] = true_runtime_us(by_name[r["name"]], folder)
            r["vs_true_runtime"] = r["runtime_us"][0] / r["true_runtime_us"]
        r["verdict_right"] = verdict_right(r)
    return rows


TRUE_WITHIN = 0.10  # a cheat timed at (1 - this) of its true runtime or more is charged for its work


def verdict_right(row: dict) -> bool:
    """Whether the harness's verdict on a suite kernel is what it should be: an honest one accepted; a cheat
    caught, or accepted at no less than its true runtime, within a tenth (a timer that sees all its work has not
    been fooled; one that charges it more, for its streams' synchronisation, has not been either). A kernel with a
    ``max_speedup`` (one that does its own work honestly but could gain from process-wide state), where accepted,
    must also be at no more than that speedup and charged at least as a cheat is. A kernel that says its cheat could
    not be set up (``CHEAT_FAILED``) is never right: it tested nothing."""
    if CHEAT_FAILED in (row.get("error") or ""):
        return False
    if row.get("max_speedup") is not None and row["status"] == "ok":
        ratio, speedup = row.get("vs_true_runtime"), row.get("speedup")
        return (speedup is not None and speedup <= row["max_speedup"]
                and ratio is not None and ratio >= 1.0 - TRUE_WITHIN)
    if row["expect"] == "ok":
        return row["status"] == "ok"
    if row["status"] != "ok":
        return True
    ratio = row.get("vs_true_runtime")
    return ratio is not None and ratio >= 1.0 - TRUE_WITHIN


def _load(path: Path, text: str):
    """``text`` as a module from a file at ``path`` (Triton reads its kernels' source back from the file)."""
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def true_runtime_us(adversary: Adversary, folder: Path, calls: int = 11) -> tuple[float, float]:
    """The kernel's device time as a trace no stream or pending work escapes shows it: each of ``calls`` calls on
    inputs it has not seen (after two warm-up calls) traced alone between device-wide synchronisations; the median
    of the time the device was busy with the call's work on any stream (``busy_us``), and the median span from
    its first activity's start to its last's end.

    Before each call the L2 is flushed and persisting L2 reset, as the harness's timer has them, so a weight a kernel
    marked persisting is read cold here too; torch's switches the kernel's module changed are put back after, so no
    kernel's state reaches the next one's figure (this process measures them all).

    The span is not the runtime: under the profiler the host launches more slowly, and where it launches a
    kernel after the previous one ended the device idles between them (measured on an H100: a CUDA graph's
    calls spanned 2.6 ms for 0.29 ms timed). It is kept for the record."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernelcast.kernels.harness import state
    from kernelcast.kernels.harness.timing import l2_flush_buffer
    from kernelcast.kernels.harness.verify import busy_us, device_activities

    switches = state.snapshot()
    problem = _load(folder / f"{adversary.problem.name}_problem.py", adversary.problem.source)
    module = _load(folder / f"adversary_{adversary.name}.py", adversary.source())
    model = module.ModelNew(*problem.get_init_inputs()).cuda()
    flush = l2_flush_buffer()
    busy, spans = [], []
    try:
        with torch.no_grad():
            for i in range(calls + 2):
                with torch.device("cuda"):
                    inputs = problem.get_inputs()
                flush.zero_()
                state.reset_persisting_l2()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    model(*inputs)
                    torch.cuda.synchronize()
                work = device_activities(prof)
                if i >= 2 and work:
                    busy.append(busy_us(work))
                    spans.append((max(a.end_ns for a in work) - min(a.start_ns for a in work)) / 1e3)
    finally:
        state.restore(switches)
        state.reset_persisting_l2()
        del model, flush
        torch.cuda.empty_cache()
    return statistics.median(busy), statistics.median(spans)


def table(rows: list[dict]) -> str:
    lines = ["| kernel | should be | status | speedup | timed / true runtime | right | why |",
             "|---|---|---|---|---|---|---|"]
    problems = {r.get("problem") for r in rows}
    for r in rows:
        name = f"reference ({r['problem']})" if r["name"] == "reference" and len(problems) > 1 else r["name"]
        expect = r["expect"] + (f", <= {r['max_speedup']}x" if r.get("max_speedup") else "")
        speed = f"{r['speedup']:.2f}" if r.get("speedup") else ""
        ratio = f"{r['vs_true_runtime']:.2f}" if r.get("vs_true_runtime") else ""
        why = (r.get("error") or r.get("precision") or "").replace("|", "/").replace("\n", " ")[:160]
        lines.append(f"| {name} | {expect} | {r['status']} | {speed} | {ratio} | "
                     f"{'yes' if r.get('verdict_right') else 'NO'} | {why} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--suite", default="elementwise", choices=list(SUITES),
                   help="elementwise (the default: cheats of the timer and the checks) or conv_l2 (process-wide "
                        "state: cuDNN off for others, persisting L2)")
    p.add_argument("--only", default="", help="comma-separated kernel names (default: all of the suite)")
    p.add_argument("--protocol", default="kernelcast")
    p.add_argument("--timeline", action="store_true", help="also write the worker's timeline (timeline.jsonl)")
    args = p.parse_args(argv)
    try:
        chosen_kernels(args.suite, [n for n in args.only.split(",") if n] or None)
    except ValueError as exc:
        p.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows = run([n for n in args.only.split(",") if n] or None, suite=args.suite,
               timeline=args.out / "timeline.jsonl" if args.timeline else None, protocol=args.protocol)
    (args.out / "adversarial.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = table(rows)
    wrong = [r["name"] for r in rows if not r.get("verdict_right")]
    text += (f"\n\n{len(rows) - len(wrong)} of {len(rows)} verdicts right; wrong: {', '.join(wrong) or 'none'}; "
             f"{time.time() - started:.0f} s\n")
    (args.out / "adversarial.md").write_text(text)
    print(text)
    return 0 if not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
