"""Cross-entropy, the operation and its template space: loss[r] = logsumexp(logits[r]) - logits[r, targets[r]].

Rows are long (V up to 50k), so every algorithm loops over BLOCK_V-wide chunks:

- ``online``: one pass; each lane keeps its own running max and rescaled sum of exponentials,
  merged across lanes once per row. The update needs a single exp per element
  (exp(-|x - m|) is either the new term or the rescale factor), and no cross-lane work inside
  the loop. ROWS rows per program as a 2-D tile.
- ``online_chunk``: one pass; the running max is per row, updated with each chunk's maximum,
  so each chunk costs a cross-warp reduction but the arithmetic is the textbook online softmax.
- ``two_pass``: a max pass, then a sum-of-exp pass; reads the logits twice (the second time
  mostly from L2).
- ``split``: SPLIT programs share a row, each reducing a slice of it to (max, sum) in a small
  fp32 workspace; a second tiny kernel merges the slices and subtracts the target logit.

ALIGN (``online``, ``online_chunk``): with ALIGN=8 a row is swept from the 8-element-aligned
address at or before its start, masking the few leading elements of the previous row by
value and loading the last partial group separately, so every load is 16-byte aligned even
when V is odd (V=50257); ALIGN=1 sweeps from the row start (16-byte loads only when Triton
can prove V a multiple of 16). ``two_pass`` and ``split`` instead pass V and the stride as
multiples of the largest power of two <= 16 dividing both.

PER_SM is 0 for one program per row (block), else the number of persistent programs per SM;
num_stages is passed to the launch and to ``tl.range`` over the chunk loops, where it
software-pipelines the loads through shared memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelcast.kernels.ops.base import Algorithm, case, itemsize, randn, src
from kernelcast.kernels.ops.rows import ROW_PRELUDE, RowOp

_PRELUDE = ROW_PRELUDE

ONLINE = _PRELUDE + '''

@triton.jit
def _ce_online(x_ptr, t_ptr, loss_ptr, M, V, stride, ALIGN: tl.constexpr,
               BLOCK_V: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr):
    # Running maxima start at a finite floor so that masked lanes (-inf) never meet
    # inf - inf; exp(-|x - m|) is then exactly 0 for them.
    NEG: tl.constexpr = -3.0e38
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_V)
    for rb in range(pid, tl.cdiv(M, ROWS), nprog):
        rows = rb * ROWS + tl.arange(0, ROWS)
        rmask = rows < M
        row_off = rows.to(tl.int64) * stride
        # Sweep each row from the ALIGN-aligned element at or before its start, so that loads
        # stay 16-byte aligned whatever the row length; the head elements (previous row) are
        # masked by value, the < ALIGN elements past the last aligned group by a tail load.
        base = (row_off // ALIGN) * ALIGN
        head = (row_off - base).to(tl.int32)
        end = head + V
        body_end = (end // ALIGN) * ALIGN
        x_rows = x_ptr + base[:, None]
        m = tl.full([ROWS, BLOCK_V], NEG, tl.float32)
        s = tl.zeros([ROWS, BLOCK_V], tl.float32)
        for start in tl.range(0, tl.max(body_end, axis=0), BLOCK_V, num_stages=STAGES):
            idx = start + cols[None, :]
            x = tl.load(x_rows + idx, mask=rmask[:, None] & (idx < body_end[:, None]),
                        other=-float("inf")).to(tl.float32)
            x = tl.where(idx >= head[:, None], x, -float("inf"))
            d = x - m
            e = tl.exp(-tl.abs(d))
            s = tl.where(d > 0, s * e + 1.0, s + e)
            m = tl.maximum(m, x)
        t_idx = body_end[:, None] + tl.arange(0, ALIGN)[None, :]
        x_tail = tl.load(x_rows + t_idx, mask=rmask[:, None] & (t_idx < end[:, None]),
                         other=-float("inf")).to(tl.float32)
        row_max = tl.maximum(tl.max(m, axis=1), tl.max(x_tail, axis=1))
        total = (tl.sum(s * tl.exp(m - row_max[:, None]), axis=1)
                 + tl.sum(tl.exp(x_tail - row_max[:, None]), axis=1))
        tgt = tl.load(t_ptr + rows, mask=rmask, other=0)
        x_t = tl.load(x_ptr + row_off + tgt, mask=rmask, other=0.0).to(tl.float32)
        tl.store(loss_ptr + rows, row_max + tl.log(total) - x_t, mask=rmask)


def launch(logits, targets, loss, *, ALIGN, BLOCK_V, ROWS, PER_SM, num_warps, num_stages):
    M, V = logits.shape
    grid = (_programs(triton.cdiv(M, ROWS), PER_SM, logits),)
    _ce_online[grid](logits, targets, loss, M, V, logits.stride(0), ALIGN=ALIGN,
                     BLOCK_V=BLOCK_V, ROWS=ROWS, STAGES=num_stages,
                     num_warps=num_warps, num_stages=num_stages)
'''

ONLINE_CHUNK = _PRELUDE + '''

@triton.jit
def _ce_online_chunk(x_ptr, t_ptr, loss_ptr, M, V, stride, ALIGN: tl.constexpr,
                     BLOCK_V: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_V)
    for row in range(pid, M, nprog):
        row_off = tl.cast(row, tl.int64) * stride
        # Sweep the row from the ALIGN-aligned element at or before its start, so that loads
        # stay 16-byte aligned whatever the row length; the head elements (previous row) are
        # masked by value, the < ALIGN elements past the last aligned group by a tail load.
        base = (row_off // ALIGN) * ALIGN
        head = (row_off - base).to(tl.int32)
        end = head + V
        body_end = (end // ALIGN) * ALIGN
        x_row = x_ptr + base
        t_idx = body_end + tl.arange(0, ALIGN)
        x_tail = tl.load(x_row + t_idx, mask=t_idx < end, other=-float("inf")).to(tl.float32)
        # The running max starts at the tail's maximum (or a finite floor): finite, so that
        # exp(m - m_new) never meets inf - inf.
        m = tl.maximum(tl.max(x_tail, axis=0), -3.0e38)
        s = tl.sum(tl.exp(x_tail - m), axis=0)
        for start in tl.range(0, body_end, BLOCK_V, num_stages=STAGES):
            idx = start + cols
            x = tl.load(x_row + idx, mask=idx < body_end, other=-float("inf")).to(tl.float32)
            x = tl.where(idx >= head, x, -float("inf"))
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        x_t = tl.load(x_ptr + row_off + tl.load(t_ptr + row)).to(tl.float32)
        tl.store(loss_ptr + row, m + tl.log(s) - x_t)


def launch(logits, targets, loss, *, ALIGN, BLOCK_V, PER_SM, num_warps, num_stages):
    M, V = logits.shape
    grid = (_programs(M, PER_SM, logits),)
    _ce_online_chunk[grid](logits, targets, loss, M, V, logits.stride(0), ALIGN=ALIGN,
                           BLOCK_V=BLOCK_V, STAGES=num_stages,
                           num_warps=num_warps, num_stages=num_stages)
'''

TWO_PASS = _PRELUDE + '''

@triton.jit
def _ce_two_pass(x_ptr, t_ptr, loss_ptr, M, v_div, sx_div,
                 VEC: tl.constexpr, BLOCK_V: tl.constexpr, STAGES: tl.constexpr):
    V = v_div * VEC
    stride = sx_div * VEC
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_V)
    for row in range(pid, M, nprog):
        row_off = tl.cast(row, tl.int64) * stride
        x_row = x_ptr + row_off
        mx = tl.full([BLOCK_V], -float("inf"), tl.float32)
        for start in tl.range(0, V, BLOCK_V, num_stages=STAGES):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
            mx = tl.maximum(mx, x)
        row_max = tl.max(mx, axis=0)
        acc = tl.zeros([BLOCK_V], tl.float32)
        for start in tl.range(0, V, BLOCK_V, num_stages=STAGES):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
            acc += tl.exp(x - row_max)
        x_t = tl.load(x_row + tl.load(t_ptr + row)).to(tl.float32)
        tl.store(loss_ptr + row, row_max + tl.log(tl.sum(acc, axis=0)) - x_t)


def launch(logits, targets, loss, *, BLOCK_V, PER_SM, num_warps, num_stages):
    M, V = logits.shape
    vec = _vec(V, logits.stride(0))
    grid = (_programs(M, PER_SM, logits),)
    _ce_two_pass[grid](logits, targets, loss, M, V // vec, logits.stride(0) // vec, VEC=vec,
                       BLOCK_V=BLOCK_V, STAGES=num_stages, num_warps=num_warps,
                       num_stages=num_stages)
'''

SPLIT = _PRELUDE + '''

@triton.jit
def _ce_split_partial(x_ptr, part_m_ptr, part_s_ptr, v_div, sx_div, blocks_per_split,
                      VEC: tl.constexpr, BLOCK_V: tl.constexpr, SPLIT: tl.constexpr,
                      STAGES: tl.constexpr):
    V = v_div * VEC
    stride = sx_div * VEC
    NEG: tl.constexpr = -3.0e38
    pid = tl.program_id(0)
    row = pid // SPLIT
    part = pid % SPLIT
    x_row = x_ptr + tl.cast(row, tl.int64) * stride
    lo = part * blocks_per_split * BLOCK_V
    hi = tl.minimum(lo + blocks_per_split * BLOCK_V, V)
    cols = tl.arange(0, BLOCK_V)
    m = tl.full([BLOCK_V], NEG, tl.float32)
    s = tl.zeros([BLOCK_V], tl.float32)
    for start in tl.range(lo, hi, BLOCK_V, num_stages=STAGES):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < hi, other=-float("inf")).to(tl.float32)
        d = x - m
        e = tl.exp(-tl.abs(d))
        s = tl.where(d > 0, s * e + 1.0, s + e)
        m = tl.maximum(m, x)
    part_max = tl.max(m, axis=0)
    tl.store(part_m_ptr + pid, part_max)
    tl.store(part_s_ptr + pid, tl.sum(s * tl.exp(m - part_max), axis=0))


@triton.jit
def _ce_split_combine(x_ptr, t_ptr, loss_ptr, part_m_ptr, part_s_ptr, M, stride,
                      SPLIT: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    idx = rows[:, None] * SPLIT + tl.arange(0, SPLIT)[None, :]
    pm = tl.load(part_m_ptr + idx, mask=rmask[:, None], other=0.0)
    ps = tl.load(part_s_ptr + idx, mask=rmask[:, None], other=0.0)
    row_max = tl.max(pm, axis=1)
    total = tl.sum(ps * tl.exp(pm - row_max[:, None]), axis=1)
    tgt = tl.load(t_ptr + rows, mask=rmask, other=0)
    x_t = tl.load(x_ptr + rows.to(tl.int64) * stride + tgt, mask=rmask, other=0.0).to(tl.float32)
    tl.store(loss_ptr + rows, row_max + tl.log(total) - x_t, mask=rmask)


def launch(logits, targets, loss, *, SPLIT, BLOCK_V, num_warps, num_stages):
    M, V = logits.shape
    vec = _vec(V, logits.stride(0))
    blocks_per_split = triton.cdiv(triton.cdiv(V, BLOCK_V), SPLIT)
    part_m = torch.empty((M, SPLIT), dtype=torch.float32, device=logits.device)
    part_s = torch.empty((M, SPLIT), dtype=torch.float32, device=logits.device)
    _ce_split_partial[(M * SPLIT,)](logits, part_m, part_s, V // vec, logits.stride(0) // vec,
                                    blocks_per_split, VEC=vec, BLOCK_V=BLOCK_V, SPLIT=SPLIT,
                                    STAGES=num_stages, num_warps=num_warps, num_stages=num_stages)
    block_m = 128
    _ce_split_combine[(triton.cdiv(M, block_m),)](logits, targets, loss, part_m, part_s, M,
                                                  logits.stride(0), SPLIT=SPLIT, BLOCK_M=block_m,
                                                  num_warps=4)
'''


def _valid(algo, p):
    tile = p.get("ROWS", 1) * p["BLOCK_V"]
    # A persistent grid with fewer than 8 warps per SM cannot keep enough loads in flight.
    if 0 < p.get("PER_SM", 0) * p["num_warps"] < 8:
        return False
    # 8 to 32 elements per thread and chunk: fewer wastes the wide loads, more spills the
    # per-lane state; pipelined chunks (fp32 at worst) must fit in shared memory.
    return 8 <= tile // (32 * p["num_warps"]) <= 32 and p["num_stages"] * tile * 4 <= 160 * 1024


ALGORITHMS = (
    Algorithm("online", ONLINE.lstrip(), {
        "ALIGN": [8], "BLOCK_V": [1024, 2048, 4096, 8192], "ROWS": [1, 2],
        "PER_SM": [0, 2], "num_warps": [4, 8, 16], "num_stages": [1, 3]}),
    Algorithm("online_chunk", ONLINE_CHUNK.lstrip(), {
        "ALIGN": [1, 8], "BLOCK_V": [1024, 2048, 4096, 8192], "PER_SM": [0, 1, 4],
        "num_warps": [4, 8, 16], "num_stages": [1, 3]}),
    Algorithm("two_pass", TWO_PASS.lstrip(), {
        "BLOCK_V": [1024, 2048, 4096, 8192], "PER_SM": [0, 4],
        "num_warps": [4, 8, 16], "num_stages": [1, 3]}),
    Algorithm("split", SPLIT.lstrip(), {
        "SPLIT": [2, 4, 8, 16], "BLOCK_V": [1024, 2048, 4096],
        "num_warps": [4, 8, 16], "num_stages": [1, 3]}),
)


class CrossEntropy(RowOp):
    name = "cross_entropy"
    forbidden_calls = ("cross_entropy", "cross_entropy_loss", "nll_loss", "log_softmax", "softmax",
                       "logsumexp")
    summary = "per-row cross-entropy loss from (M, V) logits and (M,) int64 targets, fp32 out"
    cases = (case("bfloat16", M=4096, V=32000), case("float32", M=8192, V=8192),
             case("bfloat16", M=2048, V=50257))
    interpret_cases = (case("float32", M=5, V=37), case("bfloat16", M=3, V=256),
                       case("float16", M=4, V=300))
    eager_source = src("""
        import torch
        import torch.nn.functional as F

        def launch(logits, targets, loss):
            return (F.cross_entropy(logits.float(), targets, reduction="none"),)
        """)

    def input_names(self):
        return ("logits", "targets")

    def make_inputs(self, case, gen, device):
        M, V = case["M"], case["V"]
        logits = randn((M, V), case.torch_dtype, gen, device, scale=3.0)
        targets = torch.randint(0, V, (M,), generator=gen, device=device, dtype=torch.int64)
        return (logits, targets)

    def output_specs(self, case):
        return (((case["M"],), torch.float32),)

    def reference(self, logits, targets):
        return (F.cross_entropy(logits.float(), targets, reduction="none"),)

    def bytes_moved(self, case):
        return case["M"] * case["V"] * itemsize(case.dtype) + case["M"] * (8 + 4)

    def flops(self, case):
        return 4 * case["M"] * case["V"]

    tolerance_overrides = {torch.float32: (1e-4, 1e-4)}

    algorithms = ALGORITHMS
    valid_variant = staticmethod(_valid)
