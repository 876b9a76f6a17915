"""Layer normalisation of each row: the operation and its template space.

Algorithms:

- ``single_tile``: a whole row (``BLOCK_N = next_power_of_2(N)``) sits in registers, ROWS rows
  per program as a 2-D tile; x is read once and the statistics are exact two-pass sums over
  the registers. Fastest while the row fits in registers.
- ``looped``: a loop over BLOCK_N-wide chunks accumulates the statistics (sum and sum of
  squares), then a second loop normalises. x is read twice (the second read mostly hits L2),
  but registers stay small whatever N is.
- ``welford``: like ``looped``, but the statistics are a per-lane Welford mean/M2, merged
  across lanes with Chan's formula in a ``tl.reduce``; numerically the most robust, and it
  costs extra arithmetic per element.

Axes shared by most algorithms: PER_SM is 0 for one program per row block, else the number
of persistent programs per SM (few programs per SM keep too few loads in flight: slower);
num_stages is passed to the launch and to ``tl.range`` over the chunk loops, where it
software-pipelines the loads through shared memory. ``launch`` passes N and the row stride as
multiples of VEC (the largest power of two <= 16 dividing both), so Triton can prove that rows
and masks are VEC-aligned and emit 16-byte loads even for sizes such as N=3000.

The template prelude and the valid rule are shared with ``rmsnorm`` (``kernelcast.kernels.ops.rows``).
"""

from __future__ import annotations

import torch.nn.functional as F

from kernelcast.kernels.ops.base import Algorithm, case, itemsize, randn, src
from kernelcast.kernels.ops.rows import ROW_INTERPRET_CASES, ROW_PRELUDE, RowOp, norm_valid

_PRELUDE = ROW_PRELUDE

SINGLE_TILE = _PRELUDE + '''

@triton.jit
def _layernorm_tile(x_ptr, w_ptr, b_ptr, y_ptr, M, n_div, sx_div, sy_div, eps,
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
        mean = tl.sum(x, axis=1) / N
        d = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / N + eps)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        y = d * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(y_ptr + rows64[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=mask)


def launch(x, weight, bias, out, *, ROWS, PER_SM, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0), out.stride(0))
    grid = (_programs(triton.cdiv(M, ROWS), PER_SM, x),)
    _layernorm_tile[grid](x, weight, bias, out, M, N // vec, x.stride(0) // vec,
                          out.stride(0) // vec, 1e-5, VEC=vec, BLOCK_N=triton.next_power_of_2(N),
                          ROWS=ROWS, num_warps=num_warps, num_stages=num_stages)
'''

LOOPED = _PRELUDE + '''

@triton.jit
def _layernorm_looped(x_ptr, w_ptr, b_ptr, y_ptr, M, n_div, sx_div, sy_div, eps,
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
        acc2 = tl.zeros([ROWS, BLOCK_N], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            x = tl.load(x_rows + offs[None, :], mask=rmask & (offs < N)[None, :],
                        other=0.0).to(tl.float32)
            acc += x
            acc2 += x * x
        mean = tl.sum(acc, axis=1) / N
        var = tl.maximum(tl.sum(acc2, axis=1) / N - mean * mean, 0.0)
        rstd = 1.0 / tl.sqrt(var + eps)
        y_rows = y_ptr + rows64[:, None] * stride_y
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            cmask = offs < N
            mask = rmask & cmask[None, :]
            x = tl.load(x_rows + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
            y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
            tl.store(y_rows + offs[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, weight, bias, out, *, BLOCK_N, ROWS, PER_SM, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0), out.stride(0))
    grid = (_programs(triton.cdiv(M, ROWS), PER_SM, x),)
    _layernorm_looped[grid](x, weight, bias, out, M, N // vec, x.stride(0) // vec,
                            out.stride(0) // vec, 1e-5, VEC=vec, BLOCK_N=BLOCK_N, ROWS=ROWS,
                            STAGES=num_stages, num_warps=num_warps, num_stages=num_stages)
'''

WELFORD = _PRELUDE + '''

@triton.jit
def _welford_merge(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    n = n_a + n_b
    frac = n_b / tl.maximum(n, 1.0)
    delta = mean_b - mean_a
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * n_a * frac, n


@triton.jit
def _layernorm_welford(x_ptr, w_ptr, b_ptr, y_ptr, M, n_div, sx_div, sy_div, eps,
                       VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                       STAGES: tl.constexpr):
    N = n_div * VEC
    stride_x = sx_div * VEC
    stride_y = sy_div * VEC
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    # Lane j sees chunk elements j, j + BLOCK_N, ...: cdiv(N - j, BLOCK_N) of them.
    lane_n = tl.maximum((N - cols + BLOCK_N - 1) // BLOCK_N, 0).to(tl.float32)
    for rb in range(pid, tl.cdiv(M, ROWS), nprog):
        rows = rb * ROWS + tl.arange(0, ROWS)
        rows64 = rows.to(tl.int64)
        rmask = rows[:, None] < M
        x_rows = x_ptr + rows64[:, None] * stride_x
        mean = tl.zeros([ROWS, BLOCK_N], tl.float32)
        m2 = tl.zeros([ROWS, BLOCK_N], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            cmask = (offs < N)[None, :]
            x = tl.load(x_rows + offs[None, :], mask=rmask & cmask, other=0.0).to(tl.float32)
            # Every lane still in range has seen exactly start // BLOCK_N + 1 elements:
            # only the last chunk is partial, so one scalar reciprocal serves all lanes.
            inv = 1.0 / (start // BLOCK_N + 1)
            delta = tl.where(cmask, x - mean, 0.0)
            mean += delta * inv
            m2 += delta * (x - mean)
        counts = tl.zeros([ROWS, BLOCK_N], tl.float32) + lane_n[None, :]
        mean_r, m2_r, n_r = tl.reduce((mean, m2, counts), 1, _welford_merge)
        rstd = 1.0 / tl.sqrt(m2_r / n_r + eps)
        y_rows = y_ptr + rows64[:, None] * stride_y
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            cmask = offs < N
            mask = rmask & cmask[None, :]
            x = tl.load(x_rows + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
            y = (x - mean_r[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
            tl.store(y_rows + offs[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, weight, bias, out, *, BLOCK_N, ROWS, PER_SM, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0), out.stride(0))
    grid = (_programs(triton.cdiv(M, ROWS), PER_SM, x),)
    _layernorm_welford[grid](x, weight, bias, out, M, N // vec, x.stride(0) // vec,
                             out.stride(0) // vec, 1e-5, VEC=vec, BLOCK_N=BLOCK_N, ROWS=ROWS,
                             STAGES=num_stages, num_warps=num_warps, num_stages=num_stages)
'''


ALGORITHMS = (
    Algorithm("single_tile", SINGLE_TILE.lstrip(), {
        "ROWS": [1, 2, 4], "PER_SM": [0, 1, 2, 4, 8],
        "num_warps": [4, 8, 16], "num_stages": [1]}),
    Algorithm("looped", LOOPED.lstrip(), {
        "BLOCK_N": [512, 1024, 2048, 4096], "ROWS": [1, 2, 4], "PER_SM": [0, 1, 4],
        "num_warps": [4, 8, 16], "num_stages": [1, 3]}),
    Algorithm("welford", WELFORD.lstrip(), {
        "BLOCK_N": [512, 1024, 2048], "ROWS": [1, 2], "PER_SM": [0, 4],
        "num_warps": [4, 8], "num_stages": [1, 3]}),
)


class LayerNorm(RowOp):
    name = "layernorm"
    forbidden_calls = ("layer_norm", "native_layer_norm", "group_norm", "batch_norm", "instance_norm", "var",
                       "var_mean", "std", "std_mean")
    summary = "layer normalisation of each row with weight and bias (eps 1e-5)"
    cases = (case("bfloat16", M=8192, N=4096), case("float16", M=16384, N=3000),
             case("float32", M=4096, N=8192))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = src("""
        import torch
        import torch.nn.functional as F

        def launch(x, weight, bias, out):
            return (F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5),)
        """)

    def input_names(self):
        return ("x", "weight", "bias")

    def make_inputs(self, case, gen, device):
        M, N = case["M"], case["N"]
        return (randn((M, N), case.torch_dtype, gen, device, scale=2.0, shift=0.5),
                randn((N,), case.torch_dtype, gen, device, scale=0.5, shift=1.0),
                randn((N,), case.torch_dtype, gen, device, scale=0.5))

    def reference(self, x, weight, bias):
        y = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps=1e-5)
        return (y.to(x.dtype),)

    def bytes_moved(self, case):
        return (2 * case["M"] * case["N"] + 2 * case["N"]) * itemsize(case.dtype)

    def flops(self, case):
        return 8 * case["M"] * case["N"]

    algorithms = ALGORITHMS
    valid_variant = staticmethod(norm_valid(3))
