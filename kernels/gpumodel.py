"""A model of a GPU type that turns a kernel's facts (``kernelcast.kernels.facts``) into a runtime and what bounds it.

Per launch, the time is the largest of:

- *memory*: the bytes it moves at the datasheet bandwidth (times an achievable fraction);
- *compute*: its FLOPs at the peak of the unit and precision it runs on (tensor cores in TF32, BF16/FP16,
  or the FP32 pipes);
- *latency*: Little's law per program. A program keeps ``warps x 32 x load width x loads`` bytes in flight,
  so it streams its share of the bytes at that over the DRAM latency; programs run in waves of
  ``resident programs per SM x SMs``, where residency is the occupancy its registers, shared memory and
  warps allow. Tiny blocks, scalar loads, low occupancy and a grid of a few programs land here;

plus a device-side launch gap. The host adds its own time per operator (eager PyTorch dispatch, a Triton
launch, a torch.compile guard, a CUDA graph replay); launches are asynchronous, so a call takes the larger
of its host time and its device time. ``torch.compile`` is modelled as Inductor fuses: the library
calls stay, everything else becomes one kernel per reduction plus one, moving the graph's inputs and
outputs once.

The constants are datasheet figures (bandwidth, peak rates, SMs, L2, registers and shared memory per SM)
and a few latencies, stated below with where they come from; what the model gets wrong is left to the
learned correction fit on measured pools (``kernelcast.surrogate.physics``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernelcast.kernels.facts import KernelFacts, TritonLaunch


@dataclass(frozen=True)
class GPUModel:
    """One GPU type as the datasheet gives it, with the latencies the model uses."""

    gpu_type: str
    bandwidth_gbps: float  # DRAM, datasheet
    fp32_tflops: float  # FP32 pipes (non-tensor)
    tf32_tflops: float  # dense tensor cores
    bf16_tflops: float
    sm_count: int
    l2_mib: float
    regs_per_sm: int = 65536
    smem_per_sm: int = 228 * 1024
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    dram_latency_us: float = 0.7  # a load's round trip under load (microbenchmarks put H100 at 0.5-0.8 us)
    device_gap_us: float = 2.0  # a kernel's launch-to-start gap and ramp on the device
    # Host time per launch: an eager ATen operator through the dispatcher, a Triton launch from Python,
    # a view (no launch), a torch.compile'd call's guards and wrapper, a CUDA graph's replay, a module call.
    eager_op_us: float = 5.0
    view_us: float = 1.0
    triton_launch_us: float = 9.0
    compiled_call_us: float = 25.0
    graph_replay_us: float = 8.0
    module_call_us: float = 6.0
    achievable_bandwidth: float = 0.88  # of the datasheet figure, for a well-formed streaming kernel
    achievable_compute: float = 0.70  # of the datasheet peak, for a library GEMM


# Vendor datasheets (SXM where there are two), dense rates in TFLOP/s.
MODELS = {m.gpu_type: m for m in (
    GPUModel("h100", 3350.0, 66.9, 494.7, 989.4, 132, 50.0),
    GPUModel("h200", 4800.0, 66.9, 494.7, 989.4, 132, 50.0),
    GPUModel("gh200", 4000.0, 66.9, 494.7, 989.4, 132, 50.0),
    GPUModel("a100", 1935.0, 19.5, 156.0, 312.0, 108, 40.0, smem_per_sm=164 * 1024),
    GPUModel("h20", 4000.0, 44.0, 74.0, 148.0, 78, 60.0),
    GPUModel("l40s", 864.0, 91.6, 183.0, 362.0, 142, 96.0, smem_per_sm=100 * 1024, max_warps_per_sm=48,
             max_blocks_per_sm=24),
    GPUModel("l40", 864.0, 90.5, 90.5, 181.0, 142, 96.0, smem_per_sm=100 * 1024, max_warps_per_sm=48,
             max_blocks_per_sm=24),
    GPUModel("l4", 300.0, 30.3, 60.0, 121.0, 58, 48.0, smem_per_sm=100 * 1024, max_warps_per_sm=48,
             max_blocks_per_sm=24),
    GPUModel("rtx3090", 936.0, 35.6, 35.6, 71.0, 82, 6.0, smem_per_sm=100 * 1024, max_warps_per_sm=48,
             max_blocks_per_sm=16),
    GPUModel("b200", 8000.0, 80.0, 1100.0, 2250.0, 148, 126.0),
)}


def gpu_model(gpu_type: str) -> GPUModel:
    """The model of ``gpu_type``; a clear error where no datasheet is kept."""
    try:
        return MODELS[gpu_type]
    except KeyError:
        raise ValueError(f"no GPU model for {gpu_type!r}; known: {', '.join(MODELS)}") from None


SOFTMAX_POWER = 3.0


@dataclass(frozen=True)
class Estimate:
    """A modelled runtime and what bounds it."""

    runtime_us: float
    device_us: float
    host_us: float
    bound: str  # memory, compute, latency (occupancy and waves), launch (host), or unknown
    occupancy: float = math.nan  # resident warps per SM over the maximum, of the longest Triton launch
    waves: float = math.nan


def occupancy(launch: TritonLaunch, gpu: GPUModel) -> int:
    """Programs resident per SM: the least that warps, registers and shared memory allow."""
    warps = max(launch.num_warps, 1)
    by_warps = gpu.max_warps_per_sm // warps
    regs = launch.registers if launch.registers > 0 else 32
    by_regs = gpu.regs_per_sm // (regs * 32 * warps) if regs * 32 * warps else gpu.max_blocks_per_sm
    by_smem = gpu.smem_per_sm // launch.shared_bytes if launch.shared_bytes > 0 else gpu.max_blocks_per_sm
    return max(0, min(gpu.max_blocks_per_sm, by_warps, by_regs, by_smem))


def _peak(gpu: GPUModel, dtype: str, tensor_cores: bool, tf32: bool) -> float:
    """TFLOP/s for this precision path."""
    if dtype in ("bfloat16", "float16") and tensor_cores:
        return gpu.bf16_tflops
    if tensor_cores and tf32:
        return gpu.tf32_tflops
    return gpu.fp32_tflops


def triton_time(launch: TritonLaunch, gpu: GPUModel, flops: float, dtype: str) -> tuple[float, str, float, float]:
    """(device us, bound, occupancy fraction, waves) of one Triton launch that does ``flops``."""
    resident = occupancy(launch, gpu)
    if resident == 0 or launch.programs <= 0:
        return math.inf, "resources", 0.0, math.inf
    slots = resident * gpu.sm_count
    waves = launch.programs / slots
    memory = launch.arg_bytes / (gpu.bandwidth_gbps * gpu.achievable_bandwidth * 1e3)
    peak = _peak(gpu, dtype, launch.tensor_cores, True)  # tl.dot runs fp32 inputs in TF32 by default
    compute = flops / (peak * gpu.achievable_compute * 1e6) if flops else 0.0
    # bytes a program keeps in flight: per thread its widest load times its independent loads, and in a loop the
    # loads of the stages Triton pipelines ahead
    stages = max(launch.num_stages - 1, 1) if launch.loop else 1
    in_flight = launch.num_warps * 32 * max(launch.load_bits, 32) / 8 * min(max(launch.loads, 1), 8) * stages
    per_program = launch.arg_bytes / launch.programs
    program_us = gpu.dram_latency_us * (1.0 + per_program / in_flight)
    if launch.spill_bytes:  # spilled registers go to local memory: another round trip per spill
        program_us *= 1.0 + min(launch.spill_bytes / 64.0, 4.0)
    latency = math.ceil(waves) * program_us if waves < 8 else waves * program_us
    terms = {"memory": memory, "compute": compute, "latency": latency}
    bound = max(terms, key=terms.get)
    fraction = resident * launch.num_warps / gpu.max_warps_per_sm
    # a soft maximum: near the crossover both limits are felt (and two configurations bound alike still differ)
    t = sum(v ** SOFTMAX_POWER for v in terms.values()) ** (1.0 / SOFTMAX_POWER)
    return t + gpu.device_gap_us, bound, min(fraction, 1.0), waves


def _aten_time(bytes_: float, flops: float, library: str, dtype: str, gpu: GPUModel, tf32: bool) -> tuple[float, str]:
    memory = bytes_ / (gpu.bandwidth_gbps * gpu.achievable_bandwidth * 1e3)
    tensor_cores = library in ("cublas", "cudnn", "sdpa")
    # cuDNN convolutions may use TF32 by default; cuBLAS fp32 matmuls only where the flag allows
    peak = _peak(gpu, dtype, tensor_cores, tf32 or library == "cudnn")
    compute = flops / (peak * gpu.achievable_compute * 1e6) if flops else 0.0
    return (max(memory, compute) + gpu.device_gap_us, "compute" if compute > memory else "memory")


def estimate(facts: KernelFacts, gpu: GPUModel, reference_flops: float = 0.0) -> Estimate:
    """The modelled runtime of one call with these facts on ``gpu``. ``reference_flops`` (the task's reference's
    FLOPs) is what a Triton kernel using tensor cores is taken to do, since torch cannot count inside it."""
    if facts.status != "ok":
        return Estimate(math.nan, math.nan, math.nan, "unknown")
    device: dict[str, float] = {"memory": 0.0, "compute": 0.0, "latency": 0.0, "resources": 0.0}
    host = gpu.module_call_us
    aten = list(facts.aten)
    if facts.compiled:  # Inductor: library calls stay, the rest fuses into one kernel per reduction plus one
        library = [o for o in aten if o.library]
        fused = 1 + sum(1 for o in aten if not o.library and o.reduction)
        rest_bytes = facts.input_bytes + facts.output_bytes
        host += gpu.compiled_call_us + gpu.triton_launch_us * 0.5 * (fused + len(library))
        for o in library:
            t, b = _aten_time(o.bytes, o.flops, o.library, o.dtype, gpu, facts.allow_tf32)
            device[b] += t
        if len(aten) > len(library):
            device["memory"] += rest_bytes / (gpu.bandwidth_gbps * gpu.achievable_bandwidth * 1e3) \
                + fused * gpu.device_gap_us
    else:
        host += gpu.eager_op_us * len(aten) + gpu.view_us * facts.views
        for o in aten:
            t, b = _aten_time(o.bytes, o.flops, o.library, o.dtype, gpu, facts.allow_tf32)
            device[b] += t
    occ, waves, longest = math.nan, math.nan, -1.0
    groups: dict[int, list[tuple[float, str, float, float]]] = {}
    mma = [t for t in facts.triton if t.tensor_cores]
    dtype = next((o.dtype for o in aten), "float32")
    for i, launch in enumerate(facts.triton):
        flops = reference_flops / len(mma) if launch.tensor_cores and mma else 0.0
        timed = triton_time(launch, gpu, flops, dtype)
        key = launch.autotune_group if launch.autotune_group >= 0 else -(i + 1)
        groups.setdefault(key, []).append(timed)
    for timed in groups.values():
        t, bound, fraction, w = min(timed)  # an autotuner keeps its fastest configuration
        device[bound] += t
        if t > longest:
            longest, occ, waves = t, fraction, w
    host += gpu.triton_launch_us * len(groups)
    for call in facts.cuda_kernels:  # a CUDA C++ extension's function: one launch moving its tensors (no more known)
        host += gpu.eager_op_us
        device["memory"] += call["arg_bytes"] / (gpu.bandwidth_gbps * gpu.achievable_bandwidth * 1e3) \
            + gpu.device_gap_us
    if facts.graphed:  # a replay launches the captured kernels back to back, with no host dispatch each
        host = gpu.module_call_us + gpu.graph_replay_us
        busiest = max(device, key=device.get)
        device[busiest] -= min(0.5 * gpu.device_gap_us * facts.launches, 0.5 * device[busiest])
    total_device = sum(device.values())
    bound = "launch" if host > total_device else max(device, key=device.get)
    return Estimate(max(host, total_device) + min(host, total_device) * 0.1, total_device, host, bound, occ, waves)
