"""Ray actor pools: GPU measurement routed by GPU type, and forecasters spread over actors.

Routing rests on one convention (``infra/cluster.yaml``): a node advertises each GPU it holds
as one unit of the custom resource ``gpu_type:<type>``. ``RayMeasurePool`` starts one actor
per unit, each asking for one unit (and one real GPU where the nodes have them), so Ray can
only place it on a node of that type. Types whose nodes declare no GPU are emulated: their
actors answer from a measured pool (``ReplayMeasurer``), as on a laptop or in the tests.

A measurement actor holds one ``Measurer`` from ``infra/measure.py`` and forwards to it; it
imports torch, triton and the project's core only, never prefect or mlflow. Actors restart
when they die, and a death costs the candidates in flight on that actor (reported
``crashed``), never the batch.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError, RayTaskError

from kernelcast.infra.measure import adopt_reference
from kernelcast.kernels.records import Candidate, HardwareSpec, Measurement

if TYPE_CHECKING:
    from kernelcast.surrogate.forecast import Forecast, ForecastRequest

GPU_TYPE_RESOURCE = "gpu_type:"  # + "h100": one unit per GPU of that type on a node
ORCHESTRATION = ("prefect", "mlflow")  # what a measurement worker must never need


@dataclass(frozen=True)
class ActorInfo:
    """Where a measurement actor runs and what answers for it."""

    gpu_type: str
    node_id: str
    pid: int
    mode: str  # "gpu" (the node's GPU through the isolated harness) or "replay" (a measured pool)
    orchestration_modules: tuple[str, ...]  # loaded in the actor's process; stays empty


class MeasureActor:
    """One GPU (or one emulated GPU type) and the Measurer that measures on it."""

    def __init__(self, gpu_type: str, use_gpu: bool, replay_pool=None, measurer_factory=None,
                 measurer_options: dict | None = None):
        from kernelcast.infra.measure import LocalMeasurer, ReplayMeasurer

        self.gpu_type = gpu_type
        if measurer_factory is not None:
            self.measurer = measurer_factory(gpu_type)
        elif use_gpu:  # Ray has set CUDA_VISIBLE_DEVICES; the node's other GPUs have their own cores
            options = dict(measurer_options or {})
            options.setdefault("cpus", _core_share())
            self.measurer = LocalMeasurer(**options)
            if self.measurer.gpu_type != gpu_type:
                self.measurer.close()
                raise RuntimeError(f"this node advertises {GPU_TYPE_RESOURCE}{gpu_type} but its GPU is "
                                   f"{self.measurer.hardware.device_name}; fix its resources in the cluster config")
        elif replay_pool is not None:
            self.measurer = ReplayMeasurer(replay_pool, gpu_type)
        else:
            raise RuntimeError(f"{GPU_TYPE_RESOURCE}{gpu_type} is emulated (its node declares no GPU) and no replay "
                               f"pool was given to answer for it; pass replay_pool=<measured pool URI>")
        self.mode = "replay" if isinstance(self.measurer, ReplayMeasurer) else "gpu"

    def describe(self) -> ActorInfo:
        return ActorInfo(self.gpu_type, ray.get_runtime_context().get_node_id(), os.getpid(), self.mode,
                         tuple(m for m in ORCHESTRATION if m in sys.modules))

    def prepare(self, op: str) -> HardwareSpec:
        return self.measurer.prepare(op)

    def measure(self, candidates: Sequence[Candidate]) -> Iterator[Measurement]:
        yield from self.measurer.measure(candidates)  # a Ray generator: each result streams back when yielded

    def adopt_reference(self, m: Measurement) -> str | None:
        return adopt_reference(self.measurer, m)

    def close(self) -> None:
        self.measurer.close()


def _core_share() -> tuple[int, ...] | None:
    """This actor's share of its node's cores, one share per GPU of the node (None: a node of one GPU).

    Without it, the workers of a node's GPUs each start cores - 1 children over the same cores,
    and one GPU's lock holder shares its reserved core with the other GPU's compiling children."""
    from kernelcast.kernels.harness import cores

    ids = ray.get_gpu_ids()
    node = ray.get_runtime_context().get_node_id()
    gpus = next((int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("NodeID") == node), 0)
    if len(ids) != 1 or gpus < 2:
        return None
    return cores.share(int(ids[0]) % gpus, gpus)  # ids count from 0 on the node (modulo: a node given a subset)


class _Slot:
    """One actor of the pool, as the driver knows it."""

    def __init__(self, handle, gpu_type: str):
        self.handle, self.gpu_type = handle, gpu_type
        self.info: ActorInfo | None = None
        self.hardware: HardwareSpec | None = None


def cluster_gpu_types() -> dict[str, tuple[int, bool]]:
    """{gpu_type: (units in the cluster, whether its nodes hold real GPUs)} from the live nodes' resources."""
    found: dict[str, tuple[int, bool]] = {}
    for resources in (n["Resources"] for n in ray.nodes() if n.get("Alive")):
        for key, units in resources.items():
            if key.startswith(GPU_TYPE_RESOURCE):
                total, real = found.get(key[len(GPU_TYPE_RESOURCE):], (0, True))
                found[key[len(GPU_TYPE_RESOURCE):]] = (total + int(units), real and resources.get("GPU", 0) >= units)
    return found


def _local_resources(replay_pool) -> dict[str, float]:
    """Resources for a Ray started here: this machine's GPUs by type, else one emulated unit per replayed type."""
    import torch

    from kernelcast.infra.measure import ReplayMeasurer
    from kernelcast.kernels.hardware import detect

    if torch.cuda.is_available():
        return {GPU_TYPE_RESOURCE + detect(0).gpu_type: float(torch.cuda.device_count())}
    types = ReplayMeasurer(replay_pool, "").available_gpu_types() if replay_pool is not None else []
    return {GPU_TYPE_RESOURCE + t: 1.0 for t in types}


def _init_ray(address: str | None, resources: dict[str, float] | None = None) -> bool:
    """Connect to ``address``, or start a local Ray; True when this call started (and so owns) it."""
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address)
    else:  # actors' logs stay in Ray's session folder, so that a search's own output stays readable
        ray.init(resources=resources or {}, include_dashboard=False, log_to_driver=False)
    return True


class RayMeasurePool:
    """One measurement actor per GPU of a Ray cluster, routed by GPU type; the interface of ``LocalMeasurePool``."""

    def __init__(self, owns_ray: bool = False, chunk_size: int = 16, restart_timeout_s: float = 300.0):
        self._slots: dict[str, list[_Slot]] = {}
        self._adopted: dict[str, dict[str, Measurement]] = {}  # gpu type -> op -> the reference its actors adopted
        self._owns_ray = owns_ray
        self.chunk_size = chunk_size
        self.restart_timeout_s = restart_timeout_s

    @classmethod
    def connect(cls, address: str | None = None, replay_pool=None, *,
                measurer_factory: Callable[[str], object] | None = None, measurer_options: dict | None = None,
                local_resources: dict[str, float] | None = None, chunk_size: int = 16, max_restarts: int = 4,
                startup_timeout_s: float = 600.0, restart_timeout_s: float = 300.0) -> "RayMeasurePool":
        """One actor per ``gpu_type:<type>`` unit of the cluster at ``address`` (None: start a local Ray).

        ``replay_pool`` answers for emulated types; ``measurer_factory(gpu_type)``, when given, makes
        every actor's measurer instead; ``measurer_options`` go to ``LocalMeasurer`` on real GPUs.
        ``chunk_size`` candidates go to an actor at once: enough to keep its harness compiling while
        it times, and the most that the actor's death can cost.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        if isinstance(replay_pool, str) and "://" not in replay_pool:
            replay_pool = os.path.abspath(replay_pool)  # actors run in other working directories
        if not address and local_resources is None and not ray.is_initialized():
            local_resources = _local_resources(replay_pool)
        pool = cls(_init_ray(address, local_resources), chunk_size, restart_timeout_s)
        try:
            types = cluster_gpu_types()
            if not types:
                raise ValueError(f"the Ray cluster {address or '(local)'} advertises no GPU types; give each GPU "
                                 f"node a resource '{GPU_TYPE_RESOURCE}<type>' per GPU (see infra/cluster.yaml)")
            actor_class = ray.remote(MeasureActor)
            for gpu_type, (units, real) in sorted(types.items()):
                options = dict(resources={GPU_TYPE_RESOURCE + gpu_type: 1}, num_gpus=1 if real else 0, num_cpus=0,
                               max_restarts=max_restarts, max_task_retries=0)  # never re-run what killed an actor
                pool._slots[gpu_type] = [_Slot(actor_class.options(**options).remote(
                    gpu_type, real, replay_pool, measurer_factory, measurer_options), gpu_type) for _ in range(units)]
            slots = [s for group in pool._slots.values() for s in group]
            # An actor that cannot start (no GPU and no replay pool, a mislabelled node) fails here, by name.
            infos = ray.get([s.handle.describe.remote() for s in slots], timeout=startup_timeout_s)
            for slot, info in zip(slots, infos):
                slot.info = info
        except BaseException:
            pool.close()
            raise
        return pool

    @property
    def gpu_types(self) -> list[str]:
        return sorted(t for t, slots in self._slots.items() if slots)

    @property
    def actors(self) -> list[ActorInfo]:
        return [s.info for t in self.gpu_types for s in self._slots[t]]

    def _slots_of(self, gpu_type: str) -> list[_Slot]:
        if not self._slots.get(gpu_type):
            raise ValueError(f"no measurement actor for GPU type {gpu_type!r} in this Ray cluster; it has: "
                             f"{', '.join(self.gpu_types) or 'none'}")
        return self._slots[gpu_type]

    def prepare(self, op: str, gpu_type: str) -> HardwareSpec:
        """Ready every actor of ``gpu_type`` for ``op`` (fails now if any cannot); the hardware they measure on."""
        slots = self._slots_of(gpu_type)
        for slot, hardware in zip(slots, ray.get([s.handle.prepare.remote(op) for s in slots])):
            slot.hardware = hardware
        return slots[0].hardware

    def adopt_reference(self, m: Measurement, gpu_type: str) -> str | None:
        """Every actor of ``gpu_type`` takes ``m`` as its op's reference (``Measurer.adopt_reference``), and so does
        an actor that restarts later; the first actor's reason where one cannot, else None."""
        slots = self._slots_of(gpu_type)
        self._adopted.setdefault(gpu_type, {})[m.op] = m
        refused = [r for r in ray.get([s.handle.adopt_reference.remote(m) for s in slots]) if r]
        return refused[0] if refused else None

    def measure(self, candidates: Sequence[Candidate], gpu_type: str) -> Iterator[Measurement]:
        """Measurements of ``candidates`` on ``gpu_type``, spread over its actors, yielded as they complete."""
        return self._stream(list(candidates), gpu_type, list(self._slots_of(gpu_type)))

    def _stream(self, candidates: list[Candidate], gpu_type: str, idle: list[_Slot]) -> Iterator[Measurement]:
        queue = deque(candidates)
        # Chunks let a GPU actor's harness compile several candidates at once; no bigger than a
        # fair share, so that a small batch still spreads over every actor.
        size = max(1, min(self.chunk_size, math.ceil(len(queue) / len(idle))))
        running: dict = {}  # stream -> (slot, {candidate_id: candidate} yet to come back)
        restarting: dict = {}  # ping -> (slot, deadline): an actor that died, until it answers again
        yielded: set[str] = set()
        try:
            while queue or running or restarting:
                while idle and queue:
                    chunk = [queue.popleft() for _ in range(min(size, len(queue)))]
                    slot = idle.pop()
                    running[slot.handle.measure.remote(chunk)] = (slot, {c.candidate_id: c for c in chunk})
                if not running and not restarting:
                    break  # every actor of this type is gone
                ready, _ = ray.wait([*running, *restarting], num_returns=1, timeout=1.0)
                for ping in [p for p, (_, deadline) in restarting.items() if p in ready or time.monotonic() > deadline]:
                    idle.extend(self._restarted(restarting, ping))
                for stream in (w for w in ready if w in running):
                    slot, pending = running[stream]
                    try:
                        m = ray.get(next(stream))
                    except StopIteration:  # the chunk is done; anything it left out is reported, not lost
                        del running[stream]
                        idle.append(slot)
                        yield from _crashed(pending.values(), gpu_type, "the measurement actor skipped it", slot)
                        continue
                    except RayActorError as e:
                        del running[stream]
                        restarting[slot.handle.describe.remote()] = (slot, time.monotonic() + self.restart_timeout_s)
                        yield from _crashed(pending.values(), gpu_type, f"the measurement actor died while this "
                                            f"candidate was in flight ({type(e).__name__}); it restarts", slot)
                        continue
                    # Extras are a live GPU's reference measurement: once per call, not once per actor.
                    if pending.pop(m.candidate_id, None) is not None or m.candidate_id not in yielded:
                        yielded.add(m.candidate_id)
                        yield m
            yield from _crashed(queue, gpu_type, "no measurement actor of this GPU type is alive")
        finally:
            for stream in running:  # the caller stopped early: stop the actors' work too
                try:
                    ray.cancel(stream)
                except Exception:  # noqa: BLE001 - best effort; the actor finishes its chunk otherwise
                    pass

    def _restarted(self, restarting: dict, ping) -> list[_Slot]:
        """The slot back in service once its restarted actor answers; dropped when it cannot come back."""
        slot, deadline = restarting.pop(ping)
        try:
            slot.info = ray.get(ping, timeout=0)
            # a restarted actor starts bare: the references the pool adopted are its again
            ray.get([slot.handle.adopt_reference.remote(m) for m in self._adopted.get(slot.gpu_type, {}).values()])
            return [slot]
        except ActorUnavailableError:  # still restarting: ask again
            if time.monotonic() < deadline:
                time.sleep(0.05)
                restarting[slot.handle.describe.remote()] = (slot, deadline)
                return []
        except (RayActorError, TimeoutError):  # restarts used up, or no node of its type to restart on
            pass
        ray.kill(slot.handle, no_restart=True)
        self._slots[slot.gpu_type].remove(slot)
        return []

    def close(self) -> None:
        """Close the actors' measurers and kill the actors; shut Ray down only if this pool started it."""
        handles = [s.handle for group in self._slots.values() for s in group]
        if handles:
            ray.wait([h.close.remote() for h in handles], num_returns=len(handles), timeout=10)
        for h in handles:
            ray.kill(h, no_restart=True)
        self._slots = {}
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


def _crashed(candidates, gpu_type: str, why: str, slot: _Slot | None = None) -> Iterator[Measurement]:
    """``crashed`` measurements for candidates lost with an actor: reported, never silently dropped."""
    mode = slot.info.mode if slot else "gpu"
    where = f" (node {slot.info.node_id[:12]})" if slot else ""
    for c in candidates:
        yield Measurement(c.candidate_id, c.op, gpu_type, "crashed", mode, error=why + where,
                          hardware=slot.hardware if slot else None, replayed=mode == "replay")


class ForecastActor:
    """One forecaster, made inside the actor by a picklable factory (an HTTP client, a vLLM engine)."""

    def __init__(self, factory: Callable[[], object]):
        self.forecaster = factory()

    def identity(self) -> tuple[str, str]:
        return self.forecaster.name, self.forecaster.version

    def forecast(self, requests):
        return self.forecaster.forecast(requests)


class ForecasterPool:
    """N forecaster actors behind the ``Forecaster`` protocol: a batch is split in chunks, one per actor."""

    def __init__(self, factory: Callable[[], object], actors: int = 2, *, actor_options: dict | None = None,
                 max_restarts: int = 2, address: str | None = None, startup_timeout_s: float = 900.0):
        if actors < 1:
            raise ValueError(f"a forecaster pool needs at least one actor, got {actors}")
        self._owns_ray = _init_ray(address)
        # HTTP clients wait on the network: by default they take no CPU from the cluster's scheduling.
        options = {"num_cpus": 0, **(actor_options or {}), "max_restarts": max_restarts, "max_task_retries": 0}
        self._actors = [ray.remote(ForecastActor).options(**options).remote(factory) for _ in range(actors)]
        try:
            self.name, self.version = ray.get([a.identity.remote() for a in self._actors], timeout=startup_timeout_s)[0]
        except (RayError, TimeoutError) as e:
            self.close()
            raise RuntimeError(f"forecaster actors failed to start: {e}") from e

    @classmethod
    def of_openai(cls, base_url: str, model: str, actors: int = 4, **client_kwargs) -> "ForecasterPool":
        """Actors each holding an ``OpenAIForecaster`` for one OpenAI-compatible server (vLLM, llama.cpp)."""
        from kernelcast.surrogate.llm import OpenAIForecaster

        OpenAIForecaster(base_url, model, **client_kwargs)  # a malformed URL fails here, before any actor starts
        return cls(functools.partial(OpenAIForecaster, base_url, model, **client_kwargs), actors)

    @classmethod
    def of_vllm(cls, model_path: str, actors: int = 1, **engine_kwargs) -> "ForecasterPool":
        """Actors each running a vLLM engine on one GPU of their own; vllm is imported inside the actors only."""
        from kernelcast.surrogate.llm import VLLMForecaster

        return cls(functools.partial(VLLMForecaster, model_path, **engine_kwargs), actors,
                   actor_options={"num_gpus": 1, "num_cpus": 1})

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        """One forecast per request, in order; a failed actor's chunk comes back unparsed (never trusted)."""
        from kernelcast.surrogate.forecast import unparsed

        requests = list(requests)
        size = max(1, math.ceil(len(requests) / len(self._actors)))
        chunks = [requests[i:i + size] for i in range(0, len(requests), size)]
        calls = [actor.forecast.remote(chunk) for actor, chunk in zip(self._actors, chunks)]
        out: list[Forecast] = []
        for i, (chunk, call) in enumerate(zip(chunks, calls)):
            try:
                out += ray.get(call)
            except RayError as e:
                why = repr(e.cause) if isinstance(e, RayTaskError) else f"{type(e).__name__}: {str(e)[:300]}"
                out += [unparsed(r, self.name, self.version, raw_response=f"error: forecaster actor {i} failed: {why}")
                        for r in chunk]
        return out

    def close(self) -> None:
        for a in self._actors:
            ray.kill(a, no_restart=True)
        self._actors = []
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
