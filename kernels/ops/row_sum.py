"""Row sum, the operation and its template space: out[r] = sum(x[r, :]) accumulated in fp32.

- ``row_loop``: one row at a time, a 1-D BLOCK_N-wide accumulator swept along the row and
  reduced once at the end. Suits long rows; short rows leave most of each program idle.
- ``chunk_reduce``: one row at a time, but each chunk is reduced to a scalar as it arrives (a
  cross-warp reduction and barrier per chunk): the naive loop.
- ``tile2d``: ROWS x BLOCK_N tiles, a [ROWS, BLOCK_N] accumulator, one reduction per row block.
  Suits short rows (many rows share a program's loads); with few rows (M=2048) and large ROWS
  it leaves SMs idle.
- ``split_n``: SPLIT programs share each row block, each summing a slice of N and adding its
  partial sums into the output with atomics (``launch`` zeroes the output first). More
  programs in flight when M is small; the atomic order makes the last bits vary run to run.

PER_SM is 0 for one program per row (block), else the number of persistent programs per SM
(few programs per SM keep too few loads in flight: slower); num_stages is passed to the
launch and to ``tl.range`` over the chunk loops, where it software-pipelines the loads through
shared memory. ``launch`` passes N and the row stride as multiples of VEC (the largest power of
two <= 16 dividing both) so that Triton can prove alignment and use 16-byte loads for sizes
such as N=1000.
"""

from __future__ import annotations

import torch

from kernelcast.kernels.ops.base import Algorithm, case, itemsize, src
from kernelcast.kernels.ops.rows import ROW_INTERPRET_CASES, ROW_PRELUDE, RowOp

_PRELUDE = ROW_PRELUDE

ROW_LOOP = _PRELUDE + '''

@triton.jit
def _row_sum_loop(x_ptr, out_ptr, M, n_div, sx_div,
                  VEC: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    N = n_div * VEC
    stride = sx_div * VEC
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    for row in range(pid, M, nprog):
        x_row = x_ptr + tl.cast(row, tl.int64) * stride
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            acc += tl.load(x_row + offs, mask=offs < N, other=0.0).to(tl.float32)
        tl.store(out_ptr + row, tl.sum(acc, axis=0))


def launch(x, out, *, BLOCK_N, PER_SM, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0))
    grid = (_programs(M, PER_SM, x),)
    _row_sum_loop[grid](x, out, M, N // vec, x.stride(0) // vec, VEC=vec, BLOCK_N=BLOCK_N,
                        STAGES=num_stages, num_warps=num_warps, num_stages=num_stages)
'''

CHUNK_REDUCE = _PRELUDE + '''

@triton.jit
def _row_sum_chunk_reduce(x_ptr, out_ptr, M, n_div, sx_div,
                          VEC: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    N = n_div * VEC
    stride = sx_div * VEC
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    for row in range(pid, M, nprog):
        x_row = x_ptr + tl.cast(row, tl.int64) * stride
        total = tl.zeros([], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < N, other=0.0).to(tl.float32)
            total += tl.sum(x, axis=0)
        tl.store(out_ptr + row, total)


def launch(x, out, *, BLOCK_N, PER_SM, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0))
    grid = (_programs(M, PER_SM, x),)
    _row_sum_chunk_reduce[grid](x, out, M, N // vec, x.stride(0) // vec, VEC=vec,
                                BLOCK_N=BLOCK_N, STAGES=num_stages, num_warps=num_warps,
                                num_stages=num_stages)
'''

TILE2D = _PRELUDE + '''

@triton.jit
def _row_sum_tile(x_ptr, out_ptr, M, n_div, sx_div,
                  VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                  STAGES: tl.constexpr):
    N = n_div * VEC
    stride = sx_div * VEC
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    for rb in range(pid, tl.cdiv(M, ROWS), nprog):
        rows = rb * ROWS + tl.arange(0, ROWS)
        rmask = rows < M
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride
        acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            offs = start + cols
            acc += tl.load(x_rows + offs[None, :], mask=rmask[:, None] & (offs < N)[None, :],
                           other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=rmask)


def launch(x, out, *, ROWS, BLOCK_N, PER_SM, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0))
    grid = (_programs(triton.cdiv(M, ROWS), PER_SM, x),)
    _row_sum_tile[grid](x, out, M, N // vec, x.stride(0) // vec, VEC=vec, BLOCK_N=BLOCK_N,
                        ROWS=ROWS, STAGES=num_stages, num_warps=num_warps, num_stages=num_stages)
'''

SPLIT_N = _PRELUDE + '''

@triton.jit
def _row_sum_split(x_ptr, out_ptr, M, n_div, sx_div, blocks_per_split,
                   VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                   STAGES: tl.constexpr):
    N = n_div * VEC
    stride = sx_div * VEC
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride
    lo = tl.program_id(1) * blocks_per_split * BLOCK_N
    hi = tl.minimum(lo + blocks_per_split * BLOCK_N, N)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        offs = start + cols
        acc += tl.load(x_rows + offs[None, :], mask=rmask[:, None] & (offs < hi)[None, :],
                       other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr + rows, tl.sum(acc, axis=1), mask=rmask, sem="relaxed")


def launch(x, out, *, SPLIT, ROWS, BLOCK_N, num_warps, num_stages):
    M, N = x.shape
    vec = _vec(N, x.stride(0))
    out.zero_()
    blocks_per_split = triton.cdiv(triton.cdiv(N, BLOCK_N), SPLIT)
    grid = (triton.cdiv(M, ROWS), SPLIT)
    _row_sum_split[grid](x, out, M, N // vec, x.stride(0) // vec, blocks_per_split, VEC=vec,
                         BLOCK_N=BLOCK_N, ROWS=ROWS, STAGES=num_stages, num_warps=num_warps,
                         num_stages=num_stages)
'''


def _valid(algo, p):
    tile = p.get("ROWS", 1) * p["BLOCK_N"]
    # A persistent grid with fewer than 8 warps per SM cannot keep enough loads in flight.
    if 0 < p.get("PER_SM", 0) * p["num_warps"] < 8:
        return False
    # 4 to 32 elements per thread and chunk (narrower wastes the 16-byte loads, wider only
    # adds registers); pipelined chunks (fp32 at worst) must fit in shared memory.
    return 4 <= tile // (32 * p["num_warps"]) <= 32 and p["num_stages"] * tile * 4 <= 160 * 1024


ALGORITHMS = (
    Algorithm("row_loop", ROW_LOOP.lstrip(), {
        "BLOCK_N": [512, 1024, 2048, 4096], "PER_SM": [0, 1, 2, 4],
        "num_warps": [2, 4, 8, 16], "num_stages": [1, 3]}),
    Algorithm("chunk_reduce", CHUNK_REDUCE.lstrip(), {
        "BLOCK_N": [256, 512, 1024, 2048], "PER_SM": [0, 2],
        "num_warps": [2, 4, 8], "num_stages": [1, 3]}),
    Algorithm("tile2d", TILE2D.lstrip(), {
        "ROWS": [2, 4, 8, 16], "BLOCK_N": [128, 256, 512, 1024], "PER_SM": [0, 2],
        "num_warps": [2, 4, 8], "num_stages": [1, 3]}),
    Algorithm("split_n", SPLIT_N.lstrip(), {
        "SPLIT": [2, 4, 8], "ROWS": [1, 4], "BLOCK_N": [1024, 2048],
        "num_warps": [4, 8], "num_stages": [1, 3]}),
)


class RowSum(RowOp):
    name = "row_sum"
    forbidden_calls = ("sum", "nansum", "cumsum", "mean", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum",
                       "linear", "tensordot", "mv", "dot")
    summary = "sum of each row of an (M, N) matrix, accumulated and returned in fp32"
    cases = (case("bfloat16", M=8192, N=8192), case("float32", M=32768, N=1000),
             case("float16", M=2048, N=32768))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = src("""
        import torch

        def launch(x, out):
            return (x.sum(dim=-1, dtype=torch.float32),)
        """)

    def output_specs(self, case):
        return (((case["M"],), torch.float32),)

    def reference(self, x):
        return (x.double().sum(dim=-1).float(),)

    def bytes_moved(self, case):
        return case["M"] * case["N"] * itemsize(case.dtype) + case["M"] * 4

    def flops(self, case):
        return case["M"] * case["N"]

    # A sum of N unit normals is about sqrt(N) large; summation order moves the
    # last bits, so the absolute tolerance scales with the row length.
    tolerance_overrides = {torch.float32: (1e-4, 2e-3)}

    algorithms = ALGORITHMS
    valid_variant = staticmethod(_valid)
