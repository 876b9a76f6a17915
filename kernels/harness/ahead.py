"""Compile ahead, on the CPU: a candidate's first call per case run on meta tensors, Triton kernels compiled, not run.

A candidate's first call is where Triton compiles its kernels: seconds of CPU work per
candidate. Run on the GPU, that call also makes the case's inputs (up to gigabytes) and
runs kernels, so children compiling at once would hold device memory together and run
work beside the child being timed. Here the first call runs instead on *meta* tensors
(shapes and dtypes, no memory, no compute): the candidate's host code computes its
grids and block sizes as it would on real inputs, and every Triton launch it makes is
turned into a compile for the measuring GPU's target (``triton.compile`` needs no GPU),
the artifacts landing in the worker's shared Triton cache. Autotuned kernels compile
every configuration; their benchmarking waits for the GPU lock.

While this runs, the ``DeviceGuard`` refuses any torch call that names the CUDA device
or a CUDA tensor, so nothing reaches the GPU before the lock. A first call that cannot
run on meta tensors (data-dependent host code, ``torch.compile``, a tensor made on CUDA
explicitly) is not a failure: that case's first call is made under the GPU lock instead,
as the runner records. Only a refusal by the anti-cheat guards, or a Triton compile
error, is a verdict here.

The dry run uses its own instance of the candidate's module, discarded afterwards, so
state the candidate keeps between calls (a cache keyed by shape, a call counter) starts
fresh for the real calls; the compiled kernels are found again in the Triton cache.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode


class NeedsDevice(Exception):
    """Host code touched the GPU (a CUDA tensor or device) where only meta tensors may be used."""


def _names_device(value, device_type: str) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == device_type
    if isinstance(value, torch.device):
        return value.type == device_type
    if isinstance(value, str):
        return value == device_type or value.startswith(device_type + ":")
    if isinstance(value, int) and not isinstance(value, bool):
        return False  # a bare device index is ambiguous (also a size); the tensors decide
    if isinstance(value, (tuple, list)):
        return any(_names_device(v, device_type) for v in value[:16])
    return False


class DeviceGuard(TorchFunctionMode):
    """Refuses torch calls that would put work or memory on ``device_type`` (raises ``NeedsDevice``)."""

    def __init__(self, device_type: str = "cuda"):
        super().__init__()
        self.device_type = device_type

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(_names_device(v, self.device_type) for v in args) or \
                any(_names_device(v, self.device_type) for v in kwargs.values()):
            name = getattr(func, "__name__", str(func))
            raise NeedsDevice(f"{name} uses the {self.device_type} device")
        return func(*args, **kwargs)


def _compile_only_driver(target):
    """A Triton driver that reports ``target`` and device 0 without asking CUDA anything."""
    from triton.backends.nvidia.driver import CudaDriver

    class CompileOnlyDriver(CudaDriver):
        def __init__(self):  # no CudaUtils: nothing here is loaded into a GPU
            self.launcher_cls = None

        @classmethod
        def is_active(cls):
            return False

        def get_current_target(self):
            return target

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            return torch.device("cuda", 0)

    return CompileOnlyDriver()


def parse_target(text: str):
    """A Triton GPU target from ``"cuda:90"`` (backend and capability), or None for ``""``."""
    if not text:
        return None
    from triton.backends.compiler import GPUTarget

    backend, _, arch = text.partition(":")
    if backend != "cuda" or not arch.isdigit():
        raise ValueError(f"bad compile target {text!r}; expected 'cuda:<major><minor>', e.g. cuda:90")
    return GPUTarget("cuda", int(arch), 32)


def target_of(compute_capability: str) -> str:
    """The compile target of a GPU with this compute capability ('9.0' -> 'cuda:90'); '' when unknown."""
    major, _, minor = (compute_capability or "").partition(".")
    return f"cuda:{int(major)}{int(minor or 0)}" if major.isdigit() and (minor or "0").isdigit() else ""


def warmable(kernel) -> bool:
    """Whether the C launcher of ``kernel`` may be built before CUDA's own utilities are loaded.

    A launcher takes the type of host-side TMA descriptors (``PyCUtensorMap``) from Triton's
    driver module when it is first loaded, and Python never loads an extension module twice:
    built here, before the CUDA driver has loaded that type, the launcher of a kernel taking
    tensor descriptors would keep None for it and refuse every descriptor at the real launch
    ("object must be of type PyCUtensorMap"). Such launchers are left to the first launch."""
    from triton.backends.nvidia import driver as nvidia

    takes_descriptors = any("tensordesc" in str(t) for t in getattr(kernel.src, "signature", {}).values())
    return not takes_descriptors or nvidia.PyCUtensorMap is not None


def _warm_launcher(kernel) -> None:
    """Build the C launcher of a compiled kernel now (cached on disk), not under the GPU lock; best effort."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        if warmable(kernel):
            CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 - no libcuda here, or another Triton: the launcher is built at first launch
        pass


@contextlib.contextmanager
def compile_only(target=None, interpreted: bool = False) -> Iterator[list]:
    """Within: Triton launches compile for ``target`` without running; autotuners compile every config.

    Under Triton's interpreter (``interpreted``) launches are skipped instead: nothing is
    compiled there, the host code alone is exercised. Yields the list of kernels compiled.
    """
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver

    compiled: list = []
    patches: list[tuple[type, str, object]] = []
    previous_driver = driver._active  # restored as it was: reset_active() would build a CUDA driver

    def patch(cls, name, value):
        patches.append((cls, name, cls.__dict__[name]))
        setattr(cls, name, value)

    def autotune_all(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        try:
            configs = self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs
            result = None
            for config in configs:
                result = self.fn.run(*args, **kwargs, **config.all_kwargs())
            return result
        finally:
            self.nargs = None

    patch(Autotuner, "run", autotune_all)
    if interpreted:
        from triton.runtime.interpreter import InterpretedFunction

        patch(InterpretedFunction, "run", lambda self, *args, grid=None, warmup=False, **kwargs: None)
    else:
        from triton.runtime.jit import JITFunction

        original_run = JITFunction.__dict__["run"]

        def compile_run(self, *args, grid, warmup, **kwargs):
            kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
            if kernel is not None:
                compiled.append(kernel)
                _warm_launcher(kernel)
            return kernel

        patch(JITFunction, "run", compile_run)
        if target is not None:
            driver.set_active(_compile_only_driver(target))
    try:
        yield compiled
    finally:
        for cls, name, value in reversed(patches):
            setattr(cls, name, value)
        if target is not None and not interpreted:
            driver._active = previous_driver


def meta_call(call: Callable[[], object], device_type: str) -> None:
    """Run ``call`` (a first call on meta inputs) with ``device_type`` refused."""
    with DeviceGuard(device_type):
        call()
