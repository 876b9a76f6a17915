"""Bias + exact (erf) GELU: the operation and its template space (flat, persistent, 2-D tile, row-loop, unfused).

The fused ones read x once and write y once (the bias is tiny and stays in cache); they differ
in how the bias is fetched and in how much independent memory traffic each SM keeps in
flight, which is what decides how close a variant gets to copy bandwidth:

- flat: 1-D blocks over the M*N elements, one program per block; the bias index is
  ``offs % N``, a gather that only vectorises when the compiler can see N is a multiple
  of the vector width (it can for N = 4096, not for N = 3000).
- persistent: the flat kernel as a grid-stride loop over PROGRAMS_PER_SM programs per
  SM; few resident warps leave the SM waiting on memory, many approach ``flat``.
- tile: 2-D BLOCK_M x BLOCK_N tiles, the bias loaded once per tile and broadcast down
  its rows; the whole tile is loaded at once, so a program has BLOCK_M rows in flight.
- rows: one BLOCK_N column block per program, bias loaded once and reused while the
  program loops over ROWS rows one at a time (less in flight per program, fewer programs).
- unfused: the naive two-kernel version (bias add, then GELU in place), which moves
  twice the bytes; the reference point for what fusion buys.

VEC promises the kernel that N and the row strides are multiples of VEC (the launch
lowers it to what actually divides them). The kernel rebuilds N and the strides as
``n_v * VEC``, so Triton can prove row starts and column masks are VEC-aligned and use
16-byte accesses even when N is not a multiple of 16 (N = 3000 in fp16); with VEC = 1
such rows fall back to 2-byte accesses.
"""

from __future__ import annotations

import torch.nn.functional as F

from kernelcast.kernels.ops.base import Algorithm, case, itemsize, randn, src
from kernelcast.kernels.ops.rows import ROW_INTERPRET_CASES, RowOp

_PRELUDE = '''
import math

import torch
import triton
import triton.language as tl


def _vec(VEC, *sizes):
    """The largest power of two <= VEC dividing every size (1 when VEC is 1)."""
    v = VEC
    for s in sizes:
        v = math.gcd(v, s)
    return v


@triton.jit
def _gelu(v):
    return 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
'''

FLAT = _PRELUDE + '''

@triton.jit
def _bias_gelu_flat(x_ptr, b_ptr, y_ptr, total, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    for blk in range(pid, tl.cdiv(total, BLOCK), nprog):
        offs = blk * BLOCK + lanes
        mask = offs < total
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        b = tl.load(b_ptr + offs % N, mask=mask).to(tl.float32)
        tl.store(y_ptr + offs, _gelu(x + b).to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, bias, out, *, BLOCK, num_warps):
    assert x.is_contiguous() and out.is_contiguous()
    M, N = x.shape
    total = M * N
    grid = (triton.cdiv(total, BLOCK),)
    _bias_gelu_flat[grid](x, bias, out, total, N, BLOCK=BLOCK, num_warps=num_warps)
'''

# The flat kernel again, as a grid-stride loop over PROGRAMS_PER_SM programs per SM.
PERSISTENT = FLAT[:FLAT.index("def launch(")] + '''def launch(x, bias, out, *, BLOCK, PROGRAMS_PER_SM, num_warps):
    assert x.is_contiguous() and out.is_contiguous()
    M, N = x.shape
    total = M * N
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    grid = (max(1, min(triton.cdiv(total, BLOCK), sms * PROGRAMS_PER_SM)),)
    _bias_gelu_flat[grid](x, bias, out, total, N, BLOCK=BLOCK, num_warps=num_warps)
'''

TILE = _PRELUDE + '''

@triton.jit
def _bias_gelu_tile(x_ptr, b_ptr, y_ptr, M, n_v, sx_v, sy_v,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    N = n_v * VEC
    stride_x = sx_v * VEC
    stride_y = sy_v * VEC
    # Consecutive programs take consecutive column blocks of one row block.
    n_col = tl.cdiv(N, BLOCK_N)
    t = tl.program_id(0)
    rows = (t // n_col) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (t % n_col) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    b = tl.load(b_ptr + cols, mask=cmask).to(tl.float32)
    mask = (rows[:, None] < M) & cmask[None, :]
    r64 = tl.cast(rows, tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x + cols[None, :], mask=mask).to(tl.float32)
    y = _gelu(x + b[None, :])
    tl.store(y_ptr + r64 * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, bias, out, *, BLOCK_M, BLOCK_N, VEC, num_warps):
    M, N = x.shape
    assert x.stride(1) == 1 and out.stride(1) == 1 and bias.is_contiguous()
    vec = _vec(VEC, N, x.stride(0), out.stride(0))
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _bias_gelu_tile[grid](x, bias, out, M, N // vec, x.stride(0) // vec, out.stride(0) // vec,
                          BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, VEC=vec, num_warps=num_warps)
'''

ROWS = _PRELUDE + '''

@triton.jit
def _bias_gelu_rows(x_ptr, b_ptr, y_ptr, M, n_v, sx_v, sy_v,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr):
    N = n_v * VEC
    stride_x = sx_v * VEC
    stride_y = sy_v * VEC
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    b = tl.load(b_ptr + cols, mask=cmask).to(tl.float32)
    row0 = tl.program_id(1) * ROWS
    x_rows = x_ptr + tl.cast(row0, tl.int64) * stride_x + cols
    y_rows = y_ptr + tl.cast(row0, tl.int64) * stride_y + cols
    for r in range(ROWS):
        mask = cmask & (row0 + r < M)
        x = tl.load(x_rows + r * stride_x, mask=mask).to(tl.float32)
        tl.store(y_rows + r * stride_y, _gelu(x + b).to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, bias, out, *, BLOCK_N, ROWS, VEC, num_warps):
    M, N = x.shape
    assert x.stride(1) == 1 and out.stride(1) == 1 and bias.is_contiguous()
    vec = _vec(VEC, N, x.stride(0), out.stride(0))
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(M, ROWS))
    _bias_gelu_rows[grid](x, bias, out, M, N // vec, x.stride(0) // vec, out.stride(0) // vec,
                          BLOCK_N=BLOCK_N, ROWS=ROWS, VEC=vec, num_warps=num_warps)
'''

UNFUSED = _PRELUDE + '''

@triton.jit
def _add_bias(x_ptr, b_ptr, t_ptr, total, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs % N, mask=mask).to(tl.float32)
    tl.store(t_ptr + offs, (x + b).to(t_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_from(t_ptr, y_ptr, total, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    v = tl.load(t_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, _gelu(v).to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, bias, out, *, BLOCK, TMP_FP32, num_warps):
    # Unfused: x + bias goes through memory and back before the GELU pass, twice the
    # traffic of the fused kernels when rounded to x's dtype (as eager PyTorch does),
    # three times for 16-bit x when kept in an fp32 temporary.
    assert x.is_contiguous() and out.is_contiguous()
    M, N = x.shape
    total = M * N
    grid = (triton.cdiv(total, BLOCK),)
    tmp = torch.empty(x.shape, dtype=torch.float32, device=x.device) if TMP_FP32 else out
    _add_bias[grid](x, bias, tmp, total, N, BLOCK=BLOCK, num_warps=num_warps)
    _gelu_from[grid](tmp, out, total, BLOCK=BLOCK, num_warps=num_warps)
'''


def _valid(algo, p):
    threads = 32 * p["num_warps"]
    if algo in ("flat", "persistent", "unfused"):
        per_thread = p["BLOCK"] // threads
    elif algo == "tile":
        per_thread = p["BLOCK_M"] * p["BLOCK_N"] // threads
    else:
        per_thread = p["BLOCK_N"] // threads
    # An SM holds 64 warps; with under 4 resident it mostly waits on memory.
    if algo == "persistent" and not 4 <= p["PROGRAMS_PER_SM"] * p["num_warps"] <= 64:
        return False
    # Under 4 elements a thread cannot make a 16-byte access of 16-bit values; over 32
    # the fp32 copies of x and erf's temporaries start to crowd the registers.
    return 4 <= per_thread <= 32


ALGORITHMS = (
    Algorithm("flat", FLAT.lstrip(), {
        "BLOCK": [512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16]}),
    Algorithm("persistent", PERSISTENT.lstrip(), {
        "BLOCK": [1024, 2048, 4096, 8192], "PROGRAMS_PER_SM": [1, 2, 4, 8, 16],
        "num_warps": [2, 4, 8, 16]}),
    Algorithm("tile", TILE.lstrip(), {
        "BLOCK_M": [1, 4, 16], "BLOCK_N": [128, 256, 512, 1024, 2048], "VEC": [1, 8],
        "num_warps": [4]}),
    Algorithm("rows", ROWS.lstrip(), {
        "BLOCK_N": [512, 1024, 2048, 4096], "ROWS": [2, 8, 32, 64, 128], "VEC": [1, 8],
        "num_warps": [1, 2, 4, 8]}),
    Algorithm("unfused", UNFUSED.lstrip(), {
        "BLOCK": [512, 1024, 2048, 4096, 8192], "TMP_FP32": [0, 1],
        "num_warps": [1, 2, 4, 8, 16]}),
)


class BiasGelu(RowOp):
    name = "bias_gelu"
    forbidden_calls = ("gelu", "erf", "erfc")
    summary = "fused bias add and exact (erf) GELU over an (M, N) matrix"
    cases = (case("bfloat16", M=8192, N=4096), case("float16", M=16384, N=3000),
             case("float32", M=4096, N=8192))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = src("""
        import torch
        import torch.nn.functional as F

        def launch(x, bias, out):
            return (F.gelu(x + bias),)
        """)

    def input_names(self):
        return ("x", "bias")

    def make_inputs(self, case, gen, device):
        M, N = case["M"], case["N"]
        return (randn((M, N), case.torch_dtype, gen, device, scale=2.0),
                randn((N,), case.torch_dtype, gen, device))

    def reference(self, x, bias):
        return (F.gelu(x.float() + bias.float()).to(x.dtype),)

    def bytes_moved(self, case):
        return (2 * case["M"] * case["N"] + case["N"]) * itemsize(case.dtype)

    def flops(self, case):
        return 10 * case["M"] * case["N"]

    algorithms = ALGORITHMS
    valid_variant = staticmethod(_valid)
