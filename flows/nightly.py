"""What a search run started by a deployment decides before searching: its run id, and whether it runs at all.

* **Its run id** is named for its deployment and scheduled time (``nightly-matmul-20261206-0200``), and
  recorded on the flow run as the tag ``run:<id>``. A retry of the flow run (Prefect's, or "Retry" in the
  UI) keeps its scheduled time and so its run id: it resumes from the journal, no measurement taken twice.
* **An interrupted night continues.** When the deployment's previous run ended without finishing
  (crashed, as when the machine restarted, or failed) and no later flow run finished its search, this run
  takes that run id over and resumes it rather than starting a new search beside it; unless the deployment's
  settings changed since, which a resume refuses: then it starts anew.
* **A missed night is caught up once.** Every scheduled run that was due while nothing served it starts
  when a server and ``kernelcast serve`` are back; the latest of them searches and the older ones end at
  once, Completed with the message "skipped: ...". Late by minutes or by days, one search runs.

A run started without a deployment (``kernelcast search``), or with an explicit run id, is left as it is.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Callable

RUN_TAG = "run:"  # flow run tag naming the search run id it ran
SKIPPED = "skipped"  # first word of the message of a run skipped by the missed-run policy
_ENDED_UNFINISHED = ("CRASHED", "FAILED")


@dataclass(frozen=True)
class Night:
    """What a deployment's flow run does: search under ``run_id``, or end as ``skipped`` (the reason)."""

    run_id: str
    skipped: str = ""
    resumed_from: str = ""  # the flow run whose interrupted search this one continues


def run_id_for(deployment: str, scheduled: dt.datetime) -> str:
    """The search run id of a deployment's run scheduled at ``scheduled`` (UTC, to the minute)."""
    when = scheduled.astimezone(dt.timezone.utc).strftime("%Y%m%d-%H%M")
    return f"{re.sub(r'[^a-z0-9_.-]+', '-', deployment.lower())[:48]}-{when}"


def _run_tag(flow_run) -> str:
    return next((t[len(RUN_TAG):] for t in flow_run.tags if t.startswith(RUN_TAG)), "")


def plan_night(client, flow_run, deployment_name: str, now: dt.datetime | None = None,
               can_continue: Callable[[str], bool] = lambda run_id: True) -> Night:
    """The run id (or the skip) of ``flow_run``, a run of deployment ``deployment_name``, read from the server.
    ``can_continue(run_id)``: whether this run's settings may resume that interrupted run (else it starts anew)."""
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter,
                                                FlowRunFilterExpectedStartTime, FlowRunFilterTags)
    from prefect.client.schemas.sorting import FlowRunSort

    own = _run_tag(flow_run)
    if own:  # a retry: the run id it started with
        return Night(own)
    now = now or dt.datetime.now(dt.timezone.utc)
    mine = flow_run.expected_start_time or flow_run.start_time or now
    of_deployment = DeploymentFilter(id=DeploymentFilterId(any_=[flow_run.deployment_id]))
    due = FlowRunFilter(expected_start_time=FlowRunFilterExpectedStartTime(before_=now))  # not the nights to come
    runs = client.read_flow_runs(deployment_filter=of_deployment, flow_run_filter=due,
                                 sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=100)
    later_due = [r for r in runs if r.id != flow_run.id and r.expected_start_time is not None
                 and mine < r.expected_start_time <= now]
    if later_due:
        latest = max(r.expected_start_time for r in later_due)
        return Night("", skipped=f"{SKIPPED}: a later run of {deployment_name} (scheduled "
                                 f"{latest:%Y-%m-%d %H:%M} UTC) is also due; missed runs are caught up once")
    earlier = [r for r in runs if r.id != flow_run.id and _run_tag(r) and r.expected_start_time is not None
               and r.expected_start_time < mine and r.state_type is not None
               and r.state_type.value not in ("SCHEDULED", "PENDING")]
    if earlier:
        last = earlier[0]  # newest first
        previous = _run_tag(last)
        if last.state_type.value in _ENDED_UNFINISHED:
            tagged = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(
                all_=[RUN_TAG + previous])), limit=50)
            finished = any(r.state_type is not None and r.state_type.value == "COMPLETED" for r in tagged)
            if not finished and can_continue(previous):
                return Night(previous, resumed_from=str(last.id))
    return Night(run_id_for(deployment_name, mine))


def start_night(run_id: str, can_continue: Callable[[str], bool] = lambda run_id: True) -> Night | None:
    """Inside a flow run: its ``Night`` when a deployment started it without a run id, its run id tag set;
    None otherwise (the run goes on as it was called)."""
    from prefect import get_client
    from prefect.runtime import deployment, flow_run

    if run_id or not deployment.id:
        return None
    with get_client(sync_client=True) as client:
        me = client.read_flow_run(flow_run.id)
        night = plan_night(client, me, deployment.name or "deployment", can_continue=can_continue)
        if night.run_id and RUN_TAG + night.run_id not in me.tags:
            client.update_flow_run(me.id, tags=[*me.tags, RUN_TAG + night.run_id])
    return night


def mark_orphans_crashed(deployment_names: list[str]) -> list[str]:
    """Flow runs of these deployments left Running or Pending by a process that is gone (the machine restarted,
    ``kernelcast serve`` was killed), marked Crashed so that the next run continues them; called as serving
    starts, before any run of them can be running. Returns their names."""
    from prefect import get_client
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterName, FlowRunFilter,
                                                FlowRunFilterState, FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        stale = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=deployment_names)),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType.RUNNING, StateType.PENDING]))))
        for run in stale:
            client.set_flow_run_state(run.id, Crashed(message="the process serving it stopped before it ended "
                                                              "(kernelcast serve restarted)"), force=True)
    return [run.name for run in stale]
