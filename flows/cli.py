"""The `bertpipe` app: its global options, then one line per command that puts it on the app
(the commands are in flows/commands/, each one typed function whose docstring is the help)."""

from __future__ import annotations

import os
import sys
from enum import Enum
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from flows import logs
from flows.commands import diagnosing, models, reading, running, scheduling
from flows.commands.errors import DEFAULT_EPHEMERAL_TIMEOUT_S, EPHEMERAL_TIMEOUT
from flows.commands.options import HELP_OPTIONS

app = typer.Typer(
    help="bertpipe: raw text to a pretrained, evaluated BERT-family encoder.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings=HELP_OPTIONS,
    rich_markup_mode=None,
)


class LogFormat(str, Enum):
    text = "text"
    json = "json"


def _versions(value: bool) -> None:
    if not value:
        return
    found = {}
    for package in ("bertpipe", "torch", "ray", "prefect", "deepspeed", "transformers"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed" if package != "bertpipe" else "0+unknown (source tree)"
    others = ", ".join(f"{k} {v}" for k, v in found.items() if k != "bertpipe")
    typer.echo(f"bertpipe {found['bertpipe']} (python {sys.version.split()[0]}, {others})")
    raise typer.Exit()


@app.callback()
def options(
    log_format: Annotated[
        LogFormat,
        typer.Option(
            "--log-format",
            envvar="BERTPIPE_LOG_FORMAT",
            help="text for people, or json: one JSON object per line (logs on stderr, `run`'s summary on stdout).",
        ),
    ] = LogFormat.text,
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="Also bertpipe's DEBUG lines (-vv: Prefect's too).")
    ] = 0,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only warnings and errors (and the command's result).")
    ] = False,
    show_version: Annotated[
        bool, typer.Option("--version", callback=_versions, is_eager=True, help="Print the versions and exit.")
    ] = False,
) -> None:
    """bertpipe: raw text to a pretrained, evaluated BERT-family encoder."""
    logs.setup(-1 if quiet else verbose, log_format.value)


app.command(short_help="Run the pipeline, or some of its stages.")(running.run)
app.command(short_help="Export a model: a Hugging Face folder, or ONNX files (fp32, int8) checked against PyTorch.")(
    models.export
)
app.command(short_help="Serve a run's model over HTTP (OpenAI and TEI routes): embeddings, predictions, masked words.")(
    models.serve
)
app.command(short_help="Why a task's fine-tune scores what it scores: leakage, labels, learning rate, errors, seeds.")(
    diagnosing.diagnose
)
app.command(short_help="Each stage's state: complete, stale, incomplete, damaged, missing.")(reading.status)
app.command("inspect", short_help="Look at what a stage produced.")(reading.inspect_stage)

config_app = typer.Typer(
    help="The run recipe.", no_args_is_help=True, context_settings=HELP_OPTIONS, rich_markup_mode=None
)
app.add_typer(config_app, name="config")
config_app.command("show", short_help="Print the recipe as a run would use it.")(reading.config_show)

app.command(short_help="Re-hash every shard against its manifest.")(reading.verify)
app.command(short_help="Create or update scheduled Prefect deployments.")(scheduling.deploy)
app.command("save-recipe", short_help="Store the resolved recipe as a Prefect Variable.")(scheduling.save_recipe)
app.command("demo-data", short_help="Print where the bundled sample data lives.")(reading.demo_data)


def main() -> None:
    # Stage modules log through the standard logging module; show them in Prefect's logs
    # (flows/logs.py sets up the rest when the command's options are parsed).
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", ",".join(logs.PROJECT_LOGGERS))
    # no network here or on most clusters: the temporary API server must not phone home
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # a scheduled run on a busy node waits longer for that server than Prefect's 20 s
    os.environ.setdefault(EPHEMERAL_TIMEOUT, str(DEFAULT_EPHEMERAL_TIMEOUT_S))
    app(prog_name="bertpipe")  # the same usage lines under `python -m flows.cli`


if __name__ == "__main__":
    sys.exit(main())
