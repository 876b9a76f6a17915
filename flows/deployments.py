"""Deployments: the nightly search and the on-demand flows, served by ``kernelcast serve``.

``serve`` runs a long-lived process that polls the Prefect server for scheduled and
manually triggered runs of these deployments; ``prefect.yaml`` at the repository root
declares the same deployments for ``prefect deploy`` onto a work pool.
"""

from __future__ import annotations

from kernelcast.flows.search import backfill, evaluate_surrogate, kernel_search, train_surrogate

NIGHTLY_OPS = ("softmax", "layernorm", "rmsnorm", "cross_entropy", "fp8_quant", "bias_gelu", "matmul", "attention")


def deployments(data: str = "kernelcast-data", cron: str = "0 2 * * *") -> list:
    nightly = [kernel_search.to_deployment(
        name=f"nightly-{op.replace('_', '-')}", cron=cron, tags=["nightly", op],
        parameters={"op": op, "budget": 32, "generations": 4, "data": data},
        description=f"Nightly surrogate-filtered search of {op} on this machine's GPU") for op in NIGHTLY_OPS]
    return nightly + [
        kernel_search.to_deployment(name="search", parameters={"op": "softmax", "data": data},
                                    description="A search on demand; set op, budget, surrogate in the UI"),
        backfill.to_deployment(name="backfill", parameters={"source_gpu_type": "h100", "target_gpu_type": "h200",
                                                            "data": data, "backend": "ray"}),
        evaluate_surrogate.to_deployment(name="evaluate", parameters={"data": data}),
        train_surrogate.to_deployment(name="train", cron="0 1 * * 0", parameters={"data": data},
                                      description="Weekly refit of the learned surrogate's priors"),
    ]


def serve(data: str = "kernelcast-data", cron: str = "0 2 * * *") -> None:
    from prefect import serve as prefect_serve

    prefect_serve(*deployments(data, cron))
