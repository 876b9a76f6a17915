"""Anti-cheat checks: a candidate must compute the operation itself, on every call, into fresh outputs.

A kernel can pass a plain correctness check while not being a kernel at all: it calls
the torch operation it should replace (or the harness's reference), returns a cached
result, writes its answer into its inputs or returns a view of them, moves its work to
another CUDA stream so the timer misses it, or computes only on its first calls. Each
of these gets status ``rejected`` with the reason, from these checks:

  scan_source   — a static scan before the source is imported: imports of the
                  project's own packages, frame/module introspection, and calls of
                  the op's forbidden torch functions outside ``@triton.jit`` code.
  CallGuard     — a TorchFunctionMode active around every checked call that records
                  forbidden torch functions however they were reached, plus a hook on
                  the op's reference.
  stream guard  — patches on torch.cuda's stream constructors and setters: the harness
                  never makes a stream in the child, so any stream is the candidate's.
  Checker       — every checked call gets fresh seeded inputs and fresh NaN-poisoned
                  outputs; inputs are compared with a copy afterwards, returned tensors
                  may not share storage with inputs, and a failing call is compared
                  with the results for the inputs it saw before (a cached answer) and
                  with what it wrote before (work skipped after the first calls).

The eager baseline (origin ``seed``) is exempt from the forbidden-call lists, which
name the torch functions it legitimately calls; every other check applies to it too.
"""

from __future__ import annotations

import ast
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from kernelcast.kernels.harness import precision
from kernelcast.kernels.harness.correctness import call_candidate, poisoned_outputs, stray_writes
from kernelcast.kernels.null import is_null
from kernelcast.kernels.ops import Case, Operation, mismatch
from kernelcast.kernels.records import Candidate

PROJECT_PACKAGES = ("kernelcast",)  # the one import name the project installs
# Attributes that reach into the calling harness's frames or module table.
_INTROSPECTION = {"_getframe": "sys._getframe", "f_back": "frame.f_back", "f_locals": "frame.f_locals",
                  "f_globals": "frame.f_globals", "get_referrers": "gc.get_referrers",
                  "get_objects": "gc.get_objects"}
_JIT_DECORATORS = {"jit", "autotune", "heuristics"}


class Rejected(Exception):
    """The candidate cheats; the message says how."""


def forbidden_calls(op: Operation, candidate: Candidate) -> frozenset[str]:
    """Names of torch functions this candidate may not call: the op's list, none for the eager baseline.

    The exemption goes by origin, not backend: a model-written kernel in plain torch may not
    call the function it should replace either. The null candidate (the eager baseline
    submitted as a candidate, kernelcast.kernels.null) is the baseline's code and exempt as it is."""
    if candidate.origin == "seed" or is_null(op, candidate):
        return frozenset()
    return frozenset(getattr(op, "forbidden_calls", ()))


# ---- static scan ---------------------------------------------------------------------------------

def _triton_aliases(tree: ast.AST) -> set[str]:
    names = {"triton", "tl"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("triton")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("triton"):
            names |= {a.asname or a.name for a in node.names}
    return names


def _is_device_code(fn: ast.AST) -> bool:
    """Functions decorated with triton.jit (or autotune/heuristics) are device code: tl.* only."""
    for dec in getattr(fn, "decorator_list", ()):
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in _JIT_DECORATORS:
            return True
    return False


def _host_nodes(tree: ast.AST):
    """Every node outside device-code functions."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_device_code(node):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def scan_source(candidate: Candidate, op: Operation) -> str | None:
    """Why the source is refused before it runs, or None. Unparsable sources are left to the load stage."""
    try:
        tree = ast.parse(candidate.source)
    except SyntaxError:
        return None
    forbidden = forbidden_calls(op, candidate)
    triton_names = _triton_aliases(tree)
    torch_names = _torch_imports(tree)
    for node in _host_nodes(tree):
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [node.module or ""]
        elif isinstance(node, ast.ImportFrom):
            return f"line {node.lineno}: relative import; a candidate is a single module"
        for m in modules:
            if m.split(".")[0] in PROJECT_PACKAGES:
                return (f"line {node.lineno}: imports {m}, the project's own code; a candidate may not use "
                        f"the harness or the reference")
        if isinstance(node, ast.Attribute) and node.attr in _INTROSPECTION:
            return f"line {node.lineno}: uses {_INTROSPECTION[node.attr]}, which reaches into the harness"
        if isinstance(node, ast.Attribute) and node.attr == "modules" and getattr(node.value, "id", "") == "sys":
            return f"line {node.lineno}: uses sys.modules, which reaches into the harness"
        if isinstance(node, ast.Attribute) and node.attr in _DISPATCH_OFF:
            return (f"line {node.lineno}: uses {ast.unparse(node)}, which turns off torch's function dispatch, "
                    f"where the harness's guard of forbidden calls stands")
        if isinstance(node, ast.Attribute) and forbidden and _aten_name(node) in forbidden:
            return (f"line {node.lineno}: uses {ast.unparse(node)}, torch's own operator for the {op.name} it "
                    f"should compute itself")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and "matmul" in forbidden:
            return f"line {node.lineno}: computes with torch's '@' (matmul), the operation it should replace"
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in forbidden:
                base = func.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if getattr(base, "id", None) not in triton_names:
                    return (f"line {node.lineno}: calls {ast.unparse(func)}, a route to the {op.name} it "
                            f"should compute itself")
            if isinstance(func, ast.Name) and torch_names.get(func.id) in forbidden:
                return (f"line {node.lineno}: calls {func.id} (torch's {torch_names[func.id]}), a route to the "
                        f"{op.name} it should compute itself")
    return None


# Ways to switch off __torch_function__ (and with it ``CallGuard``) for the calls made under them.
_DISPATCH_OFF = {"DisableTorchFunction", "DisableTorchFunctionSubclass", "_disabled_torch_function_impl",
                 "_DisableTorchDispatch", "_DisableFuncTorch", "_ExcludeDispatchKeyGuard", "_unset_torch_function_mode",
                 "_pop_torch_function_stack", "_pop_mode", "_pop_torch_dispatch_stack"}


def _aten_name(node: ast.Attribute) -> str:
    """The operator an ``ops.aten.<name>[.<overload>]`` expression names ("" for anything else), without the
    leading underscore ATen's internal variants carry (``_softmax``)."""
    chain = []
    value = node
    while isinstance(value, ast.Attribute):
        chain.append(value.attr)
        value = value.value
    chain.reverse()  # e.g. ops, aten, _softmax, default
    for i in range(len(chain) - 1):
        if chain[i] == "ops" and chain[i + 1] == "aten" and len(chain) > i + 2:
            name = chain[i + 2]
            return name if len(chain) == i + 3 or node.attr == chain[-1] else ""
    return ""


def _torch_imports(tree: ast.AST) -> dict[str, str]:
    """Bare names bound by ``from torch... import x [as y]``: y -> x. Builtins such as max stay unflagged."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names.update({a.asname or a.name: a.name for a in node.names})
    return names


# ---- runtime guards ------------------------------------------------------------------------------

def _func_name(func) -> str:
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__"):  # a property such as Tensor.T reaches the mode as its getter
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class CallGuard(TorchFunctionMode):
    """Records (and refuses) calls of forbidden torch functions, and of the op's reference, while active."""

    def __init__(self, op: Operation, candidate: Candidate):
        super().__init__()
        self.op = op
        self.forbidden = forbidden_calls(op, candidate)
        self.violations: list[str] = []
        self._reference = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = _func_name(func)
        if name in self.forbidden:
            self._violate(f"called torch's {name} while it runs, the operation it should replace")
        return func(*args, **(kwargs or {}))

    def _violate(self, what: str) -> None:
        self.violations.append(what)
        raise Rejected(what)

    def __enter__(self):
        # The reference is an attribute of the op's class; replace it on the instance while active.
        original = type(self.op).reference

        def refused(*args, **kwargs):
            self._violate("called the harness's reference implementation")
            return original(self.op, *args, **kwargs)

        self.op.reference = refused
        return super().__enter__()

    def __exit__(self, *exc):
        self.op.__dict__.pop("reference", None)
        return super().__exit__(*exc)

    def reason(self) -> str | None:
        return self.violations[0] if self.violations else None


STREAM_EVENTS: list[str] = []  # what the candidate did with CUDA streams in this child


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _called_from_torch(depth: int = 2) -> bool:
    """Whether the caller of the guarded function is torch's own code (CUDA graph capture, cudagraph trees)."""
    return sys._getframe(depth).f_code.co_filename.startswith(_TORCH_DIR)


def install_stream_guard() -> None:
    """Refuse stream creation and switching in this process: the timer measures the current stream only.

    Installed where verification is off: with it on, a trace of each timed call shows any work that
    escapes the timed window, so a candidate's own streams (a CUDA graph captured on a stream it made,
    work joined back to the timed stream) are judged by what they do, not refused for existing.

    Installed once in the child before the candidate's source is imported, so names the
    source binds (``from torch.cuda import Stream``) are the guarded ones. Torch's own
    code may still make and switch streams for the candidate: capturing a CUDA graph
    (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``) needs a side stream,
    and the graph it captures is replayed on the current stream, where it is timed. The
    candidate's own code may not.
    """
    cuda = torch.cuda

    def refuse(what: str, original=None):
        def refused(*args, **kwargs):
            if original is not None and _called_from_torch():
                return original(*args, **kwargs)
            STREAM_EVENTS.append(what)
            raise Rejected(f"{what}: kernels must run on the harness's stream, where they are timed")
        return refused

    # torch.cuda.current_stream() (and Triton's launcher through it) wraps the stream that
    # already exists as Stream(stream_id=...); only a Stream made without one is a new stream.
    make_stream = cuda.Stream.__new__
    refuse_new = refuse("created a CUDA stream (Stream)")

    def stream_new(cls, *args, **kwargs):
        if "stream_id" in kwargs or _called_from_torch():
            return make_stream(cls, *args, **kwargs)
        return refuse_new()

    cuda.Stream.__new__ = staticmethod(stream_new)
    cuda.ExternalStream.__new__ = staticmethod(refuse("created a CUDA stream (ExternalStream)"))
    cuda.set_stream = refuse("switched the current CUDA stream (set_stream)", cuda.set_stream)
    cuda.StreamContext.__enter__ = refuse("switched the current CUDA stream (torch.cuda.stream)",
                                          cuda.StreamContext.__enter__)
    if hasattr(torch._C, "_cuda_setStream"):
        torch._C._cuda_setStream = refuse("switched the current CUDA stream (_cuda_setStream)",
                                          torch._C._cuda_setStream)


# ---- checked calls -------------------------------------------------------------------------------

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def plain_tensors(got) -> None:
    """Refuse returned tensors of other types: a subclass can compute lazily, when its values are read."""
    for j, g in enumerate(got):
        if isinstance(g, torch.Tensor) and type(g) not in _PLAIN:
            raise Rejected(f"output {j} is a {type(g).__module__}.{type(g).__name__}, not a plain tensor: an output "
                           f"that computes when it is read is not computed in the timed call")


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_contiguous() and b.is_contiguous() and a.numel():
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return torch.equal(a, b)


def warm_comparisons(op, cases, device) -> int:
    """The checks' comparisons run once on tensors of four elements, one per output dtype of ``cases`` (an op that
    declares no outputs: its inputs' dtypes), on ``device``; returns how many dtypes were warmed. No case's data is
    made.

    In a fresh process the first launch of each of the comparisons' kernels (the inputs left unchanged, the
    outputs written, the reference within tolerance, the error against float64) loads it: the worker's lock
    breakdown puts about 200 ms on a check's first case and 3-16 ms on each later one (H100). Called before the
    GPU lock (``WorkerConfig.warm_checks``), the loading is paid outside it, for a few launches of a few
    microseconds beside another child's work. A dtype the comparisons cannot take is skipped: warming never
    fails a candidate."""
    from kernelcast.kernels.harness import precision
    from kernelcast.kernels.harness.budget import meta_inputs
    from kernelcast.kernels.ops.base import mismatch

    dtypes: dict[str, tuple] = {}
    for case in cases:
        try:
            # An op whose candidates return their outputs (an imported task) declares none: its inputs' dtypes,
            # made on the meta device (no memory), stand for them.
            found = [dtype for _, dtype in op.output_specs(case)] or [
                t.dtype for t in meta_inputs(op, case) if isinstance(t, torch.Tensor)]
        except Exception:  # noqa: BLE001 - a case the meta device cannot describe: nothing to warm for it
            continue
        for dtype in found:
            dtypes.setdefault(str(dtype), (dtype, case))
    warmed = 0
    for dtype, case in dtypes.values():
        try:
            t = torch.ones(4, dtype=dtype, device=device)
            copy = t.clone()
            _same_bytes(t, copy)
            _untouched(t)
            mismatch(op, case, (t,), (copy,))
            precision.relative_error((t,), (copy,))
        except Exception:  # noqa: BLE001 - a dtype the comparisons do not take here: the check will say so itself
            continue
        warmed += 1
    if device != "cpu":
        torch.cuda.synchronize()
    return warmed


# Inputs up to this size are copied to check that a call left them unchanged; larger ones are made
# again from their seed instead, so a check never holds two copies of a gigabyte case.
COPY_INPUTS_BYTES = 256 << 20


def _poison_writable(inputs, writable: set[int]) -> None:
    """Fill output buffers passed among the inputs with NaN (or an extreme integer), so unwritten elements show."""
    for i in writable:
        t = inputs[i]
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        elif t.dtype != torch.bool and not t.dtype.is_complex:
            t.fill_(torch.iinfo(t.dtype).max)


def _untouched(t: torch.Tensor) -> bool:
    if t.dtype.is_floating_point:
        return bool(torch.isnan(t.float()).all())
    return bool((t == torch.iinfo(t.dtype).max).all())


@dataclass
class Unseen:
    """One call's worth of inputs the candidate has not been given yet (``Checker.prepare``)."""

    case: Case
    seed: int
    inputs: tuple
    outputs: tuple
    writable: set


SECONDS_CHECKED = 1.0  # a case whose calls take this long is checked on as many seeds as it took to know it


class Checker:
    """Calls one candidate on fresh inputs, case by case, remembering enough to recognise cheats.

    Inputs come from ``op.make_inputs`` with a seed per call, so any earlier call's inputs
    (and their reference result) can be rebuilt on demand instead of kept in memory.
    """

    def __init__(self, op: Operation, candidate: Candidate, launch: Callable, device: str,
                 on_inputs: Callable[[], None] = lambda: None, measure_precision: bool = False,
                 on_first_call: Callable[[str, float], None] = lambda case, seconds: None,
                 on_first_call_start: Callable[[str], None] = lambda case: None,
                 draw: Callable[[str, int], int] | None = None, record: Callable[..., None] | None = None):
        self.op, self.candidate, self.launch, self.device = op, candidate, launch, device
        # The protocol's seeds (0 compile, 1.. checks, 1000.. timing, 5000.. fresh, 9000 recheck) name input sets;
        # the values are drawn when first used (by the worker, from the operating system, in a child): a candidate
        # that has read this source still cannot make the inputs ahead of the call that gets them.
        self._draw = draw or (lambda case, keys: [int.from_bytes(os.urandom(8), "little") >> 1 for _ in keys])
        self.drawn: dict[tuple[str, int], int] = {}
        self._record = record  # (case, drawn seed, role, outputs): a checked call's outputs, for the judge
        self._recorded: set[tuple[str, str]] = set()
        self.seeds: dict[str, list[int]] = {}  # case -> seeds of the inputs it was called with, in order
        self.wrote: dict[str, bool] = {}  # case -> some earlier call wrote into the harness outputs
        self.calls = 0
        self.first_call_seconds: dict[str, float] = {}  # case -> seconds its first call took
        self.call_seconds: dict[str, float] = {}  # case -> seconds its latest call took
        self._on_inputs = on_inputs  # told once, when the first inputs are made on the device
        self._on_first_call = on_first_call  # told each case's first call's seconds, as soon as it returns
        self._on_first_call_start = on_first_call_start  # told as each case's first call begins
        self.measure_precision = measure_precision
        self.precision: dict[str, dict] = {}  # case -> its errors against float64 (kernelcast.kernels.harness.precision)

    def _precision(self, case: Case, inputs, got) -> dict:
        if self.device != "cpu":
            free, _ = torch.cuda.mem_get_info()
            if not precision.fits(inputs, free):
                return {"precision": "not measured: float64 copies of the case do not fit beside it"}
        return precision.errors(self.op, case, inputs, got)

    def inputs(self, case: Case, seed: int) -> tuple[torch.Tensor, ...]:
        if self._on_inputs is not None:
            self._on_inputs()
            self._on_inputs = None
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.drawn_seed(case, seed))
        return self.op.make_inputs(case, gen, self.device)

    def drawn_seed(self, case: Case, seed: int) -> int:
        """The value behind the protocol's seed ``seed`` of ``case``: drawn at its first use, the same after."""
        self.draw(case, [seed])
        return self.drawn[(case.name, seed)]

    def draw(self, case: Case, seeds) -> None:
        """Draw the values behind the protocol's ``seeds`` of ``case`` not drawn yet, in one request: for input sets
        made together, with no call of the candidate between the draw and the making."""
        new = [s for s in dict.fromkeys(seeds) if (case.name, s) not in self.drawn]
        if new:
            self.drawn.update(zip(((case.name, s) for s in new), self._draw(case.name, new)))

    def record(self, case: Case, seed: int, role: str, got) -> None:
        """Keep a call's outputs for the judge (nothing where no judge reads them): one checked and one rechecked call
        a case (the first; the others are checked here alone), every timed call the caller passes."""
        if self._record is None or (role != "timed" and (case.name, role) in self._recorded):
            return
        self._recorded.add((case.name, role))
        self._record(case.name, self.drawn_seed(case, seed), role, got)

    def note(self, case: Case, seed: int, wrote: bool = True) -> None:
        """Record an unchecked call (compile stage, timing) made with the inputs of ``seed``."""
        self.seeds.setdefault(case.name, []).append(seed)
        self.wrote[case.name] = self.wrote.get(case.name, False) or wrote
        self.calls += 1

    def first_call(self, case: Case, seed: int = 0) -> None:
        """The first call per case: guarded, but only recorded (its reference is not computed here)."""
        inputs = self.inputs(case, seed)
        writable = set(self.op.writable_inputs(case))
        _poison_writable(inputs, writable)
        outputs = poisoned_outputs(self.op, case, self.device)
        got = self._timed_call(case, inputs, outputs)
        self.note(case, seed, wrote=any(not _untouched(o) for o in outputs))
        self._aliasing(inputs, got, writable)

    def check(self, case: Case, seed: int, role: str = "check") -> str | None:
        """One checked call: None when correct, a problem (``incorrect``) as text, or ``Rejected``."""
        inputs = self.inputs(case, seed)
        writable = set(self.op.writable_inputs(case))
        _poison_writable(inputs, writable)
        # Large inputs are not copied (a second copy of a gigabyte case): made again from their seed afterwards.
        small = sum(t.numel() * t.element_size() for t in inputs) <= COPY_INPUTS_BYTES
        before = tuple(None if i in writable else t.clone() for i, t in enumerate(inputs)) if small else None
        outputs = poisoned_outputs(self.op, case, self.device)
        got = self._timed_call(case, inputs, outputs)
        self._unchanged(case, seed, inputs, before, writable)
        self._aliasing(inputs, got, writable)
        earlier = list(self.seeds.get(case.name, ()))
        wrote_now = any(not _untouched(o) for o in outputs)
        self.note(case, seed, wrote=wrote_now)
        stray = stray_writes(outputs)
        if stray:
            return f"case {case.name}: {stray}"
        problem = self.op.check(case, inputs, got)
        if problem is None:
            self.record(case, seed, role, got)  # what this process found correct, for the judge to decide
            if self.measure_precision and case.name not in self.precision:
                self.precision[case.name] = self._precision(case, inputs, got)
            return None
        returned_harness_outputs = all(g is o for g, o in zip(got, outputs)) and len(got) == len(outputs)
        if returned_harness_outputs and not wrote_now and self.wrote.get(case.name) and earlier:
            raise Rejected(f"case {case.name}: wrote its outputs on earlier calls but nothing on call "
                           f"{self.calls}: it computes only on its first calls")
        for old in list(dict.fromkeys(reversed(earlier)))[:4]:
            if old != seed and mismatch(self.op, case, got, self.op.reference(*self.inputs(case, old))) is None:
                raise Rejected(f"case {case.name}: returned the result for earlier inputs (seed {old}), not for "
                               f"the ones it was given: it caches its output across calls")
        return problem

    def _timed_call(self, case: Case, inputs, outputs):
        """A guarded call, finished on the device; the first per case is timed (wall clock, warm-up included)."""
        if case.name not in self.first_call_seconds:
            self._on_first_call_start(case.name)
        t0 = time.perf_counter()
        got = self._guarded(inputs, outputs)
        self._sync()
        self.call_seconds[case.name] = time.perf_counter() - t0
        if case.name not in self.first_call_seconds:
            self.first_call_seconds[case.name] = self.call_seconds[case.name]
            self._on_first_call(case.name, self.first_call_seconds[case.name])
        return got

    def enough_seeds(self, case: Case, was_first: bool) -> bool:
        """Whether the checks of ``case`` may stop at the seeds checked so far: its latest call, not its first
        (which may have compiled), took a second or more (``SECONDS_CHECKED``). Each further seed would hold the
        device for seconds, and the verification's unseen inputs and the recheck check it on three more input
        sets. Measured on an H100: GPU MODE's linalg/eigh spent 291 s of its 1,021 s under the lock in its checks,
        three seeds of 13 cases, five of them with calls of 9-15 s."""
        return not was_first and self.call_seconds.get(case.name, 0.0) >= SECONDS_CHECKED

    def _guarded(self, inputs, outputs):
        guard = CallGuard(self.op, self.candidate)
        try:
            with guard:
                got = call_candidate(self.launch, inputs, outputs, self.candidate.params)
        except Exception:
            if guard.reason():
                raise Rejected(guard.reason()) from None
            raise
        if guard.reason():  # refused, but the candidate caught our exception and carried on
            raise Rejected(guard.reason())
        if STREAM_EVENTS:
            raise Rejected(f"{STREAM_EVENTS[0]}: kernels must run on the harness's stream, where they are timed")
        plain_tensors(got)
        return got

    def prepare(self, case: Case, seed: int) -> "Unseen":
        """Inputs (writable ones poisoned) and outputs for a call on inputs the candidate has never seen."""
        inputs = self.inputs(case, seed)
        writable = set(self.op.writable_inputs(case))
        _poison_writable(inputs, writable)
        return Unseen(case, seed, inputs, poisoned_outputs(self.op, case, self.device), writable)

    def fresh(self, unseen: "Unseen", run: Callable[[Callable[[], object]], object]) -> str | None:
        """The call on ``unseen`` (from ``prepare``), made (and timed) by ``run``, its outputs judged afterwards.

        Not guarded (the timed calls are not either, and a guard's overhead would skew the comparison
        with the timed calls beside it); what it returns is checked as a checked call's is."""
        case, inputs, outputs = unseen.case, unseen.inputs, unseen.outputs
        got = run(lambda: call_candidate(self.launch, inputs, outputs, self.candidate.params))
        self._sync()
        self.note(case, unseen.seed)
        plain_tensors(got)
        self._aliasing(inputs, got, unseen.writable)
        stray = stray_writes(outputs)
        if stray:
            return f"case {case.name}: {stray}"
        problem = self.op.check(case, inputs, got)
        if problem is None:  # the recheck the judge reads: a call on fresh inputs and outputs after the timing
            self.record(case, unseen.seed, "recheck", got)
        return problem

    def _unchanged(self, case: Case, seed: int, inputs, before, writable: set[int]) -> None:
        """Refuse a call that changed a read-only input (compared with a copy, or with the inputs made again)."""
        if before is None:
            before = self.inputs(case, seed)
        for i, (now, then) in enumerate(zip(inputs, before)):
            if i not in writable and then is not None and not _same_bytes(now, then):
                names = self.op.input_names()
                raise Rejected(f"case {case.name}: changed its input {names[i] if i < len(names) else i}; "
                               f"inputs are read-only")

    @staticmethod
    def _aliasing(inputs, got, writable: set[int] = frozenset()) -> None:
        """Refuse returned tensors that share memory with a read-only input (an output buffer may be returned)."""
        storages = {t.untyped_storage().data_ptr(): i for i, t in enumerate(inputs) if t.numel() and i not in writable}
        for j, g in enumerate(got):
            if isinstance(g, torch.Tensor) and g.numel() and g.untyped_storage().data_ptr() in storages:
                raise Rejected(f"output {j} shares memory with input {storages[g.untyped_storage().data_ptr()]}: "
                               f"it returns a view of its input instead of computing a new tensor")

    def _sync(self) -> None:
        if self.device != "cpu":
            torch.cuda.synchronize()
