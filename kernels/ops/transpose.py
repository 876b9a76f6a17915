"""2-D transpose: the operation and its template space (tiles: pointers, block pointers, persistent; gather).

The tile algorithms load a BLOCK_M x BLOCK_N tile of x coalesced along its rows,
transpose it in registers (``tl.trans``; Triton moves it through shared memory to
re-coalesce) and store it coalesced along the rows of out. They differ in addressing
and scheduling:

- tiles: plain pointer arithmetic and masks, one program per tile in row-major order;
  thin tiles (8 or 16 wide) move short runs per row and fall well short of copy speed.
- block_ptr: the same tiles through ``tl.make_block_ptr`` with boundary checks.
- persistent: PROGRAMS_PER_SM programs per SM loop over the tiles in an order grouped
  GROUP_M row-tiles at a time (GROUP_M = 1 walks x row-tile by row-tile; larger groups
  keep a band of x's rows and of out's rows hot in L2 together).
- gather: the naive transpose with no tile: each program writes runs of COLS rows of
  out and reads them down columns of x, one memory transaction per element; the L1
  (across a program's columns) and L2 (across programs) are all that keep it in range.
  (Its mirror, one-element writes down columns of out, measured over 10x off the best
  on an H100 and is left out.)

The launch passes M, N and the row strides divided by the largest power of two (<= 16)
dividing them all, and the kernel multiplies back by that constexpr VEC, so Triton can
prove masked rows start aligned and use wide accesses even when N = 3000.
"""

from __future__ import annotations

import torch

from kernelcast.kernels.ops.base import Algorithm, case, src
from kernelcast.kernels.ops.rows import RowOp

_PRELUDE = '''
import math

import torch
import triton
import triton.language as tl


def _vec(*sizes):
    """The largest power of two <= 16 dividing every size."""
    v = 16
    for s in sizes:
        v = math.gcd(v, s)
    return v

'''

TILES = _PRELUDE + '''

@triton.jit
def _transpose_tiles(x_ptr, y_ptr, m_v, n_v, sx_v, sy_v, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    M = m_v * VEC
    N = n_v * VEC
    stride_x = sx_v * VEC
    stride_y = sy_v * VEC
    n_tn = tl.cdiv(N, BLOCK_N)
    tm = tl.program_id(0) // n_tn
    tn = tl.program_id(0) % n_tn
    rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    tile = tl.load(x_ptr + tl.cast(rows, tl.int64)[:, None] * stride_x + cols[None, :],
                   mask=rmask[:, None] & cmask[None, :])
    tl.store(y_ptr + tl.cast(cols, tl.int64)[:, None] * stride_y + rows[None, :], tl.trans(tile),
             mask=cmask[:, None] & rmask[None, :])


def launch(x, out, *, BLOCK_M, BLOCK_N, num_warps):
    M, N = x.shape
    assert x.stride(1) == 1 and out.stride(1) == 1
    vec = _vec(M, N, x.stride(0), out.stride(0))
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _transpose_tiles[grid](x, out, M // vec, N // vec, x.stride(0) // vec, out.stride(0) // vec,
                           BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, VEC=vec, num_warps=num_warps)
'''

BLOCK_PTR = _PRELUDE + '''

@triton.jit
def _transpose_block_ptr(x_ptr, y_ptr, m_v, n_v, sx_v, sy_v, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    M = m_v * VEC
    N = n_v * VEC
    stride_x = sx_v * VEC
    stride_y = sy_v * VEC
    n_tn = tl.cdiv(N, BLOCK_N)
    tm = tl.program_id(0) // n_tn
    tn = tl.program_id(0) % n_tn
    src = tl.make_block_ptr(x_ptr, shape=(M, N), strides=(stride_x, 1),
                            offsets=(tm * BLOCK_M, tn * BLOCK_N), block_shape=(BLOCK_M, BLOCK_N),
                            order=(1, 0))
    dst = tl.make_block_ptr(y_ptr, shape=(N, M), strides=(stride_y, 1),
                            offsets=(tn * BLOCK_N, tm * BLOCK_M), block_shape=(BLOCK_N, BLOCK_M),
                            order=(1, 0))
    tile = tl.load(src, boundary_check=(0, 1))
    tl.store(dst, tl.trans(tile), boundary_check=(0, 1))


def launch(x, out, *, BLOCK_M, BLOCK_N, num_warps):
    M, N = x.shape
    assert x.stride(1) == 1 and out.stride(1) == 1
    vec = _vec(M, N, x.stride(0), out.stride(0))
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _transpose_block_ptr[grid](x, out, M // vec, N // vec, x.stride(0) // vec, out.stride(0) // vec,
                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, VEC=vec, num_warps=num_warps)
'''

PERSISTENT = _PRELUDE + '''

@triton.jit
def _tile_coords(t, n_tm, n_tn, GROUP_M: tl.constexpr):
    """Tile t of the grouped order -> (row tile, column tile) of x."""
    per_group = GROUP_M * n_tn
    first_m = (t // per_group) * GROUP_M
    size_m = tl.minimum(n_tm - first_m, GROUP_M)
    return first_m + (t % per_group) % size_m, (t % per_group) // size_m


@triton.jit
def _transpose_persistent(x_ptr, y_ptr, m_v, n_v, sx_v, sy_v, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, VEC: tl.constexpr):
    M = m_v * VEC
    N = n_v * VEC
    stride_x = sx_v * VEC
    stride_y = sy_v * VEC
    n_tm = tl.cdiv(M, BLOCK_M)
    n_tn = tl.cdiv(N, BLOCK_N)
    for t in range(tl.program_id(0), n_tm * n_tn, tl.num_programs(0)):
        tm, tn = _tile_coords(t, n_tm, n_tn, GROUP_M)
        rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < M
        cmask = cols < N
        tile = tl.load(x_ptr + tl.cast(rows, tl.int64)[:, None] * stride_x + cols[None, :],
                       mask=rmask[:, None] & cmask[None, :])
        tl.store(y_ptr + tl.cast(cols, tl.int64)[:, None] * stride_y + rows[None, :],
                 tl.trans(tile), mask=cmask[:, None] & rmask[None, :])


def launch(x, out, *, BLOCK_M, BLOCK_N, GROUP_M, PROGRAMS_PER_SM, num_warps):
    M, N = x.shape
    assert x.stride(1) == 1 and out.stride(1) == 1
    vec = _vec(M, N, x.stride(0), out.stride(0))
    n_tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    grid = (max(1, min(n_tiles, sms * PROGRAMS_PER_SM)),)
    _transpose_persistent[grid](x, out, M // vec, N // vec, x.stride(0) // vec, out.stride(0) // vec,
                                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, GROUP_M=GROUP_M, VEC=vec,
                                num_warps=num_warps)
'''

GATHER = _PRELUDE + '''

@triton.jit
def _transpose_gather(x_ptr, y_ptr, M, N, sx, sy, BLOCK: tl.constexpr, COLS: tl.constexpr):
    # Program (i, j) writes BLOCK consecutive elements of each of out's rows j..j+COLS-1,
    # reading them down columns of x: every load is its own memory transaction, and
    # only caches (L1 across the COLS columns of one program, L2 across neighbouring
    # programs) save the traffic.
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    imask = i < M
    src = x_ptr + tl.cast(i, tl.int64) * sx
    for c in tl.static_range(COLS):
        j = tl.program_id(1) * COLS + c
        mask = imask & (j < N)
        v = tl.load(src + j, mask=mask)
        tl.store(y_ptr + tl.cast(j, tl.int64) * sy + i, v, mask=mask)


def launch(x, out, *, BLOCK, COLS, num_warps):
    M, N = x.shape
    assert x.stride(1) == 1 and out.stride(1) == 1
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, COLS))
    _transpose_gather[grid](x, out, M, N, x.stride(0), out.stride(0), BLOCK=BLOCK, COLS=COLS,
                            num_warps=num_warps)
'''

def _valid(algo, p):
    threads = 32 * p["num_warps"]
    if algo == "gather":
        # Every element is its own load: 2..16 a thread.
        return 2 <= p["BLOCK"] // threads <= 16
    # Up to 64 elements a thread stay in registers. Tiles with fewer than 4 (idle or
    # narrow lanes) are kept as the plausible-but-slower end of the tile sizes.
    return 1 <= p["BLOCK_M"] * p["BLOCK_N"] // threads <= 64


_TILE_AXES = {"BLOCK_M": [32, 64, 128], "BLOCK_N": [32, 64, 128]}


ALGORITHMS = (
    Algorithm("tiles", TILES.lstrip(), {
        "BLOCK_M": [8, 16, 32, 64, 128], "BLOCK_N": [8, 16, 32, 64, 128],
        "num_warps": [1, 2, 4, 8, 16]}),
    Algorithm("block_ptr", BLOCK_PTR.lstrip(), {**_TILE_AXES, "num_warps": [4, 8]}),
    Algorithm("persistent", PERSISTENT.lstrip(), {
        **_TILE_AXES, "GROUP_M": [1, 8], "PROGRAMS_PER_SM": [1, 2, 4], "num_warps": [4]}),
    Algorithm("gather", GATHER.lstrip(), {
        "BLOCK": [256, 512, 1024, 2048], "COLS": [1, 2, 4, 8], "num_warps": [1, 2, 4, 8]}),
)


class Transpose(RowOp):
    name = "transpose"
    forbidden_calls = ("t", "T", "mT", "transpose", "permute", "swapaxes", "swapdims", "movedim",
                       "as_strided")
    summary = "2-D transpose of an (M, N) matrix into a contiguous (N, M) one"
    cases = (case("bfloat16", M=8192, N=8192), case("float32", M=4096, N=3000),
             case("float16", M=16384, N=2048))
    interpret_cases = (case("float32", M=5, N=37), case("bfloat16", M=64, N=48),
                       case("float16", M=33, N=70))
    eager_source = src("""
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

    algorithms = ALGORITHMS
    valid_variant = staticmethod(_valid)
