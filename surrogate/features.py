"""Features of a forecast request: candidate launch params, static code, op case, hardware, anchor.

Every feature is a named float (NaN when it does not apply), so one table serves all
operations and a model can transfer across them: block elements per thread, rows per
program, persistence, how much of a row one block covers, the case's bytes and FLOPs,
and, when the anchor was measured, how close the anchor already is to the roofline.
"""

from __future__ import annotations

import math
import re

import numpy as np

from kernels.hardware import peak_tflops as hardware_peak_tflops
from kernels.ops import get_operation
from surrogate.forecast import ForecastRequest

_CODE_PATTERNS = {
    "n_kernels": r"@triton\.jit", "n_dot": r"tl\.dot\(", "n_exp": r"tl\.exp2?\(", "n_atomic": r"tl\.atomic_",
    "n_loops": r"\bfor\b", "n_range": r"tl\.range\(", "n_block_ptr": r"make_block_ptr",
    "n_descriptor": r"tensor_descriptor|TensorDescriptor", "n_reduce": r"tl\.(sum|max|min)\(",
    "n_where": r"tl\.where\(", "n_loads": r"tl\.load\(", "n_stores": r"tl\.store\(", "n_sqrt": r"rsqrt|sqrt\(",
}
_PERSIST_KEYS = ("PERSISTENT", "PER_SM", "PROGRAMS_PER_SM")
_ROW_KEYS = ("ROWS", "GROUPS_PER_PROG", "G")
_ROW_LENGTH = ("N", "V", "K", "S")

FEATURE_NAMES = (
    "num_warps", "num_stages", "block_elems", "block_max", "block_m", "block_n", "block_k", "rows",
    "persistent", "per_sm", "log_waves", "vec", "split_k", "group_m", "elems_per_thread", "row_coverage", "log_programs",
    "log_bytes", "log_flops", "log_row_len", "log_rows", "dtype_bytes", "intensity", "memory_bound",
    "sm_count", "peak_gbps", "l2_mib", "anchor_is_reference", "log_anchor_us", "anchor_fraction_of_roofline",
    "log_roofline_us", "code_len", *_CODE_PATTERNS,
)


def _first(params, keys, default=math.nan):
    for k in keys:
        if k in params:
            return float(params[k])
    return default


def request_features(req: ForecastRequest) -> np.ndarray:
    """The feature vector of one request (aligned with FEATURE_NAMES)."""
    op = get_operation(req.op)
    p = req.candidate.params
    case = next((c for c in op.cases if c.name in req.case_names), op.cases[0])
    blocks = {k: float(v) for k, v in p.items() if k.startswith("BLOCK")}
    block_elems = float(np.prod(list(blocks.values()))) if blocks else math.nan
    warps = float(p.get("num_warps", 4))
    row_len = next((case[d] for d in _ROW_LENGTH if d in dict(case.dims)), math.nan)
    rows_total = case["M"] if "M" in dict(case.dims) else math.nan
    rows = _first(p, _ROW_KEYS, 1.0)
    persistent = 1.0 if any(float(p.get(k, 0) or 0) > 0 for k in _PERSIST_KEYS) else 0.0
    bytes_, flops = op.bytes_moved(case), op.flops(case)
    hw = req.hardware
    peak_gbps = hw.peak_bandwidth_gbps or math.nan
    peak_tflops = hardware_peak_tflops(hw.gpu_type) or 500.0  # an unknown GPU: a mid-range guess
    roofline_us = max(bytes_ / (peak_gbps * 1e3) if peak_gbps == peak_gbps else 0.0, flops / (peak_tflops * 1e6))
    anchor_us = req.anchor_runtime_us[0] if req.anchor_runtime_us else math.nan
    src = req.candidate.source
    programs = (rows_total / rows) if rows_total == rows_total else math.nan
    values = {
        "num_warps": warps, "num_stages": _first(p, ("num_stages", "STAGES")),
        "block_elems": block_elems, "block_max": max(blocks.values()) if blocks else math.nan,
        "block_m": blocks.get("BLOCK_M", math.nan), "block_n": blocks.get("BLOCK_N", blocks.get("BLOCK_V", math.nan)),
        "block_k": blocks.get("BLOCK_K", math.nan), "rows": rows, "persistent": persistent,
        "per_sm": _first(p, ("PER_SM", "PROGRAMS_PER_SM"), 0.0),
        "log_waves": (math.log(programs / hw.sm_count) if programs == programs and programs > 0 and hw.sm_count
                      else math.nan),
        "vec": _first(p, ("VEC", "ALIGN")), "split_k": _first(p, ("SPLIT_K",), 1.0), "group_m": _first(p, ("GROUP_M",)),
        "elems_per_thread": block_elems * rows / (32 * warps) if block_elems == block_elems else math.nan,
        "row_coverage": (blocks.get("BLOCK_N", blocks.get("BLOCK_V", math.nan)) / row_len) if row_len == row_len else math.nan,
        "log_programs": math.log(programs) if programs == programs and programs > 0 else math.nan,
        "log_bytes": math.log(bytes_), "log_flops": math.log(flops + 1), "log_row_len": math.log(row_len),
        "log_rows": math.log(rows_total) if rows_total == rows_total else math.nan,
        "dtype_bytes": float(case.torch_dtype.itemsize), "intensity": flops / bytes_,
        "memory_bound": 1.0 if op.bound == "memory" else 0.0,
        "sm_count": float(hw.sm_count or math.nan), "peak_gbps": peak_gbps, "l2_mib": float(hw.l2_mib or math.nan),
        "anchor_is_reference": 1.0 if req.anchor.origin == "seed" else 0.0,
        "log_anchor_us": math.log(anchor_us) if anchor_us == anchor_us and anchor_us > 0 else math.nan,
        "anchor_fraction_of_roofline": roofline_us / anchor_us if anchor_us == anchor_us and anchor_us > 0 else math.nan,
        "log_roofline_us": math.log(roofline_us) if roofline_us > 0 else math.nan,
        "code_len": float(len(src)),
        **{k: float(len(re.findall(pat, src))) for k, pat in _CODE_PATTERNS.items()},
    }
    return np.array([values[n] for n in FEATURE_NAMES], dtype=np.float64)


def feature_matrix(requests) -> np.ndarray:
    return np.vstack([request_features(r) for r in requests]) if requests else np.empty((0, len(FEATURE_NAMES)))
