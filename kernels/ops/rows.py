"""What the row-wise operations share: the (M, N) row-op base, interpreter cases and template text.

Eight of the ten operations work over the rows of an (M, N) matrix. They share the input
and output conventions (``RowOp``), the tiny interpreter cases, the opening of the row-wise
template modules (``ROW_PRELUDE``: norms, cross-entropy, row sum) and, for the two norms, the
rule that prunes their template space (``norm_valid``).
"""

from __future__ import annotations

from kernelcast.kernels.ops.base import Operation, case, itemsize, randn

# Tiny row-op cases for the CPU interpreter: odd, power-of-two and long-ish rows, three dtypes.
ROW_INTERPRET_CASES = (case("float32", M=5, N=37), case("bfloat16", M=3, N=256), case("float16", M=4, N=300))


class RowOp(Operation):
    """Operations over rows of an (M, N) matrix."""

    bound = "memory"

    def input_names(self):
        return ("x",)

    def make_inputs(self, case, gen, device):
        return (randn((case["M"], case["N"]), case.torch_dtype, gen, device),)

    def output_specs(self, case):
        return (((case["M"], case["N"]), case.torch_dtype),)

    def bytes_moved(self, case):
        return 2 * case["M"] * case["N"] * itemsize(case.dtype)


# The opening of every row-wise template module (norms, cross-entropy, row sum): imports, the
# grid-size rule for persistent variants, and the alignment helper that lets Triton prove
# 16-byte accesses when a row length is not a multiple of 16.
ROW_PRELUDE = '''
import torch
import triton
import triton.language as tl


def _programs(n_blocks, per_sm, x):
    """Grid size: one program per row block (PER_SM=0), or PER_SM persistent programs per SM."""
    if per_sm == 0:
        return n_blocks
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    return max(1, min(n_blocks, sms * per_sm))


def _vec(*sizes):
    """The largest power of two <= 16 that divides every size."""
    v = 16
    while v > 1 and any(s % v for s in sizes):
        v //= 2
    return v
'''

# The widest row among the norms' GPU cases (N = 8192); tiles are judged at that size in fp32.
_MAX_N = 8192


def norm_valid(row_vectors):
    """The norms' valid rule, given how many row-length vectors the normalise loop loads (x, w[, b])."""

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
