"""Per-group (128 along a row) FP8 e4m3 quantisation: the operation and its template space.

Each group of 128 consecutive row elements gets scale = max(amax, 1e-10) / 448 and
q = clamp(x / scale, -448, 448) in float8 e4m3. The fused algorithms read x once and write
q and the scales once; they differ in how work is cut, and so in how many bytes each SM
keeps in flight:

- groups: the (M, N/128) groups are numbered in row-major order and each program takes
  G consecutive groups as one [G, 128] tile (crossing row ends freely), so every
  program is the same size whatever N is.
- persistent: the groups kernel as a grid-stride loop over PROGRAMS_PER_SM programs
  per SM; few resident warps leave the SM waiting on memory.
- rows: a program owns ROWS whole rows and walks each in chunks of G groups, one chunk
  in flight at a time: small G and many ROWS leave too little in flight.
- two_pass: the unfused way, one kernel for the scales and a second that reads x again
  to quantise, the reference point for what fusing the amax into the quantising buys.

RECIP multiplies by 1/scale (one division per group) instead of dividing every element
(persistent and rows always multiply).
All offsets are built as multiples of 128 elements so the compiler can see every group
starts 16-byte aligned and use full-width loads and stores.
"""

from __future__ import annotations

import torch

from kernelcast.kernels.ops.base import Algorithm, case, itemsize, src
from kernelcast.kernels.ops.rows import RowOp

_PRELUDE = '''
import torch
import triton
import triton.language as tl


def _sm_count(x):
    return torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4


def _check(x, q, scales):
    M, N = x.shape
    assert N % 128 == 0 and x.stride(1) == 1 and q.stride(1) == 1 and scales.stride(1) == 1
    assert x.stride(0) % 128 == 0 and q.stride(0) % 128 == 0
    return M, N


@triton.jit
def _quantise(x, RECIP: tl.constexpr):
    """x: [G, 128] fp32 -> (q [G, 128] fp32 clamped to the e4m3 range, scale [G])."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.maximum(amax, 1e-10) / 448.0
    if RECIP:
        q = x * (1.0 / scale)[:, None]
    else:
        q = x / scale[:, None]
    return tl.clamp(q, -448.0, 448.0), scale


@triton.jit
def _to_fp8(q, dtype: tl.constexpr, PREROUND: tl.constexpr):
    if PREROUND:
        # Triton's CPU interpreter drops the carry when rounding up overflows the fp8
        # mantissa (127.6 becomes 64, not 128); rounding to 3 mantissa bits (to nearest
        # even) in fp32 first makes its conversion exact. The launch sets PREROUND only
        # off the GPU, where the hardware conversion already rounds correctly.
        bits = q.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
        q = bits.to(tl.float32, bitcast=True)
    return q.to(dtype)
'''

_GROUPS_KERNEL = _PRELUDE + '''

@triton.jit
def _fp8_quant_groups(x_ptr, q_ptr, s_ptr, n_groups, gpr, sx_g, sq_g, ss,
                      G: tl.constexpr, RECIP: tl.constexpr, PREROUND: tl.constexpr):
    # gpr: groups per row; sx_g, sq_g: row strides of x and q in groups (128 elements).
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    k = tl.arange(0, 128)
    for blk in range(pid, tl.cdiv(n_groups, G), nprog):
        gid = blk * G + tl.arange(0, G)
        gmask = gid < n_groups
        row = tl.cast(gid // gpr, tl.int64)
        cg = gid % gpr
        mask = gmask[:, None]
        x = tl.load(x_ptr + ((row * sx_g + cg) * 128)[:, None] + k[None, :], mask=mask).to(tl.float32)
        q, scale = _quantise(x, RECIP)
        tl.store(q_ptr + ((row * sq_g + cg) * 128)[:, None] + k[None, :],
                 _to_fp8(q, q_ptr.dtype.element_ty, PREROUND), mask=mask)
        tl.store(s_ptr + row * ss + cg, scale, mask=gmask)
'''

GROUPS = _GROUPS_KERNEL + '''

def launch(x, q, scales, *, G, RECIP, num_warps):
    M, N = _check(x, q, scales)
    n_groups = M * (N // 128)
    _fp8_quant_groups[(triton.cdiv(n_groups, G),)](
        x, q, scales, n_groups, N // 128, x.stride(0) // 128, q.stride(0) // 128, scales.stride(0),
        G=G, RECIP=RECIP, PREROUND=not x.is_cuda, num_warps=num_warps)
'''

PERSISTENT = _GROUPS_KERNEL + '''

def launch(x, q, scales, *, G, PROGRAMS_PER_SM, num_warps):
    M, N = _check(x, q, scales)
    n_groups = M * (N // 128)
    grid = (max(1, min(triton.cdiv(n_groups, G), _sm_count(x) * PROGRAMS_PER_SM)),)
    _fp8_quant_groups[grid](
        x, q, scales, n_groups, N // 128, x.stride(0) // 128, q.stride(0) // 128, scales.stride(0),
        G=G, RECIP=1, PREROUND=not x.is_cuda, num_warps=num_warps)
'''

ROWS = _PRELUDE + '''

@triton.jit
def _fp8_quant_rows(x_ptr, q_ptr, s_ptr, M, gpr, sx_g, sq_g, ss,
                    G: tl.constexpr, ROWS: tl.constexpr, PREROUND: tl.constexpr):
    k = tl.arange(0, 128)
    lanes = tl.arange(0, G)
    for r in range(ROWS):
        row = tl.program_id(0) * ROWS + r
        if row < M:
            r64 = tl.cast(row, tl.int64)
            x_row = x_ptr + r64 * sx_g * 128
            q_row = q_ptr + r64 * sq_g * 128
            s_row = s_ptr + r64 * ss
            for c in range(0, gpr, G):
                cg = c + lanes
                gmask = cg < gpr
                mask = gmask[:, None]
                offs = cg[:, None] * 128 + k[None, :]
                x = tl.load(x_row + offs, mask=mask).to(tl.float32)
                q, scale = _quantise(x, 1)
                tl.store(q_row + offs, _to_fp8(q, q_ptr.dtype.element_ty, PREROUND), mask=mask)
                tl.store(s_row + cg, scale, mask=gmask)


def launch(x, q, scales, *, G, ROWS, num_warps):
    M, N = _check(x, q, scales)
    _fp8_quant_rows[(triton.cdiv(M, ROWS),)](
        x, q, scales, M, N // 128, x.stride(0) // 128, q.stride(0) // 128, scales.stride(0),
        G=G, ROWS=ROWS, PREROUND=not x.is_cuda, num_warps=num_warps)
'''

TWO_PASS = _PRELUDE + '''

@triton.jit
def _group_scales(x_ptr, s_ptr, n_groups, gpr, sx_g, ss, G: tl.constexpr):
    gid = tl.program_id(0) * G + tl.arange(0, G)
    gmask = gid < n_groups
    row = tl.cast(gid // gpr, tl.int64)
    cg = gid % gpr
    k = tl.arange(0, 128)
    x = tl.load(x_ptr + ((row * sx_g + cg) * 128)[:, None] + k[None, :], mask=gmask[:, None])
    amax = tl.max(tl.abs(x.to(tl.float32)), axis=1)
    tl.store(s_ptr + row * ss + cg, tl.maximum(amax, 1e-10) / 448.0, mask=gmask)


@triton.jit
def _apply_scales(x_ptr, q_ptr, s_ptr, n_groups, gpr, sx_g, sq_g, ss,
                  G: tl.constexpr, RECIP: tl.constexpr, PREROUND: tl.constexpr):
    gid = tl.program_id(0) * G + tl.arange(0, G)
    gmask = gid < n_groups
    row = tl.cast(gid // gpr, tl.int64)
    cg = gid % gpr
    k = tl.arange(0, 128)
    mask = gmask[:, None]
    x = tl.load(x_ptr + ((row * sx_g + cg) * 128)[:, None] + k[None, :], mask=mask).to(tl.float32)
    scale = tl.load(s_ptr + row * ss + cg, mask=gmask, other=1.0)
    if RECIP:
        q = x * (1.0 / scale)[:, None]
    else:
        q = x / scale[:, None]
    q = tl.clamp(q, -448.0, 448.0)
    tl.store(q_ptr + ((row * sq_g + cg) * 128)[:, None] + k[None, :],
             _to_fp8(q, q_ptr.dtype.element_ty, PREROUND), mask=mask)


def launch(x, q, scales, *, G, RECIP, num_warps):
    # Scales first, then a second pass that reads x again: the unfused way, 5/3 of
    # the traffic for 16-bit inputs.
    M, N = _check(x, q, scales)
    n_groups = M * (N // 128)
    grid = (triton.cdiv(n_groups, G),)
    _group_scales[grid](x, scales, n_groups, N // 128, x.stride(0) // 128, scales.stride(0),
                        G=G, num_warps=num_warps)
    _apply_scales[grid](x, q, scales, n_groups, N // 128, x.stride(0) // 128, q.stride(0) // 128,
                        scales.stride(0), G=G, RECIP=RECIP, PREROUND=not x.is_cuda,
                        num_warps=num_warps)
'''


def _valid(algo, p):
    # Elements a thread holds of one [G, 128] tile: 4 (an 8-byte access of 16-bit
    # values) to 64 (beyond, the fp32 tile and its quotient crowd the registers).
    if not 4 <= p["G"] * 128 // (32 * p["num_warps"]) <= 64:
        return False
    # Resident warps per SM of a persistent grid: 4 (mostly waiting) to 64 (full).
    if algo == "persistent" and not 4 <= p["PROGRAMS_PER_SM"] * p["num_warps"] <= 64:
        return False
    # One group a step over 16 rows a program: too little in flight (~15x off the best).
    return not (algo == "rows" and p["G"] == 1 and p["ROWS"] == 16)


ALGORITHMS = (
    Algorithm("groups", GROUPS.lstrip(), {
        "G": [1, 2, 4, 8, 16, 32], "RECIP": [0, 1], "num_warps": [1, 2, 4, 8, 16]}),
    Algorithm("persistent", PERSISTENT.lstrip(), {
        "G": [1, 2, 4, 8, 16, 32], "PROGRAMS_PER_SM": [2, 4, 8, 16],
        "num_warps": [1, 2, 4, 8]}),
    Algorithm("rows", ROWS.lstrip(), {
        "G": [1, 2, 4, 8, 16], "ROWS": [1, 2, 4, 8, 16], "num_warps": [1, 2, 4, 8, 16]}),
    Algorithm("two_pass", TWO_PASS.lstrip(), {
        "G": [1, 2, 4, 8, 16, 32], "RECIP": [0, 1], "num_warps": [1, 2, 4, 8, 16]}),
)


class FP8Quant(RowOp):
    name = "fp8_quant"
    forbidden_calls = ("amax", "aminmax", "max", "abs", "_scaled_mm")
    summary = "per-group (128 along a row) FP8 e4m3 quantisation: values and fp32 group scales"
    group = 128
    cases = (case("bfloat16", M=8192, N=4096), case("bfloat16", M=4096, N=14336),
             case("float32", M=3000, N=7168))
    interpret_cases = (case("float32", M=5, N=256), case("bfloat16", M=3, N=384),
                       case("float16", M=7, N=128))
    eager_source = src("""
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
        return M * N * (itemsize(case.dtype) + 1) + M * (N // self.group) * 4

    def flops(self, case):
        return 3 * case["M"] * case["N"]

    tolerance_overrides = {torch.float32: (1e-5, 1e-8)}

    algorithms = ALGORITHMS
    valid_variant = staticmethod(_valid)
