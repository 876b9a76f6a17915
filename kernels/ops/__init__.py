"""The operation suite and its registry: one module per operation, listed once below.

Each module under ``kernels/ops/`` holds one ``Operation`` subclass — reference, eager
baseline, cases, tolerances, bytes/FLOPs model — and its template space (source templates,
parameter axes, valid rule). ``kernelcast.kernels.ops.base`` is the contract they share, ``kernelcast.kernels.ops.rows``
what the row-wise ones share. ``OPERATIONS`` is the one registry: ``get_operation`` and
``kernelcast.kernels.spaces.get_space`` both read it. Adding an operation is one new module and one line
here (docs/operations.md).
"""

from __future__ import annotations

from kernelcast.kernels.formats import is_imported_name, load_operation
from kernelcast.kernels.ops.attention import Attention
from kernelcast.kernels.ops.base import (DEFAULT_TOLERANCES, DTYPES, SHORT_DTYPE, Algorithm, Case, Operation, case,
                              mismatch)
from kernelcast.kernels.ops.bias_gelu import BiasGelu
from kernelcast.kernels.ops.cross_entropy import CrossEntropy
from kernelcast.kernels.ops.fp8_quant import FP8Quant
from kernelcast.kernels.ops.layernorm import LayerNorm
from kernelcast.kernels.ops.matmul import Matmul
from kernelcast.kernels.ops.rmsnorm import RMSNorm
from kernelcast.kernels.ops.row_sum import RowSum
from kernelcast.kernels.ops.softmax import Softmax
from kernelcast.kernels.ops.transpose import Transpose

__all__ = ["DEFAULT_TOLERANCES", "DTYPES", "OPERATIONS", "SHORT_DTYPE", "Algorithm", "Case", "Operation", "case",
           "get_operation", "mismatch"]

# The registry, in the order the suite is listed (``kernelcast ops``, reports, benchmarks).
OPERATIONS: dict[str, Operation] = {
    op.name: op for op in (
        Softmax(),
        LayerNorm(),
        RMSNorm(),
        CrossEntropy(),
        FP8Quant(),
        BiasGelu(),
        RowSum(),
        Transpose(),
        Matmul(),
        Attention(),
    )
}


def get_operation(name: str) -> Operation:
    """The operation called ``name`` (built in, or an imported task: ``kb.*``, ``gpumode.*``), or an error
    that lists the known ones."""
    op = OPERATIONS.get(name)
    if op is not None:
        return op
    if is_imported_name(name):
        return load_operation(name)
    raise ValueError(f"unknown operation {name!r}; known: {', '.join(OPERATIONS)}, or an imported task "
                     "(kb.NAME, gpumode.NAME)")
