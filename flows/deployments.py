"""Deployments: the nightly searches and the on-demand flows, served by ``kernelcast serve``.

``serve`` runs a long-lived process that polls a Prefect server for scheduled and manually
triggered runs of these deployments and runs each in a subprocess of its own; the server's
scheduler is what turns a cron into runs (``kernelcast.flows.server``). ``prefect.yaml`` at the
repository root declares the same deployments for ``prefect deploy`` onto a work pool.

Every run served here shares one GPU lock file (``$KERNELCAST_GPU_LOCK``, set here when unset):
two searches whose schedules overlap on one GPU queue on it, one kernel timed at a time, rather
than timing their kernels over each other.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping

from kernelcast.flows.search import backfill, evaluate_surrogate, kernel_search, train_surrogate

NIGHTLY_OPS = ("softmax", "layernorm", "rmsnorm", "cross_entropy", "fp8_quant", "bias_gelu", "matmul", "attention")
NIGHTLY_DEFAULTS = {"budget": 32, "generations": 4}
# kernel_search's own parameters; any other search setting travels in its ``options``.
_FLOW_PARAMETERS = ("gpu_type", "budget", "generations", "children", "budget_kind", "generator", "surrogate",
                    "policy", "seed", "backend", "tracking_uri")


def nightly_parameters(op: str, data: str, settings: Mapping[str, Any] | None = None) -> dict:
    """kernel_search's parameters for the nightly search of ``op``: the defaults, then ``settings`` (fields of
    ``SearchConfig``, as a ``--config`` file gives them); the run id is left to each run (its schedule's)."""
    values = {**NIGHTLY_DEFAULTS, **{k: v for k, v in (settings or {}).items() if k not in ("op", "data", "run_id")}}
    params = {"op": op, "data": data, **{k: values.pop(k) for k in _FLOW_PARAMETERS if k in values}}
    if values:
        params["options"] = values
    return params


def deployments(data: str = "kernelcast-data", cron: str = "0 2 * * *", ops: tuple[str, ...] = NIGHTLY_OPS,
                settings: Mapping[str, Any] | None = None, backfill_cron: str | None = None,
                backfill_backend: str = "ray") -> list:
    nightly = [kernel_search.to_deployment(
        name=f"nightly-{op.replace('_', '-')}", cron=cron, tags=["nightly", op],
        parameters=nightly_parameters(op, data, settings),
        description=f"Nightly surrogate-filtered search of {op} on this machine's GPU") for op in ops]
    return nightly + [
        kernel_search.to_deployment(name="search", parameters={"op": "softmax", "data": data},
                                    description="A search on demand; set op, budget, surrogate in the UI"),
        backfill.to_deployment(name="backfill", cron=backfill_cron, tags=["backfill"],
                               parameters={"source_gpu_type": "h100", "target_gpu_type": "h200", "data": data,
                                           "backend": backfill_backend}),
        evaluate_surrogate.to_deployment(name="evaluate", parameters={"data": data}),
        train_surrogate.to_deployment(name="train", cron="0 1 * * 0", parameters={"data": data},
                                      description="Weekly refit of the learned surrogate's priors"),
    ]


def shared_gpu_lock() -> str:
    """The GPU lock every run served from this process takes: ``$KERNELCAST_GPU_LOCK``, else one file per set of
    visible GPUs in the temporary folder (set in the environment the runs inherit)."""
    from kernelcast.kernels.harness.worker import GPU_LOCK_ENV

    if not os.environ.get(GPU_LOCK_ENV):
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "").replace(",", "-")
        os.environ[GPU_LOCK_ENV] = os.path.join(tempfile.gettempdir(), f"kernelcast-gpu{'-' + gpus if gpus else ''}.lock")
    return os.environ[GPU_LOCK_ENV]


def serve(data: str = "kernelcast-data", cron: str = "0 2 * * *", ops: tuple[str, ...] = NIGHTLY_OPS,
          settings: Mapping[str, Any] | None = None, backfill_cron: str | None = None,
          backfill_backend: str = "ray") -> None:
    """Serve the deployments until interrupted; runs a crashed process left Running are marked Crashed first."""
    from prefect import serve as prefect_serve

    from kernelcast.flows.nightly import mark_orphans_crashed

    lock = shared_gpu_lock()
    served = deployments(data, cron, ops, settings, backfill_cron, backfill_backend)
    for name in mark_orphans_crashed([d.name for d in served]):
        print(f"flow run {name!r} was left running by a process that is gone: marked Crashed; the next run of its "
              "deployment continues it", flush=True)
    print(f"GPU lock shared by the served runs: {lock}", flush=True)
    # Schedules stay active when serving stops: the nights due meanwhile are caught up once on the next start
    # (kernelcast.flows.nightly), where Prefect's default pauses them until someone resumes them by hand.
    prefect_serve(*served, pause_on_shutdown=False)
