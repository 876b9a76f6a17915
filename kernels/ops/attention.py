"""Attention forward: the operation and its template space (flash attention with pointer, block-pointer or TMA loads).

All three algorithms are the FlashAttention-2 forward pass: a program owns BLOCK_M query
rows of one (batch, head), keeps them in registers, and streams the keys and values in
BLOCK_N blocks (software-pipelined num_stages deep), folding each block into an online
softmax (running row max m, running sum l, fp32 accumulator rescaled when m grows).
Keys are split into full blocks, processed without masks, and one masked tail block
(S = 1000): keys beyond S get score -inf, query rows beyond S are neither loaded nor
stored. They differ in how K and V reach shared memory and in small arithmetic choices:

- flash: plain pointer arithmetic (cp.async copies on Hopper); K is loaded row-major and
  transposed for the dot.
- block_ptr: ``tl.make_block_ptr`` tiles with boundary checks; K is read as a
  column-major (HEAD_DIM, S) block, so the transpose is in the addressing.
- tma: host-built tensor descriptors over the (B*H*S, D) views of Q, K and V, so the
  bulk tensor copy engine moves the tiles (rows past a head's end are masked as keys or
  never stored as queries); the output is stored through masked pointers.

Axes shared by all: EXP2 = 1 pre-multiplies the scores by log2(e) (folded into the
softmax scale) and uses exp2, EXP2 = 0 scales then calls exp (an extra multiply per
score inside the exponential). HEAD_MAJOR = 0 launches the query blocks of one head
next to each other (they share that head's K and V in L2), HEAD_MAJOR = 1 launches the
same query block of every head together.
"""

from __future__ import annotations

import math

import torch

from kernelcast.kernels.ops.base import Algorithm, Operation, case, itemsize, randn, src

_PRELUDE = '''
import math
import os

import torch
import triton
import triton.language as tl

# Triton 3.6's CPU interpreter multiplies the raw bits of bf16 operands in tl.dot; there
# (and only there) the kernels upcast the operands to fp32 first.
UPCAST = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _program_coords(HEAD_MAJOR: tl.constexpr):
    """(query block, flattened batch*head) of this program."""
    if HEAD_MAJOR:
        return tl.program_id(1), tl.program_id(0)
    return tl.program_id(0), tl.program_id(1)


@triton.jit
def _online_step(acc, l_i, m_i, q, kt, v, qk_scale, key_idx, S,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
                 EXP2: tl.constexpr, UPCAST: tl.constexpr):
    """Fold one block of keys (kt: HEAD_DIM x BLOCK_N) and values into the running softmax."""
    qk = _dot(q, kt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), UPCAST)
    if MASK:
        qk = tl.where(key_idx[None, :] < S, qk, -float("inf"))
    # Every block holds at least one real key, so m_new is finite and no inf - inf occurs.
    if EXP2:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
    else:
        s = qk * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
    return acc, l_i, m_new


def _grid(B, H, S, BLOCK_M, HEAD_MAJOR):
    n_m = triton.cdiv(S, BLOCK_M)
    return (B * H, n_m) if HEAD_MAJOR else (n_m, B * H)


def _prepare(q, k, v, out, EXP2):
    B, H, S, D = q.shape
    assert out.is_contiguous(), "output must be contiguous"
    q, k, v = (t.contiguous() for t in (q, k, v))
    qk_scale = (LOG2E if EXP2 else 1.0) / math.sqrt(D)
    return q, k, v, B, H, S, D, qk_scale
'''

FLASH = _PRELUDE + '''

@triton.jit
def _attn_fwd(q_ptr, k_ptr, v_ptr, o_ptr, S, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              EXP2: tl.constexpr, HEAD_MAJOR: tl.constexpr, UPCAST: tl.constexpr):
    mb, bh = _program_coords(HEAD_MAJOR)
    base = tl.cast(bh, tl.int64) * S * HEAD_DIM
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    m_i = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    s_full = (S // BLOCK_N) * BLOCK_N
    for start_n in range(0, s_full, BLOCK_N):
        k = tl.load(k_ptr + kv_offs + start_n * HEAD_DIM)
        v = tl.load(v_ptr + kv_offs + start_n * HEAD_DIM)
        acc, l_i, m_i = _online_step(acc, l_i, m_i, q, tl.trans(k), v, qk_scale, start_n + offs_n, S,
                                     BLOCK_M, BLOCK_N, False, EXP2, UPCAST)
    if s_full < S:
        kv_mask = (s_full + offs_n)[:, None] < S
        k = tl.load(k_ptr + kv_offs + s_full * HEAD_DIM, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_offs + s_full * HEAD_DIM, mask=kv_mask, other=0.0)
        acc, l_i, m_i = _online_step(acc, l_i, m_i, q, tl.trans(k), v, qk_scale, s_full + offs_n, S,
                                     BLOCK_M, BLOCK_N, True, EXP2, UPCAST)
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < S)


def launch(q, k, v, out, *, BLOCK_M, BLOCK_N, EXP2, HEAD_MAJOR, num_warps, num_stages):
    q, k, v, B, H, S, D, qk_scale = _prepare(q, k, v, out, EXP2)
    _attn_fwd[_grid(B, H, S, BLOCK_M, HEAD_MAJOR)](
        q, k, v, out, S, qk_scale, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, EXP2=EXP2,
        HEAD_MAJOR=HEAD_MAJOR, UPCAST=UPCAST, num_warps=num_warps, num_stages=num_stages)
'''

BLOCK_PTR = _PRELUDE + '''

@triton.jit
def _attn_fwd_block_ptr(q_ptr, k_ptr, v_ptr, o_ptr, S, qk_scale,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        EXP2: tl.constexpr, HEAD_MAJOR: tl.constexpr, UPCAST: tl.constexpr):
    mb, bh = _program_coords(HEAD_MAJOR)
    base = tl.cast(bh, tl.int64) * S * HEAD_DIM
    q_blk = tl.make_block_ptr(q_ptr + base, shape=(S, HEAD_DIM), strides=(HEAD_DIM, 1),
                              offsets=(mb * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    kt_blk = tl.make_block_ptr(k_ptr + base, shape=(HEAD_DIM, S), strides=(1, HEAD_DIM),
                               offsets=(0, 0), block_shape=(HEAD_DIM, BLOCK_N), order=(0, 1))
    v_blk = tl.make_block_ptr(v_ptr + base, shape=(S, HEAD_DIM), strides=(HEAD_DIM, 1),
                              offsets=(0, 0), block_shape=(BLOCK_N, HEAD_DIM), order=(1, 0))
    q = tl.load(q_blk, boundary_check=(0,), padding_option="zero")
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    s_full = (S // BLOCK_N) * BLOCK_N
    for start_n in range(0, s_full, BLOCK_N):
        kt = tl.load(kt_blk)
        v = tl.load(v_blk)
        acc, l_i, m_i = _online_step(acc, l_i, m_i, q, kt, v, qk_scale, start_n + offs_n, S,
                                     BLOCK_M, BLOCK_N, False, EXP2, UPCAST)
        kt_blk = tl.advance(kt_blk, (0, BLOCK_N))
        v_blk = tl.advance(v_blk, (BLOCK_N, 0))
    if s_full < S:
        kt = tl.load(kt_blk, boundary_check=(1,), padding_option="zero")
        v = tl.load(v_blk, boundary_check=(0,), padding_option="zero")
        acc, l_i, m_i = _online_step(acc, l_i, m_i, q, kt, v, qk_scale, s_full + offs_n, S,
                                     BLOCK_M, BLOCK_N, True, EXP2, UPCAST)
    o_blk = tl.make_block_ptr(o_ptr + base, shape=(S, HEAD_DIM), strides=(HEAD_DIM, 1),
                              offsets=(mb * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    tl.store(o_blk, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), boundary_check=(0,))


def launch(q, k, v, out, *, BLOCK_M, BLOCK_N, EXP2, HEAD_MAJOR, num_warps, num_stages):
    q, k, v, B, H, S, D, qk_scale = _prepare(q, k, v, out, EXP2)
    _attn_fwd_block_ptr[_grid(B, H, S, BLOCK_M, HEAD_MAJOR)](
        q, k, v, out, S, qk_scale, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, EXP2=EXP2,
        HEAD_MAJOR=HEAD_MAJOR, UPCAST=UPCAST, num_warps=num_warps, num_stages=num_stages)
'''

TMA = _PRELUDE + '''
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _attn_fwd_tma(q_desc, k_desc, v_desc, o_ptr, S, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  EXP2: tl.constexpr, HEAD_MAJOR: tl.constexpr, UPCAST: tl.constexpr):
    mb, bh = _program_coords(HEAD_MAJOR)
    row0 = bh * S  # first row of this head in the (B*H*S, D) views
    # Rows past this head's end belong to the next head (or are zero-filled past the
    # tensor): finite, masked to -inf as keys, multiplied by p = 0 as values, and never
    # stored as queries.
    q = q_desc.load([row0 + mb * BLOCK_M, 0])
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    s_full = (S // BLOCK_N) * BLOCK_N
    for start_n in range(0, s_full, BLOCK_N):
        k = k_desc.load([row0 + start_n, 0])
        v = v_desc.load([row0 + start_n, 0])
        acc, l_i, m_i = _online_step(acc, l_i, m_i, q, tl.trans(k), v, qk_scale, start_n + offs_n, S,
                                     BLOCK_M, BLOCK_N, False, EXP2, UPCAST)
    if s_full < S:
        k = k_desc.load([row0 + s_full, 0])
        v = v_desc.load([row0 + s_full, 0])
        acc, l_i, m_i = _online_step(acc, l_i, m_i, q, tl.trans(k), v, qk_scale, s_full + offs_n, S,
                                     BLOCK_M, BLOCK_N, True, EXP2, UPCAST)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(o_ptr + (tl.cast(row0, tl.int64) + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
             (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < S)


def launch(q, k, v, out, *, BLOCK_M, BLOCK_N, EXP2, HEAD_MAJOR, num_warps, num_stages):
    q, k, v, B, H, S, D, qk_scale = _prepare(q, k, v, out, EXP2)
    rows = B * H * S
    q_desc = TensorDescriptor.from_tensor(q.view(rows, D), [BLOCK_M, D])
    k_desc = TensorDescriptor.from_tensor(k.view(rows, D), [BLOCK_N, D])
    v_desc = TensorDescriptor.from_tensor(v.view(rows, D), [BLOCK_N, D])
    _attn_fwd_tma[_grid(B, H, S, BLOCK_M, HEAD_MAJOR)](
        q_desc, k_desc, v_desc, out, S, qk_scale, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        EXP2=EXP2, HEAD_MAJOR=HEAD_MAJOR, UPCAST=UPCAST, num_warps=num_warps, num_stages=num_stages)
'''

MAX_HEAD_DIM = 128  # the largest D among the cases; shared memory is budgeted for it


def _valid(algo, p):
    bm, bn, warps, stages = p["BLOCK_M"], p["BLOCK_N"], p["num_warps"], p["num_stages"]
    # Q tile plus num_stages K and V tiles, bf16.
    if (bm + stages * 2 * bn) * MAX_HEAD_DIM * 2 > 200 * 1024:
        return False
    # Registers: with D = 128 a 128 x 128 score tile next to the 128 x 128 accumulator
    # spills on 4 warps. 8 warps want 128 query rows (64 per warpgroup, as wgmma works).
    if bm * bn >= 128 * 128 and warps != 8:
        return False
    if warps == 8 and bm != 128:
        return False
    # Unpipelined loads (one stage) only where each step is a large block of keys.
    return stages > 1 or bn >= 64


_AXES = {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64, 128], "EXP2": [0, 1], "HEAD_MAJOR": [0, 1],
         "num_warps": [4, 8], "num_stages": [1, 2, 3]}


ALGORITHMS = (
    Algorithm("flash", FLASH.lstrip(), _AXES),
    Algorithm("block_ptr", BLOCK_PTR.lstrip(), _AXES),
    Algorithm("tma", TMA.lstrip(), _AXES),
)


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
    eager_source = src("""
        import torch
        import torch.nn.functional as F

        def launch(q, k, v, out):
            return (F.scaled_dot_product_attention(q, k, v),)
        """)

    def input_names(self):
        return ("q", "k", "v")

    def make_inputs(self, case, gen, device):
        shape = (case["B"], case["H"], case["S"], case["D"])
        return tuple(randn(shape, case.torch_dtype, gen, device) for _ in range(3))

    def output_specs(self, case):
        return (((case["B"], case["H"], case["S"], case["D"]), case.torch_dtype),)

    def reference(self, q, k, v):
        scale = 1.0 / math.sqrt(q.shape[-1])
        p = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * scale, dim=-1)
        return ((p @ v.float()).to(q.dtype),)

    def bytes_moved(self, case):
        return 4 * case["B"] * case["H"] * case["S"] * case["D"] * itemsize(case.dtype)

    def flops(self, case):
        return 4 * case["B"] * case["H"] * case["S"] * case["S"] * case["D"]

    tolerance_overrides = {torch.bfloat16: (1.6e-2, 2e-2)}

    algorithms = ALGORITHMS
    valid_variant = staticmethod(_valid)
