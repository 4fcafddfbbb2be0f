"""Prefect deployments of `bert_pretraining` (flows/deploy.py): what they carry, checked
without a server, and a real round trip: a Prefect server and a process worker started by
the test, a scheduled deployment created against the server, a run triggered and carried
out by the worker from this checkout."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC
from pathlib import Path

import pytest

from bertcore.errors import ConfigError
from flows.deploy import ENTRYPOINT, KINDS, PROJECT_ROOT, VARIABLE_LIMIT, deploy, plan_deployments, recipe_parameter
from pipelines.registry import load_config
from processes import free_port, migrated_prefect_home, stop

DEMO = PROJECT_ROOT / "configs" / "demo.yaml"
PREFECT = [sys.executable, "-m", "prefect"]


# -- plans: no server needed ------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_cfg(tmp_path_factory):
    return load_config(DEMO, [f"run.root={tmp_path_factory.mktemp('deploy-plan')}"])


def test_plans_carry_the_recipe_and_the_stage_selection(demo_cfg):
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    from flows.pipeline import bert_pretraining

    plans = plan_deployments(demo_cfg, name_prefix="demo", schedules={"evaluate": None})
    assert [p.name for p in plans] == ["demo-full", "demo-corpus-refresh", "demo-evaluate"]
    assert {p.kind: p.parameters["only"] for p in plans} == {
        "full": None,
        "corpus-refresh": ["corpus"],
        "evaluate": ["evaluate"],
    }
    assert {p.kind: p.cron for p in plans} == {
        "full": KINDS["full"].cron,
        "corpus-refresh": KINDS["corpus-refresh"].cron,
        "evaluate": None,
    }
    schema = parameter_schema(bert_pretraining.fn).model_dump_for_openapi()
    for plan in plans:
        # what the Prefect server enforces for a deployment's parameters, and what the flow receives
        validate(plan.parameters, schema, raise_on_error=True)
        assert type(demo_cfg).model_validate(plan.parameters["config"]) == demo_cfg


@pytest.mark.parametrize("recipe", sorted(p.name for p in (PROJECT_ROOT / "configs").glob("*.yaml")))
def test_every_recipe_fits_a_prefect_variable_and_comes_back_whole(recipe, minilm_or_stand_in):
    """The parameter holds only what differs from the defaults: small enough for the Prefect
    Variable prefect.yaml reads, and the same recipe once the flow validates it."""
    cfg = load_config(PROJECT_ROOT / "configs" / recipe)
    value = recipe_parameter(cfg)
    assert len(json.dumps(value)) < VARIABLE_LIMIT
    assert type(cfg).model_validate(value) == cfg


def test_recipe_parameter_never_carries_credentials(demo_cfg):
    with_keys = demo_cfg.model_copy(
        update={"storage": type(demo_cfg.storage)(key="AKIAEXAMPLE", secret="s3cr3t-value")}
    )
    text = str(recipe_parameter(with_keys))
    assert "AKIAEXAMPLE" not in text and "s3cr3t-value" not in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kinds": ["nightly"]}, "deploy kinds: unknown deployment kind 'nightly'"),
        ({"schedules": {"ful": "0 1 * * *"}}, "deploy schedules: unknown deployment kind 'ful'"),
        ({"schedules": {"full": "0 25 * * *"}}, "deploy schedules.full: '0 25 * * *' is not a valid cron expression"),
        ({"timezone": "Mars/Olympus"}, "deploy timezone: 'Mars/Olympus' is not an IANA time zone"),
    ],
)
def test_bad_deploy_options_are_one_line_errors(demo_cfg, kwargs, message):
    with pytest.raises(ConfigError) as err:
        plan_deployments(demo_cfg, name_prefix="demo", **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_deploy_without_a_server_says_how_to_get_one():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: None}),
        pytest.raises(ConfigError, match="PREFECT_API_URL is not set"),
    ):
        deploy(DEMO, pool="nowhere")


def test_the_automations_file_is_valid_and_agrees_with_the_flow_runs_settings():
    """infra/prefect/automations.yaml, as Prefect validates it: the heartbeat automation's
    window is the one the flow runs' own watch reads, the rescheduled state has the name the
    flow counts, and both act on bertpipe's runs only."""
    from flows.deploy import FLOW_RUN_ENV, HEARTBEAT_S, crash_window_s, load_automations
    from flows.supervise import CRASH_AFTER_ENV, RESCHEDULED

    automations = {a.name: a for a in load_automations()}
    heartbeat, reschedule = (
        automations["bertpipe-crash-on-missing-heartbeats"],
        automations["bertpipe-reschedule-crashed"],
    )
    assert heartbeat.trigger.posture == "Proactive" and "prefect.flow-run.heartbeat" in heartbeat.trigger.after
    assert {
        "prefect.flow-run.heartbeat",
        "prefect.flow-run.Completed",
        "prefect.flow-run.Failed",
        "prefect.flow-run.Cancelling",
    } <= heartbeat.trigger.expect
    assert heartbeat.actions[0].state == "CRASHED" and reschedule.trigger.expect == {"prefect.flow-run.Crashed"}
    assert (reschedule.actions[0].state, reschedule.actions[0].name) == ("SCHEDULED", RESCHEDULED)
    for automation in automations.values():
        assert automation.trigger.for_each == {"prefect.resource.id"}
        assert automation.trigger.match_related.root == {"prefect.resource.id": "prefect.tag.bertpipe"}
    assert float(FLOW_RUN_ENV[CRASH_AFTER_ENV]) == crash_window_s(list(automations.values())) > HEARTBEAT_S
    assert FLOW_RUN_ENV["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == str(HEARTBEAT_S)
    assert crash_window_s(load_automations(crash_after_s=120)) == 120
    with pytest.raises(ConfigError, match="beyond one heartbeat interval"):
        load_automations(crash_after_s=40)


def test_every_deployment_carries_the_tag_the_automations_match(demo_cfg):
    assert all("bertpipe" in plan.tags for plan in plan_deployments(demo_cfg, name_prefix="demo"))


# -- a real server, worker and run ------------------------------------------------------------


def _prefect_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", **extra)
    return env


# Exits 0 when the Prefect API at argv[1] answers its health check.
HEALTHY = (
    "import sys, urllib.request; sys.exit(urllib.request.urlopen(sys.argv[1] + '/health', timeout=2).status != 200)"
)


@contextlib.contextmanager
def running_prefect_server(home: Path, enter: Sequence[str] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """`prefect server start` on a free port with its own SQLite database in `home`, run with
    the command prefix `enter` (a network namespace's, say; the health check runs there too);
    yields the API URL and the server's process, and stops it on exit."""
    migrated_prefect_home(home)
    port = free_port()
    env = _prefect_env(
        home,
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        PREFECT_SERVER_UI_ENABLED="false",
        # the scheduler looks at new deployments every few seconds
        PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS="2",
    )
    log = open(home / "server.log", "wb")
    server = subprocess.Popen(
        [*enter, *PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=home,
    )
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 150
        while (
            subprocess.run([*enter, sys.executable, "-c", HEALTHY, api], capture_output=True, timeout=30).returncode
            != 0
        ):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not start:\n{(home / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield api, server
    finally:
        stop(server)
        log.close()


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """`running_prefect_server` for this module's tests; yields the API URL."""
    with running_prefect_server(tmp_path_factory.mktemp("prefect-server")) as (api, _):
        yield api


@pytest.fixture
def api(prefect_server):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server}):
        yield prefect_server


def _scheduled_times(client, deployment_id, minimum: int, wait_s: float = 60):
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    deadline = time.monotonic() + wait_s
    while True:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
            ),
        )
        if len(runs) >= minimum or time.monotonic() > deadline:
            return [r.expected_start_time.astimezone(UTC) for r in runs]
        time.sleep(1)


@pytest.mark.slow
def test_scheduled_deployment_runs_on_a_process_worker(api, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    root = tmp_path / "run"
    pool = "bertpipe-test"
    ids = deploy(
        DEMO,
        [f"run.root={root}"],
        pool=pool,
        schedules={"corpus-refresh": "17 3 * * *", "evaluate": None},
        name_prefix="demo",
    )
    assert len(ids) == 3
    # deploying the same recipe again updates the deployments instead of adding more
    assert (
        deploy(
            DEMO,
            [f"run.root={root}"],
            pool=pool,
            schedules={"corpus-refresh": "17 3 * * *", "evaluate": None},
            name_prefix="demo",
        )
        == ids
    )

    with get_client(sync_client=True) as client:
        assert client.read_work_pool(pool).type == "process"
        refresh = client.read_deployment_by_name("bert_pretraining/demo-corpus-refresh")
        assert refresh.entrypoint == ENTRYPOINT and refresh.work_pool_name == pool
        assert refresh.parameters["only"] == ["corpus"] and refresh.parameters["config"]["run"]["root"] == str(root)
        assert refresh.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(PROJECT_ROOT)}}
        ]
        assert [s.schedule.cron for s in refresh.schedules] == ["17 3 * * *"]
        assert not client.read_deployment_by_name("bert_pretraining/demo-evaluate").schedules
        # the server's scheduler turns the cron into upcoming runs at 03:17 UTC
        upcoming = _scheduled_times(client, refresh.id, minimum=1)
        assert upcoming and all((t.hour, t.minute) == (3, 17) for t in upcoming)

    run = run_deployment("bert_pretraining/demo-corpus-refresh", timeout=0)
    worker_home = tmp_path / "worker"
    worker_home.mkdir()
    log_path = worker_home / "worker.log"
    with open(log_path, "wb") as log:
        # the worker runs from an unrelated directory: the deployment's pull step finds the code
        worker = subprocess.Popen(
            [*PREFECT, "worker", "start", "--pool", pool, "--type", "process"],
            env=_prefect_env(worker_home, PREFECT_API_URL=api, PREFECT_WORKER_QUERY_SECONDS="2"),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=worker_home,
        )
        try:
            with get_client(sync_client=True) as client:
                deadline = time.monotonic() + 420
                while True:
                    state = client.read_flow_run(run.id).state
                    if state is not None and state.is_final():
                        break
                    assert worker.poll() is None, f"the worker exited:\n{log_path.read_text()[-3000:]}"
                    assert time.monotonic() < deadline, (
                        f"flow run still {state.name if state else None}:\n{log_path.read_text()[-3000:]}"
                    )
                    time.sleep(2)
        finally:
            stop(worker)
    assert state.is_completed(), f"{state.name}: {state.message}\n{log_path.read_text()[-4000:]}"
    assert (root / "corpus" / "_manifest.json").is_file()
    assert not (root / "vocab").exists()  # the refresh selected the corpus stage only


def test_prefect_yaml_deploys_the_same_deployments(api, tmp_path):
    """`prefect deploy` on infra/prefect/prefect.yaml, fed the recipe through the Prefect
    Variable that `save_recipe` stores, gives the deployments `deploy` would create."""
    import shutil

    from prefect.client.orchestration import get_client

    from flows.deploy import FLOW_RUN_ENV, ensure_work_pool, save_recipe

    root = tmp_path / "run"
    recipe = save_recipe(DEMO, [f"run.root={root}"])
    ensure_work_pool("bertpipe")
    # a copy: `prefect deploy` may offer to write back into the file it read
    prefect_file = tmp_path / "prefect.yaml"
    shutil.copy(PROJECT_ROOT / "infra" / "prefect" / "prefect.yaml", prefect_file)
    out = subprocess.run(
        [*PREFECT, "--no-prompt", "deploy", "--prefect-file", str(prefect_file), "--all"],
        cwd=PROJECT_ROOT,
        env=_prefect_env(tmp_path, PREFECT_API_URL=api),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    plans = {p.kind: p for p in plan_deployments(load_config(DEMO, [f"run.root={root}"]), name_prefix="bertpipe")}
    with get_client(sync_client=True) as client:
        for kind, plan in plans.items():
            deployment = client.read_deployment_by_name(f"bert_pretraining/bertpipe-{kind}")
            assert deployment.parameters == plan.parameters and deployment.parameters["config"] == recipe
            assert [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules] == [
                (plan.cron, plan.timezone)
            ]
            assert deployment.entrypoint == ENTRYPOINT and deployment.work_pool_name == "bertpipe"
            assert deployment.job_variables == {"env": FLOW_RUN_ENV}
            assert deployment.pull_steps == [
                {"prefect.deployments.steps.set_working_directory": {"directory": str(PROJECT_ROOT)}}
            ]
