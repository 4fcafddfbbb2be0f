"""Logging of the `bertpipe` command: one line per event that matters, on stderr and (for
the project's loggers, through PREFECT_LOGGING_EXTRA_LOGGERS) in Prefect's log of the flow
run.

`setup(verbosity, fmt)` runs before Prefect or Ray is imported. It installs one handler on
the root logger, so Prefect keeps it (Prefect adds its own console handler only to a root
logger that has none), and every record — the project's, Prefect's, Python warnings, Ray's
driver messages and, once `route_ray_output()` ran, the output Ray relays from its
workers — is written in one format: text for people, or one JSON object per line.
Passwords inside URIs are masked in every record when it is made (bertcore/redact.py), so
no handler, Prefect's API log included, writes them.

Levels: the project's loggers (pipelines, bertcore, flows) at INFO, DEBUG with -v, WARNING
with -q; Prefect's at INFO (DEBUG with -vv, WARNING with -q); everything else at WARNING, as
Python does by default.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import sys
import time
from typing import Any, Literal

from bertcore.redact import mask_log_records

PROJECT_LOGGERS = ("pipelines", "bertcore", "flows")
WORKERS = logging.getLogger("bertpipe.workers")
"""Output Ray relays from its workers (print and logging there), one record per line."""
RAY_OUTPUT = logging.getLogger("bertpipe.ray")
"""What Ray itself relays (its controllers' and raylets' accounts, worker tracebacks, library
warnings): DEBUG records that the console shows only with -v; log files keep them."""
_OURS = re.compile(
    r"^(?:\([^)]*\) )?(?:(?:corpus|vocab|examples|pretrain|distill|evaluate|export|bertpipe)\b[\w.\[\] -]*: "
    r"|object store unreachable\b)"
)
"""A relayed line that is one of bertpipe's own messages from a worker (`pretrain: resumed
from step-0000010`, or pipelines/storage.py's `object store unreachable ...`), after Ray's
`(RayTrainWorker pid=...)` prefix."""

Format = Literal["text", "json"]

# Attributes every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_PREFECT_RUN = ("flow_run_name", "task_run_name")

_configured: Format | None = None


class TextFormatter(logging.Formatter):
    """`12:04:31 corpus: done in 4.1s · documents 391`; the level only when it is not INFO,
    and Prefect's run name where Prefect gives one ("Task run 'corpus' - Finished ...")."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        where = ""
        if getattr(record, "task_run_name", None):
            where = f"Task run '{record.task_run_name}' - "
        elif getattr(record, "flow_run_name", None):
            where = f"Flow run '{record.flow_run_name}' - "
        text = f"{stamp} {level}{where}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + (record.exc_text or self.formatException(record.exc_info))
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, and the
    record's structured fields (a progress line's done/total/eta_s, a stage's headline,
    Prefect's flow and task run ids and names)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def json_line(level: int, message: str, logger: str = "flows.cli", **fields: Any) -> str:
    """One JSON log line written outside logging (an error that ends the command), in the
    same shape as every other line: time, level, logger, message, then `fields`."""
    record = logging.LogRecord(logger, level, "", 0, message, None, None)
    record.__dict__.update(fields)
    return JsonFormatter().format(record)


class StderrHandler(logging.StreamHandler):
    """A stream handler that writes to whatever `sys.stderr` is when a record arrives, not
    to the stream it was created with: a command run inside another program (a test's
    CliRunner, a notebook) may swap stderr and close the old one, and later records must
    not go to a closed file."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # the current stderr
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ assigns it; the property decides
        pass


def level_for(verbosity: int) -> int:
    return logging.DEBUG if verbosity > 0 else logging.WARNING if verbosity < 0 else logging.INFO


def setup(verbosity: int = 0, fmt: Format = "text") -> None:
    """Configure logging for one command (call before Prefect and Ray are imported)."""
    global _configured
    mask_log_records()
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if verbosity <= 0:  # Ray's relayed output reaches the console with -v only
        handler.addFilter(lambda record: not record.name.startswith(RAY_OUTPUT.name))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    level = level_for(verbosity)
    for name in (*PROJECT_LOGGERS, WORKERS.name):
        logging.getLogger(name).setLevel(level)
    RAY_OUTPUT.setLevel(logging.DEBUG)
    logging.captureWarnings(True)  # warnings.warn(...) become records in the same format
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", ",".join(PROJECT_LOGGERS))
    # a record from outside a flow run's context (the lease heartbeat, the object-store client's
    # thread) reaches the console and the run log; Prefect's API cannot take it, and would add a warning
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    # Prefect's loggers (its run loggers say when a task ends) at INFO; -q: WARNING; -vv: DEBUG
    prefect_level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 1 else logging.INFO
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", logging.getLevelName(prefect_level))
    _configured = fmt


def default_levels() -> None:
    """The project's loggers at INFO where nothing chose their level: a flow run that a
    Prefect worker started (a deployment) has not been through `setup`, and its stage lines
    would otherwise stop at the root logger's WARNING. Passwords inside URIs are masked in
    every record there too. In a worker's flow-run process the console survives the worker
    (`worker_console`)."""
    mask_log_records()
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    if os.environ.get("PREFECT__FLOW_RUN_ID") and _configured is None:
        worker_console()


class ConsoleHandler(StderrHandler):
    """The console of a worker's flow-run process: stderr is a pipe the worker reads. When
    the worker is gone the pipe is broken; the first failed write points stdout and stderr at
    /dev/null (`detach_console`) and the run goes on, its records still reaching Prefect's API
    and the run log. (Prefect's own console handler ends the process on a broken pipe:
    rich raises SystemExit in whichever thread logged.)"""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + self.terminator)
            self.stream.flush()
        except (BrokenPipeError, ValueError):  # ValueError: a closed stream
            detach_console()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                self.handleError(record)
            detach_console()


_worker_run = False


def worker_console() -> None:
    """In a flow-run process a Prefect worker started: the root logger's console handler (Prefect's)
    becomes a `ConsoleHandler` with the same format, level and filters, and the output Ray relays
    from its workers goes through logging (`route_ray_output`) instead of straight to stdout,
    so it reaches the run log too and never meets a broken pipe."""
    global _worker_run
    _worker_run = True
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, logging.StreamHandler) and not isinstance(old, (ConsoleHandler, logging.FileHandler)):
            handler = ConsoleHandler()
            handler.setLevel(old.level)
            handler.setFormatter(old.formatter)
            for item in old.filters:
                handler.addFilter(item)
            root.removeHandler(old)
            root.addHandler(handler)


def detach_console() -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2) at /dev/null: the
    process that read them is gone, and a write to a broken pipe would fail wherever it
    happens. Safe to call more than once."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def configured() -> Format | None:
    """The format `setup` chose, or None when the command did not set up logging (tests)."""
    return _configured


def route_ray_output() -> bool:
    """Send the lines Ray relays from its workers through logging, one record per line, so
    they share the command's format and `--log-format json` stays one JSON object per line.
    Ray still composes each line (its `(TrainController pid=...)` prefix, the deduplication
    of lines repeated across workers, the filtering of autoscaler output); only where it
    prints changes, also for what the deduplication still holds when Ray disconnects at
    exit (else printed below the command's error line). Ray's printer stays in place where
    this Ray lacks those hooks, or where neither the command nor a worker's flow run set up
    logging. Call after ray.init; returns whether lines are routed."""
    if _configured is None and not _worker_run:
        return False
    try:
        from ray._private import worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        hooks = (
            worker.print_worker_logs,
            worker.stdout_deduplicator,
            worker.stderr_deduplicator,
            dispatcher.remove_handler,
        )
    except (ImportError, AttributeError):  # pragma: no cover - another Ray: keep its printer
        return False
    del hooks
    os.environ["RAY_COLOR_PREFIX"] = "0"  # plain prefixes: the formatter adds no terminal colours
    ignore_prefix = (
        worker._should_ignore_worker_log_prefix(worker.global_worker)
        if hasattr(worker, "_should_ignore_worker_log_prefix")
        else False
    )

    def relay(data: dict) -> None:
        deduplicator = worker.stderr_deduplicator if data["is_err"] else worker.stdout_deduplicator
        batches = [data] if data.get("pid") == "autoscaler" else deduplicator.deduplicate(data)
        for batch in batches:
            worker.print_worker_logs(batch, _LogSink.of(data), ignore_prefix)

    if not getattr(worker.print_worker_logs, "routed", False):
        printer = worker.print_worker_logs

        def print_worker_logs(data: dict, print_file: Any, ignore_prefix: bool = False) -> None:
            # Ray's disconnect (at exit, after the error line) prints what its deduplicators
            # still hold, e.g. a failure's tracebacks "[repeated 3x across cluster]", straight
            # to the process's stdout and stderr: they go through logging like the rest
            if print_file is sys.stdout or print_file is sys.stderr:
                print_file = _LogSink.of(data)
            printer(data, print_file, ignore_prefix)

        print_worker_logs.routed = True  # type: ignore[attr-defined]
        worker.print_worker_logs = print_worker_logs
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", relay)
    return True


class _LogSink:
    """A file for Ray's worker-log printer: each line it prints becomes one log record."""

    def __init__(self, fields: dict[str, Any]):
        self.fields, self.buffer = fields, ""

    @classmethod
    def of(cls, data: dict) -> _LogSink:
        """The sink for one batch of lines Ray relays (its pid, worker name and stream)."""
        return cls(
            {
                "pid": data.get("pid"),
                "worker": data.get("actor_name") or data.get("task_name") or "",
                "stream": "stderr" if data.get("is_err") else "stdout",
            }
        )

    def write(self, text: str) -> int:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            if not line.strip():
                continue
            if _OURS.match(line):
                WORKERS.info("%s", line.rstrip(), extra=self.fields)
            else:  # Ray's own account of a failure is pages long: the error line is the driver's
                RAY_OUTPUT.debug("%s", line.rstrip(), extra=self.fields)
        return len(text)

    def flush(self) -> None:
        pass


def stop_temporary_server() -> None:
    """Prefect stops the temporary API server it started when the process exits, with a log
    line of its own; stopped here, before the error is printed, that line comes above it.
    A server named by PREFECT_API_URL (a real one, or a test harness the command runs under
    in-process) is not this process's to stop."""
    server = sys.modules.get("prefect.server.api.server")
    if server is not None and not _api_url_given():
        handlers = sys.modules.get("prefect.logging.handlers")
        if handlers is not None:
            handlers.APILogWorker.drain_all(timeout=5)  # the records still on their way to it
        for instance in list(server.SubprocessASGIServer._instances.values()):
            instance.stop()


def _api_url_given() -> bool:
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())
