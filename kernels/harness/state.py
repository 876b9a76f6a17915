"""Process-wide state a candidate can change, taken before its code loads and put back before every timed window.

A candidate that turns cuDNN off for the whole process at import (and on for its own calls) makes the reference
timed beside it slower; one that sets aside persisting L2 for a reused weight keeps it resident across the
harness's flushes. Neither changes what the candidate computes, so no check of outputs sees it: the harness
restores the settings below before each timed window (the candidate's and the reference's) and the row says
which it found changed. What a candidate sets inside its own call lasts only as long as its call is timed.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

# (name, read, write): torch's process-wide switches that change which kernels a call runs, or how precisely.
_SWITCHES = (
    ("torch.backends.cudnn.enabled", lambda: torch.backends.cudnn.enabled,
     lambda v: setattr(torch.backends.cudnn, "enabled", v)),
    ("torch.backends.cudnn.benchmark", lambda: torch.backends.cudnn.benchmark,
     lambda v: setattr(torch.backends.cudnn, "benchmark", v)),
    ("torch.backends.cudnn.deterministic", lambda: torch.backends.cudnn.deterministic,
     lambda v: setattr(torch.backends.cudnn, "deterministic", v)),
    ("torch.backends.cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32,
     lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
    ("torch.backends.cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32,
     lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
    ("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
     lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
     lambda v: setattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", v)),
    ("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
     lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
     lambda v: setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", v)),
    ("torch.get_float32_matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    ("torch.get_default_dtype", torch.get_default_dtype, torch.set_default_dtype),
    ("torch.are_deterministic_algorithms_enabled", torch.are_deterministic_algorithms_enabled,
     torch.use_deterministic_algorithms),
    ("torch.backends.cuda.flash_sdp_enabled", torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.enable_flash_sdp),
    ("torch.backends.cuda.mem_efficient_sdp_enabled", torch.backends.cuda.mem_efficient_sdp_enabled,
     torch.backends.cuda.enable_mem_efficient_sdp),
    ("torch.backends.cuda.math_sdp_enabled", torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.enable_math_sdp),
    ("torch.get_num_threads", torch.get_num_threads, torch.set_num_threads),
)
_CUDA_LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize


def snapshot() -> dict[str, object]:
    """The switches as they are now (taken before any candidate code runs)."""
    found = {}
    for name, read, _ in _SWITCHES:
        try:
            found[name] = read()
        except Exception:  # noqa: BLE001 - a switch this build of torch lacks
            continue
    return found


def swap(harness: dict[str, object], candidate: dict[str, object]):
    """(to the harness's, back to the candidate's): two functions that set only the switches where the two differ,
    for a reference called beside a candidate that changed some (None, None where it changed none)."""
    writes = [(write, harness[name], candidate[name]) for name, _, write in _SWITCHES
              if name in harness and name in candidate and harness[name] != candidate[name]]
    if not writes:
        return None, None

    def to_harness():
        for write, mine, _ in writes:
            write(mine)

    def to_candidate():
        for write, _, theirs in writes:
            write(theirs)
    return to_harness, to_candidate


def differing(harness: dict[str, object], candidate: dict[str, object]) -> list[str]:
    """The switches the candidate's process has set otherwise than the harness had them."""
    return [name for name in harness if name in candidate and harness[name] != candidate[name]]


def restore(taken: dict[str, object]) -> list[str]:
    """Put every switch back as ``taken`` had it; the names of those that had changed."""
    changed = []
    for name, read, write in _SWITCHES:
        if name not in taken:
            continue
        try:
            if read() != taken[name]:
                write(taken[name])
                changed.append(name)
        except Exception:  # noqa: BLE001 - cannot be read or written back: said so, not held against anyone
            changed.append(f"{name} (could not be restored)")
    return changed


@functools.lru_cache(maxsize=1)
def _cudart():
    """The CUDA runtime library this process loaded (torch's), or None; found once a process."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.exists(path):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


def reset_persisting_l2() -> str:
    """No L2 set aside for persisting accesses, and every line persisting so far made normal again: what the flush
    before each repetition then evicts is everything. Returns what was done ("" where there is no CUDA here)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return ""
    lib = _cudart()
    if lib is None:
        return "persisting L2: not reset (no CUDA runtime library found in this process)"
    size = ctypes.c_size_t(0)
    had = lib.cudaDeviceGetLimit(ctypes.byref(size), _CUDA_LIMIT_PERSISTING_L2)
    set_code = lib.cudaDeviceSetLimit(_CUDA_LIMIT_PERSISTING_L2, ctypes.c_size_t(0))
    reset_code = lib.cudaCtxResetPersistingL2Cache()
    if set_code or reset_code:
        return f"persisting L2: not reset (CUDA errors {set_code}, {reset_code})"
    return f"persisting L2: {size.value} bytes set aside, reset" if had == 0 and size.value else ""
