"""The commands that set a recipe up on a Prefect server for its workers to run on a
schedule: `deploy` (the deployments), `save-recipe` (the recipe as a Prefect Variable)."""

from __future__ import annotations

from typing import Annotated

import typer

from bertcore.errors import ConfigError
from flows.commands.errors import one_line_errors
from flows.commands.options import ConfigOpt, SetOpt, split_names


def deploy(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    pool: Annotated[
        str, typer.Option("--pool", metavar="NAME", help="Prefect work pool of type process; created if missing.")
    ] = "bertpipe",
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            metavar="KIND[,KIND]",
            help=(
                "Deployments to create or update: full, corpus-refresh, evaluate (repeatable or comma-separated; "
                "default: all)."
            ),
        ),
    ] = None,
    cron: Annotated[
        list[str] | None,
        typer.Option(
            "--cron",
            metavar="KIND=CRON",
            help=(
                "Schedule of one deployment as KIND=CRON, e.g. --cron 'full=0 3 * * 0'; KIND=none leaves it "
                "unscheduled (repeatable)."
            ),
        ),
    ] = None,
    timezone: Annotated[str, typer.Option("--timezone", metavar="TZ", help="IANA time zone of the schedules.")] = "UTC",
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="PREFIX",
            help=(
                "Deployment name prefix (default: the recipe's file name), giving NAME-full, "
                "NAME-corpus-refresh, NAME-evaluate."
            ),
        ),
    ] = None,
    paused: Annotated[
        bool, typer.Option("--paused", help="Create the deployments with their schedules paused.")
    ] = False,
    crash_after: Annotated[
        float | None,
        typer.Option(
            "--crash-after",
            metavar="SECONDS",
            help=(
                "A run without heartbeats (every 30 s) for this long is marked crashed and rescheduled (default: "
                "infra/prefect/automations.yaml, 90)."
            ),
        ),
    ] = None,
) -> None:
    """Create or update scheduled Prefect deployments of the flow for one recipe (full pipeline, corpus refresh,
    evaluation); a `prefect worker start --pool POOL` on a machine with this checkout runs them."""
    with one_line_errors(prefect_server=True):
        from flows.deploy import deploy as deploy_recipe

        schedules: dict[str, str | None] = {}
        for item in cron or []:
            which, sep, expression = item.partition("=")
            if not sep:
                raise ConfigError(f"--cron {item!r}: expected KIND=CRON, e.g. --cron 'full=0 3 * * 0'")
            schedules[which.strip()] = None if expression.strip().lower() == "none" else expression.strip()
        ids = deploy_recipe(
            config,
            set_ or [],
            pool=pool,
            kinds=split_names(kind),
            schedules=schedules,
            timezone=timezone,
            name_prefix=name,
            paused=paused,
            crash_after_s=crash_after,
        )
    typer.echo(
        f"{len(ids)} deployment(s) in work pool {pool!r}; start a worker with: prefect worker start --pool {pool}"
    )


def save_recipe(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variable: Annotated[
        str, typer.Option("--variable", metavar="NAME", help="Name of the Prefect Variable.")
    ] = "bertpipe_recipe",
) -> None:
    """Store the resolved recipe as a Prefect Variable: the `config` parameter infra/prefect/prefect.yaml deploys."""
    with one_line_errors(prefect_server=True):
        from flows.deploy import save_recipe as store_recipe

        store_recipe(config, set_ or [], variable=variable)
    typer.echo(f"recipe stored as Prefect Variable {variable!r}")
