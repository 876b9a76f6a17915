"""The operation suite: what a kernel must compute, on which inputs, within which tolerance.

Each operation has a float32 reference (the correctness oracle), an eager PyTorch
implementation (the timed baseline every speedup is measured against), input cases
(GPU cases sized to fill an H100; tiny cases for Triton's CPU interpreter), per-dtype
tolerances and a bytes/FLOPs model that turns a runtime into GB/s or TFLOP/s.

Candidate kernels follow one calling convention: ``launch(*inputs, *outputs, **params)``
writes into output tensors the harness allocates (or returns a tuple of outputs).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.formats import is_imported_name, load_operation
from kernels.records import Candidate

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "int64": torch.int64,
}
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

# Output tolerances by output dtype: (rtol, atol). bf16 keeps 8 mantissa bits, so
# rtol 1.6e-2 is two units in the last place; fp8 e4m3 keeps 3, one unit is 12.5%.
DEFAULT_TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float8_e4m3fn: (0.13, 2e-3),
}


@dataclass(frozen=True)
class Case:
    """One input configuration of an operation: named sizes and the input dtype."""

    dims: tuple[tuple[str, int], ...]
    dtype: str

    def __getitem__(self, key: str) -> int:
        for name, value in self.dims:
            if name == key:
                return value
        raise KeyError(f"case has no dimension {key!r}; it has {', '.join(n for n, _ in self.dims)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def name(self) -> str:
        sizes = "x".join(str(v) for _, v in self.dims)
        return f"{sizes}-{SHORT_DTYPE.get(self.dtype, self.dtype)}"


def case(dtype: str, **dims: int) -> Case:
    return Case(tuple(dims.items()), dtype)


def _randn(shape, dtype, gen, device, scale=1.0, shift=0.0) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return (x * scale + shift).to(dtype)


class Operation:
    """Base class; a subclass fills in the names, cases and the five methods below."""

    name: str
    summary: str
    bound: str  # "memory" or "compute": which roofline the bytes/FLOPs model is judged by
    cases: tuple[Case, ...]
    interpret_cases: tuple[Case, ...]
    eager_source: str
    tolerance_overrides: dict = {}
    # Torch functions a non-torch candidate may not call: the routes to the answer it should compute.
    forbidden_calls: tuple[str, ...] = ()

    def make_inputs(self, case: Case, gen: torch.Generator, device) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def output_specs(self, case: Case) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
        raise NotImplementedError

    def reference(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def bytes_moved(self, case: Case) -> int:
        """The fewest bytes a kernel must move through device memory (inputs once, outputs once)."""
        raise NotImplementedError

    def flops(self, case: Case) -> int:
        raise NotImplementedError

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return self.tolerance_overrides.get(dtype, DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0)))

    def check(self, case: Case, inputs, got) -> str | None:
        """None when ``got`` (a candidate's outputs on ``inputs``) is correct, else what is wrong.

        The reference within tolerance; an operation with its own judge (an imported GPU MODE
        task's ``check_implementation``) overrides this.
        """
        from kernels.harness.correctness import mismatch  # the harness imports this module

        return mismatch(self, case, tuple(got), self.reference(*inputs))

    def input_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def seed_candidates(self) -> list[Candidate]:
        """The eager PyTorch baseline as a measurable candidate (origin ``seed``)."""
        return [Candidate(op=self.name, backend="torch", source=self.eager_source,
                          template=f"{self.name}/eager", origin="seed")]

    def achieved(self, case: Case, runtime_us: float) -> tuple[float, float]:
        """(GB/s, TFLOP/s) achieved by a kernel that took ``runtime_us`` on ``case``."""
        seconds = runtime_us * 1e-6
        return self.bytes_moved(case) / seconds / 1e9, self.flops(case) / seconds / 1e12


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=DTYPES[dtype]).element_size()


# Tiny row-op cases for the CPU interpreter: odd, power-of-two and long-ish rows, three dtypes.
ROW_INTERPRET_CASES = (case("float32", M=5, N=37), case("bfloat16", M=3, N=256), case("float16", M=4, N=300))


class _RowOp(Operation):
    """Operations over rows of an (M, N) matrix."""

    bound = "memory"

    def input_names(self):
        return ("x",)

    def make_inputs(self, case, gen, device):
        return (_randn((case["M"], case["N"]), case.torch_dtype, gen, device),)

    def output_specs(self, case):
        return (((case["M"], case["N"]), case.torch_dtype),)

    def bytes_moved(self, case):
        return 2 * case["M"] * case["N"] * _itemsize(case.dtype)


class Softmax(_RowOp):
    name = "softmax"
    forbidden_calls = ("softmax", "log_softmax", "_softmax", "softmin")
    summary = "row softmax over the last dimension of an (M, N) matrix"
    cases = (case("float32", M=8192, N=4096), case("bfloat16", M=32768, N=1000),
             case("bfloat16", M=4096, N=8192))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = _src("""
        import torch

        def launch(x, out):
            return (torch.softmax(x, dim=-1),)
        """)

    def reference(self, x):
        return (torch.softmax(x.float(), dim=-1).to(x.dtype),)

    def flops(self, case):
        return 5 * case["M"] * case["N"]


class LayerNorm(_RowOp):
    name = "layernorm"
    forbidden_calls = ("layer_norm", "native_layer_norm", "group_norm", "batch_norm", "instance_norm", "var",
                       "var_mean", "std", "std_mean")
    summary = "layer normalisation of each row with weight and bias (eps 1e-5)"
    cases = (case("bfloat16", M=8192, N=4096), case("float16", M=16384, N=3000),
             case("float32", M=4096, N=8192))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = _src("""
        import torch
        import torch.nn.functional as F

        def launch(x, weight, bias, out):
            return (F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5),)
        """)

    def input_names(self):
        return ("x", "weight", "bias")

    def make_inputs(self, case, gen, device):
        M, N = case["M"], case["N"]
        return (_randn((M, N), case.torch_dtype, gen, device, scale=2.0, shift=0.5),
                _randn((N,), case.torch_dtype, gen, device, scale=0.5, shift=1.0),
                _randn((N,), case.torch_dtype, gen, device, scale=0.5))

    def reference(self, x, weight, bias):
        y = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps=1e-5)
        return (y.to(x.dtype),)

    def bytes_moved(self, case):
        return (2 * case["M"] * case["N"] + 2 * case["N"]) * _itemsize(case.dtype)

    def flops(self, case):
        return 8 * case["M"] * case["N"]


class RMSNorm(_RowOp):
    name = "rmsnorm"
    forbidden_calls = ("rms_norm", "norm", "vector_norm", "rsqrt", "mean")
    summary = "RMS normalisation of each row with a weight (eps 1e-6)"
    cases = (case("bfloat16", M=8192, N=4096), case("bfloat16", M=16384, N=5000),
             case("float32", M=4096, N=8192))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = _src("""
        import torch
        import torch.nn.functional as F

        def launch(x, weight, out):
            return (F.rms_norm(x, (x.shape[-1],), weight, eps=1e-6),)
        """)

    def input_names(self):
        return ("x", "weight")

    def make_inputs(self, case, gen, device):
        M, N = case["M"], case["N"]
        return (_randn((M, N), case.torch_dtype, gen, device, scale=2.0),
                _randn((N,), case.torch_dtype, gen, device, scale=0.5, shift=1.0))

    def reference(self, x, weight):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
        return (y.to(x.dtype),)

    def bytes_moved(self, case):
        return (2 * case["M"] * case["N"] + case["N"]) * _itemsize(case.dtype)

    def flops(self, case):
        return 4 * case["M"] * case["N"]


class CrossEntropy(_RowOp):
    name = "cross_entropy"
    forbidden_calls = ("cross_entropy", "cross_entropy_loss", "nll_loss", "log_softmax", "softmax",
                       "logsumexp")
    summary = "per-row cross-entropy loss from (M, V) logits and (M,) int64 targets, fp32 out"
    cases = (case("bfloat16", M=4096, V=32000), case("float32", M=8192, V=8192),
             case("bfloat16", M=2048, V=50257))
    interpret_cases = (case("float32", M=5, V=37), case("bfloat16", M=3, V=256),
                       case("float16", M=4, V=300))
    eager_source = _src("""
        import torch
        import torch.nn.functional as F

        def launch(logits, targets, loss):
            return (F.cross_entropy(logits.float(), targets, reduction="none"),)
        """)

    def input_names(self):
        return ("logits", "targets")

    def make_inputs(self, case, gen, device):
        M, V = case["M"], case["V"]
        logits = _randn((M, V), case.torch_dtype, gen, device, scale=3.0)
        targets = torch.randint(0, V, (M,), generator=gen, device=device, dtype=torch.int64)
        return (logits, targets)

    def output_specs(self, case):
        return (((case["M"],), torch.float32),)

    def reference(self, logits, targets):
        return (F.cross_entropy(logits.float(), targets, reduction="none"),)

    def bytes_moved(self, case):
        return case["M"] * case["V"] * _itemsize(case.dtype) + case["M"] * (8 + 4)

    def flops(self, case):
        return 4 * case["M"] * case["V"]

    tolerance_overrides = {torch.float32: (1e-4, 1e-4)}


class FP8Quant(_RowOp):
    name = "fp8_quant"
    forbidden_calls = ("amax", "aminmax", "max", "abs", "_scaled_mm")
    summary = "per-group (128 along a row) FP8 e4m3 quantisation: values and fp32 group scales"
    group = 128
    cases = (case("bfloat16", M=8192, N=4096), case("bfloat16", M=4096, N=14336),
             case("float32", M=3000, N=7168))
    interpret_cases = (case("float32", M=5, N=256), case("bfloat16", M=3, N=384),
                       case("float16", M=7, N=128))
    eager_source = _src("""
        import torch

        def launch(x, q, scales):
            M, N = x.shape
            g = x.float().view(M, N // 128, 128)
            s = g.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10) / 448.0
            qv = (g / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            return qv.view(M, N), s.squeeze(-1)
        """)

    def output_specs(self, case):
        M, N = case["M"], case["N"]
        return (((M, N), torch.float8_e4m3fn), ((M, N // self.group), torch.float32))

    def reference(self, x):
        M, N = x.shape
        g = x.float().view(M, N // self.group, self.group)
        s = g.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10) / 448.0
        q = (g / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q.view(M, N), s.squeeze(-1)

    def bytes_moved(self, case):
        M, N = case["M"], case["N"]
        return M * N * (_itemsize(case.dtype) + 1) + M * (N // self.group) * 4

    def flops(self, case):
        return 3 * case["M"] * case["N"]

    tolerance_overrides = {torch.float32: (1e-5, 1e-8)}


class BiasGelu(_RowOp):
    name = "bias_gelu"
    forbidden_calls = ("gelu", "erf", "erfc")
    summary = "fused bias add and exact (erf) GELU over an (M, N) matrix"
    cases = (case("bfloat16", M=8192, N=4096), case("float16", M=16384, N=3000),
             case("float32", M=4096, N=8192))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = _src("""
        import torch
        import torch.nn.functional as F

        def launch(x, bias, out):
            return (F.gelu(x + bias),)
        """)

    def input_names(self):
        return ("x", "bias")

    def make_inputs(self, case, gen, device):
        M, N = case["M"], case["N"]
        return (_randn((M, N), case.torch_dtype, gen, device, scale=2.0),
                _randn((N,), case.torch_dtype, gen, device))

    def reference(self, x, bias):
        return (F.gelu(x.float() + bias.float()).to(x.dtype),)

    def bytes_moved(self, case):
        return (2 * case["M"] * case["N"] + case["N"]) * _itemsize(case.dtype)

    def flops(self, case):
        return 10 * case["M"] * case["N"]


class RowSum(_RowOp):
    name = "row_sum"
    forbidden_calls = ("sum", "nansum", "cumsum", "mean", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum",
                       "linear", "tensordot", "mv", "dot")
    summary = "sum of each row of an (M, N) matrix, accumulated and returned in fp32"
    cases = (case("bfloat16", M=8192, N=8192), case("float32", M=32768, N=1000),
             case("float16", M=2048, N=32768))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = _src("""
        import torch

        def launch(x, out):
            return (x.sum(dim=-1, dtype=torch.float32),)
        """)

    def output_specs(self, case):
        return (((case["M"],), torch.float32),)

    def reference(self, x):
        return (x.double().sum(dim=-1).float(),)

    def bytes_moved(self, case):
        return case["M"] * case["N"] * _itemsize(case.dtype) + case["M"] * 4

    def flops(self, case):
        return case["M"] * case["N"]

    # A sum of N unit normals is about sqrt(N) large; summation order moves the
    # last bits, so the absolute tolerance scales with the row length.
    tolerance_overrides = {torch.float32: (1e-4, 2e-3)}


class Transpose(_RowOp):
    name = "transpose"
    forbidden_calls = ("t", "T", "mT", "transpose", "permute", "swapaxes", "swapdims", "movedim",
                       "as_strided")
    summary = "2-D transpose of an (M, N) matrix into a contiguous (N, M) one"
    cases = (case("bfloat16", M=8192, N=8192), case("float32", M=4096, N=3000),
             case("float16", M=16384, N=2048))
    interpret_cases = (case("float32", M=5, N=37), case("bfloat16", M=64, N=48),
                       case("float16", M=33, N=70))
    eager_source = _src("""
        import torch

        def launch(x, out):
            return (x.t().contiguous(),)
        """)

    def output_specs(self, case):
        return (((case["N"], case["M"]), case.torch_dtype),)

    def reference(self, x):
        return (x.t().contiguous(),)

    def flops(self, case):
        return 0

    tolerance_overrides = {torch.float32: (0.0, 0.0), torch.float16: (0.0, 0.0),
                           torch.bfloat16: (0.0, 0.0)}


class Matmul(Operation):
    name = "matmul"
    forbidden_calls = ("matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "linear", "tensordot", "mv",
                       "dot", "__matmul__")
    summary = "bf16 matrix product C = A @ B, (M, K) x (K, N), fp32 accumulation"
    bound = "compute"
    cases = (case("bfloat16", M=4096, N=4096, K=4096), case("bfloat16", M=1024, N=1024, K=16384),
             case("bfloat16", M=3000, N=5000, K=2048))
    interpret_cases = (case("bfloat16", M=33, N=40, K=50), case("bfloat16", M=64, N=64, K=256),
                       case("bfloat16", M=17, N=96, K=80))
    eager_source = _src("""
        import torch

        def launch(a, b, c):
            return (a @ b,)
        """)

    def input_names(self):
        return ("a", "b")

    def make_inputs(self, case, gen, device):
        M, N, K = case["M"], case["N"], case["K"]
        scale = K ** -0.25  # keeps |C| near 1 whatever K is, so one tolerance fits all cases
        return (_randn((M, K), case.torch_dtype, gen, device, scale=scale),
                _randn((K, N), case.torch_dtype, gen, device, scale=scale))

    def output_specs(self, case):
        return (((case["M"], case["N"]), case.torch_dtype),)

    def reference(self, a, b):
        return ((a.float() @ b.float()).to(a.dtype),)

    def bytes_moved(self, case):
        M, N, K = case["M"], case["N"], case["K"]
        return (M * K + K * N + M * N) * _itemsize(case.dtype)

    def flops(self, case):
        return 2 * case["M"] * case["N"] * case["K"]


class Attention(Operation):
    name = "attention"
    forbidden_calls = ("scaled_dot_product_attention", "softmax", "matmul", "mm", "bmm", "addmm", "baddbmm",
                       "einsum", "linear", "tensordot", "mv", "dot", "__matmul__")
    summary = "non-causal scaled dot-product attention forward, (B, H, S, D) bf16, D 64 or 128"
    bound = "compute"
    cases = (case("bfloat16", B=4, H=16, S=2048, D=64), case("bfloat16", B=2, H=16, S=2048, D=128),
             case("bfloat16", B=4, H=8, S=1000, D=64))
    interpret_cases = (case("bfloat16", B=1, H=2, S=40, D=64), case("bfloat16", B=1, H=1, S=64, D=128),
                       case("bfloat16", B=2, H=1, S=17, D=64))
    eager_source = _src("""
        import torch
        import torch.nn.functional as F

        def launch(q, k, v, out):
            return (F.scaled_dot_product_attention(q, k, v),)
        """)

    def input_names(self):
        return ("q", "k", "v")

    def make_inputs(self, case, gen, device):
        shape = (case["B"], case["H"], case["S"], case["D"])
        return tuple(_randn(shape, case.torch_dtype, gen, device) for _ in range(3))

    def output_specs(self, case):
        return (((case["B"], case["H"], case["S"], case["D"]), case.torch_dtype),)

    def reference(self, q, k, v):
        scale = 1.0 / math.sqrt(q.shape[-1])
        p = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * scale, dim=-1)
        return ((p @ v.float()).to(q.dtype),)

    def bytes_moved(self, case):
        return 4 * case["B"] * case["H"] * case["S"] * case["D"] * _itemsize(case.dtype)

    def flops(self, case):
        return 4 * case["B"] * case["H"] * case["S"] * case["S"] * case["D"]

    tolerance_overrides = {torch.bfloat16: (1.6e-2, 2e-2)}


OPERATIONS: dict[str, Operation] = {
    op.name: op for op in (Softmax(), LayerNorm(), RMSNorm(), CrossEntropy(), FP8Quant(),
                           BiasGelu(), RowSum(), Transpose(), Matmul(), Attention())
}


def get_operation(name: str) -> Operation:
    """The operation called ``name`` (built in, or an imported task: ``kb.*``, ``gpumode.*``), or an error
    that lists the known ones."""
    op = OPERATIONS.get(name)
    if op is not None:
        return op
    if is_imported_name(name):
        return load_operation(name)
    raise ValueError(f"unknown operation {name!r}; known: {', '.join(OPERATIONS)}, or an imported task "
                     "(kb.NAME, gpumode.NAME)")
