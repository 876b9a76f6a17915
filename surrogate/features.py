"""Features of a forecast request: candidate launch params, static code, op case, hardware, anchor.

Every feature is a named float (NaN when it does not apply), so one table serves all
operations and a model can transfer across them: block elements per thread, rows per
program, persistence, how much of a row one block covers, the case's bytes and FLOPs,
and, when the anchor was measured, how close the anchor already is to the roofline.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

import numpy as np

from kernelcast.kernels.hardware import peak_tflops as hardware_peak_tflops
from kernelcast.kernels.ops import get_operation
from kernelcast.surrogate.forecast import ForecastRequest

_CODE_PATTERNS = {
    "n_kernels": r"@triton\.jit", "n_dot": r"tl\.dot\(", "n_exp": r"tl\.exp2?\(", "n_atomic": r"tl\.atomic_",
    "n_loops": r"\bfor\b", "n_range": r"tl\.range\(", "n_block_ptr": r"make_block_ptr",
    "n_descriptor": r"tensor_descriptor|TensorDescriptor", "n_reduce": r"tl\.(sum|max|min)\(",
    "n_where": r"tl\.where\(", "n_loads": r"tl\.load\(", "n_stores": r"tl\.store\(", "n_sqrt": r"rsqrt|sqrt\(",
    # CUDA C++ (torch.utils.cpp_extension.load_inline): what a hand-written kernel does on the device
    "n_cuda_global": r"__global__", "n_cuda_shared": r"__shared__", "n_cuda_launch": r"<<<",
    "n_cuda_vector": r"\b(?:float4|float2|half2|__half2|int4|__nv_bfloat162)\b",
    "n_cuda_warp": r"__shfl\w*|__reduce_\w+_sync|cooperative_groups|\bwmma::|\bmma\.sync",
    "n_cuda_unroll": r"#pragma\s+unroll", "n_cuda_sync": r"__syncthreads|__syncwarp",
    "n_cuda_extension": r"load_inline|cpp_extension", "n_cuda_library": r"cublas\w*|cudnn\w*\(|at::(?:mm|bmm|matmul|addmm|conv\w*)\b",
    # PyTorch: how the model is run and how much of it is still PyTorch's own operators
    "n_graph": r"cuda\.graph\(|CUDAGraph\(|make_graphed_callables|\.replay\(\)",
    "n_compile": r"\.compile\(|torch\.jit\.(?:script|trace)", "n_channels_last": r"channels_last",
    "n_backend_flags": r"cudnn\.(?:benchmark|deterministic|flags)|allow_tf32|set_float32_matmul_precision",
    "n_lower_precision": r"\b(?:__half|__nv_bfloat16|at::Half)\b|torch\.(?:float16|half|bfloat16)\b|\.half\(\)",
    "n_nn_modules": r"\bnn\.[A-Z]\w*\(", "n_functional": r"\bF\.\w+\(|functional\.\w+\(",
    "n_streams": r"cuda\.Stream\(|cudaStream\w*", "n_contiguous": r"\.contiguous\(\)",
}
_PERSIST_KEYS = ("PERSISTENT", "PER_SM", "PROGRAMS_PER_SM")
_ROW_KEYS = ("ROWS", "GROUPS_PER_PROG", "G")
_ROW_LENGTH = ("N", "V", "K", "S")

# Four groups, each a contiguous run of the feature vector: the candidate's launch parameters,
# the op case on the GPU (shared by a whole pool), the anchor, and the candidate's code.
PARAM_FEATURES = (
    "num_warps", "num_stages", "block_elems", "block_max", "block_m", "block_n", "block_k", "rows",
    "persistent", "per_sm", "log_waves", "vec", "split_k", "group_m", "elems_per_thread", "row_coverage",
    "log_programs",
)
CASE_FEATURES = (
    "log_bytes", "log_flops", "log_row_len", "log_rows", "dtype_bytes", "intensity", "memory_bound",
    "sm_count", "peak_gbps", "l2_mib", "log_roofline_us",
)
ANCHOR_FEATURES = ("anchor_is_reference", "log_anchor_us", "anchor_fraction_of_roofline", "log_anchor_operators",
                   "log_anchor_us_per_operator")
CODE_FEATURES = ("code_len", *_CODE_PATTERNS)
FEATURE_NAMES = PARAM_FEATURES + CASE_FEATURES + ANCHOR_FEATURES + CODE_FEATURES


def _first(params, keys, default=math.nan):
    for k in keys:
        if k in params:
            return float(params[k])
    return default


_CODE_REGEXES = tuple(re.compile(pattern) for pattern in _CODE_PATTERNS.values())


# Forecasting is called on thousands of requests per generation that share a handful of
# sources (one per template algorithm), op cases and GPUs; the costly parts (regex scans,
# bytes/FLOPs models) are computed once per distinct value. A search forecasts candidates
# on one op case and GPU at a time, so these caches stay small.
@lru_cache(maxsize=8192)
def _code_features(source: str) -> tuple[float, ...]:
    """CODE_FEATURES of a kernel's source: its length and counts of telling constructs."""
    return (float(len(source)), *(float(len(rx.findall(source))) for rx in _CODE_REGEXES))


@lru_cache(maxsize=1024)
def _case_features(op_name: str, case_names: tuple[str, ...], gpu_type: str, sm_count: int,
                   peak_gbps: float, l2_mib: float) -> tuple[tuple[float, ...], float, float, float]:
    """(CASE_FEATURES of this op case on this GPU, row length, rows, roofline us)."""
    op = get_operation(op_name)
    case = next((c for c in op.cases if c.name in case_names), op.cases[0])
    dims = dict(case.dims)
    row_len = next((case[d] for d in _ROW_LENGTH if d in dims), math.nan)
    rows_total = case["M"] if "M" in dims else math.nan
    bytes_, flops = op.bytes_moved(case), op.flops(case)
    peak_gbps = peak_gbps or math.nan
    peak_tflops = hardware_peak_tflops(gpu_type) or 500.0  # an unknown GPU: a mid-range guess
    roofline_us = max(bytes_ / (peak_gbps * 1e3) if peak_gbps == peak_gbps else 0.0, flops / (peak_tflops * 1e6))
    values = {
        "log_bytes": math.log(bytes_), "log_flops": math.log(flops + 1), "log_row_len": math.log(row_len),
        "log_rows": math.log(rows_total) if rows_total == rows_total else math.nan,
        "dtype_bytes": float(case.torch_dtype.itemsize), "intensity": flops / bytes_,
        "memory_bound": 1.0 if op.bound == "memory" else 0.0,
        "sm_count": float(sm_count or math.nan), "peak_gbps": peak_gbps, "l2_mib": float(l2_mib or math.nan),
        "log_roofline_us": math.log(roofline_us) if roofline_us > 0 else math.nan,
    }
    return tuple(values[n] for n in CASE_FEATURES), row_len, rows_total, roofline_us


_OPERATORS = re.compile(r"\bnn\.[A-Z]\w*\(|\bF\.\w+\(|functional\.\w+\(|\btorch\.(?!cuda\b|nn\b|backends\b|"
                        r"utils\b|jit\b|no_grad\b|randn\b|rand\b|zeros\b|ones\b|empty\b|manual_seed\b|device\b|"
                        r"Tensor\b|tensor\b|Size\b|float\w*\b|int\w*\b)\w+\(|\.(?:view|reshape|permute|transpose|"
                        r"matmul|mm|bmm|sum|mean|max|min|softmax|relu|sigmoid|tanh|clamp|exp|log|pow|add|mul|div)\(")


@lru_cache(maxsize=8192)
def _operators(source: str) -> float:
    """PyTorch operators an (eager) anchor's code calls, a proxy for its launches per call: a host-bound
    model of many small operators is what a CUDA graph or a fused kernel speeds up most."""
    return float(len(_OPERATORS.findall(source)))


def clear_feature_caches() -> None:
    """Forget cached code and case features (for benchmarks that time a cold start)."""
    _code_features.cache_clear()
    _operators.cache_clear()
    _case_features.cache_clear()


def _param_features(p, row_len: float, rows_total: float, sm_count: int) -> tuple[float, ...]:
    """PARAM_FEATURES of launch parameters ``p`` on a case with rows of ``row_len`` elements."""
    blocks = [float(v) for k, v in p.items() if k.startswith("BLOCK")]
    block_elems = math.prod(blocks) if blocks else math.nan
    block_n = float(p.get("BLOCK_N", p.get("BLOCK_V", math.nan)))
    warps = float(p.get("num_warps", 4))
    rows = _first(p, _ROW_KEYS, 1.0)
    programs = rows_total / rows  # NaN when the case has no rows
    has_programs = programs == programs and programs > 0
    return (
        warps, _first(p, ("num_stages", "STAGES")), block_elems, max(blocks) if blocks else math.nan,
        float(p.get("BLOCK_M", math.nan)), block_n, float(p.get("BLOCK_K", math.nan)), rows,
        1.0 if any(float(p.get(k, 0) or 0) > 0 for k in _PERSIST_KEYS) else 0.0,
        _first(p, ("PER_SM", "PROGRAMS_PER_SM"), 0.0),
        math.log(programs / sm_count) if has_programs and sm_count else math.nan,
        _first(p, ("VEC", "ALIGN")), _first(p, ("SPLIT_K",), 1.0), _first(p, ("GROUP_M",)),
        block_elems * rows / (32 * warps),  # NaN without blocks
        block_n / row_len,
        math.log(programs) if has_programs else math.nan,
    )


def request_features(req: ForecastRequest) -> list[float]:
    """The feature vector of one request (aligned with FEATURE_NAMES)."""
    hw = req.hardware
    case, row_len, rows_total, roofline_us = _case_features(
        req.op, tuple(req.case_names), hw.gpu_type, hw.sm_count, hw.peak_bandwidth_gbps, hw.l2_mib)
    anchor_us = req.anchor_runtime_us[0] if req.anchor_runtime_us else math.nan
    anchor_known = anchor_us == anchor_us and anchor_us > 0
    operators = _operators(req.anchor.source)
    anchor = (1.0 if req.anchor.origin == "seed" else 0.0,
              math.log(anchor_us) if anchor_known else math.nan,
              roofline_us / anchor_us if anchor_known else math.nan,
              math.log(operators + 1),
              math.log(anchor_us / (operators + 1)) if anchor_known else math.nan)
    return [*_param_features(req.candidate.params, row_len, rows_total, hw.sm_count), *case, *anchor,
            *_code_features(req.candidate.source)]


def feature_matrix(requests) -> np.ndarray:
    """(n, len(FEATURE_NAMES)) features of ``requests``, one row each."""
    if not requests:
        return np.empty((0, len(FEATURE_NAMES)))
    return np.array([request_features(r) for r in requests], dtype=np.float64)
