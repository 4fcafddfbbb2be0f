"""Prefect deployments of the `bert_pretraining` flow, each with a cron schedule.

Three kinds of deployment share one recipe:

- `full`: every stage; stages whose inputs and settings are unchanged are cached, so a
  weekly full run only recomputes what changed.
- `corpus-refresh`: only the corpus stage. Its fingerprint covers the input files' metadata,
  so a daily refresh recomputes the corpus only when the inputs changed (a new dump under a
  glob, an edited file); `bertpipe status` then shows the later stages as stale until the
  next full run.
- `evaluate`: only the evaluate stage, to re-score the current model.

The flow's parameter is the pydantic `PipelineConfig`, so the Prefect UI shows the recipe
as a typed form; each deployment stores the recipe resolved by `load_config` as that
parameter's default value (secrets are excluded from the dump and never reach the Prefect
database; a recipe with a password inside a URI is refused). The code is not packaged or
pushed anywhere: the deployments point at this checkout (a `set_working_directory` pull
step) and run on a process work pool, so a `prefect worker start --pool <pool>` on a machine
with this checkout and its virtualenv runs them.
"""

from __future__ import annotations

import json
import logging
import os
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from bertcore.errors import ConfigError
from flows.supervise import CRASH_AFTER_ENV, DEFAULT_CRASH_AFTER_S
from pipelines.registry import PipelineConfig, load_config

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/pipeline.py:bert_pretraining"
DEFAULT_POOL = "bertpipe"
DEFAULT_RECIPE_VARIABLE = "bertpipe_recipe"
VARIABLE_LIMIT = 5000
"""Prefect refuses a Variable whose value is this many characters or more."""

AUTOMATIONS = PROJECT_ROOT / "infra" / "prefect" / "automations.yaml"
"""The automations that mark a run whose heartbeats stopped Crashed and reschedule crashed runs."""
HEARTBEAT_AUTOMATION = "bertpipe-crash-on-missing-heartbeats"
HEARTBEAT_S = 30
"""Seconds between a flow run's heartbeat events (Prefect's minimum; its default is 180)."""

FLOW_RUN_ENV = {
    # Prefect shows only its own loggers unless told; the stage modules log through `logging`.
    "PREFECT_LOGGING_EXTRA_LOGGERS": "pipelines,bertcore,flows",
    # heartbeats that tell the server the flow-run process is alive (infra/prefect/automations.yaml)
    "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
    # the automation's window, for the flow run's own watch (flows/supervise.py); deploy sets the one it applied
    CRASH_AFTER_ENV: f"{DEFAULT_CRASH_AFTER_S:g}",
}


@dataclass(frozen=True)
class DeploymentKind:
    """One kind of deployment: which stages its runs select and its default schedule."""

    name: str
    description: str
    only: tuple[str, ...] | None
    cron: str | None
    """Default cron schedule (None: runs only when triggered)."""


KINDS: dict[str, DeploymentKind] = {
    kind.name: kind
    for kind in (
        DeploymentKind(
            "full",
            (
                "Every stage, raw text to an evaluated model; complete stages with unchanged inputs and settings "
                "are cached."
            ),
            None,
            "0 2 * * 6",  # Saturdays 02:00, after that night's corpus refresh
        ),
        DeploymentKind(
            "corpus-refresh",
            (
                "Only the corpus stage: recomputed when the input files changed; later stages become stale until "
                "the next full run."
            ),
            ("corpus",),
            "0 1 * * *",  # daily 01:00
        ),
        DeploymentKind(
            "evaluate",
            "Only the evaluate stage: re-scores the current model on the task files.",
            ("evaluate",),
            "0 6 * * 1",  # Mondays 06:00, after the weekend's full run
        ),
    )
}


@dataclass(frozen=True)
class DeploymentPlan:
    """Everything one deployment is created from; built without touching Prefect's API."""

    name: str
    kind: str
    description: str
    parameters: dict[str, Any]
    cron: str | None
    timezone: str
    tags: tuple[str, ...]


def recipe_parameter(cfg: PipelineConfig) -> dict[str, Any]:
    """The recipe as the JSON value of the flow's `config` parameter (secrets excluded):
    only the keys that differ from their defaults, so it stays readable in the UI and fits
    a Prefect Variable; the flow fills the defaults back in when it validates it. A
    password inside a URI cannot be stored (the JSON form masks it): refused, naming the key."""
    from bertcore.redact import userinfo_keys

    if keys := userinfo_keys(cfg.model_dump(mode="python")):
        raise ConfigError(
            f"{keys[0]}: a deployment keeps its recipe in Prefect's database, where a password inside a URI is masked; "
            "remove the user information and give the worker its credentials through its environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL)"
        )
    return cfg.model_dump(mode="json", exclude_defaults=True)


def plan_deployments(
    cfg: PipelineConfig,
    *,
    name_prefix: str,
    kinds: Sequence[str] | None = None,
    schedules: Mapping[str, str | None] | None = None,
    timezone: str = "UTC",
) -> list[DeploymentPlan]:
    """One plan per selected kind (default: all), in KINDS order.

    `schedules` overrides the default cron of some kinds; a None value leaves that
    deployment without a schedule (it runs when triggered from the UI or the API).
    """
    from prefect._internal.schemas.validators import validate_cron_string

    selected = list(KINDS) if kinds is None else list(dict.fromkeys(kinds))
    schedules = dict(schedules or {})
    for where, names in (("kinds", selected), ("schedules", list(schedules))):
        for name in names:
            if name not in KINDS:
                raise ConfigError(f"deploy {where}: unknown deployment kind {name!r}; kinds are: {', '.join(KINDS)}")
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"deploy timezone: {timezone!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)") from None
    if not name_prefix.strip():
        raise ConfigError("deploy name_prefix: must not be empty")

    config = recipe_parameter(cfg)
    plans = []
    for name in KINDS:
        if name not in selected:
            continue
        kind = KINDS[name]
        cron = schedules.get(name, kind.cron)
        if cron is not None:
            try:
                validate_cron_string(cron)
            except ValueError:
                raise ConfigError(
                    f"deploy schedules.{name}: {cron!r} is not a valid cron expression (e.g. '0 2 * * 6')"
                ) from None
        plans.append(
            DeploymentPlan(
                name=f"{name_prefix}-{name}",
                kind=name,
                description=kind.description,
                parameters={
                    "config": config,
                    "only": list(kind.only) if kind.only else None,
                    "from_stage": None,
                    "force": False,
                },
                cron=cron,
                timezone=timezone,
                tags=("bertpipe", f"recipe:{name_prefix}", name),
            )
        )
    return plans


def ensure_work_pool(name: str) -> None:
    """Create a process work pool called `name` unless it exists; an existing pool of another
    type is an error (these deployments run from a checkout, not from an image)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            try:
                client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
            except ObjectAlreadyExists:  # created meanwhile by another deploy
                pass
            return
    if pool.type != "process":
        raise ConfigError(
            f"deploy pool: work pool {name!r} has type {pool.type!r}; bertpipe deployments run this checkout "
            "in local processes, so use a process work pool (another --pool name creates one)"
        )


def _share_root_limit(root: str) -> None:
    """One slot for every deployment of this run root (flows/pipeline.py `one_writer` takes it),
    so a corpus refresh waits for a full run on the same root instead of colliding with it."""
    from prefect.client.orchestration import get_client

    from flows.pipeline import root_limit

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(root_limit(root), 1)


def load_automations(path: str | os.PathLike = AUTOMATIONS, crash_after_s: float | None = None) -> list[Any]:
    """The automations of `path` (YAML, the `prefect automation create --from-file` layout),
    validated; `crash_after_s` replaces the heartbeat automation's window."""
    from datetime import timedelta

    import yaml
    from prefect.events.schemas.automations import AutomationCore

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    items = (
        data["automations"]
        if isinstance(data, dict) and "automations" in data
        else data
        if isinstance(data, list)
        else [data]
    )
    automations = [AutomationCore.model_validate(item) for item in items]
    if crash_after_s is not None:
        if crash_after_s < HEARTBEAT_S + 15:
            raise ConfigError(
                f"deploy crash_after_s: {crash_after_s:g} s leaves less than 15 s beyond one heartbeat interval "
                f"({HEARTBEAT_S} s); a busy run would be taken for a dead one"
            )
        for automation in automations:
            if automation.name == HEARTBEAT_AUTOMATION:
                automation.trigger.within = timedelta(seconds=crash_after_s)
    return automations


def crash_window_s(automations: Sequence[Any]) -> float:
    """Seconds without heartbeats after which the heartbeat automation marks a run crashed."""
    for automation in automations:
        if automation.name == HEARTBEAT_AUTOMATION:
            return automation.trigger.within.total_seconds()
    raise ConfigError(f"{AUTOMATIONS}: no automation named {HEARTBEAT_AUTOMATION!r}")


def apply_automations(automations: Sequence[Any]) -> list[UUID]:
    """Create each automation, or update the one of the same name (every one of that name),
    so applying the file again changes nothing; returns their ids in order."""
    from prefect.client.orchestration import get_client

    ids = []
    with get_client(sync_client=True) as client:
        for automation in automations:
            existing = client.read_automations_by_name(automation.name)
            for found in existing:
                client.update_automation(found.id, automation)
            ids.append(existing[0].id if existing else client.create_automation(automation))
    return ids


def _require_api() -> None:
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:
        raise ConfigError(
            "no Prefect server to deploy to: PREFECT_API_URL is not set; start one with `prefect server start` "
            "and run `prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`"
        )


def deploy(
    config_path: str | os.PathLike | None,
    overrides: Sequence[str] = (),
    *,
    pool: str = DEFAULT_POOL,
    kinds: Sequence[str] | None = None,
    schedules: Mapping[str, str | None] | None = None,
    timezone: str = "UTC",
    name_prefix: str | None = None,
    env: Mapping[str, str] | None = None,
    paused: bool = False,
    source: str | os.PathLike = PROJECT_ROOT,
    crash_after_s: float | None = None,
) -> list[UUID]:
    """Create or update the deployments of `bert_pretraining` for one recipe in the process
    work pool `pool` (created if missing) and return their ids, in KINDS order.

    Deployments are named `<name_prefix>-<kind>` (default prefix: the recipe's file name
    without extension), so deploying the same recipe again updates them in place. `env` adds
    environment variables to the flow-run processes (stored in the Prefect database: no
    credentials; workers take those from their own environment). Deploying sets each deployment's paused
    state to `paused`, so re-deploying resumes a deployment paused in the UI unless it says so.

    The automations of infra/prefect/automations.yaml are created or updated too: a run
    without heartbeats for `crash_after_s` (default: the file's 90 s) is marked crashed, and
    a crashed run is rescheduled (flows/supervise.py has the flow-run side).
    """
    from prefect import deploy as prefect_deploy
    from prefect.flows import Flow
    from prefect.schedules import Cron

    cfg = load_config(config_path, list(overrides))
    prefix = name_prefix or (Path(config_path).stem if config_path else "default")
    plans = plan_deployments(cfg, name_prefix=prefix, kinds=kinds, schedules=schedules, timezone=timezone)
    if not plans:
        return []
    automations = load_automations(crash_after_s=crash_after_s)
    window = crash_window_s(automations)
    _require_api()
    ensure_work_pool(pool)
    _share_root_limit(cfg.run.root)

    flow = Flow.from_source(source=str(source), entrypoint=ENTRYPOINT)
    job_variables = {"env": {**FLOW_RUN_ENV, CRASH_AFTER_ENV: f"{window:g}", **dict(env or {})}}
    deployments = [
        flow.to_deployment(
            name=plan.name,
            description=plan.description,
            parameters=plan.parameters,
            schedules=[Cron(plan.cron, timezone=plan.timezone)] if plan.cron else [],
            paused=paused,
            tags=list(plan.tags),
            job_variables=job_variables,
            concurrency_limit=1,  # two runs of one deployment would write the same stage directories
        )
        for plan in plans
    ]
    ids = prefect_deploy(
        *deployments, work_pool_name=pool, build=False, push=False, print_next_steps_message=False, ignore_warnings=True
    )
    apply_automations(automations)
    log.info(
        "automations %s: a run without heartbeats for %g s is marked crashed, a crashed run is rescheduled; "
        "a worker stops at one SIGTERM within about a second, and its running flow runs are rescheduled within %g s",
        ", ".join(a.name for a in automations),
        window,
        window + 5,  # the server looks at the window every 5 s (PREFECT_SERVER_EVENTS_PROACTIVE_GRANULARITY)
    )
    return ids


def save_recipe(
    config_path: str | os.PathLike | None,
    overrides: Sequence[str] = (),
    *,
    variable: str = DEFAULT_RECIPE_VARIABLE,
) -> dict[str, Any]:
    """Store the resolved recipe as the Prefect Variable `variable` (JSON), the value that
    `infra/prefect/prefect.yaml` passes as the flow's `config` parameter; returns it."""
    from prefect.variables import Variable

    cfg = load_config(config_path, list(overrides))
    _require_api()
    value = recipe_parameter(cfg)
    size = len(json.dumps(value))
    if size >= VARIABLE_LIMIT:
        raise ConfigError(
            f"the recipe is {size:,} characters of JSON; a Prefect Variable holds fewer than {VARIABLE_LIMIT:,}. "
            "Deploy with `bertpipe deploy`, which passes the recipe as the deployments' parameter instead"
        )
    Variable.set(variable, value, overwrite=True)
    return value
