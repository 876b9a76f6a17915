"""LayerNorm and RMSNorm template spaces.

Algorithms (both ops unless noted):

- ``single_tile``: a whole row (``BLOCK_N = next_power_of_2(N)``) sits in registers, ROWS rows
  per program as a 2-D tile; x is read once and the statistics are exact two-pass sums over
  the registers. Fastest while the row fits in registers.
- ``looped``: a loop over BLOCK_N-wide chunks accumulates the statistics (sum and sum of
  squares for LayerNorm, sum of squares for RMSNorm), then a second loop normalises. x is read
  twice (the second read mostly hits L2), but registers stay small whatever N is.
- ``welford`` (LayerNorm only): like ``looped``, but the statistics are a per-lane Welford
  mean/M2, merged across lanes with Chan's formula in a ``tl.reduce``; numerically the most
  robust, and it costs extra arithmetic per element.
- ``two_kernel`` (RMSNorm only): the unfused form, one kernel writing 1/rms per row to a
  scratch vector and a 2-D elementwise kernel applying it; x comes from DRAM twice.

Axes shared by most algorithms: PER_SM is 0 for one program per row block, else the number
of persistent programs per SM (few programs per SM keep too few loads in flight: slower);
num_stages is passed to the launch and to ``tl.range`` over the chunk loops, where it
software-pipelines the loads through shared memory. ``launch`` passes N and the row stride as
multiples of VEC (the largest power of two <= 16 dividing both), so Triton can prove that rows
and masks are VEC-aligned and emit 16-byte loads even for sizes such as N=3000.
"""

from kernels.spaces import ROW_PRELUDE, Algorithm, TemplateSpace

_PRELUDE = ROW_PRELUDE

LN_SINGLE_TILE = _PRELUDE + '''

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

LN_LOOPED = _PRELUDE + '''

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

LN_WELFORD = _PRELUDE + '''

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

RMS_SINGLE_TILE = _PRELUDE + '''

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

RMS_LOOPED = _PRELUDE + '''

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

RMS_TWO_KERNEL = _PRELUDE + '''

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

# The widest row among the GPU cases (N = 8192); tiles are judged at that size in fp32.
_MAX_N = 8192


def _valid_for(row_vectors):
    """The valid rule, given how many row-length vectors the normalise loop loads (x, w[, b])."""

    def valid(algo, p):
        threads = 32 * p["num_warps"]
        # A persistent grid with fewer than 8 warps per SM cannot keep enough loads in flight.
        if 0 < p.get("PER_SM", 0) * p["num_warps"] < 8:
            return False
        if algo == "single_tile":
            # At most 64 fp32 row values per thread, or the tile spills.
            return p["ROWS"] * _MAX_N // threads <= 64
        tile = p["ROWS"] * p["BLOCK_N"]
        # Chunks from 4 to 32 elements per thread: fewer leaves loads narrow, more spills the
        # accumulators. Pipelined chunks of x, w (and b), fp32 at worst, must fit in shared
        # memory (about 227 KB on H100; leave headroom).
        return (4 <= tile // threads <= 32
                and p["num_stages"] * (p["ROWS"] + row_vectors - 1) * p["BLOCK_N"] * 4
                <= 160 * 1024)

    return valid


def _space(op, row_vectors, tile_src, looped_src, looped_per_sm, welford_src=None,
           two_kernel_src=None):
    algos = [
        Algorithm("single_tile", tile_src.lstrip(), {
            "ROWS": [1, 2, 4], "PER_SM": [0, 1, 2, 4, 8],
            "num_warps": [4, 8, 16], "num_stages": [1]}),
        Algorithm("looped", looped_src.lstrip(), {
            "BLOCK_N": [512, 1024, 2048, 4096], "ROWS": [1, 2, 4], "PER_SM": looped_per_sm,
            "num_warps": [4, 8, 16], "num_stages": [1, 3]}),
    ]
    if welford_src is not None:
        algos.append(Algorithm("welford", welford_src.lstrip(), {
            "BLOCK_N": [512, 1024, 2048], "ROWS": [1, 2], "PER_SM": [0, 4],
            "num_warps": [4, 8], "num_stages": [1, 3]}))
    if two_kernel_src is not None:
        algos.append(Algorithm("two_kernel", two_kernel_src.lstrip(), {
            "BLOCK_N": [512, 1024, 2048], "ROWS": [1, 2],
            "num_warps": [4, 8], "num_stages": [1, 3]}))
    return TemplateSpace(op=op, algorithms=algos, valid=_valid_for(row_vectors))


SPACES = {
    "layernorm": _space("layernorm", 3, LN_SINGLE_TILE, LN_LOOPED, [0, 1, 4],
                        welford_src=LN_WELFORD),
    "rmsnorm": _space("rmsnorm", 2, RMS_SINGLE_TILE, RMS_LOOPED, [0, 1, 2, 4],
                      two_kernel_src=RMS_TWO_KERNEL),
}
