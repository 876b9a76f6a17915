"""Prefect flows: ``kernel_search``, ``backfill``, ``evaluate_surrogate``, ``train_surrogate``.

Each flow is a short function that calls tasks; the work is in ``tasks/`` and the core
packages. Flow runs are named for what they do ("search softmax on h100, learned, b32, seed 0"),
so a night of runs reads clearly in the Prefect UI.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed

from kernelcast.flows.nightly import start_night
from kernelcast.tasks import steps
from kernelcast.tasks.run_page import RunPage
from kernelcast.tasks.config import SearchConfig
from kernelcast.tasks.report import summary_lines
from kernelcast.tasks.search import screened_text


@task(name="prepare", cache_policy=NO_CACHE)
def prepare(config: SearchConfig):
    """Validate, reach every service, fit or load the surrogate, register the run, measure the reference."""
    from kernelcast.tasks.setup import open_search

    return open_search(config)


@task(name="finish", cache_policy=NO_CACHE)
def finish(search):
    return search.finish()


def _search_name() -> str:
    """'search softmax on h100, learned, b32, seed 0'; a deployment's run begins with the deployment and its
    scheduled time ('nightly-matmul 2026-12-06 02:00 UTC: search matmul ...'), so last night's matmul search
    is found by name as well as by its tags."""
    from prefect.runtime import deployment, flow_run

    p = flow_run.parameters
    name = (f"search {p['op']} on {p.get('gpu_type', 'auto')}, {p.get('surrogate', 'learned')}, "
            f"b{p.get('budget', 32)}, seed {p.get('seed', 0)}")
    when = flow_run.scheduled_start_time
    if deployment.id and when is not None:
        name = f"{deployment.name} {when.astimezone(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: {name}"
    return name


def _can_resume(values: dict) -> bool:
    """Whether a search of these settings may resume the run id among them (``check_resume`` accepts it)."""
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.config import ConfigError
    from kernelcast.tasks.search import check_resume
    from kernelcast.tasks.setup import resolve

    try:
        config = resolve(SearchConfig.from_mapping(values))
        check_resume(DataRoot(config.data, storage_options=dict(config.storage_options)), config)
    except ConfigError as exc:
        get_run_logger().warning("not continuing the interrupted run: %s", exc)
        return False
    return True


@flow(name="kernel-search", flow_run_name=_search_name, log_prints=True)
def kernel_search(op: str, gpu_type: str = "auto", budget: int | float = 32, generations: int = 4,
                  children: int = 256, budget_kind: str = "measurements", generator: str = "template", surrogate: str = "learned", policy: str = "budget", seed: int = 0,
                  run_id: str = "", data: str = "kernelcast-data", backend: str = "auto", tracking_uri: str = "",
                  options: dict[str, Any] | None = None) -> dict:
    """One search run: generations of generate -> forecast -> select -> measure -> update.

    ``budget`` is in ``budget_kind``'s units: measurements, gpu_seconds, or gpu_compile_seconds (GPU plus
    compile seconds charged). ``options`` takes any other ``SearchConfig`` setting (trust_threshold, target_risk,
    replay_pool, storage_options, llm_url, ...). Rerunning with the same ``run_id``
    replays the finished generations from the journal and continues after them.
    """
    logger = get_run_logger()
    settings = {"op": op, "gpu_type": gpu_type, "budget": budget, "budget_kind": budget_kind, "generations": generations,
                "children": children, "generator": generator, "surrogate": surrogate, "policy": policy, "seed": seed,
                "data": data, "backend": backend, "tracking_uri": tracking_uri, **(options or {})}
    # A deployment's run: named for its schedule, or continuing an interrupted night that has the same settings.
    night = start_night(run_id, lambda interrupted: _can_resume({**settings, "run_id": interrupted}))
    if night is not None:
        if night.skipped:
            logger.info(night.skipped)
            return Completed(message=night.skipped)
        if night.resumed_from:
            logger.info("continuing run %s, interrupted in flow run %s", night.run_id, night.resumed_from)
        run_id = night.run_id
    config = SearchConfig.from_mapping({**settings, "run_id": run_id})
    from kernelcast.kernels.harness.worker import GPU_LOCK_ENV

    if os.environ.get(GPU_LOCK_ENV):
        logger.info("GPU lock: %s (shared with every run served here: one kernel timed at a time)",
                    os.environ[GPU_LOCK_ENV])
    search = prepare(config)
    page = RunPage(search)
    try:
        for g in range(search.config.generations):
            stop = search.should_stop()
            if stop:
                logger.info("stopping before generation %d: %s", g, stop)
                break
            if g in search.completed:
                steps.replay(search, g)
                page.publish()
                continue
            gen = search.plan(g)
            steps.generate(search, gen)
            steps.forecast(search, gen)
            steps.select(search, gen)
            steps.measure(search, gen)
            for m in gen.measurements:
                if m.status != "ok":
                    steps.failed_measurement(m.candidate_id, g, m.status, m.error, return_state=True)
            summary = steps.update(search, gen)
            page.publish()
            if gen.skipped:
                logger.info("generation %d: %d execution variants not made: %s", g, len(gen.skipped),
                            "; ".join(f"{s.variant} of {s.parent_id}: {s.reason}" for s in gen.skipped[:8]))
            logger.info("generation %d: measured %d, trusted %d, dropped %d, best measured speedup %s",
                        g, summary.measured, summary.trusted, summary.dropped, summary.best_speedup)
            if summary.generator_asked:
                logger.info("generation %d: the model wrote %d children of %d asked; dropped before forecasting: %s",
                            g, summary.generator_children, summary.generator_asked, screened_text(summary))
        result = finish(search)
        page.publish(finished=True)
    finally:
        search.pool.close()
    for line in summary_lines(result, search.config.data, search.tracker.uri if search.tracker else "", None):
        logger.info(line)
    out = dataclasses.asdict(result)
    out["generations"] = [dataclasses.asdict(s) for s in result.generations]
    out["tracking_uri"] = search.tracker.uri if search.tracker else ""
    out["data"] = search.config.data
    return out


@flow(name="backfill", flow_run_name="backfill {op} from {source_gpu_type} to {target_gpu_type}", log_prints=True)
def backfill(source_gpu_type: str, target_gpu_type: str, op: str = "all", data: str = "kernelcast-data",
             backend: str = "replay", limit: int = 0, only_ok: bool = True,
             options: dict[str, Any] | None = None) -> dict:
    """Measure on ``target_gpu_type`` the candidates already measured on ``source_gpu_type``."""
    from kernelcast.tasks.backfill import backfill_plan, run_backfill

    plan = task(backfill_plan, name="plan backfill", cache_policy=NO_CACHE)(
        source_gpu_type, target_gpu_type, op, data, limit, only_ok, options or {})
    return task(run_backfill, name="measure backfill", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=10)(
        plan, backend, options or {})


@flow(name="evaluate-surrogate", flow_run_name="evaluate {surrogate} ({split} split)", log_prints=True)
def evaluate_surrogate(surrogate: str = "learned", data: str = "data/pools", split: str = "operation",
                       gpu_type: str | None = None, out: str = "kernelcast-eval", tracking_uri: str | None = None,
                       calibrator: str = "platt", recentre: bool = True):
    """Offline evaluation of a surrogate on held-out splits of a measured pool; table and plots under ``out``."""
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs
    from kernelcast.surrogate.evaluate import evaluate
    from kernelcast.surrogate.registry import get_forecaster_factory

    factory = get_forecaster_factory(surrogate)
    pairs = task(case_pairs, name="load pairs", cache_policy=NO_CACHE)(DataRoot(data), gpu_type=gpu_type)
    if pairs.empty:
        raise ValueError(f"no measured pairs under {data}")
    table = task(evaluate, name="evaluate", cache_policy=NO_CACHE)(
        factory, pairs, how=split, out_dir=out, name=surrogate, tracking_uri=tracking_uri, calibrator=calibrator,
        recentre=recentre)
    return table.to_dict("records")


@flow(name="train-surrogate", flow_run_name="train {surrogate} from {prior_data}", log_prints=True)
def train_surrogate(surrogate: str = "learned", prior_data: str = "", data: str = "kernelcast-data",
                    ops: str = "all", pairs: str = "", gpu_type: str | None = None,
                    grpo: dict[str, Any] | None = None, prior_scope: str = "other-ops") -> list[str] | dict:
    """Refit the surrogate prior for each operation (held out of its own prior, as ``prior_scope`` says) on
    ``gpu_type`` (default: as a search would choose) and store it under ``data``, where every later search
    of that operation on that GPU type picks it up instead of fitting again.

    ``surrogate='llm-grpo'`` instead trains an LLM surrogate with GRPO (``grpo`` holds
    ``kernelcast.surrogate.grpo.GRPOSettings``' fields) on the pairs file ``pairs``, or on pairs drawn from the
    ``gpu_type`` measurements of ``prior_data``, and returns its run: adapter, before/after metrics."""
    if surrogate == "llm-grpo":
        from kernelcast.surrogate.grpo import GRPOSettings, train_grpo
        from kernelcast.tasks.setup import grpo_pairs, grpo_tracker

        settings = GRPOSettings(**(grpo or {}))  # bad settings fail before any pair or model is loaded
        frame = task(grpo_pairs, name="load pairs", cache_policy=NO_CACHE)(prior_data, pairs, gpu_type, settings.seed)
        result = task(train_grpo, name="train with GRPO", task_run_name=f"GRPO, reward {settings.reward}",
                      cache_policy=NO_CACHE)(frame, settings, grpo_tracker(settings))
        return dataclasses.asdict(result)

    from kernelcast.kernels.ops import OPERATIONS
    from kernelcast.tasks.config import PACKAGED_POOL
    from kernelcast.tasks.setup import data_root, fit_prior, resolve

    names = list(OPERATIONS) if ops == "all" else [o.strip() for o in ops.split(",")]
    fitted = []
    for name in names:
        # Resolved as a search resolves it, so the fitted prior is stored under the key a search looks up.
        config = resolve(SearchConfig(op=name, surrogate=surrogate, prior_data=prior_data or PACKAGED_POOL,
                                      data=data, gpu_type=gpu_type or "auto", prior_scope=prior_scope))
        task(fit_prior, name="fit prior", task_run_name=f"fit {surrogate} for {name} ({prior_scope})",
             cache_policy=NO_CACHE)(config, data_root(config))
        fitted.append(name)
    return fitted
