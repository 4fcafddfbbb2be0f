"""`bertpipe diagnose`: why a fine-tune scores what it scores, measured on the task's own
files (flows/diagnosis.py does the work, bertcore/eval/diagnosis/ computes it)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from flows.commands.errors import fail, one_line_errors
from flows.commands.options import ConfigOpt, SetOpt, load_recipe


def _numbers(value: str | None, option: str, kind: type) -> tuple | None:
    if value is None:
        return None
    try:
        found = tuple(kind(part) for part in value.split(",") if part.strip())
    except ValueError:
        fail(f"{option} {value}: give comma-separated {'integers' if kind is int else 'numbers'}, e.g. {option} 1,2,3")
    if not found:
        fail(f"{option}: give at least one value")
    return found


def diagnose(
    task: Annotated[
        str, typer.Option("--task", metavar="NAME", help="The evaluate task to diagnose (its name in evaluate.tasks).")
    ],
    config: ConfigOpt = None,
    set_: SetOpt = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="pretrain|distill|PATH",
            help=(
                "The model fine-tuned: a stage's exported model/ folder, or a Hugging Face BERT-family folder (local "
                "or s3://, with config.json, safetensors weights and tokenizer.json). Default: distill when the recipe "
                "distils, else pretrain."
            ),
        ),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            metavar="DIR",
            help="Where the files go (default: <run.root>/diagnose/<task>/, beside eval/ and linked from its report).",
        ),
    ] = None,
    folds: Annotated[
        int,
        typer.Option(
            "--folds", min=2, metavar="K", help="Folds of the out-of-fold predictions that rank suspect labels."
        ),
    ] = 5,
    seeds: Annotated[
        str | None,
        typer.Option(
            "--seeds", metavar="1,2,3", help="Fine-tuning seeds for the spread and the verdict (default: the task's)."
        ),
    ] = None,
    learning_rates: Annotated[
        str | None,
        typer.Option(
            "--learning-rates",
            metavar="LR,LR",
            help="The sweep's learning rates (default: 1e-5,3e-5,1e-4,3e-4,1e-3); the task's own is added.",
        ),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", min=1, metavar="N", help="torch threads of the fits (default: every CPU)."),
    ] = None,
) -> None:
    """Why a task's fine-tune scores what it scores, measured: validation rows also in the training file, label balance
    and the majority-class score, inputs longer than max_seq_length, empty, duplicate and malformed rows; suspect labels
    from out-of-fold predictions (cleanlab); a learning-rate sweep, the loss curves and the best epoch; the path from
    pretraining, forgetting, and pretrained against random init; the confusion matrix, per-class scores and the worst
    examples; the seed spread against the gain. Prints one line per finding, worst first, with what to try, and writes
    diagnosis.md, plots and machine-readable files (diagnosis.json, suspect_labels.tsv, ...)."""
    with one_line_errors():
        from bertcore.eval.diagnosis.optimisation import GRID
        from bertcore.eval.diagnosis.run import Options
        from flows import diagnosis

        options = Options(
            folds=folds,
            seeds=_numbers(seeds, "--seeds", int),
            learning_rates=_numbers(learning_rates, "--learning-rates", float) or GRID,
            num_threads=threads or os.cpu_count() or 1,
        )
        cfg = load_recipe(config, set_)
        from pipelines.lease import RootLease
        from pipelines.storage import Storage

        storage = Storage(cfg.storage)
        diagnosis.task_of(cfg, task)  # a task the recipe lacks: one line before anything else
        with RootLease(storage, cfg.run.root, "bertpipe diagnose"):
            lines = diagnosis.run(cfg, storage, task, model, out, options)
    for line in lines:
        typer.echo(line)
