"""The flow run's own log under run.root: `<run.root>/_logs/flow-run-<created>-<name>.log`.

Prefect keeps a run's log in its database, as long as the process can reach the API; the
run root keeps it too, next to what the run wrote. While the flow runs, every record that
reaches the root logger (Prefect's flow and task run loggers, the stage loggers, Ray's
relayed worker output, Python warnings) is written to the file in the console's format, so
the file holds the lines the console shows; the run's summary and how it ended come last.

- A local root is appended to line by line: a killed process loses nothing written.
- An object store gets a local buffer, uploaded every `UPLOAD_EVERY_S` and at the end (a
  killed process loses at most that much). When the last upload fails, the buffer stays on
  this machine and one line says where.
- The same flow run started again (rescheduled after a crash, or retried from the UI) is a
  new process that appends to the same file, after a line naming the attempt.

The file is the record of the run, not a stage output: it is written even after the run
lost its lease (a taken-over run says so there), and nothing else writes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from bertcore.redact import mask_text
from pipelines.storage import Storage, is_local, join

LOGS = "_logs"
"""Folder of run.root that holds the flow runs' logs (and the tracebacks of failures
outside any stage, flows/failures.py)."""
UPLOAD_EVERY_S = 30.0
"""How often the buffer of a log on an object store is uploaded while the run goes on."""

log = logging.getLogger(__name__)


def file_name(created: Any, name: str) -> str:
    """`flow-run-20260101-020000-amber-fox.log`: sortable by the flow run's creation time
    (UTC), which stays the same when the run is rescheduled."""
    stamp = created.strftime("%Y%m%d-%H%M%S") if created is not None else time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"flow-run-{stamp}-{re.sub(r'[^A-Za-z0-9_-]+', '-', name).strip('-') or 'run'}.log"


class RunLog(logging.Handler):
    """A logging handler writing every record it gets to the run's log file (local: the file
    itself, appended to and flushed per line; remote: a local buffer uploaded now and then)."""

    def __init__(self, storage: Storage, uri: str, formatter: logging.Formatter | None = None):
        super().__init__(logging.NOTSET)
        self.storage, self.uri = storage, uri
        self.setFormatter(formatter or _console_formatter())
        self.local = storage.local_path(uri)
        self.buffer: str | None = None
        self._dirty = False
        self._stop = threading.Event()
        self._uploader: threading.Thread | None = None
        if self.local is not None:
            storage.inside(uri, uri.rsplit("/", 1)[0])  # no link out of _logs/
            os.makedirs(os.path.dirname(self.local), exist_ok=True)
            self._file = open(self.local, "a", encoding="utf-8", buffering=1)
        else:
            handle, self.buffer = tempfile.mkstemp(prefix="bertpipe-run-log-", suffix=".log")
            os.close(handle)
            with contextlib.suppress(Exception):  # an earlier attempt of this flow run: go on after it
                if storage.exists(uri):
                    fs, path = storage.fs(uri)
                    fs.get_file(path, self.buffer)
            self._file = open(self.buffer, "a", encoding="utf-8", buffering=1)
            self._uploader = threading.Thread(target=self._upload_periodically, name="bertpipe-run-log", daemon=True)
            self._uploader.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(self.format(record))
        except OSError as exc:  # a full disk, a vanished mount: the file ends here, the run goes on
            self._give_up(exc)
        except Exception:  # noqa: BLE001 - a log that cannot be written must not end the run
            self.handleError(record)

    def _give_up(self, exc: OSError) -> None:
        """Stop writing the file after its first failed write, with one warning (the console
        and Prefect's log keep every line); a traceback per record would bury the run's own
        error, and a full disk fails every record."""
        with self.lock:
            if self._file.closed:
                return
            with contextlib.suppress(OSError):
                self._file.close()  # flushing what is buffered fails the same way
        log.warning(
            "the run log stopped at %s: %s; Prefect's log of the run has every line",
            mask_text(self.uri),
            exc.strerror or exc,
        )

    def note(self, message: str, level: int = logging.INFO) -> None:
        """A line in the file only (what the console shows otherwise, or nothing), in the
        file's format."""
        record = logging.LogRecord(__name__, level, __file__, 0, mask_text(message), None, None)
        self.emit(record)

    def _write(self, line: str) -> None:
        with self.lock:
            if self._file.closed:
                return
            self._file.write(line + "\n")
            self._dirty = True

    def _upload_periodically(self) -> None:
        while not self._stop.wait(UPLOAD_EVERY_S):
            self._upload()

    def _upload(self) -> bool:
        """Copy the buffer to the object store; False when that failed (tried again later)."""
        if self.buffer is None:
            return True
        with self.lock:
            if not self._dirty:
                return True
            self._dirty = False
        try:
            fs, path = self.storage.fs(self.uri)
            fs.put_file(self.buffer, path)
            return True
        except Exception:  # noqa: BLE001 - tried again at the next upload
            self._dirty = True
            return False

    def close(self) -> None:
        self._stop.set()
        if self._uploader is not None:
            self._uploader.join(timeout=UPLOAD_EVERY_S)
        with self.lock, contextlib.suppress(OSError):  # what was buffered is lost with the disk
            if not self._file.closed:
                self._file.close()
        if self.buffer is not None:
            if self._upload():
                os.unlink(self.buffer)
            else:
                log.warning(
                    "the run log could not be uploaded to %s; it is kept on this machine at %s",
                    mask_text(self.uri),
                    self.buffer,
                )
        super().close()


def _console_formatter() -> logging.Formatter:
    """The formatter of the console's handler on the root logger (bertpipe's own under
    `bertpipe run`, Prefect's in a worker's flow run), so the file holds the console's lines."""
    from flows.logs import TextFormatter

    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.formatter is not None:
            return handler.formatter
    return TextFormatter()


def _flow_run() -> Any:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context.flow_run if context is not None else None


class Record:
    """What the flow does with its log: `ended` writes the summary and the outcome last."""

    def __init__(self, handler: RunLog | None, by_deployment: bool):
        self.handler, self.by_deployment = handler, by_deployment

    def ended(self, result: Any) -> Any:
        """Write how the run ended (the stage summary, or the failure's line) and return
        `result` unchanged. A deployment's run has no `bertpipe run` to print the summary,
        so there it goes through the flow run's logger (the UI shows it too)."""
        from prefect.states import State

        if self.handler is None:
            return result
        if isinstance(result, State):
            self.handler.note(f"run ended: {result.name}: {' '.join(str(result.message or '').split())}", logging.ERROR)
            return result
        lines = summary_lines(result)
        if self.by_deployment:
            from prefect import get_run_logger

            logger = get_run_logger()
            for line in lines:
                logger.info("%s", line)
        else:
            for line in lines:
                self.handler.note(line)
        self.handler.note("run ended: Completed")
        return result


def _what(exc: BaseException) -> str:
    import signal

    number = getattr(exc, "signal", None)
    if isinstance(number, int):
        with contextlib.suppress(ValueError):
            return f"{signal.Signals(number).name} ({type(exc).__name__})"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")


def summary_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """The table `bertpipe run` prints at the end, and the evaluation's verdicts."""
    from flows import summary

    lines = summary.table(summaries)
    for s in summaries:
        for verdict in s.get("verdicts", []):
            lines += summary.wrap(f"{s['stage']}: {verdict}")
    return lines


@contextlib.contextmanager
def recorded(root: str, storage: Storage) -> Iterator[Record]:
    """Write the flow run's log under `root` while the block runs (see the module's text).
    When the file cannot be opened (an unwritable root), the run goes on with a warning:
    Prefect's log still has every line."""
    from prefect.runtime import deployment

    flow_run = _flow_run()
    name = flow_run.name if flow_run is not None else "run"
    uri = join(root, LOGS, file_name(getattr(flow_run, "created", None), name))
    try:
        handler = RunLog(storage, uri)
    except Exception as exc:  # noqa: BLE001 - a run log that cannot be opened must not stop the run
        log.warning(
            "the run log cannot be written to %s (%s); Prefect's log of the run has every line", mask_text(uri), exc
        )
        yield Record(None, bool(deployment.id))
        return
    top = logging.getLogger()
    top.addHandler(handler)
    try:
        attempt = getattr(flow_run, "run_count", 1) or 1
        where = f"{socket.gethostname()} pid {os.getpid()}"
        log.info(
            "flow run %s: attempt %d on %s; its full log: %s",
            name,
            attempt,
            where,
            mask_text(uri if not is_local(uri) else handler.local),
        )
        yield Record(handler, bool(deployment.id))
    except BaseException as exc:  # a signal (the worker stopping it), Ctrl-C, a bug: the file says so
        handler.note(f"run ended: interrupted by {_what(exc)}", logging.ERROR)
        raise
    finally:
        top.removeHandler(handler)
        handler.close()
