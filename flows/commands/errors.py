"""How a command ends on a mistake the user can fix: one line on stderr (a JSON object with
--log-format json), exit 2."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import typer

from bertcore.errors import BertpipeError
from flows import logs


def fail(message: str, hint: str | None = None) -> None:
    from bertcore.redact import mask_text

    message, hint = mask_text(message), hint and mask_text(hint)
    logs.stop_temporary_server()
    if logs.configured() == "json":
        typer.echo(logs.json_line(logging.ERROR, message, event="error", hint=hint), err=True)
        raise typer.Exit(code=2)
    if hint:
        typer.echo(f"  {hint}", err=True)
    typer.secho(f"bertpipe: error: {message}", err=True, fg="red")  # the last line on the console
    raise typer.Exit(code=2)


EPHEMERAL_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
"""Prefect's setting: how long a command waits for the temporary API server it starts when
no PREFECT_API_URL is set (Prefect's default, 20 s, is too short on a busy machine)."""
DEFAULT_EPHEMERAL_TIMEOUT_S = 120


def _fail_if_no_prefect_server(exc: BaseException) -> None:
    """One line naming the setting when Prefect's temporary API server did not start in time."""
    if "ephemeral Prefect API server" in str(exc):
        fail(
            f"Prefect's temporary API server did not answer within {os.environ.get(EPHEMERAL_TIMEOUT, '?')} s "
            f"(a busy machine?); set {EPHEMERAL_TIMEOUT} higher, or PREFECT_API_URL to a running Prefect server"
        )


@contextlib.contextmanager
def one_line_errors(prefect_server: bool = False) -> Iterator[None]:
    """A mistake the user can fix (BertpipeError) ends the command in one line, exit 2; with
    `prefect_server`, so does Prefect's temporary API server not starting in time. Anything
    else keeps its traceback."""
    try:
        yield
    except BertpipeError as exc:
        fail(str(exc))
    except RuntimeError as exc:
        if not prefect_server:
            raise
        _fail_if_no_prefect_server(exc)
        raise
