"""The loop's steps as Prefect tasks: thin skins over ``kernelcast.tasks.search.Search``'s methods.

Task runs are named for the step and generation ("measure g3"), so the Prefect UI reads
like the loop. Inputs are live objects, so no task result is cached; retries are set only
where repeating is safe: forecasting (LLM servers fail transiently) and measuring (what
was measured before a failure is stored and reused, never measured again).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from kernelcast.tasks.search import Generation, Search


@task(name="generate", task_run_name="generate g{gen.index}", cache_policy=NO_CACHE)
def generate(search: Search, gen: Generation):
    return search.generate(gen)


@task(name="forecast", task_run_name="forecast g{gen.index}", cache_policy=NO_CACHE, retries=2,
      retry_delay_seconds=5)
def forecast(search: Search, gen: Generation):
    return search.forecast(gen)


@task(name="select", task_run_name="select g{gen.index}", cache_policy=NO_CACHE)
def select(search: Search, gen: Generation):
    return search.select(gen)


@task(name="measure", task_run_name="measure g{gen.index}", cache_policy=NO_CACHE, retries=2,
      retry_delay_seconds=10)
def measure(search: Search, gen: Generation):
    return search.measure(gen)


@task(name="update", task_run_name="update g{gen.index}", cache_policy=NO_CACHE)  # not idempotent: no retries
def update(search: Search, gen: Generation):
    return search.update(gen)


@task(name="replay", task_run_name="replay g{g} from the journal", cache_policy=NO_CACHE)
def replay(search: Search, g: int):
    """A generation finished by an earlier attempt of this run, rebuilt from the journal (no GPU time)."""
    return search.run_generation(g)


class MeasurementFailed(Exception):
    """A measured child that did not pass: its status and the harness's reason."""


@task(name="measurement failed", task_run_name="{status} {candidate_id:.12} g{generation}", cache_policy=NO_CACHE)
def failed_measurement(candidate_id: str, generation: int, status: str, error: str):
    """One failed measurement as a failed task run, its reason the state's message (the search goes on)."""
    raise MeasurementFailed(f"{status}: {error or 'no reason recorded'}"[:2000])
