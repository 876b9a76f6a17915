"""What a kernel makes the device do, found on the CPU: its calls on meta tensors, recorded.

``extract(op, candidate, case, target)`` runs the candidate once on the case's inputs made on the
*meta* device (shapes and dtypes, no memory, no compute) and records:

- every ATen operator it dispatches (a ``TorchDispatchMode``): which launch a kernel and which are
  views, the bytes each reads and writes, the library behind it (cuBLAS, cuDNN, SDPA), its dtypes;
  FLOPs from the formulas of torch's own flop counter (``torch.utils.flop_counter``);
- every Triton launch: the kernel compiled for ``target`` (``cuda:90``: no GPU needed, the compile
  path the harness uses ahead, ``kernelcast.kernels.harness.ahead.compile_only``), its grid evaluated
  on the case's arguments, registers, shared memory and spilled (local) bytes from the cubin's
  resource report (``cuobjdump --dump-resource-usage``: a compiled kernel's ``n_regs`` and
  ``n_spills`` are only filled in when a GPU loads it), warps and stages from its metadata, the
  widest global load per thread and whether it uses tensor cores from its PTX;
- ``torch.compile`` and CUDA graphs, recognised by standing in for them while the call runs (the
  compile becomes eager, a capture runs its body once and a replay nothing), so the operators
  behind them are still counted;
- which of the judge's rules (or CUDA's) it breaks, from one more call on inputs of its own, as the checks
  make (``_RuleWatch``, ``_later_call``): a write into an input, an output that is an input, a CUDA graph whose
  replay reads an earlier call's input or a tensor let go since its capture, a capture on the default stream; and
  each output's shape, strides and dtype, which the forecaster sets against the reference's.

A meta tensor answers ``is_cuda`` as a CUDA tensor does, so a kernel is read down the path it takes on the GPU.
A Triton compile error is a failure found without a GPU (``status`` "compile_error"). Host code
that cannot run on meta tensors (data-dependent, ``.item()``, a library the CPU build lacks) is
recorded as "host_error" with the reason: nothing is known then, which is not a failure.

Facts are cached by (source, parameters, operation, case, target): a search forecasts many
candidates sharing a source, and the extraction is the costly part of a forecast. In memory always, and
with ``cache_dir`` in one JSON file a job there too (``DEFAULT_CACHE_DIR``: a pool's facts take minutes on
two cores), under a folder named by this module's own text and the installed torch and Triton, so facts
found by other code are never read back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import torch
from torch.multiprocessing.reductions import StorageWeakRef

# ATen operators that launch no kernel: views, metadata, allocation without a fill
_NO_KERNEL = re.compile(r"^(view|_unsafe_view|reshape|t|transpose|permute|expand|as_strided|slice|select|unsqueeze|"
                        r"squeeze|alias|detach|lift_fresh|_reshape_alias|unfold|split|split_with_sizes|chunk|"
                        r"narrow|view_as_real|view_as_complex|empty|empty_like|empty_strided|new_empty|"
                        r"new_empty_strided|_to_copy_meta|is_same_size|sym_size|sym_stride|sym_numel|"
                        r"resize_|set_|_local_scalar_dense|unbind|diagonal|movedim|flatten|unflatten|"
                        r"expand_as|view_as|contiguous|numpy_T|_has_compatible_shallow_copy_type)$")
_LIBRARY = (("cublas", re.compile(r"^(mm|bmm|addmm|addbmm|baddbmm|_addmm_activation|addmv|mv|dot|matmul|"
                                   r"_scaled_mm|linear)$")),
            ("cudnn", re.compile(r"convolution|cudnn|conv\d?d|conv_transpose|_batch_norm|native_batch_norm|"
                                 r"batch_norm")),
            ("sdpa", re.compile(r"scaled_dot_product")))
_REDUCTION = re.compile(r"^(sum|mean|amax|amin|max|min|argmax|argmin|norm|linalg_vector_norm|var|std|var_mean|"
                        r"_softmax|_log_softmax|logsumexp|prod|cumsum|cumprod|native_layer_norm|"
                        r"native_group_norm|_native_batch_norm_legit\w*|topk|sort|any|all)$")
_PTX_LOAD = re.compile(r"\bld\.global(?:\.[\w:]+?)*?(?:\.v(\d))?\.(?:b|f|u|s)(\d+)\b")
_PTX_ASYNC = re.compile(r"\bcp\.async(?!\.bulk)(?:\.\w+)*\.shared(?:::\w+)?\.global(?:\.\w+)*\s+\[[^\]]+\],\s*\[[^\]]+\],"
                        r"\s*(\d+)")
_PTX_BULK = re.compile(r"\bcp\.async\.bulk")
_PTX_STORE = re.compile(r"\bst\.global(?:\.[\w:]+?)*?(?:\.v(\d))?\.(?:b|f|u|s)(\d+)\b")
_RESOURCE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


@dataclass(frozen=True)
class TritonLaunch:
    """One launch of a compiled Triton kernel on the case's shapes."""

    kernel: str
    programs: int  # the grid's product
    num_warps: int
    num_stages: int
    registers: int  # per thread, from the cubin (-1 when the report could not be read)
    shared_bytes: int  # per program
    spill_bytes: int  # local memory per thread (spilled registers)
    load_bits: int  # widest global load per thread, in bits (a vectorised load is 128)
    loads: int  # global load instructions in the PTX (static count)
    stores: int
    tensor_cores: bool  # mma / wgmma in the PTX
    arg_bytes: int  # bytes of the tensors passed: the traffic a kernel that reads and writes each once moves
    autotune_group: int = -1  # launches of one autotuner call share a group: only the fastest config runs
    loop: bool = False  # a loop in the kernel (scf.for / scf.while in its TTGIR): its loads are pipelined by stages


@dataclass(frozen=True)
class AtenOp:
    """One kernel-launching ATen operator as dispatched (views and allocations are counted, not listed)."""

    name: str
    bytes: int  # its inputs' and outputs' bytes
    flops: float
    library: str  # cublas, cudnn, sdpa or "" (a native kernel)
    dtype: str
    reduction: bool


@dataclass(frozen=True)
class KernelFacts:
    """What one candidate makes the device do on one case, for one compile target."""

    status: str  # ok, compile_error (fails without a GPU), host_error (nothing known), unknown
    error: str = ""
    target: str = ""
    aten: tuple[AtenOp, ...] = ()
    views: int = 0  # ATen operators that launch nothing (host time only)
    triton: tuple[TritonLaunch, ...] = ()
    compiled: bool = False  # torch.compile was called
    graphed: bool = False  # a CUDA graph was captured or replayed
    allow_tf32: bool = False  # fp32 matmuls may use TF32 (the candidate set the flag)
    autocast: str = ""  # the dtype CUDA autocast ran library calls in ("" where it was off)
    input_bytes: int = 0  # the case's inputs and the model's parameters
    output_bytes: int = 0
    flops: float = 0.0  # the ATen operators' FLOPs (torch.utils.flop_counter's formulas)
    seconds: float = 0.0  # what the extraction cost on the CPU
    # per call of a CUDA C++ extension's function (load_inline, not built here): its extension, function and the
    # bytes of its tensors and of an output shaped like its first (a guess)
    cuda_kernels: tuple[dict, ...] = field(default_factory=tuple)
    # What the judge's rules read, found on a later call on other inputs as the checks make (``_RuleWatch``): a write
    # into one of the call's inputs, an output that is (a view of) an input, a CUDA graph replayed that reads an
    # earlier call's inputs (captured off them: every replay reads the first call's), cuDNN autotuning turned on
    # during the call (repeated inputs then run faster than new ones); and each output's (shape, strides, dtype)
    writes_input: bool = False
    returns_input: bool = False
    graph_stale_input: bool = False
    graph_reads_freed: bool = False  # a graph replayed reads a tensor made outside its capture and let go since
    graph_default_stream: bool = False  # a capture begun on the default stream (CUDA refuses it)
    cudnn_benchmark: bool = False
    outputs: tuple[tuple, ...] = ()

    @property
    def launches(self) -> int:
        return len(self.aten) + len(self.triton) + len(self.cuda_kernels)

    @property
    def aten_bytes(self) -> int:
        return sum(o.bytes for o in self.aten)

    def libraries(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.aten:
            if o.library:
                out[o.library] = out.get(o.library, 0) + 1
        return out


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every ATen operator dispatched: kernel-launching ones with bytes, FLOPs and library."""

    def __init__(self):
        super().__init__()
        self.ops: list[AtenOp] = []
        self.views = 0
        self.capture: list[AtenOp] | None = None  # the operators a CUDA graph being captured holds
        self.autocast: str = ""  # the dtype CUDA autocast runs library calls in, while it is on
        self.rules = _RuleWatch()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__.rstrip("_") if func.overloadpacket.__name__ != "t_" else "t"
        base = func.overloadpacket.__name__
        ins = list(_tensors(args)) + list(_tensors(kwargs.values()))
        if _NO_KERNEL.match(base) or _NO_KERNEL.match(name) or getattr(func, "is_view", False):
            self.rules.see(func, args, kwargs, ins, out, launches=False)
            self.views += 1
            return out
        self.rules.see(func, args, kwargs, ins, out)
        outs = list(_tensors(out if isinstance(out, (tuple, list)) else [out]))
        moved = sum(_nbytes(t) for t in {id(t): t for t in ins + outs}.values())
        library = next((lib for lib, rx in _LIBRARY if rx.search(name)), "")
        dtype = str((ins or outs or [torch.empty(0)])[0].dtype).removeprefix("torch.")
        if self.autocast and library and dtype == "float32":  # autocast: the library call runs in half the bytes
            dtype, moved = self.autocast, moved // 2
        self.ops.append(AtenOp(name, int(moved), _flops(func, args, kwargs, out), library, dtype,
                               bool(_REDUCTION.match(name))))
        if self.capture is not None:
            self.capture.append(self.ops[-1])
        return out


def _storage(t) -> int:
    """Which storage a tensor views (meta tensors have storages of their own too): 0 where it has none."""
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - a tensor subclass without a storage
        return 0


class _RuleWatch:
    """What the judge's rules read of the operators dispatched: writes into the call's inputs, what a CUDA graph being
    captured reads (``graph_held``) and makes (``graph_made``), cuDNN autotuning switched on."""

    def __init__(self):
        self.inputs: set[int] = set()  # the storages of this call's inputs
        self.earlier: set[int] = set()  # of earlier calls' inputs
        self.written: set[int] = set()  # the storages written during this call
        self.graph_held: dict | None = None  # while a graph is captured: storage -> a weak reference, of what it reads
        self.graph_made: set[int] | None = None  # the storages the capture's own operators made
        self.writes_input = self.cudnn_benchmark = False
        self.benchmark_before = torch.backends.cudnn.benchmark

    def new_call(self, inputs) -> None:
        self.earlier |= self.inputs
        self.inputs = {k for k in (_storage(t) for t in _tensors(inputs)) if k}
        self.written = set()

    def see(self, func, args, kwargs, tensors: list, out=None, launches: bool = True) -> None:
        """One operator dispatched, ``tensors`` its tensor arguments; ``launches``: whether it runs a kernel (a view
        or an allocation reads no data)."""
        read = {k for k in (_storage(t) for t in tensors) if k}
        if self.graph_held is not None:
            made = {k for k in (_storage(t) for t in _tensors(out if isinstance(out, (tuple, list)) else [out])) if k}
            self.graph_made |= made - read
            if launches:
                for t in tensors:  # held weakly: what the capture reads (those it made are left out at replay)
                    key = _storage(t)
                    if key and key not in self.graph_held:
                        self.graph_held[key] = StorageWeakRef(t.untyped_storage())
        written = {k for k in (_storage(t) for t in _written(func, args, kwargs)) if k}
        if func.overloadpacket.__name__ == "copy_" and len(read) == 1:
            written = set()  # a tensor copied onto itself (a buffer that is the input): nothing changes
        self.written |= written
        if written & self.inputs:
            self.writes_input = True
        if torch.backends.cudnn.benchmark and not self.benchmark_before:
            self.cudnn_benchmark = True

    def stale(self, reads) -> bool:
        """Whether a graph replayed now, reading ``reads``, reads an earlier call's input this call has not
        written: what it reads is the first call's."""
        return bool(reads & self.earlier - self.inputs - self.written)


def _written(func, args, kwargs):
    """The tensors an operator writes in place (its schema's mutable arguments, ``out=`` among them)."""
    try:
        schema = func._schema.arguments
    except AttributeError:
        return
    for i, a in enumerate(schema):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
        yield from _tensors([value])


def _flops(func, args, kwargs, out) -> float:
    """The operator's FLOPs by torch's own flop counter's formulas (0 for the operators it has none for)."""
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(func.overloadpacket)
    if formula is None:
        return 0.0
    try:
        return float(formula(*args, **kwargs, out_val=out))
    except Exception:  # noqa: BLE001 - a formula that does not fit this overload's arguments
        return 0.0


@lru_cache(maxsize=1)
def _cuobjdump() -> str:
    """Triton's own cuobjdump (it ships ptxas, cuobjdump and nvdisasm), else one on PATH, else ''."""
    import triton.backends.nvidia as nvidia

    bundled = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    if os.path.exists(bundled):
        return bundled
    from shutil import which

    return which("cuobjdump") or ""


def kernel_resources(cubin: bytes) -> tuple[int, int, int]:
    """(registers per thread, static shared bytes, local bytes per thread) from a cubin's resource report;
    (-1, 0, 0) when it cannot be read."""
    tool = _cuobjdump()
    if not tool or not cubin:
        return -1, 0, 0
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                              timeout=30).stdout
    m = _RESOURCE.search(text)
    return (int(m.group(1)), int(m.group(3)), int(m.group(4))) if m else (-1, 0, 0)


def ptx_facts(ptx: str) -> tuple[int, int, int, bool]:
    """(widest global load in bits, global loads, global stores, uses tensor cores) of a kernel's PTX; asynchronous
    copies to shared memory count as loads (``cp.async`` of their width, TMA's bulk copies as 128-bit)."""
    loads = [(int(v or 1) * int(bits)) for v, bits in _PTX_LOAD.findall(ptx)]
    loads += [8 * int(n) for n in _PTX_ASYNC.findall(ptx)] + [128] * len(_PTX_BULK.findall(ptx))
    stores = _PTX_STORE.findall(ptx)
    return max(loads, default=0), len(loads), len(stores), bool(re.search(r"\b(?:w?gmma|mma\.sync)", ptx))


def _grid_programs(grid, arg_names, args, kwargs) -> int:
    if callable(grid):
        meta = dict(zip(arg_names, args))
        meta.update(kwargs)
        grid = grid(meta)
    dims = [int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,))]
    n = 1
    for d in dims:
        n *= max(d, 0)
    return n


@contextlib.contextmanager
def _stand_ins(state: dict, recorder: _Recorder):
    """torch.compile as eager, a CUDA graph's capture as a plain call whose operators ``recorder`` keeps, its
    replay as those operators again, synchronisation as nothing; each use noted in ``state`` (restored on exit)."""
    cuda = torch.cuda
    saved = {"compile": torch.compile, **{n: getattr(cuda, n, None) for n in (
        "CUDAGraph", "graph", "synchronize", "Stream", "stream", "current_stream", "make_graphed_callables",
        "is_available", "Event", "current_device", "set_device", "device_count", "get_device_properties",
        "get_device_capability", "empty_cache", "get_device_name")}}
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision(),
             torch.backends.cudnn.allow_tf32)
    benchmark = torch.backends.cudnn.benchmark

    def compile_(model=None, *args, **kwargs):
        state["compiled"] = True
        return model if model is not None else (lambda m: m)

    class Graph:
        def __init__(self, *args, **kwargs):
            state["graphed"] = True
            self.ops: list[AtenOp] = []
            self.held: dict = {}  # storage -> a weak reference to it, of what its captured operators read
            self.made: set[int] = set()  # the storages its captured operators made

        def capture_begin(self, *args, **kwargs):
            if not state.get("side_stream"):  # torch.cuda.graph captures on a stream of its own; a bare capture_begin
                state["graph_default_stream"] = True  # on the default stream is refused by CUDA
            recorder.capture = self.ops
            recorder.rules.graph_held, recorder.rules.graph_made = self.held, self.made

        def capture_end(self):
            recorder.capture = None
            recorder.rules.graph_held = recorder.rules.graph_made = None

        def replay(self):
            recorder.ops.extend(self.ops)
            if recorder.rules.stale(self.held.keys()):
                state["graph_stale_input"] = True
            # a tensor made outside the capture, read by it, and let go since: its memory can hold anything now (the
            # capture's own tensors live on in the graph's private pool)
            if any(ref.expired() for key, ref in self.held.items() if key not in self.made):
                state["graph_reads_freed"] = True

        def reset(self, *args, **kwargs):
            self.ops, self.held, self.made = [], {}, set()

        enable_debug_mode = reset

    @contextlib.contextmanager
    def graph(cuda_graph, *args, **kwargs):
        state["graphed"] = True
        with side_stream():
            cuda_graph.capture_begin()
        try:
            yield
        finally:
            cuda_graph.capture_end()

    @contextlib.contextmanager
    def side_stream(*args, **kwargs):
        state["side_stream"] = state.get("side_stream", 0) + 1
        try:
            yield
        finally:
            state["side_stream"] -= 1

    class Stream:
        def __init__(self, *args, **kwargs):
            pass

        def synchronize(self):
            pass

        def wait_stream(self, *args):
            pass

        def record_event(self, *args):
            return None

        wait_event = synchronize

    def made_here(factory):
        """``factory`` (torch.tensor, torch.as_tensor: they dispatch no operator) noting what it makes within a
        capture as the capture's own (a scalar made there is, on the GPU, a CPU scalar captured by value)."""
        def make(*args, **kwargs):
            t = factory(*args, **kwargs)
            if recorder.rules.graph_made is not None and isinstance(t, torch.Tensor):
                recorder.rules.graph_made.add(_storage(t))
            return t

        return make

    def graphed_callables(callables, *args, **kwargs):
        state["graphed"] = True
        return callables

    class Extension:
        """A CUDA C++ extension built on the CPU stands in for: each function call is noted as one kernel launch
        moving its tensors' bytes and an output shaped like its first tensor (a guess: the code is not run)."""

        def __init__(self, name):
            self.name = name

        def __getattr__(self, function):
            def call(*args, **kwargs):
                tensors = list(_tensors(list(args) + list(kwargs.values())))
                out = torch.empty_like(tensors[0]) if tensors else torch.empty(0)
                moved = sum(_nbytes(t) for t in {id(t): t for t in tensors}.values()) + _nbytes(out)
                state.setdefault("cuda", []).append({"extension": self.name, "function": function,
                                                     "arg_bytes": int(moved)})
                return out

            return call

    class Autocast(contextlib.ContextDecorator):
        """CUDA autocast: meta tensors are not autocast, so the library calls within are noted as its dtype."""

        def __init__(self, device_type="cuda", dtype=None, enabled=True, *args, **kwargs):
            self.device_type, self.enabled = str(device_type), enabled
            self.dtype = str(dtype or torch.float16).removeprefix("torch.")

        def __enter__(self):
            self.before = recorder.autocast
            if self.enabled and self.device_type.startswith("cuda"):
                recorder.autocast = self.dtype
                state["autocast"] = self.dtype
            return self

        def __exit__(self, *exc):
            recorder.autocast = self.before
            return False

    class CudaAutocast(Autocast):
        def __init__(self, enabled=True, dtype=None, *args, **kwargs):
            super().__init__("cuda", dtype, enabled)

    def load_inline(name="", *args, **kwargs):
        state.setdefault("extensions", []).append(name)
        return Extension(name)

    from torch.utils import cpp_extension

    saved_build = cpp_extension.load_inline, cpp_extension.load
    cpp_extension.load_inline = cpp_extension.load = load_inline
    saved_autocast = torch.autocast, torch.cuda.amp.autocast, torch.amp.autocast
    torch.autocast = torch.amp.autocast = Autocast
    torch.cuda.amp.autocast = CudaAutocast
    torch.compile = compile_
    saved_factories = torch.tensor, torch.as_tensor
    torch.tensor, torch.as_tensor = made_here(torch.tensor), made_here(torch.as_tensor)
    cuda.CUDAGraph, cuda.graph, cuda.synchronize = Graph, graph, lambda *a, **k: None
    cuda.Stream, cuda.stream = Stream, side_stream
    cuda.current_stream = lambda *a, **k: Stream()
    cuda.make_graphed_callables, cuda.is_available = graphed_callables, lambda: True
    cuda.current_device, cuda.set_device, cuda.device_count = (lambda: 0), (lambda *a: None), (lambda: 1)
    cuda.get_device_capability, cuda.empty_cache = (lambda *a: (9, 0)), (lambda: None)
    cuda.get_device_name = lambda *a: "NVIDIA H100 80GB HBM3"

    class Properties:  # what candidates read of the device: an H100's
        name, major, minor, multi_processor_count = "NVIDIA H100 80GB HBM3", 9, 0, 132
        total_memory, max_threads_per_multi_processor, L2_cache_size = 80 << 30, 2048, 50 << 20
        shared_memory_per_block, shared_memory_per_multiprocessor, regs_per_multiprocessor = 49152, 233472, 65536
        warp_size = 32

    cuda.get_device_properties = lambda *a: Properties()
    # a meta tensor stands for a CUDA one: a kernel that asks ``x.is_cuda`` takes the path it takes on the GPU (its
    # CUDA extension, say), not its CPU fallback
    torch.Tensor.is_cuda = property(lambda t: t.device.type in ("cuda", "meta"))
    try:
        yield
    finally:
        del torch.Tensor.is_cuda  # the tensor base's own again
        state["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32
                                   or torch.get_float32_matmul_precision() != "highest")
        cpp_extension.load_inline, cpp_extension.load = saved_build
        torch.autocast, torch.cuda.amp.autocast, torch.amp.autocast = saved_autocast
        torch.compile = saved.pop("compile")
        torch.tensor, torch.as_tensor = saved_factories
        for name, value in saved.items():
            if value is not None:
                setattr(cuda, name, value)
        torch.backends.cuda.matmul.allow_tf32, precision, torch.backends.cudnn.allow_tf32 = flags
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.benchmark = benchmark


@contextlib.contextmanager
def _compiled_triton():
    """``@triton.jit`` makes compiled kernels within, even in a process that runs Triton's interpreter (a
    forecast is about the GPU, whatever this process runs kernels on)."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


@contextlib.contextmanager
def _triton_recorder(launches: list, target):
    """Within: each Triton launch compiled for ``target`` (not run) and recorded with its grid and resources."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    from kernelcast.kernels.harness.ahead import compile_only

    with compile_only(target) as _:
        compiling = JITFunction.__dict__["run"]
        tuning = Autotuner.__dict__["run"]
        group = {"id": -1, "next": 0}

        def run(self, *args, grid, warmup, **kwargs):
            kernel = compiling(self, *args, grid=grid, warmup=warmup, **kwargs)
            if kernel is not None:
                regs, shared, local = kernel_resources(kernel.asm.get("cubin", b""))
                load_bits, loads, stores, mma = ptx_facts(kernel.asm.get("ptx", ""))
                seen = {}
                values = list(args) + list(kwargs.values())
                # a tensor descriptor (TMA) carries its tensor as ``base``
                values += [v.base for v in values if isinstance(getattr(v, "base", None), torch.Tensor)]
                for t in _tensors(values):
                    seen[id(t)] = _nbytes(t)
                launches.append(TritonLaunch(
                    self.fn.__name__, _grid_programs(grid, self.arg_names, args, kwargs),
                    int(kernel.metadata.num_warps), int(kernel.metadata.num_stages), regs,
                    max(shared, int(getattr(kernel.metadata, "shared", 0) or 0)), local, load_bits, loads, stores,
                    mma, int(sum(seen.values())), group["id"],
                    bool(re.search(r"\bscf\.(?:for|while)\b", kernel.asm.get("ttgir", "")))))
            return kernel

        def tune(self, *args, **kwargs):
            group["id"], group["next"] = group["next"], group["next"] + 1
            try:
                return tuning(self, *args, **kwargs)
            finally:
                group["id"] = -1

        JITFunction.run, Autotuner.run = run, tune
        try:
            yield
        finally:
            JITFunction.run, Autotuner.run = compiling, tuning


# The most shared memory one block may use (opt-in), by compute capability: Hopper and Blackwell 227 KiB, Ampere
# A100 163 KiB, the consumer parts 99 KiB
_MAX_SHARED = {90: 232448, 100: 232448, 80: 166912, 86: 101376, 89: 101376}


def _over_limits(launch: TritonLaunch, target: str) -> str:
    """Why the driver would refuse ``launch`` on ``target`` (shared memory, registers per block), or ''."""
    arch = int(target.partition(":")[2] or 90)
    limit = _MAX_SHARED.get(arch, 232448)
    if launch.shared_bytes > limit:
        return f"{launch.kernel} needs {launch.shared_bytes} bytes of shared memory, the target allows {limit}"
    if launch.registers > 0 and launch.registers * 32 * launch.num_warps > 65536:
        return f"{launch.kernel} needs {launch.registers} registers x {32 * launch.num_warps} threads, over 65536"
    return ""


def _is_compile_failure(exc: BaseException) -> bool:
    import traceback

    if type(exc).__name__ in ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure"):
        return True
    return any("/triton/compiler/" in f.filename or "/triton/backends/" in f.filename
               for f in traceback.extract_tb(exc.__traceback__))


_CACHE: dict[tuple, KernelFacts] = {}
MANY_OPERATORS = 2000
DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "kernelcast", "facts")
CHILD_BATCH = 32  # jobs a child finds before it reports: a crash or a timeout loses no more, and each is saved
_KEPT = ("ok", "compile_error", "host_error")  # verdicts of the code itself; "unknown" (a child lost) is found again


def cache_key(candidate, op_name: str, case_name: str, target: str) -> tuple:
    digest = hashlib.sha256((candidate.source + repr(sorted(candidate.params.items()))).encode()).hexdigest()[:20]
    return digest, op_name, case_name, target


def extract(op, candidate, case, target: str = "cuda:90", isolated: bool = False,
            cache_dir: str | None = None) -> KernelFacts:
    """The facts of ``candidate`` on ``case`` of ``op`` compiled for ``target``; cached by source and case.
    ``isolated``: found in a child process (``extract_many``)."""
    return extract_many([(op, candidate, case, target)], isolated, cache_dir)[0]


def extract_many(jobs, isolated: bool = False, cache_dir: str | None = None, workers: int = 0) -> list[KernelFacts]:
    """The facts of each (op, candidate, case, target) of ``jobs``, cached by source and case (in memory, and in
    ``cache_dir`` when given).

    The candidate's host code runs to find them. ``isolated`` runs the jobs not cached in child processes
    (``python -m kernelcast.kernels.facts``, a bare environment: what a candidate does to its process, patching
    torch, setting flags, crashing, stays there), ``CHILD_BATCH`` jobs a child and ``workers`` children at once
    (0: one a CPU core, at most 4), at the cost of one start of Python and torch per batch. A process whose Triton
    runs its interpreter (its library functions are interpreted then, and cannot be compiled) always finds them
    in a child."""
    keys = [cache_key(c, op.name, case.name, target) for op, c, case, target in jobs]
    todo = {k: job for k, job in zip(keys, jobs) if k not in _CACHE}
    folder = _cache_folder(cache_dir) if cache_dir else None
    if folder and todo:
        for key in list(todo):
            found = _read_cached(folder, key)
            if found is not None:
                _CACHE[key] = found
                del todo[key]
    if todo:
        def done(batch_keys, found):
            _CACHE.update(zip(batch_keys, found))
            if folder:
                for key, facts in zip(batch_keys, found):
                    if facts.status in _KEPT:
                        _write_cached(folder, key, facts)

        if isolated or _interpreting():
            _in_children(todo, done, workers)
        else:
            for key, job in todo.items():
                done([key], [_extract(*job)])
    return [_CACHE[k] for k in keys]


def _in_children(todo: dict, done, workers: int) -> None:
    """``_extract_in_child`` of ``todo``'s jobs in batches of ``CHILD_BATCH``, ``workers`` children at once, each
    batch handed to ``done(keys, facts)`` as it finishes."""
    from concurrent.futures import ThreadPoolExecutor

    items = list(todo.items())
    batches = [items[i:i + CHILD_BATCH] for i in range(0, len(items), CHILD_BATCH)]
    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(batches)))) as pool:
        futures = [(pool.submit(_extract_in_child, [job for _, job in batch]), [key for key, _ in batch])
                   for batch in batches]
        for future, batch_keys in futures:
            done(batch_keys, future.result())


@lru_cache(maxsize=None)
def _cache_folder(cache_dir: str) -> str:
    """``cache_dir``'s folder for facts found by this code: named by this module's text and torch's and Triton's
    versions (what decides the facts), so a change to any of them starts a fresh folder."""
    import triton

    with open(__file__, "rb") as f:
        code = f.read()
    stamp = hashlib.sha256(code + torch.__version__.encode() + triton.__version__.encode()).hexdigest()[:16]
    folder = os.path.join(cache_dir, stamp)
    os.makedirs(folder, exist_ok=True)
    return folder


def _cache_path(folder: str, key: tuple) -> str:
    return os.path.join(folder, hashlib.sha256(repr(key).encode()).hexdigest()[:32] + ".json")


def _read_cached(folder: str, key: tuple) -> KernelFacts | None:
    try:
        with open(_cache_path(folder, key)) as f:
            return from_json(f.read())
    except (OSError, ValueError, TypeError, KeyError):  # not there, or cut short: found again
        return None


def _write_cached(folder: str, key: tuple, facts: KernelFacts) -> None:
    """One job's facts into its file."""
    write_whole(_cache_path(folder, key), to_json(facts))


def write_whole(path: str, text: str) -> None:
    """``text`` into ``path``, whole or not at all (written aside in the same folder, then renamed): a reader meets
    the old file, the new one, or none, never a part."""
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), suffix=".part", delete=False) as f:
        f.write(text)
    os.replace(f.name, path)


def _interpreting() -> bool:
    import triton.language.standard as standard
    from triton.runtime.jit import JITFunction

    return not isinstance(standard.cdiv, JITFunction)


def to_json(facts: KernelFacts) -> str:
    return json.dumps(asdict(facts))


def from_json(text: str) -> KernelFacts:
    d = json.loads(text)
    d["aten"] = tuple(AtenOp(**o) for o in d["aten"])
    d["triton"] = tuple(TritonLaunch(**t) for t in d["triton"])
    d["cuda_kernels"] = tuple(d.get("cuda_kernels", ()))
    d["outputs"] = tuple((tuple(shape), tuple(stride), dtype) for shape, stride, dtype in d.get("outputs", ()))
    return KernelFacts(**d)


_CHILD_ENV = ("PATH", "HOME", "TMPDIR", "LANG", "PYTHONPATH", "KERNELCAST_TASKS", "TRITON_CACHE_DIR",
              "TRITON_HOME", "CUDA_HOME", "VIRTUAL_ENV")


def _extract_in_child(jobs) -> list[KernelFacts]:
    """``_extract`` of each job in one fresh Python that compiles Triton kernels (``python -m kernelcast.kernels.facts``),
    given only the environment it needs."""
    import sys

    request = json.dumps([{"op": op.name, "case": case.name, "target": target, "source": c.source,
                           "params": dict(c.params), "backend": c.backend, "origin": c.origin}
                          for op, c, case, target in jobs])
    env = {k: os.path.abspath(os.environ[k]) if k in ("KERNELCAST_TASKS", "TRITON_CACHE_DIR") else os.environ[k]
           for k in _CHILD_ENV if k in os.environ}
    env["PYTHONPATH"] = importable_path(env.get("PYTHONPATH", ""))
    env.update(TRITON_INTERPRET="0", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    try:
        # in a scratch folder of its own: what the candidates write where they stand lands there
        with tempfile.TemporaryDirectory(prefix="kernelcast-facts-child-") as scratch:
            done = subprocess.run([sys.executable, "-m", "kernelcast.kernels.facts"], input=request,
                                  capture_output=True, text=True, env=env, cwd=scratch, timeout=120 + 30 * len(jobs))
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            return [from_json(json.dumps(d)) for d in json.loads(lines[-1])]
        why = f"the facts child failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        why = "the facts child timed out"
    return [KernelFacts("unknown", why, target) for _, _, _, target in jobs]


def importable_path(pythonpath: str = "") -> str:
    """``pythonpath`` with this kernelcast's root first: a child Python imports kernelcast as this one does (a checkout
    run from its root is not installed)."""
    import kernelcast

    root = os.path.dirname(os.path.dirname(os.path.abspath(kernelcast.__file__)))
    return os.pathsep.join(p for p in (root, pythonpath) if p)


def _child() -> None:
    """Read a list of jobs (JSON on stdin), print their facts as one JSON list: ``extract_many`` isolated."""
    import sys

    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.records import Candidate

    out = []
    for r in json.loads(sys.stdin.read()):
        try:
            op = get_operation(r["op"])
            case = next(c for c in op.cases if c.name == r["case"])
            candidate = Candidate(op=r["op"], backend=r["backend"], source=r["source"], params=r["params"],
                                  origin=r["origin"])
            out.append(asdict(_extract(op, candidate, case, r["target"])))
        except Exception as exc:  # noqa: BLE001 - this job's facts are unknown, the others stand
            out.append(asdict(KernelFacts("unknown", f"{type(exc).__name__}: {str(exc)[:300]}", r["target"])))
    sys.stdout.write("\n" + json.dumps(out) + "\n")


def _extract(op, candidate, case, target: str) -> KernelFacts:
    from kernelcast.kernels.formats.operation import on_device
    from kernelcast.kernels.harness.ahead import parse_target
    from kernelcast.kernels.harness.budget import meta_inputs
    from kernelcast.kernels.harness.correctness import call_candidate, load_launch, poisoned_outputs

    t0 = time.perf_counter()
    state: dict = {}
    launches: list[TritonLaunch] = []
    recorder = _Recorder()
    input_bytes = output_bytes = 0
    try:
        with tempfile.TemporaryDirectory(prefix="kernelcast-facts-") as folder, _compiled_triton(), \
                _stand_ins(state, recorder), _triton_recorder(launches, parse_target(target)):
            launch = load_launch(candidate.source, folder, module_name=f"facts_{key_name(candidate)}")
            inputs = meta_inputs(op, case)
            input_bytes = sum(_nbytes(t) for t in _tensors(inputs))
            # The first call builds, captures and compiles; the second is the steady state a timer sees.
            for call in range(2):
                if call and len(recorder.ops) + recorder.views > MANY_OPERATORS:
                    break  # host code this long (a loop of thousands of operators): its first call stands for both
                recorder.ops.clear()
                recorder.views = 0
                del launches[:]
                state.pop("cuda", None)
                outputs = poisoned_outputs(op, case, "meta")
                recorder.rules.new_call(inputs)
                with on_device("meta"), recorder:
                    result = call_candidate(launch, inputs, outputs, candidate.params)
            output_bytes = sum(_nbytes(t) for t in _tensors(result))
            input_bytes += _parameter_bytes(launch)
            rules = _later_call(op, case, launch, candidate, recorder, state, launches, result)
    except Exception as exc:  # noqa: BLE001 - sorted: a Triton compile failure is a verdict, anything else unknown
        status = "compile_error" if _is_compile_failure(exc) else "host_error"
        # the end of the message: a compile error ends with what went wrong, after the code it points at
        return KernelFacts(status, f"{type(exc).__name__}: {str(exc)[-400:]}", target, tuple(recorder.ops),
                           recorder.views, tuple(launches), seconds=time.perf_counter() - t0)
    ops = tuple(recorder.ops)
    refused = next((why for why in (_over_limits(t, target) for t in launches) if why), "")
    if refused:  # the driver refuses such a launch: a failure found without a GPU, as a compile error is
        return KernelFacts("compile_error", f"OutOfResources: {refused}", target, ops, recorder.views,
                           tuple(launches), seconds=time.perf_counter() - t0)
    return KernelFacts("ok", "", target, ops, recorder.views, tuple(launches), bool(state.get("compiled")),
                       bool(state.get("graphed")), bool(state.get("allow_tf32")), str(state.get("autocast", "")),
                       int(input_bytes), int(output_bytes), sum(o.flops for o in ops), time.perf_counter() - t0,
                       tuple(state.get("cuda", ())), **rules)


def _later_call(op, case, launch, candidate, recorder: _Recorder, state: dict, launches: list, result) -> dict:
    """The rule facts (``KernelFacts.writes_input`` and on): the steady call's outputs against its inputs, then one
    more call on inputs of its own, as the checks make, its operators and launches not counted in the facts."""
    from kernelcast.kernels.formats.operation import on_device
    from kernelcast.kernels.harness.budget import meta_inputs
    from kernelcast.kernels.harness.correctness import call_candidate, poisoned_outputs

    outs = list(_tensors(result if isinstance(result, (tuple, list)) else [result]))
    rules = {"returns_input": any(_storage(t) in recorder.rules.inputs for t in outs),
             "outputs": tuple((tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch.")) for t in outs)}
    if len(recorder.ops) + recorder.views <= MANY_OPERATORS:
        kept = list(recorder.ops), recorder.views, list(launches), list(state.get("cuda", ()))
        try:
            inputs = meta_inputs(op, case)
            recorder.rules.new_call(inputs)
            with on_device("meta"), recorder:
                call_candidate(launch, inputs, poisoned_outputs(op, case, "meta"), candidate.params)
        except Exception:  # noqa: BLE001 - the steady call's facts stand; a later call that fails says nothing here
            pass
        finally:
            recorder.ops[:], launches[:] = kept[0], kept[2]
            recorder.views = kept[1]
            state.pop("cuda", None)
            if kept[3]:
                state["cuda"] = kept[3]
    return {**rules, "writes_input": recorder.rules.writes_input, "cudnn_benchmark": recorder.rules.cudnn_benchmark,
            "graph_stale_input": bool(state.get("graph_stale_input")),
            "graph_reads_freed": bool(state.get("graph_reads_freed")),
            "graph_default_stream": bool(state.get("graph_default_stream"))}


def key_name(candidate) -> str:
    return hashlib.sha256(candidate.source.encode()).hexdigest()[:12]


def _parameter_bytes(launch) -> int:
    """Bytes of the parameters and buffers of the models a KernelBench-style launch built (0 when none)."""
    models = getattr(launch, "__globals__", {}).get("_KC_MODELS", {})
    total = 0
    for model in models.values():
        if isinstance(model, torch.nn.Module):
            total += sum(_nbytes(p) for p in model.parameters()) + sum(_nbytes(b) for b in model.buffers())
    return total


def clear_cache() -> None:
    _CACHE.clear()


if __name__ == "__main__":
    _child()
