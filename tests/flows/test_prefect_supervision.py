"""A scheduled run survives its Prefect worker (flows/supervise.py, infra/prefect/automations.yaml,
flows/run_log.py): a real `prefect server start` on 127.0.0.1, process workers started and
killed by the test, `bertpipe deploy` of the demo recipe with a short crash window.

1. The worker is SIGKILLed during corpus. Its flow-run process finishes corpus (the server
   still hears from it), then ends Crashed before vocab; the automation reschedules the
   same run, a new worker picks it up, corpus is cached and vocab computed.
2. The next worker gets one SIGTERM during examples. It exits within about a second and
   SIGKILLs its flow-run process, leaving the run Running; the heartbeats stop, the
   heartbeat automation marks the run Crashed, the other automation reschedules it, and a
   new worker completes it (taking over the dead attempt's lease at once).

Each flow run's log under run.root holds every attempt and ends with the summary.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC
from pathlib import Path

import psutil
import pytest

from flows.deploy import deploy
from flows.supervise import RESCHEDULED
from processes import stop
from test_deploy import DEMO, PREFECT, _prefect_env, api, prefect_server  # noqa: F401 - fixtures

CRASH_AFTER_S = 45  # heartbeats come every 30 s (Prefect's minimum)
POOL = "bertpipe-supervision"


def small_recipe(root: Path) -> list[str]:
    """The demo's recipe on its news file alone: what is tested is the run's supervision, not
    the stages, and each stage still takes seconds (a kill lands inside it)."""
    return [
        f"run.root={root}",
        "corpus.inputs=[{uri: '{demo_data}/lee_background.cor', format: lines, name: lee-news}]",
        "vocab.vocab_size=2000",
        "examples.dupe_factor=1",
    ]


class Workers:
    """Process workers this test starts, each in a session of its own (a SIGTERM or SIGKILL
    reaches only it), and every process they started, for the clean-up. `enter` is a command
    prefix they run with (a network namespace's), `env` what they get beyond Prefect's settings."""

    def __init__(
        self,
        api_url: str,
        home: Path,
        pool: str = POOL,
        enter: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ):
        self.api_url, self.home, self.pool, self.enter, self.env = api_url, home, pool, list(enter), dict(env or {})
        self.started: list[subprocess.Popen] = []
        self.seen: dict[int, psutil.Process] = {}
        self.logs: list[Path] = []

    def start(self) -> subprocess.Popen:
        name = f"worker-{len(self.started) + 1}"
        (self.home / name).mkdir(parents=True)
        log_path = self.home / name / "worker.log"
        self.logs.append(log_path)
        worker = subprocess.Popen(
            [*self.enter, *PREFECT, "worker", "start", "--pool", self.pool, "--type", "process", "--name", name],
            env={
                **_prefect_env(self.home / name, PREFECT_API_URL=self.api_url, PREFECT_WORKER_QUERY_SECONDS="2"),
                **self.env,
            },
            stdout=open(log_path, "wb"),
            stderr=subprocess.STDOUT,
            cwd=self.home / name,
            start_new_session=True,
        )
        self.started.append(worker)
        return worker

    def flow_run_process(self, worker: subprocess.Popen) -> psutil.Process:
        """The worker's `python -m prefect.engine` child (and note every descendant)."""
        children = psutil.Process(worker.pid).children(recursive=True)
        self.seen.update({p.pid: p for p in children})
        engines = [p for p in children if "prefect.engine" in " ".join(p.cmdline())]
        assert len(engines) == 1, [p.cmdline() for p in children]
        return engines[0]

    def kill_seen(self) -> None:
        """SIGKILL every process the workers started that is still there (a lost machine)."""
        for proc in self.seen.values():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass

    def tail(self) -> str:
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-2500:]}" for p in self.logs if p.exists())

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                stop(proc)
        self.kill_seen()


def wait_for(what: str, check, timeout: float, workers: Workers, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}\n{workers.tail()}"
        time.sleep(every)


def complete_on_a_new_worker(client, run_id, workers: Workers) -> None:
    """Start a worker and wait until the rescheduled run `run_id` ends: it must complete."""
    workers.start()
    state = wait_for(
        "the rescheduled run to end",
        lambda: (s := client.read_flow_run(run_id).state).is_final() and s,
        420,
        workers,
        every=2,
    )
    assert state.is_completed(), f"{state.name}: {state.message}\n{workers.tail()}"


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run_log_lines(root: Path) -> list[str]:
    files = sorted((root / "_logs").glob("flow-run-*.log")) if (root / "_logs").exists() else []
    return [line for f in files for line in f.read_text(encoding="utf-8").splitlines()]


def log_of(root: Path, run_name: str) -> list[str]:
    (path,) = [p for p in (root / "_logs").glob("flow-run-*.log") if p.name.endswith(f"-{run_name}.log")]
    return path.read_text(encoding="utf-8").splitlines()


def states_of(client, run_id) -> list:
    return sorted(client.read_flow_run_states(run_id), key=lambda s: s.timestamp)


# -- the flow run's watch, without a server ------------------------------------------------


@pytest.fixture
def watch(monkeypatch):
    """A Watch as a worker's flow run has it, with the server's answers and the stop faked."""
    from types import SimpleNamespace
    from uuid import uuid4

    from flows import logs, supervise

    monkeypatch.setattr(supervise, "CHECK_S", 0.01)
    monkeypatch.setattr(supervise, "SERVER_CHECK_S", 0.01)
    monkeypatch.setenv(supervise.CRASH_AFTER_ENV, "0.3")
    monkeypatch.setattr(logs, "detach_console", lambda: None)  # this test's stdout stays
    w = supervise.Watch()
    w.flow_run, w.active, w._state_id = SimpleNamespace(id=uuid4(), name="amber-fox"), True, uuid4()
    w.stops = []

    def stop_now(reason, code):
        w.stops.append((reason, code))
        w._stop.set()

    w._stop_now = stop_now
    yield w
    w._stop.set()


def _watch_for(w, seconds: float) -> None:
    with w:
        deadline = time.monotonic() + seconds
        while not w.stops and time.monotonic() < deadline:
            time.sleep(0.02)


@pytest.mark.parametrize("worker_alive", [False, True])
def test_the_watch_lets_the_stage_finish_while_the_server_still_has_the_run(watch, worker_alive):
    from types import SimpleNamespace

    watch.parent = os.getppid() if worker_alive else -1  # -1: the parent is not who started us
    watch._server_state = lambda: SimpleNamespace(id=watch._state_id, name="Running", message=None)
    _watch_for(watch, 0.5)
    assert watch.stops == [] and watch.worker_lost is not worker_alive


@pytest.mark.parametrize("worker_alive", [False, True])
def test_the_watch_stops_a_run_the_server_moved_on_from(watch, worker_alive):
    """Marked crashed (its heartbeats were missed) and rescheduled, or cancelled: another
    attempt may be starting, so this one stops at once, and exits 0 so that a live worker
    reports no crash over the new attempt."""
    from types import SimpleNamespace
    from uuid import uuid4

    watch.parent = os.getppid() if worker_alive else -1
    watch._server_state = lambda: SimpleNamespace(id=uuid4(), name="Rescheduled", message="rescheduled after a crash")
    _watch_for(watch, 5)
    ((reason, code),) = watch.stops
    assert "shows it Rescheduled (rescheduled after a crash)" in reason and code == 0


def test_the_watch_stops_an_orphan_the_server_cannot_hear(watch):
    def unreachable():
        raise ConnectionError("no route to host")

    watch.parent = -1
    watch._server_state = unreachable
    _watch_for(watch, 5)
    ((reason, code),) = watch.stops
    assert (
        "its worker is gone and the Prefect server has not answered" in reason
        and "ConnectionError" in reason
        and code == 1
    )


def test_an_unreachable_server_alone_stops_nothing_while_the_worker_lives(watch):
    def unreachable():
        raise ConnectionError("no route to host")

    watch.parent = os.getppid()
    watch._server_state = unreachable
    _watch_for(watch, 0.8)
    assert watch.stops == [] and not watch.worker_lost


def test_reschedules_are_counted_since_the_run_was_last_scheduled_otherwise():
    from datetime import datetime, timedelta

    from prefect.client.schemas.objects import State, StateType

    from flows.supervise import reschedules_in_a_row

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def history(*names):
        kinds = {
            "Scheduled": StateType.SCHEDULED,
            RESCHEDULED: StateType.SCHEDULED,
            "AwaitingRetry": StateType.SCHEDULED,
            "Running": StateType.RUNNING,
            "Crashed": StateType.CRASHED,
            "Failed": StateType.FAILED,
        }
        return [State(type=kinds[n], name=n, timestamp=t0 + timedelta(seconds=i)) for i, n in enumerate(names)]

    crash = ["Running", "Crashed", RESCHEDULED]
    assert reschedules_in_a_row(history("Scheduled", "Running")) == 0
    assert reschedules_in_a_row(history("Scheduled", *crash, *crash, "Running")) == 2
    # a retry from the UI after it failed starts the count again
    assert reschedules_in_a_row(history("Scheduled", *crash * 4, "Failed", "AwaitingRetry", *crash)) == 1


@pytest.mark.slow
def test_a_run_outlives_its_worker_and_is_rescheduled(api, tmp_path):  # noqa: F811 - a fixture from test_deploy
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    started = time.monotonic()
    root = tmp_path / "run"
    deploy(
        DEMO,
        small_recipe(root),
        pool=POOL,
        kinds=["full"],
        schedules={"full": None},
        name_prefix="sup",
        crash_after_s=CRASH_AFTER_S,
    )
    # deploying again changes nothing: the automations are updated by name, not added
    deploy(
        DEMO,
        small_recipe(root),
        pool=POOL,
        kinds=["full"],
        schedules={"full": None},
        name_prefix="sup",
        crash_after_s=CRASH_AFTER_S,
    )
    with get_client(sync_client=True) as client:
        names = sorted(a.name for a in client.read_automations())
        assert names == ["bertpipe-crash-on-missing-heartbeats", "bertpipe-reschedule-crashed"]
        heartbeat = client.read_automations_by_name("bertpipe-crash-on-missing-heartbeats")[0]
        assert heartbeat.trigger.within.total_seconds() == CRASH_AFTER_S
        env = client.read_deployment_by_name("bert_pretraining/sup-full").job_variables["env"]
        assert env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30" and env["BERTPIPE_CRASH_AFTER_S"] == str(CRASH_AFTER_S)
    timings = {"deployed": time.monotonic() - started}

    workers = Workers(api, tmp_path / "workers")
    try:
        # -- 1. the worker is SIGKILLed during corpus ------------------------------------------
        first = run_deployment("bert_pretraining/sup-full", parameters={"only": ["corpus", "vocab"]}, timeout=0)
        worker = workers.start()
        wait_for("corpus to start", lambda: any("corpus: start" in line for line in run_log_lines(root)), 300, workers)
        orphan = workers.flow_run_process(worker)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        killed = time.monotonic()
        with get_client(sync_client=True) as client:
            crashed = wait_for(
                "the run to end Crashed",
                lambda: next((s for s in states_of(client, first.id) if s.is_crashed()), None),
                300,
                workers,
            )
            assert "worker" in crashed.message and "died" in crashed.message and "before vocab" in crashed.message, (
                crashed.message
            )
            # the orphan finished corpus under nobody's eye but Prefect's, then left
            assert (root / "corpus" / "_manifest.json").is_file() and not (root / "vocab" / "_manifest.json").exists()
            wait_for("the orphaned flow-run process to exit", lambda: gone(orphan), 60, workers)
            wait_for(
                "the automation to reschedule it",
                lambda: client.read_flow_run(first.id).state.name == RESCHEDULED,
                60,
                workers,
            )
            timings["1: killed -> rescheduled"] = time.monotonic() - killed
            complete_on_a_new_worker(client, first.id, workers)
            timings["1: killed -> completed"] = time.monotonic() - killed
            first_run = client.read_flow_run(first.id)
        log = log_of(root, first_run.name)
        assert any("attempt 1 on" in line for line in log) and any("attempt 2 on" in line for line in log)
        assert any("its Prefect worker" in line and "died" in line for line in log)
        assert any("corpus: done in" in line for line in log) and any("vocab: done in" in line for line in log)
        assert log[-1].endswith("run ended: Completed"), log[-5:]
        rows = [line for line in log if re.search(r"\bcorpus +cached\b|\bvocab +computed\b", line)]
        assert len(rows) == 2, log[-8:]  # the summary: corpus from attempt 1, vocab from attempt 2

        # -- 2. one SIGTERM stops the next worker during examples ---------------------------
        second = run_deployment("bert_pretraining/sup-full", parameters={"only": ["examples"]}, timeout=0)
        worker = workers.started[-1]
        wait_for(
            "examples to start", lambda: any("examples: start" in line for line in run_log_lines(root)), 300, workers
        )
        engine = workers.flow_run_process(worker)
        term = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(120)  # one signal is enough (the time allows a loaded 2-core machine)
        timings["2: SIGTERM -> worker exited"] = time.monotonic() - term
        wait_for("its flow-run process to exit", lambda: gone(engine), 60, workers)  # the worker SIGKILLs it
        timings["2: SIGTERM -> flow-run process gone"] = time.monotonic() - term
        workers.kill_seen()  # and Ray's processes, were any left
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(second.id).state.is_running()  # what the worker left behind
            crashed = wait_for(
                "the heartbeat automation to mark it Crashed",
                lambda: next((s for s in states_of(client, second.id) if s.is_crashed()), None),
                CRASH_AFTER_S + 120,
                workers,
                every=2,
            )
            assert "no heartbeat" in crashed.message, crashed.message
            timings["2: SIGTERM -> crashed"] = time.monotonic() - term
            wait_for(
                "the automation to reschedule it",
                lambda: client.read_flow_run(second.id).state.name == RESCHEDULED,
                60,
                workers,
            )
            complete_on_a_new_worker(client, second.id, workers)
            timings["2: SIGTERM -> completed"] = time.monotonic() - term
            second_run = client.read_flow_run(second.id)
        assert (root / "examples" / "_manifest.json").is_file()
        log = log_of(root, second_run.name)
        assert any("attempt 2 on" in line for line in log) and log[-1].endswith("run ended: Completed"), log[-5:]
        assert any("took over the stale lease" in line for line in log)  # the killed attempt's, at once
    finally:
        workers.stop_all()
        timings["total"] = time.monotonic() - started
        print(
            "timings:",
            json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in timings.items()}, indent=1),
            file=sys.stderr,
        )
