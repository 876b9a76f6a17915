"""Measurement backends behind one interface, and the single-machine pool that routes to them.

- ``LocalMeasurer``: this machine's GPU through the isolated harness (``kernelcast.kernels.harness``);
- ``ReplayMeasurer``: answers from a measured pool, for machines without a GPU; every
  record it returns says ``mode='replay'`` and ``replayed=True``, and keeps the time it
  was really measured;
- ``LocalMeasurePool``: one measurer per GPU type on this machine, the same interface as
  the Ray pool in ``infra/ray_pools.py``, so a search runs unchanged on one box or a cluster.

A measurer needs only torch, triton and the project's own code: it is what runs on a
GPU worker, with or without Ray around it.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Protocol, Sequence

from kernelcast.kernels.records import Candidate, HardwareSpec, Measurement


class Measurer(Protocol):
    gpu_type: str
    hardware: HardwareSpec | None

    def prepare(self, op: str) -> HardwareSpec:
        """Be ready to measure ``op`` (fail now if it cannot); the hardware measurements will run on."""
        ...

    def measure(self, candidates: Sequence[Candidate]) -> Iterator[Measurement]:
        ...

    def adopt_reference(self, m: Measurement) -> str | None:
        """Take ``m``, a stored measurement of its op's reference, as this measurer's own (its candidates are set
        against it and paired as it was); why it cannot, or None."""
        ...

    def close(self) -> None:
        ...


def adopt_reference(measurer, m: Measurement) -> str | None:
    """``measurer.adopt_reference(m)``; a measurer of a user's own without the method measures its own reference."""
    adopt = getattr(measurer, "adopt_reference", None)
    return adopt(m) if adopt is not None else f"{type(measurer).__name__} measures its own reference"


class LocalMeasurer:
    """The GPU (device ``index``) of this machine: compile, check and time in isolated children.

    ``mode="interpreter"`` runs the same isolated harness on the CPU under Triton's interpreter:
    correctness only, no timings, GPU type ``interpreter`` (what a machine without a GPU can say
    about a kernel nobody measured).
    """

    def __init__(self, concurrency: int = 0, timeout_s: float = 300.0, gpu_timeout_s: float = 60.0,
                 device_index: int = 0, mode: str = "gpu", cpus: tuple[int, ...] | None = None,
                 precision: str = "tolerance"):
        import os

        import torch
        import triton

        from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
        from kernelcast.kernels.hardware import INTERPRETER, detect

        if mode == "interpreter":
            self.hardware = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter",
                                         torch_version=torch.__version__, triton_version=triton.__version__)
        elif not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU is visible on this machine; use the replay backend "
                               "(answers from a measured pool) or a Ray cluster with GPU workers")
        else:
            self.hardware = detect(device_index)
        self.gpu_type = self.hardware.gpu_type
        cores = len(cpus) if cpus else len(os.sched_getaffinity(0))
        config = WorkerConfig(mode=mode, concurrency=concurrency or max(1, cores - 1), cpus=cpus,
                              timeout_s=timeout_s, gpu_timeout_s=gpu_timeout_s, precision=precision,
                              **({"seeds": 1} if mode == "interpreter" else {}))
        self._worker = MeasureWorker(self.hardware, config)

    def prepare(self, op: str) -> HardwareSpec:
        from kernelcast.kernels.ops import get_operation

        get_operation(op)
        return self.hardware

    def measure(self, candidates: Sequence[Candidate]) -> Iterator[Measurement]:
        return self._worker.measure(candidates)

    def adopt_reference(self, m: Measurement) -> str | None:
        return self._worker.adopt_reference(m)

    def close(self) -> None:
        self._worker.close()


class ReplayMeasurer:
    """Answers from the measurements of ``gpu_type`` stored under ``pool`` (a DataRoot or URI)."""

    def __init__(self, pool, gpu_type: str):
        from kernelcast.storage.dataset import DataRoot

        self.pool = pool if isinstance(pool, DataRoot) else DataRoot(pool)
        self.gpu_type = gpu_type
        self.hardware: HardwareSpec | None = None
        self._by_op: dict[str, dict[str, Measurement]] = {}

    def available_gpu_types(self) -> list[str]:
        base = self.pool.path.rstrip("/") + "/measurements"
        if not self.pool.fs.exists(base):
            return []
        found = {p.rsplit("gpu_type=", 1)[1].split("/", 1)[0] for p in self.pool.fs.find(base) if "gpu_type=" in p}
        return sorted(found)

    def _measured(self, op: str) -> dict[str, Measurement]:
        if op not in self._by_op:
            from kernelcast.storage.schema import measurements_from_frame

            frame = self.pool.read_measurements(op=op, gpu_type=self.gpu_type)
            if frame.empty:
                raise ValueError(f"the replay pool {self.pool.uri} has no {op} measurements on {self.gpu_type}; "
                                 f"it has GPU types: {', '.join(self.available_gpu_types()) or 'none'}")
            self._by_op[op] = {m.candidate_id: m for m in measurements_from_frame(frame)}
            if self.hardware is None:
                self.hardware = next(iter(self._by_op[op].values())).hardware
        return self._by_op[op]

    def prepare(self, op: str) -> HardwareSpec:
        self._measured(op)
        return self.hardware

    def measure(self, candidates: Sequence[Candidate]) -> Iterator[Measurement]:
        for c in candidates:
            known = self._measured(c.op).get(c.candidate_id)
            if known is None:
                yield Measurement(c.candidate_id, c.op, self.gpu_type, "rejected", "replay",
                                  error="replay: this candidate is not in the measured pool; measure it on a GPU",
                                  hardware=self.hardware, replayed=True)
            else:
                yield dataclasses.replace(known, mode="replay", replayed=True)

    def adopt_reference(self, m: Measurement) -> str | None:
        return "a replay answers from its pool's rows, each already set against the reference it was measured with"

    def close(self) -> None:
        self._by_op.clear()


class LocalMeasurePool:
    """Routes each request to this machine's measurer for the asked GPU type."""

    def __init__(self, measurers: Iterable[Measurer]):
        self.measurers = {m.gpu_type: m for m in measurers}

    @property
    def gpu_types(self) -> list[str]:
        return sorted(self.measurers)

    def prepare(self, op: str, gpu_type: str) -> HardwareSpec:
        return self._measurer(gpu_type).prepare(op)

    def _measurer(self, gpu_type: str) -> Measurer:
        try:
            return self.measurers[gpu_type]
        except KeyError:
            raise ValueError(f"no measurement backend for GPU type {gpu_type!r} here; this machine has: "
                             f"{', '.join(self.gpu_types) or 'none'}") from None

    def measure(self, candidates: Sequence[Candidate], gpu_type: str) -> Iterator[Measurement]:
        return self._measurer(gpu_type).measure(list(candidates))

    def adopt_reference(self, m: Measurement, gpu_type: str) -> str | None:
        return adopt_reference(self._measurer(gpu_type), m)

    def close(self) -> None:
        for m in self.measurers.values():
            m.close()
