"""`bertpipe run`: the pipeline, or some of its stages, as the Prefect flow `bert_pretraining`,
ended at once and in one line by Ctrl-C or SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Annotated, Any

import typer

from flows import logs
from flows.commands.errors import fail, one_line_errors
from flows.commands.options import ConfigOpt, SetOpt, load_recipe, split_names


def _stop_when_interrupted() -> None:
    """Ctrl-C or SIGTERM ends `run` at once with one line: the lease is given back, Ray is
    shut down, and the process exits. Prefect's temporary API server shares the
    terminal's Ctrl-C and is already gone, so Prefect cannot record the end; waiting on it
    would hang with a page of connection errors. Finished units are kept."""
    import signal

    def stop(signum: int, _frame: Any) -> None:
        from pipelines.lease import release_all

        release_all()
        what = signal.Signals(signum).name
        message = f"interrupted ({what}); finished work is kept: run the same command again to go on"
        line = (
            logs.json_line(logging.ERROR, message, event="error")
            if logs.configured() == "json"
            else f"bertpipe: error: {message}"
        )
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            if "ray" in sys.modules:  # Ray's processes, gracefully; at most 15 s
                import threading

                threading.Timer(15, os._exit, args=(128 + signum,)).start()
                sys.modules["ray"].shutdown()
        finally:
            os._exit(128 + signum)

    # pipelines/stages/pretrain/work.py keeps it in place
    stop.bertpipe_stops_the_run = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def run(
    config: ConfigOpt = None,
    only: Annotated[
        list[str] | None,
        typer.Option("--only", metavar="STAGE[,STAGE]", help="Run only these stages (repeatable or comma-separated)."),
    ] = None,
    from_stage: Annotated[
        str | None, typer.Option("--from", metavar="STAGE", help="Run this stage and every stage after it.")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help=(
                "Recompute the selected stages from nothing, even if complete: pretrain and distill delete their "
                "checkpoints and train from step 0 (a plain rerun resumes)."
            ),
        ),
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help=(
                "Re-hash every shard before trusting it, and every local input file (default: only what changed "
                "size or mtime/ETag)."
            ),
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Run the pipeline (or some of its stages) as the Prefect flow `bert_pretraining`."""
    with one_line_errors(prefect_server=True):
        cfg = load_recipe(config, set_)
        from pipelines.registry import select

        stages = select(split_names(only), from_stage, cfg.off)  # validate names before starting anything
        from pipelines.runner import Pipeline

        Pipeline(cfg).preflight(stages)  # a held root, a missing upstream: refused before Prefect and Ray start
        from flows import reaper
        from flows.pipeline import bert_pretraining

        _stop_when_interrupted()
        reaper.start()  # if this process is killed outright, Prefect's server and Ray go with it

        state = bert_pretraining(
            cfg, only=split_names(only), from_stage=from_stage, force=force, verify=verify, return_state=True
        )
    if state.is_failed():
        fail(state.message or "the flow failed", hint=f"logs above; stage outputs under {cfg.run.root}")
    summaries = state.result()
    from flows import summary

    commands = summary.next_commands(summaries, cfg.run.root, str(config) if config else None, set_ or [])
    if logs.configured() == "json":
        typer.echo(json.dumps({"event": "summary", "stages": summaries, "next": commands}, default=str))
        return
    typer.echo("")
    for line in summary.table(summaries):
        typer.echo(line)
    for s in summaries:
        for verdict in s.get("verdicts", []):
            for line in summary.wrap(f"{s['stage']}: {verdict}"):
                typer.echo(line)
    typer.echo("next:")
    for line in commands:
        typer.echo(f"  {line}")
