"""Row softmax: the operation and its template space (one-tile, one-pass online, two-pass).

Memory traffic differs by algorithm: one-tile reads a row once (when it fits in
registers), online reads it twice (max+sum, then write), two-pass three times.
"""

from __future__ import annotations

import torch

from kernelcast.kernels.ops.base import Algorithm, case, src
from kernelcast.kernels.ops.rows import ROW_INTERPRET_CASES, RowOp

_PRELUDE = '''
import torch
import triton
import triton.language as tl


def _programs(n_blocks, persistent, num_warps, x):
    """Grid size: one program per row block, or a persistent grid sized to the SMs."""
    if not persistent:
        return n_blocks
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    return max(1, min(n_blocks, sms * max(1, 32 // num_warps)))
'''

SINGLE_TILE = _PRELUDE + '''

@triton.jit
def _softmax_tile(x_ptr, y_ptr, M, N, stride_x, stride_y,
                  BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    for rb in range(pid, tl.cdiv(M, ROWS), nprog):
        rows = rb * ROWS + tl.arange(0, ROWS)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask,
                    other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=1)
        e = tl.exp(x - m[:, None])
        y = e / tl.sum(e, axis=1)[:, None]
        tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, out, *, ROWS, PERSISTENT, num_warps, num_stages):
    M, N = x.shape
    n_blocks = triton.cdiv(M, ROWS)
    grid = (_programs(n_blocks, PERSISTENT, num_warps, x),)
    _softmax_tile[grid](x, out, M, N, x.stride(0), out.stride(0),
                        BLOCK_N=triton.next_power_of_2(N), ROWS=ROWS,
                        num_warps=num_warps, num_stages=num_stages)
'''

ONLINE = _PRELUDE + '''

@triton.jit
def _softmax_online(x_ptr, y_ptr, M, N, stride_x, stride_y,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    # A finite sentinel instead of -inf keeps exp(m - m_new) free of inf - inf = NaN.
    NEG: tl.constexpr = -3.0e38
    for rb in range(pid, tl.cdiv(M, ROWS), nprog):
        for r in range(ROWS):
            row = rb * ROWS + r
            if row < M:
                x_row = x_ptr + tl.cast(row, tl.int64) * stride_x
                m = tl.full([BLOCK_N], NEG, tl.float32)
                s = tl.zeros([BLOCK_N], tl.float32)
                for start in range(0, N, BLOCK_N):
                    offs = start + cols
                    x = tl.load(x_row + offs, mask=offs < N, other=NEG).to(tl.float32)
                    m_new = tl.maximum(m, x)
                    s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
                    m = m_new
                row_max = tl.max(m, axis=0)
                inv = 1.0 / tl.sum(s * tl.exp(m - row_max), axis=0)
                y_row = y_ptr + tl.cast(row, tl.int64) * stride_y
                for start in range(0, N, BLOCK_N):
                    offs = start + cols
                    x = tl.load(x_row + offs, mask=offs < N, other=NEG).to(tl.float32)
                    y = tl.exp(x - row_max) * inv
                    tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=offs < N)


def launch(x, out, *, BLOCK_N, ROWS, PERSISTENT, num_warps, num_stages):
    M, N = x.shape
    n_blocks = triton.cdiv(M, ROWS)
    grid = (_programs(n_blocks, PERSISTENT, num_warps, x),)
    _softmax_online[grid](x, out, M, N, x.stride(0), out.stride(0), BLOCK_N=BLOCK_N, ROWS=ROWS,
                          num_warps=num_warps, num_stages=num_stages)
'''

TWO_PASS = _PRELUDE + '''

@triton.jit
def _softmax_two_pass(x_ptr, y_ptr, M, N, stride_x, stride_y, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    for row in range(pid, M, nprog):
        x_row = x_ptr + tl.cast(row, tl.int64) * stride_x
        m = tl.full([BLOCK_N], -float("inf"), tl.float32)
        for start in range(0, N, BLOCK_N):
            offs = start + cols
            m = tl.maximum(m, tl.load(x_row + offs, mask=offs < N, other=-float("inf")).to(tl.float32))
        row_max = tl.max(m, axis=0)
        s = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, N, BLOCK_N):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < N, other=-float("inf")).to(tl.float32)
            s += tl.exp(x - row_max)
        inv = 1.0 / tl.sum(s, axis=0)
        y_row = y_ptr + tl.cast(row, tl.int64) * stride_y
        for start in range(0, N, BLOCK_N):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < N, other=-float("inf")).to(tl.float32)
            tl.store(y_row + offs, (tl.exp(x - row_max) * inv).to(y_ptr.dtype.element_ty), mask=offs < N)


def launch(x, out, *, BLOCK_N, PERSISTENT, num_warps, num_stages):
    M, N = x.shape
    grid = (_programs(M, PERSISTENT, num_warps, x),)
    _softmax_two_pass[grid](x, out, M, N, x.stride(0), out.stride(0), BLOCK_N=BLOCK_N,
                            num_warps=num_warps, num_stages=num_stages)
'''


ALGORITHMS = (
    Algorithm("single_tile", SINGLE_TILE.lstrip(), {
        "ROWS": [1, 2, 4, 8], "PERSISTENT": [0, 1],
        "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2]}),
    Algorithm("online", ONLINE.lstrip(), {
        "BLOCK_N": [512, 1024, 2048, 4096], "ROWS": [1, 2], "PERSISTENT": [0, 1],
        "num_warps": [2, 4, 8, 16], "num_stages": [1, 3]}),
    Algorithm("two_pass", TWO_PASS.lstrip(), {
        "BLOCK_N": [512, 1024, 2048, 4096], "PERSISTENT": [0, 1],
        "num_warps": [4, 8, 16], "num_stages": [1, 3]}),
)


class Softmax(RowOp):
    name = "softmax"
    forbidden_calls = ("softmax", "log_softmax", "_softmax", "softmin")
    summary = "row softmax over the last dimension of an (M, N) matrix"
    cases = (case("float32", M=8192, N=4096), case("bfloat16", M=32768, N=1000),
             case("bfloat16", M=4096, N=8192))
    interpret_cases = ROW_INTERPRET_CASES
    eager_source = src("""
        import torch

        def launch(x, out):
            return (torch.softmax(x, dim=-1),)
        """)

    def reference(self, x):
        return (torch.softmax(x.float(), dim=-1).to(x.dtype),)

    def flops(self, case):
        return 5 * case["M"] * case["N"]

    algorithms = ALGORITHMS
    valid_variant = staticmethod(lambda algo, p: algo == "single_tile" or p["BLOCK_N"] >= 32 * p["num_warps"])
