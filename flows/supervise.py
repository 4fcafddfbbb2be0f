"""A flow run that a Prefect worker started is never left running unsupervised.

The worker is the flow-run process's parent: it streams the run's console, carries out a
cancellation from the UI and reports a crash of the process. When the worker dies (killed,
out of memory, its machine drained), the flow-run process lives on, re-parented. `Watch`
notices within `CHECK_S` (the parent pid changes) and then:

- While the Prefect server can be reached and still shows this attempt's Running state,
  the process finishes the stage it is in: the stage keeps logging to Prefect and to the
  run log under run.root, and its heartbeats keep reaching the server. Before the next
  stage the flow ends in a Crashed state that says so, and the automation in
  infra/prefect/automations.yaml reschedules it; a live worker picks it up and the stages
  resume from their finished units and checkpoints.
- When the server cannot be reached for longer than the crash window (the automation marks
  a run crashed after that long without heartbeats), or it shows another state (the run was
  cancelled, marked crashed or rescheduled meanwhile), the process stops at once: it gives
  its lease back, stops Ray and exits, so a rescheduled attempt never meets a second writer.

With the worker alive, only the second check applies: a run the server marked crashed
(its heartbeats stopped reaching it) and rescheduled is stopped here, and exits 0 so the
worker does not report a crash over the new attempt.

A worker stopped with SIGTERM (Prefect 3.9.1) exits within a second and SIGKILLs its
flow-run processes, which can do nothing about it: their runs stay Running until the
heartbeat automation marks them Crashed (within the crash window), then they are
rescheduled like any other crash.

A run rescheduled more than `MAX_RESCHEDULES` times in a row (its worker or process died
each time) is not run again: it fails with one line instead of crashing forever.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

CHECK_S = 2.0
"""How often the parent (the worker) is checked."""
SERVER_CHECK_S = 10.0
"""How often the server's view of the run is read."""
CRASH_AFTER_ENV = "BERTPIPE_CRASH_AFTER_S"
"""Seconds without heartbeats after which the automation marks a run crashed; `bertpipe
deploy` puts it in the flow runs' environment."""
DEFAULT_CRASH_AFTER_S = 90.0
RESCHEDULED = "Rescheduled"
"""Name of the Scheduled state the automation gives a crashed run."""
MAX_RESCHEDULES = 3


def crash_after_s() -> float:
    try:
        return float(os.environ.get(CRASH_AFTER_ENV, DEFAULT_CRASH_AFTER_S))
    except ValueError:
        return DEFAULT_CRASH_AFTER_S


def slot_lease_s() -> float:
    """Lease of the run root's concurrency slot (flows/pipeline.py `one_writer`): a process that
    died holding it frees it this long after its last renewal, about when the automation
    reschedules its run (Prefect's default, 300 s, would hold the rescheduled run back)."""
    return max(60.0, crash_after_s())


def _flow_run() -> Any:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context.flow_run if context is not None else None


def started_by_worker(flow_run: Any) -> bool:
    """Whether this process is a worker's flow-run process for `flow_run` (the worker puts
    the run's id in its environment; a run in `bertpipe run` or a test has no worker)."""
    return (
        flow_run is not None
        and flow_run.deployment_id is not None
        and os.environ.get("PREFECT__FLOW_RUN_ID") == str(flow_run.id)
    )


def reschedules_in_a_row(states: list[Any]) -> int:
    """How many times the automation rescheduled the run since it was last scheduled or
    retried otherwise (its schedule, a retry from the UI)."""
    times = 0
    for state in sorted(states, key=lambda s: s.timestamp, reverse=True):
        if state.is_scheduled():
            if state.name != RESCHEDULED:
                break
            times += 1
    return times


class Watch:
    """Watches the worker and the server's view of this flow run (see the module's text).
    Use as a context manager around the flow's stages; inactive outside a worker's run."""

    def __init__(self) -> None:
        self.flow_run = _flow_run()
        self.active = started_by_worker(self.flow_run)
        self.parent = os.getppid()
        self.worker_lost_at: float | None = None
        self.stage: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state_id = getattr(getattr(self.flow_run, "state", None), "id", None)

    @property
    def worker_lost(self) -> bool:
        return self.worker_lost_at is not None

    def __enter__(self) -> Watch:
        if self.active:
            context = contextvars.copy_context()  # the same Prefect settings (API URL) in the thread
            self._thread = threading.Thread(target=context.run, args=(self._loop,), name="bertpipe-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def refusal(self):
        """A Failed state when the automation rescheduled this run more than MAX_RESCHEDULES
        times in a row; None otherwise."""
        if not self.active:
            return None
        from prefect.client.orchestration import get_client
        from prefect.states import Failed

        with get_client(sync_client=True) as client:
            times = reschedules_in_a_row(client.read_flow_run_states(self.flow_run.id))
        if times <= MAX_RESCHEDULES:
            return None
        return Failed(
            message=(
                f"flow run {self.flow_run.name} crashed and was rescheduled {times} times in a row (its worker or its "
                "process died each time); not running it again: read its log under run.root/_logs and the worker's "
                "output, then retry it from the Prefect UI or `prefect deployment run`"
            )
        )

    def handover(self, next_stage: str):
        """The Crashed state the flow ends in when its worker died: the stage that was
        running finished, the next one runs after the automation rescheduled the run."""
        from prefect.states import Crashed

        message = (
            f"its Prefect worker (pid {self.parent}) died; this process finished the stage that was running and stops "
            f"before {next_stage}: the run is rescheduled and goes on from there under a live worker"
        )
        log.warning("flow run %s: %s", self.flow_run.name, message)
        return Crashed(message=message)

    # -- the watching thread -----------------------------------------------------------------

    def _loop(self) -> None:
        next_server_check = time.monotonic() + SERVER_CHECK_S
        unreachable_since: float | None = None
        while not self._stop.wait(CHECK_S):
            if not self.worker_lost and os.getppid() != self.parent:
                self.worker_lost_at = time.monotonic()
                from flows import logs

                logs.detach_console()  # nobody reads the pipes to the worker any more
                log.warning(
                    "flow run %s: its Prefect worker (pid %d) died; the stage that is running finishes while the "
                    "Prefect server can be reached, then the run is rescheduled",
                    self.flow_run.name,
                    self.parent,
                )
                next_server_check = 0.0  # look at once whether the server still has the run
            if time.monotonic() < next_server_check:
                continue
            next_server_check = time.monotonic() + SERVER_CHECK_S
            try:
                state = self._server_state()
            except Exception as exc:  # noqa: BLE001 - the server cannot be reached
                unreachable_since = unreachable_since or time.monotonic()
                waited = time.monotonic() - unreachable_since
                if self.worker_lost and waited > crash_after_s():
                    self._stop_now(
                        f"flow run {self.flow_run.name}: its worker is gone and the Prefect server has not "
                        f"answered for {waited:.0f} s "
                        f"({type(exc).__name__}), so its heartbeats do not reach it either",
                        code=1,
                    )
                continue
            unreachable_since = None
            if state is not None and self._state_id is not None and state.id != self._state_id:
                self._stop_now(
                    f"flow run {self.flow_run.name}: the Prefect server shows it {state.name} "
                    f"({' '.join(str(state.message or '').split())}), not the attempt this process runs",
                    code=0,
                )

    def _server_state(self):
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            return client.read_flow_run(self.flow_run.id).state

    def _stop_now(self, reason: str, code: int) -> None:
        """Log why, give the lease back, stop Ray and exit at once: the flow's own code is not
        unwound (Prefect would report a crash over a state the server already moved on from)."""
        log.error(
            (
                "%s; this process stops now: finished units and checkpoints are kept, and the run goes on from "
                "them when it runs again"
            ),
            reason,
        )
        _bounded(_flush_logs, 10)
        from pipelines.lease import release_all

        release_all()
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            _bounded(ray.shutdown, 15)
        os._exit(code)


def _flush_logs() -> None:
    """Send what Prefect's API log handlers hold and close the run log (it uploads its
    buffer to an object store)."""
    from flows.run_log import RunLog

    loggers = [
        logging.getLogger(),
        *(
            logging.getLogger(name)
            for name in ("prefect", "prefect.flow_runs", "prefect.task_runs", "pipelines", "bertcore", "flows")
        ),
    ]
    for logger in loggers:
        for handler in list(logger.handlers):
            try:
                handler.close() if isinstance(handler, RunLog) else handler.flush()
            except Exception:  # noqa: BLE001 - one handler that fails must not keep the others from sending
                pass


def _bounded(fn, seconds: float) -> None:
    """Run `fn` in a thread and wait for it at most `seconds`."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(seconds)
