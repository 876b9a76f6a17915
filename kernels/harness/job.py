"""What a measuring child is told (``Job``): one candidate, how to confine it, and how to check and time it.

The worker makes one per candidate and hands it to the child (kernelcast.kernels.harness.runner); every stage of the
child's life reads its settings from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelcast.kernels.harness import sandbox
from kernelcast.kernels.records import Candidate


@dataclass(frozen=True)
class Job:
    candidate: Candidate
    mode: str  # "gpu" or "interpreter"
    scratch_dir: str
    lock_path: str
    triton_cache_dir: str
    seeds: int = 3
    recheck: bool = True  # the recheck round where nothing is verified (WorkerConfig.recheck)
    max_seconds_per_case: float = 1.0
    network: str = "namespace"  # strongest network protection to try (sandbox.NETWORK_CHOICES)
    filesystem: str = "landlock"
    cpu_seconds: int = 600
    address_space_bytes: int | None = 8 << 30  # interpreter mode only
    file_size_bytes: int = 512 << 20
    compile_target: str = ""  # "cuda:90": compile ahead for this target with no CUDA call; "": ask the device
    device_memory_bytes: int | None = None  # the device's memory for the fit check; None: ask the device
    alone: bool = False  # a retry after running out of device memory, with no other child running
    environment: tuple[tuple[str, str], ...] = ()  # variables the op's own code needs (set before CUDA starts)
    compile_cpus: tuple[int, ...] = ()  # where the child runs until it holds the lock (kernelcast.kernels.harness.cores)
    timing_cpus: tuple[int, ...] = ()  # where it runs while it holds the lock; () for both: wherever it may
    host_bound_windows: int = 5  # timing windows for a case whose host side outlasts the flush (the fastest counts)
    # The op's reference runtime per case, as the worker measured it; given, a host-bound case is timed
    # in one window with the reference and reported as this runtime times their ratio (``anchored``).
    reference_us: tuple[float, ...] = ()
    verify: bool = True  # the checks of kernelcast.kernels.harness.verify after each case is timed
    fresh_calls: int = 3  # verification calls on unseen inputs per case, each beside a call on a timing set
    peak_bandwidth_gbps: float | None = None  # the device's, for the physics floor; None: no floor
    peak_tflops: float | None = None
    l2_bytes: int = 0  # outputs up to this size may still sit in the L2 when the timed call ends
    precision: str = "tolerance"  # "strict": a result of a lower precision class than the reference fails
    protocol: str = "kernelcast"  # how cases are timed (kernelcast.kernels.harness.timing.PROTOCOLS)
    model_build: str = "auto"  # where an imported task's models are built (kernelcast.kernels.ops.base.MODEL_BUILDS)
    anchor_all: bool = False  # every case of a candidate timed again beside the reference, not only host-bound ones
    reference_host_bound: tuple[str, ...] = ()  # cases where the reference's own timing was host-bound
    warm_checks: bool = False  # the checks' comparisons and the libraries' handles warmed before the lock
    shared_checks: bool = False  # first calls and checks with the lock held shared (DeviceLock), timing alone

    def policy(self) -> sandbox.SandboxPolicy:
        return sandbox.SandboxPolicy(scratch_dir=self.scratch_dir, triton_cache_dir=self.triton_cache_dir,
                                     gpu=self.mode == "gpu", network=self.network, filesystem=self.filesystem,
                                     cpu_seconds=self.cpu_seconds, address_space_bytes=self.address_space_bytes,
                                     file_size_bytes=self.file_size_bytes,
                                     readable=(self.lock_path,) if self.lock_path else ())
