"""RMS normalisation of each row: the operation and its template space.

Algorithms:

- ``single_tile``: a whole row (``BLOCK_N = next_power_of_2(N)``) sits in registers, ROWS rows
  per program as a 2-D tile; x is read once and the sum of squares is exact over the
  registers. Fastest while the row fits in registers.
- ``looped``: a loop over BLOCK_N-wide chunks accumulates the sum of squares, then a second
  loop normalises. x is read twice (the second read mostly hits L2), but registers stay small
  whatever N is.
- ``two_kernel``: the unfused form, one kernel writing 1/rms per row to a scratch vector and
  a 2-D elementwise kernel applying it; x comes from DRAM twice.

Axes shared by most algorithms: PER_SM is 0 for one program per row block, else the number
of persistent programs per SM (few programs per SM keep too few loads in flight: slower);
num_stages is passed to the launch and to ``tl.range`` over the chunk loops, where it
software-pipelines the loads through shared memory. ``launch`` passes N and the row stride as
multiples of VEC (the largest power of two <= 16 dividing both), so Triton can prove that rows
and masks are VEC-aligned and emit 16-byte loads even for sizes such as N=3000.

The template prelude and the valid rule are shared with ``layernorm`` (``kernelcast.kernels.ops.rows``).
"""

from __future__ import annotations

import torch

from kernelcast.kernels.ops.base import Algorithm, case, itemsize, randn, src
from kernelcast.kernels.ops.rows import ROW_INTERPRET_CASES, ROW_PRELUDE, RowOp, norm_valid

_PRELUDE = ROW_PRELUDE

SINGLE_TILE = _PRELUDE + '''

@triton.jit
def _rmsnorm_tile(x_ptr, w_ptr, y_ptr, M, n_div, sx_div, sy_div, eps,
                  VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    N = n_div * VEC
    stride_x = sx_div * VEC
    stride_y = sy_div * VEC
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    for rb in range(pid, tl.cdiv(M, ROWS), nprog):
        rows = rb * ROWS + tl.arange(0, ROWS)
        rows64 = rows.to(tl.int64)
        mask = (rows[:, None] < M) & cmask[None, :]
        x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(y_ptr + rows64[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=mask)


def launch(x, weight, out, *, ROWS, PER_SM, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0), out.stride(0))
    grid = (_programs(triton.cdiv(M, ROWS), PER_SM, x),)
    _rmsnorm_tile[grid](x, weight, out, M, N // vec, x.stride(0) // vec, out.stride(0) // vec,
                        1e-6, VEC=vec, BLOCK_N=triton.next_power_of_2(N), ROWS=ROWS,
                        num_warps=num_warps, num_stages=num_stages)
'''

LOOPED = _PRELUDE + '''

@triton.jit
def _rmsnorm_looped(x_ptr, w_ptr, y_ptr, M, n_div, sx_div, sy_div, eps,
                    VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                    STAGES: tl.constexpr):
    N = n_div * VEC
    stride_x = sx_div * VEC
    stride_y = sy_div * VEC
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    for rb in range(pid, tl.cdiv(M, ROWS), nprog):
        rows = rb * ROWS + tl.arange(0, ROWS)
        rows64 = rows.to(tl.int64)
        rmask = rows[:, None] < M
        x_rows = x_ptr + rows64[:, None] * stride_x
        acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            x = tl.load(x_rows + offs[None, :], mask=rmask & (offs < N)[None, :],
                        other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps)
        y_rows = y_ptr + rows64[:, None] * stride_y
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            cmask = offs < N
            mask = rmask & cmask[None, :]
            x = tl.load(x_rows + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(y_rows + offs[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, weight, out, *, BLOCK_N, ROWS, PER_SM, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0), out.stride(0))
    grid = (_programs(triton.cdiv(M, ROWS), PER_SM, x),)
    _rmsnorm_looped[grid](x, weight, out, M, N // vec, x.stride(0) // vec, out.stride(0) // vec,
                          1e-6, VEC=vec, BLOCK_N=BLOCK_N, ROWS=ROWS, STAGES=num_stages,
                          num_warps=num_warps, num_stages=num_stages)
'''

TWO_KERNEL = _PRELUDE + '''

@triton.jit
def _rmsnorm_stats(x_ptr, rstd_ptr, M, n_div, sx_div, eps, VEC: tl.constexpr,
                   BLOCK_N: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr):
    N = n_div * VEC
    stride_x = sx_div * VEC
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows[:, None] < M
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
        offs = start + cols
        x = tl.load(x_rows + offs[None, :], mask=rmask & (offs < N)[None, :],
                    other=0.0).to(tl.float32)
        acc += x * x
    tl.store(rstd_ptr + rows, 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps), mask=rows < M)


@triton.jit
def _rmsnorm_apply(x_ptr, w_ptr, rstd_ptr, y_ptr, M, n_div, sx_div, sy_div, VEC: tl.constexpr,
                   BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    N = n_div * VEC
    stride_x = sx_div * VEC
    stride_y = sy_div * VEC
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows64 = rows.to(tl.int64)
    cmask = cols < N
    mask = (rows[:, None] < M) & cmask[None, :]
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask,
                other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows64[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask)


def launch(x, weight, out, *, BLOCK_N, ROWS, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0), out.stride(0))
    rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
    row_blocks = triton.cdiv(M, ROWS)
    _rmsnorm_stats[(row_blocks,)](x, rstd, M, N // vec, x.stride(0) // vec, 1e-6, VEC=vec,
                                  BLOCK_N=BLOCK_N, ROWS=ROWS, STAGES=num_stages,
                                  num_warps=num_warps, num_stages=num_stages)
    _rmsnorm_apply[(row_blocks, triton.cdiv(N, BLOCK_N))](
        x, weight, rstd, out, M, N // vec, x.stride(0) // vec, out.stride(0) // vec, VEC=vec,
        BLOCK_N=BLOCK_N, ROWS=ROWS, num_warps=num_warps)
'''


ALGORITHMS = (
    Algorithm("single_tile", SINGLE_TILE.lstrip(), {
        "ROWS": [1, 2, 4], "PER_SM": [0, 1, 2, 4, 8],
        "num_warps": [4, 8, 16], "num_stages": [1]}),
    Algorithm("looped", LOOPED.lstrip(), {
        "BLOCK_N": [512, 1024, 2048, 4096], "ROWS": [1, 2, 4], "PER_SM": [0, 1, 2, 4],
        "num_warps": [4, 8, 16], "num_stages": [1, 3]}),
    Algorithm("two_kernel", TWO_KERNEL.lstrip(), {
        "BLOCK_N": [512, 1024, 2048], "ROWS": [1, 2],
        "num_warps": [4, 8], "num_stages": [1, 3]}),
)


class RMSNorm(RowOp):
    name = "rmsnorm"
    forbidden_calls = ("rms_norm", "norm", "vector_norm", "rsqrt", "mean")
    summary = "RMS normalisation of each row with a weight (eps 1e-6)"
    cases = (case("bfloat16", M=8192, N=4096), case("bfloat16", M=16384, N=5000),
             case("float32", M=4096, N=8192))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = src("""
        import torch
        import torch.nn.functional as F

        def launch(x, weight, out):
            return (F.rms_norm(x, (x.shape[-1],), weight, eps=1e-6),)
        """)

    def input_names(self):
        return ("x", "weight")

    def make_inputs(self, case, gen, device):
        M, N = case["M"], case["N"]
        return (randn((M, N), case.torch_dtype, gen, device, scale=2.0),
                randn((N,), case.torch_dtype, gen, device, scale=0.5, shift=1.0))

    def reference(self, x, weight):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
        return (y.to(x.dtype),)

    def bytes_moved(self, case):
        return (2 * case["M"] * case["N"] + case["N"]) * itemsize(case.dtype)

    def flops(self, case):
        return 4 * case["M"] * case["N"]

    algorithms = ALGORITHMS
    valid_variant = staticmethod(norm_valid(2))
