"""bf16 matmul: the operation and its template space (tiled, split-K, persistent, TMA tensor-descriptor kernels).

Every algorithm computes BLOCK_M x BLOCK_N tiles of C = A @ B with an fp32 accumulator,
walking K in BLOCK_K steps that Triton software-pipelines num_stages deep (cp.async or
TMA copies feeding wgmma on Hopper). They differ in how the work is scheduled:

- tiled: one program per output tile. GROUP_M = 1 walks the tiles row by row; larger
  groups walk GROUP_M row-tiles down a column band together, so a band of A's rows and
  of B's columns stays in L2 while it is reused (fewer DRAM re-reads on big problems).
- split_k: SPLIT_K programs share each tile, each summing one contiguous slice of K.
  This multiplies the parallelism when M x N has too few tiles to fill the SMs (1024 x
  1024 x 16384: 64 tiles of 128 x 128 for 132 SMs). ATOMIC = 1 adds the slices with
  fp32 atomics into a zeroed fp32 workspace and casts it into C; ATOMIC = 0 stores each
  slice's partial tile and a second kernel sums them and casts (deterministic, more
  bytes).
- persistent: PROGRAMS_PER_SM programs per SM loop over the tiles in the grouped order,
  saving launch and tail effects when there are many tiles.
- tma: loads and stores through host-built tensor descriptors (Hopper's bulk tensor
  copy engine, which also zero-fills out-of-bounds boxes, so no masks), one program per
  tile or persistent.

Loads in the pointer-based kernels are unmasked along M and N: out-of-range rows and
columns are wrapped back into the matrix (their results are never stored), so the
loads stay 16-byte vectors even for N = 5000. K is masked only when BLOCK_K (times
SPLIT_K) does not divide it.
"""

from __future__ import annotations

from kernelcast.kernels.ops.base import Algorithm, Operation, case, itemsize, randn, src

_PRELUDE = '''
import os

import torch
import triton
import triton.language as tl

# Triton 3.6's CPU interpreter multiplies the raw bits of bf16 operands in tl.dot; there
# (and only there) the kernels upcast the operands to fp32 first.
UPCAST = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _sm_count(x):
    return torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4


@triton.jit
def _tile_coords(t, n_tm, n_tn, GROUP_M: tl.constexpr):
    """Tile t of the grouped order -> (row tile, column tile) of C."""
    per_group = GROUP_M * n_tn
    first_m = (t // per_group) * GROUP_M
    size_m = tl.minimum(n_tm - first_m, GROUP_M)
    return first_m + (t % per_group) % size_m, (t % per_group) // size_m


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_bk, tm, tn, k_lo, k_iters,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN_K: tl.constexpr, VEC: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 sum over k_iters BLOCK_K-steps from k_lo of A[tile rows, k] @ B[k, tile columns]."""
    offs_m = (tm * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (tn * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    if VEC == 8:
        # B's columns are contiguous in aligned groups of 8 even across the wrap-around,
        # since N % 8 == 0: enough for 16-byte loads.
        offs_n = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + tl.cast(offs_m, tl.int64)[:, None] * stride_am + (k_lo + offs_k)[None, :]
    b_ptrs = b_ptr + tl.cast(k_lo + offs_k, tl.int64)[:, None] * stride_bk + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(k_iters):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_lo - i * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = _mma(a, b, acc, UPCAST)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _store_tile(c_ptr, acc, M, N, stride_cm, tm, tn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + tl.cast(rows, tl.int64)[:, None] * stride_cm + cols[None, :],
             acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def _check(a, b, c):
    assert a.stride(1) == 1 and b.stride(1) == 1 and c.stride(1) == 1, "row-major operands expected"
    return a.shape[0], b.shape[1], a.shape[1]


def _vec(N, *strides):
    """8 when N and the row strides are multiples of 8 elements (16 bytes), else 1.

    The kernels take them divided by VEC and multiply back, so that Triton knows their
    divisibility (it only specialises integers divisible by 16) and keeps loads and
    stores 16 bytes wide, e.g. for N = 5000.
    """
    return 8 if all(x % 8 == 0 for x in (N, *strides)) else 1
'''

TILED = _PRELUDE + '''

@triton.jit
def _matmul_tiled(a_ptr, b_ptr, c_ptr, M, n_v, K, sa_v, sb_v, sc_v,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, VEC: tl.constexpr, UPCAST: tl.constexpr):
    N = n_v * VEC
    tm, tn = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = _tile_dot(a_ptr, b_ptr, M, N, K, sa_v * VEC, sb_v * VEC, tm, tn, 0, tl.cdiv(K, BLOCK_K),
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, VEC, UPCAST)
    _store_tile(c_ptr, acc, M, N, sc_v * VEC, tm, tn, BLOCK_M, BLOCK_N)


def launch(a, b, c, *, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages):
    M, N, K = _check(a, b, c)
    v = _vec(N, a.stride(0), b.stride(0), c.stride(0))
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _matmul_tiled[grid](a, b, c, M, N // v, K, a.stride(0) // v, b.stride(0) // v, c.stride(0) // v,
                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
                        EVEN_K=K % BLOCK_K == 0, VEC=v, UPCAST=UPCAST,
                        num_warps=num_warps, num_stages=num_stages)
'''

SPLIT_K = _PRELUDE + '''

@triton.jit
def _matmul_split_k(a_ptr, b_ptr, out_ptr, M, n_v, K, sa_v, sb_v, k_chunk,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, VEC: tl.constexpr,
                    UPCAST: tl.constexpr, ATOMIC: tl.constexpr):
    N = n_v * VEC
    tm, tn = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    split = tl.program_id(1)
    k_lo = split * k_chunk
    k_iters = tl.cdiv(tl.minimum(K - k_lo, k_chunk), BLOCK_K)  # <= 0 for empty tail slices
    acc = _tile_dot(a_ptr, b_ptr, M, N, K, sa_v * VEC, sb_v * VEC, tm, tn, k_lo, k_iters,
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, VEC, UPCAST)
    rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    # The fp32 output (workspace or slice buffer) is contiguous with row stride N.
    offs = tl.cast(rows, tl.int64)[:, None] * N + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if ATOMIC:
        tl.atomic_add(out_ptr + offs, acc, mask=mask, sem="relaxed")
    else:
        # Slice `split` of a (SPLIT_K, M, N) buffer of partial sums.
        tl.store(out_ptr + tl.cast(split, tl.int64) * M * N + offs, acc, mask=mask)


@triton.jit
def _sum_slices(p_ptr, c_ptr, M, N, stride_cm, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(p_ptr + s * M * N + offs, mask=mask, other=0.0)
    rows = offs // N
    tl.store(c_ptr + tl.cast(rows, tl.int64) * stride_cm + (offs - rows * N),
             acc.to(c_ptr.dtype.element_ty), mask=mask)


def launch(a, b, c, *, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, ATOMIC, num_warps, num_stages):
    M, N, K = _check(a, b, c)
    k_chunk = triton.cdiv(triton.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    if ATOMIC:
        out = torch.zeros((M, N), device=c.device, dtype=torch.float32)
    else:
        out = torch.empty((SPLIT_K, M, N), device=c.device, dtype=torch.float32)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), SPLIT_K)
    v = _vec(N, a.stride(0), b.stride(0))
    _matmul_split_k[grid](a, b, out, M, N // v, K, a.stride(0) // v, b.stride(0) // v, k_chunk,
                          BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8,
                          EVEN_K=K % (BLOCK_K * SPLIT_K) == 0, VEC=v, UPCAST=UPCAST,
                          ATOMIC=ATOMIC, num_warps=num_warps, num_stages=num_stages)
    if ATOMIC:
        c.copy_(out)
    else:
        block = 1024
        _sum_slices[(triton.cdiv(M * N, block),)](out, c, M, N, c.stride(0), SPLIT_K=SPLIT_K,
                                                  BLOCK=block, num_warps=4)
'''

PERSISTENT = _PRELUDE + '''

@triton.jit
def _matmul_persistent(a_ptr, b_ptr, c_ptr, M, n_v, K, sa_v, sb_v, sc_v,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, VEC: tl.constexpr, UPCAST: tl.constexpr):
    N = n_v * VEC
    n_tm = tl.cdiv(M, BLOCK_M)
    n_tn = tl.cdiv(N, BLOCK_N)
    k_iters = tl.cdiv(K, BLOCK_K)
    for t in range(tl.program_id(0), n_tm * n_tn, tl.num_programs(0)):
        tm, tn = _tile_coords(t, n_tm, n_tn, GROUP_M)
        acc = _tile_dot(a_ptr, b_ptr, M, N, K, sa_v * VEC, sb_v * VEC, tm, tn, 0, k_iters,
                        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, VEC, UPCAST)
        _store_tile(c_ptr, acc, M, N, sc_v * VEC, tm, tn, BLOCK_M, BLOCK_N)


def launch(a, b, c, *, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PROGRAMS_PER_SM, num_warps, num_stages):
    M, N, K = _check(a, b, c)
    v = _vec(N, a.stride(0), b.stride(0), c.stride(0))
    n_tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    grid = (max(1, min(n_tiles, _sm_count(a) * PROGRAMS_PER_SM)),)
    _matmul_persistent[grid](a, b, c, M, N // v, K, a.stride(0) // v, b.stride(0) // v, c.stride(0) // v,
                             BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
                             EVEN_K=K % BLOCK_K == 0, VEC=v, UPCAST=UPCAST,
                        num_warps=num_warps, num_stages=num_stages)
'''

TMA = _PRELUDE + '''
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _matmul_tma(a_desc, b_desc, c_desc, M, N, K,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    n_tm = tl.cdiv(M, BLOCK_M)
    n_tn = tl.cdiv(N, BLOCK_N)
    k_iters = tl.cdiv(K, BLOCK_K)
    for t in range(tl.program_id(0), n_tm * n_tn, tl.num_programs(0)):
        tm, tn = _tile_coords(t, n_tm, n_tn, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in range(k_iters):
            a = a_desc.load([tm * BLOCK_M, i * BLOCK_K])
            b = b_desc.load([i * BLOCK_K, tn * BLOCK_N])
            acc = _mma(a, b, acc, UPCAST)
        c_desc.store([tm * BLOCK_M, tn * BLOCK_N], acc.to(c_desc.dtype))


def _padded(x, rows, cols):
    """x itself, or a zero-padded copy when its row stride is not a multiple of 16 bytes."""
    if x.stride(0) % 8 == 0 and x.shape == (rows, cols):
        return x
    p = torch.zeros((rows, cols), device=x.device, dtype=x.dtype)
    p[:x.shape[0], :x.shape[1]] = x
    return p


def launch(a, b, c, *, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PERSISTENT, num_warps, num_stages):
    M, N, K = _check(a, b, c)
    # TMA needs 16-byte aligned row strides: pad K and N up to multiples of 8 when they are not
    # (zero columns of A and rows of B add nothing). The GPU cases never need it.
    Kp, Np = triton.cdiv(K, 8) * 8, triton.cdiv(N, 8) * 8
    a_t, b_t = _padded(a, M, Kp), _padded(b, Kp, Np)
    aligned_c = c.stride(0) % 8 == 0 and Np == N
    c_t = c if aligned_c else torch.empty((M, Np), device=c.device, dtype=c.dtype)
    a_desc = TensorDescriptor.from_tensor(a_t, [BLOCK_M, BLOCK_K])
    b_desc = TensorDescriptor.from_tensor(b_t, [BLOCK_K, BLOCK_N])
    c_desc = TensorDescriptor.from_tensor(c_t, [BLOCK_M, BLOCK_N])
    n_tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(Np, BLOCK_N)
    grid = (max(1, min(n_tiles, _sm_count(a))) if PERSISTENT else n_tiles,)
    _matmul_tma[grid](a_desc, b_desc, c_desc, M, Np, Kp, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                      BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, UPCAST=UPCAST, num_warps=num_warps,
                      num_stages=num_stages)
    if c_t is not c:
        c.copy_(c_t[:, :N])
'''


def _smem_bytes(algo, p):
    stages = p["num_stages"] * (p["BLOCK_M"] * p["BLOCK_K"] + p["BLOCK_K"] * p["BLOCK_N"]) * 2
    # The TMA store stages the output tile through shared memory too.
    return stages + (p["BLOCK_M"] * p["BLOCK_N"] * 2 if algo == "tma" else 0)


def _valid(algo, p):
    bm, bn, bk, warps, stages = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["num_warps"], p["num_stages"]
    # Hopper gives a program at most 227 KB of shared memory; leave Triton some headroom.
    if _smem_bytes(algo, p) > (220 if algo == "tma" else 200) * 1024:
        return False
    # fp32 accumulator registers per thread: tiles of 128 x 256 need 8 warps (128 each);
    # 64 x 128 and smaller give 8 warps too little to do (wgmma works on 64-row slices).
    if bm * bn >= 128 * 256 and warps != 8:
        return False
    if bm * bn <= 64 * 128 and warps != 4:
        return False
    # 256 x 256 spills even on 8 warps (measured 5-40x slower on an H100); 256 x 64 adds little.
    if bm * bn > 128 * 256 or (bm == 256 and bn == 64):
        return False
    # Pipeline depth by K step: short steps need more stages in flight, long ones fewer.
    if stages not in {32: (4, 5), 64: (3, 4), 128: (2, 3)}[bk]:
        return False
    if algo == "tiled":
        # Grouped ordering matters where tiles are big enough for DRAM traffic to bind.
        return p["GROUP_M"] == 8 or bm * bn >= 128 * 128
    if algo == "split_k":
        return bm * bn <= 128 * 128 and (warps == 4 or bm * bn == 128 * 128)
    if algo == "persistent":
        # Two programs per SM only fit when a program's tile and buffers take half the SM.
        return p["PROGRAMS_PER_SM"] == 1 or (bm * bn <= 128 * 128 and _smem_bytes(algo, p) <= 100 * 1024)
    return True


ALGORITHMS = (
    Algorithm("tiled", TILED.lstrip(), {
        "BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128],
        "GROUP_M": [1, 8], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}),
    Algorithm("split_k", SPLIT_K.lstrip(), {
        "BLOCK_M": [64, 128], "BLOCK_N": [64, 128], "BLOCK_K": [64, 128],
        "SPLIT_K": [2, 4, 8], "ATOMIC": [0, 1], "num_warps": [4, 8], "num_stages": [3]}),
    Algorithm("persistent", PERSISTENT.lstrip(), {
        "BLOCK_M": [64, 128], "BLOCK_N": [64, 128, 256], "BLOCK_K": [64, 128],
        "GROUP_M": [8], "PROGRAMS_PER_SM": [1, 2], "num_warps": [4, 8], "num_stages": [3, 4]}),
    Algorithm("tma", TMA.lstrip(), {
        "BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [64, 128],
        "GROUP_M": [8], "PERSISTENT": [0, 1], "num_warps": [4, 8], "num_stages": [2, 3, 4]}),
)


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
    eager_source = src("""
        import torch

        def launch(a, b, c):
            return (a @ b,)
        """)

    def input_names(self):
        return ("a", "b")

    def make_inputs(self, case, gen, device):
        M, N, K = case["M"], case["N"], case["K"]
        scale = K ** -0.25  # keeps |C| near 1 whatever K is, so one tolerance fits all cases
        return (randn((M, K), case.torch_dtype, gen, device, scale=scale),
                randn((K, N), case.torch_dtype, gen, device, scale=scale))

    def output_specs(self, case):
        return (((case["M"], case["N"]), case.torch_dtype),)

    def reference(self, a, b):
        return ((a.float() @ b.float()).to(a.dtype),)

    def bytes_moved(self, case):
        M, N, K = case["M"], case["N"], case["K"]
        return (M * K + K * N + M * N) * itemsize(case.dtype)

    def flops(self, case):
        return 2 * case["M"] * case["N"] * case["K"]

    algorithms = ALGORITHMS
    valid_variant = staticmethod(_valid)
