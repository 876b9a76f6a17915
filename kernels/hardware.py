"""What GPU we are on: the spec recorded with every measurement, and its short routing name.

torch and triton are imported where a device is inspected, not here: the GPU type names are
what a command line checks its arguments against, before anything heavy loads.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from kernelcast.kernels.records import HardwareSpec

INTERPRETER = "interpreter"
KNOWN_GPU_TYPES = ("h200", "h100", "h20", "gh200", "b200", "b100", "a100", "a10g", "a10", "l40s", "l40",
                "l4", "v100", "t4", "rtx4090", "rtx3090", "mi300x", "mi250")


def gpu_type_of(device_name: str) -> str:
    """Short routing name of a device: 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    flat = re.sub(r"[^a-z0-9]", "", device_name.lower())
    for known in KNOWN_GPU_TYPES:
        if known in flat:
            return "gh200" if known == "h200" and "gh200" in flat else known
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug or "unknown-gpu"


def _nvml_fields(index: int) -> dict:
    """Clocks and bus width from NVML where it is installed; empty otherwise."""
    try:
        import pynvml  # shipped as nvidia-ml-py
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "bus_width_bits": pynvml.nvmlDeviceGetMemoryBusWidth(h),
            "driver_version": driver.decode() if isinstance(driver, bytes) else str(driver),
        }
    except Exception:  # NVML present but unusable (container, old driver): fall back
        return {}


def _nvidia_smi_fields(index: int) -> dict:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=clocks.max.sm,clocks.max.mem,driver_version",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20, check=True).stdout
        sm, mem, driver = [s.strip() for s in out.strip().split(",")]
        return {"sm_clock_mhz": int(sm), "mem_clock_mhz": int(mem), "driver_version": driver}
    except Exception:
        return {}


def detect(device_index: int = 0) -> HardwareSpec:
    """The spec of CUDA device ``device_index``, or the interpreter's when no GPU is present."""
    import torch
    import triton

    versions = {"torch_version": torch.__version__, "triton_version": triton.__version__}
    if not torch.cuda.is_available():
        return HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter", **versions)
    props = torch.cuda.get_device_properties(device_index)
    fields = {**_nvidia_smi_fields(device_index), **_nvml_fields(device_index)}
    return HardwareSpec(
        gpu_type=gpu_type_of(props.name),
        device_name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        sm_clock_mhz=int(fields.get("sm_clock_mhz", 0)),
        mem_clock_mhz=int(fields.get("mem_clock_mhz", 0)),
        bus_width_bits=int(fields.get("bus_width_bits", 0)),
        memory_gib=round(props.total_memory / 2**30, 2),
        l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 2),
        threads_per_sm=getattr(props, "max_threads_per_multi_processor", 0),
        driver_version=str(fields.get("driver_version", "")),
        cuda_version=str(torch.version.cuda or ""),
        **versions,
    )


# Dense bf16 tensor-core peaks from vendor datasheets (TFLOP/s); the benchmark measures the real one.
DENSE_BF16_TFLOPS = {"h100": 989.4, "h200": 989.4, "gh200": 989.4, "b200": 2250.0, "a100": 312.0,
                     "l40s": 362.0, "l40": 181.0, "l4": 121.0, "a10g": 70.0, "a10": 125.0}


def peak_tflops(gpu_type: str) -> float | None:
    return DENSE_BF16_TFLOPS.get(gpu_type)


@dataclass(frozen=True)
class Datasheet:
    """A GPU as its vendor's datasheet gives it: peak DRAM bandwidth, dense FP32 rate, SM count."""

    bandwidth_gbps: float
    fp32_tflops: float
    sm_count: int


# Vendor datasheets: H100 SXM5 80GB, A100 80GB PCIe, L40, H20, GeForce RTX 3090.
DATASHEETS = {"h100": Datasheet(3350.0, 66.9, 132), "a100": Datasheet(1935.0, 19.5, 108),
              "l40": Datasheet(864.0, 90.5, 142), "h20": Datasheet(4000.0, 44.0, 78),
              "rtx3090": Datasheet(936.0, 35.6, 82)}


def datasheet(gpu_type: str) -> Datasheet:
    """The datasheet figures of ``gpu_type``; a clear error where none is kept."""
    try:
        return DATASHEETS[gpu_type]
    except KeyError:
        raise ValueError(f"no datasheet kept for GPU type {gpu_type!r}; known: {', '.join(DATASHEETS)}") from None
