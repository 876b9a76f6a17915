"""CPU cores for measuring: one reserved for the child that holds the GPU lock, the rest for compiling.

A kernel's measured runtime includes its host side: Python, argument handling, launches. A
host-bound call is timed slower when the core it runs on is shared with children compiling
ahead, and the children compiling at the moment differ from one measurement to the next. So
the worker splits the cores it may use: the last core (with its hyperthread siblings, which
share its execution units) is kept for the lock holder, and every child runs on the others
until it takes the lock. With a single core (or a single core's threads) there is nothing to
split, and every child runs everywhere. (On the H100 machine measured in docs/harness.md this
alone did not bring the null candidate to 1.00: that host's own speed moves from outside it;
``kernelcast.kernels.harness.timing`` re-times host-bound cases for that.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterable

_TOPOLOGY = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"
_GPUS = "/proc/driver/nvidia/gpus"  # one folder a GPU of the machine, named by its PCI address


@dataclass(frozen=True)
class CorePlan:
    """Where children run: ``compile`` until they hold the GPU lock, ``timing`` while they do."""

    timing: tuple[int, ...]
    compile: tuple[int, ...]

    @property
    def reserved(self) -> bool:
        """Whether the lock holder has cores of its own."""
        return not set(self.timing) & set(self.compile)


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a kernel CPU list such as ``0-3,8,10-11``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def siblings(cpu: int) -> set[int]:
    """``cpu`` and the hyperthreads sharing its core (``{cpu}`` where the topology cannot be read)."""
    try:
        with open(_TOPOLOGY.format(cpu)) as f:
            return parse_cpu_list(f.read()) | {cpu}
    except (OSError, ValueError):
        return {cpu}


def plan(cpus: Iterable[int] | None = None, reserve: bool = True,
         siblings_of: Callable[[int], set[int]] = siblings) -> CorePlan:
    """Split ``cpus`` (default: those this process may run on) into a timing core and compile cores."""
    allowed = sorted(set(os.sched_getaffinity(0) if cpus is None else cpus))
    if not allowed:
        raise ValueError("no CPUs to plan measurements on")
    timing = sorted(siblings_of(allowed[-1]) & set(allowed))
    rest = [c for c in allowed if c not in timing]
    if not reserve or not rest:
        return CorePlan(tuple(allowed), tuple(allowed))
    return CorePlan(tuple(timing), tuple(rest))


def share(index: int, parts: int, cpus: Iterable[int] | None = None,
          siblings_of: Callable[[int], set[int]] = siblings) -> tuple[int, ...]:
    """The ``index``-th of ``parts`` disjoint shares of ``cpus`` (default: this process's), whole cores each.

    Several GPUs of one machine each get a measurement worker; each worker's children must compile
    and time on cores of their own, or one GPU's lock holder shares a core with the other's compiling
    children. Hyperthread siblings stay in one share (they share a core's execution units)."""
    allowed = sorted(set(os.sched_getaffinity(0) if cpus is None else cpus))
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"share {index} of {parts}: the index must lie in 0..{parts - 1}")
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for cpu in allowed:
        if cpu not in seen:
            group = tuple(sorted(siblings_of(cpu) & set(allowed)))
            seen.update(group)
            groups.append(group)
    if len(groups) < parts:
        raise ValueError(f"{len(groups)} cores cannot be shared among {parts} workers: each needs one of its own")
    first, last = index * len(groups) // parts, (index + 1) * len(groups) // parts
    return tuple(sorted(c for g in groups[first:last] for c in g))


def gpu_of_machine(visible: str | None, gpus_dir: str = _GPUS) -> tuple[int, int] | None:
    """``(index, count)``: which of the machine's ``count`` GPUs a process that sees one of them measures on, from
    its ``CUDA_VISIBLE_DEVICES`` (an index or a UUID) and the driver's list of the machine's GPUs; None where it sees
    all of them or several, where the machine has one GPU, or where the driver's list cannot be read."""
    names = [v.strip() for v in (visible or "").split(",") if v.strip()]
    try:
        buses = sorted(os.listdir(gpus_dir))
    except OSError:
        return None
    if len(names) != 1 or len(buses) < 2:
        return None
    name = names[0]
    if name.isdigit():
        index = int(name)
        return (index, len(buses)) if index < len(buses) else None
    for index, bus in enumerate(buses):  # a UUID (GPU-...): the driver's information file of each GPU names it
        try:
            with open(os.path.join(gpus_dir, bus, "information")) as f:
                if any(line.split(":", 1)[-1].strip() == name for line in f if line.startswith("GPU UUID")):
                    return index, len(buses)
        except OSError:
            continue
    return None


def this_gpus_share(visible: str | None = None, gpus_dir: str = _GPUS, cpus: Iterable[int] | None = None,
                    machine_cpus: int | None = None) -> tuple[int, ...] | None:
    """The cores of this process's share (``share``) of ``cpus`` (default: those it may run on) where it measures on
    one of the machine's several GPUs (``gpu_of_machine``; default: this process's ``CUDA_VISIBLE_DEVICES``); None
    otherwise, where the machine has fewer cores than GPUs, or where the process was already given fewer than the
    machine's ``machine_cpus`` (default: all of them; ``taskset`` a GPU: that is its share already).

    Two processes measuring on two GPUs of one machine (two sweeps, two searches), each told nothing of the
    other, would otherwise each keep the same last core for its lock holder. Measured on a host of two H200s:
    two task sweeps' lock holders shared core 31, and five honest calls of milliseconds were rejected as work
    left on the device, their host's wake-up after the synchronisation delayed by the other's (docs/harness.md)."""
    found = gpu_of_machine(os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible, gpus_dir)
    allowed = sorted(set(os.sched_getaffinity(0) if cpus is None else cpus))
    if found is None or len(allowed) < (machine_cpus or os.cpu_count() or 0):
        return None
    try:
        return share(*found, cpus=allowed)
    except ValueError:
        return None


def pin(cpus: Iterable[int]) -> tuple[int, ...]:
    """Run the calling thread (and the threads it starts later) on ``cpus``; returns where it now runs."""
    os.sched_setaffinity(0, set(cpus))
    return tuple(sorted(os.sched_getaffinity(0)))
