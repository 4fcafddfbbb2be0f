"""The `bertpipe` command line. Each command is one typed function; its docstring is the help."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from bertcore.errors import BertpipeError, ConfigError

app = typer.Typer(
    help="bertpipe: raw text to a pretrained, evaluated BERT-family encoder.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="Run recipe (YAML).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override one key, e.g. --set examples.max_seq_length=512 (repeatable).")]


def _fail(message: str, hint: str | None = None) -> None:
    typer.secho(f"bertpipe: error: {message}", err=True, fg="red")
    if hint:
        typer.echo(f"  {hint}", err=True)
    raise typer.Exit(code=2)


def _load(config: Path | None, overrides: list[str] | None):
    from pipelines.registry import load_config

    return load_config(config, overrides or [])


def _split_names(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


@app.command()
def run(
    config: ConfigOpt = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only these stages (repeatable or comma-separated).")] = None,
    from_stage: Annotated[Optional[str], typer.Option("--from", help="Run this stage and every stage after it.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Recompute the selected stages even if their output is complete.")] = False,
    set_: SetOpt = None,
) -> None:
    """Run the pipeline (or some of its stages) as the Prefect flow `bert_pretraining`."""
    try:
        cfg = _load(config, set_)
        from pipelines.registry import select

        select(_split_names(only), from_stage)  # validate names before starting anything
        from flows.pipeline import bert_pretraining

        state = bert_pretraining(cfg, only=_split_names(only), from_stage=from_stage, force=force, return_state=True)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    if state.is_failed():
        _fail(state.message or "the flow failed", hint=f"logs above; stage outputs under {cfg.run.root}")
    summaries = state.result()
    for summary in summaries:
        typer.echo(
            f"{summary['stage']:<10} {summary['state']:<9} rows={summary['rows']:<9} "
            f"fingerprint={summary['fingerprint']}  {summary['uri']}"
        )
    for summary in summaries:
        if "report" in summary:
            typer.echo(f"report: {summary['report']}")


@app.command()
def export(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    step: Annotated[Optional[int], typer.Option("--step", help="Checkpoint step to export (default: the latest complete one).")] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="Output folder or URI (default: <run.root>/pretrain/model).")] = None,
) -> None:
    """Write a Hugging Face model folder (config.json, model.safetensors, tokenizer files) from a pretraining checkpoint."""
    try:
        cfg = _load(config, set_)
        from pipelines import pretrain
        from pipelines.ray_runtime import ensure_ray
        from pipelines.registry import REGISTRY
        from pipelines.runner import Pipeline, upstream

        pipeline = Pipeline(cfg)
        vocab = upstream(REGISTRY["pretrain"], cfg.run.root, pipeline.storage)["vocab"]
        ensure_ray(cfg.ray)
        written = pretrain.export_model(pipeline.dir("pretrain"), vocab, step=step, out=out)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    for item in written:
        typer.echo(str(item.get("uri") or item.get("path") or item))


@app.command()
def status(config: ConfigOpt = None, set_: SetOpt = None, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Per stage: complete / stale (inputs or config changed) / incomplete / missing, with fingerprint, rows, size, duration and location."""
    try:
        cfg = _load(config, set_)
        from pipelines.runner import Pipeline

        rows = Pipeline(cfg).status()
    except BertpipeError as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(f"{'stage':<10} {'state':<11} {'fingerprint':<21} {'rows':>9} {'size':>10} {'time':>8}  location")
    for r in rows:
        size = f"{r['bytes'] / 2**20:.1f}MB" if r["bytes"] is not None else "-"
        seconds = f"{r['seconds']:.1f}s" if r["seconds"] is not None else "-"
        rows_text = str(r["rows"]) if r["rows"] is not None else "-"
        typer.echo(f"{r['stage']:<10} {r['state']:<11} {r['fingerprint'] or '-':<21} {rows_text:>9} {size:>10} {seconds:>8}  {r['uri']}")
        for reason in r.get("changed") or []:
            typer.echo(f"{'':<10} changed: {reason}")


@app.command()
def deploy(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    pool: Annotated[str, typer.Option("--pool", help="Prefect work pool of type process; created if missing.")] = "bertpipe",
    kind: Annotated[Optional[list[str]], typer.Option("--kind", help="Deployments to create or update: full, corpus-refresh, evaluate (repeatable or comma-separated; default: all).")] = None,
    cron: Annotated[Optional[list[str]], typer.Option("--cron", help="Schedule of one deployment as KIND=CRON, e.g. --cron 'full=0 3 * * 0'; KIND=none leaves it unscheduled (repeatable).")] = None,
    timezone: Annotated[str, typer.Option("--timezone", help="IANA time zone of the schedules.")] = "UTC",
    name: Annotated[Optional[str], typer.Option("--name", help="Deployment name prefix (default: the recipe's file name), giving NAME-full, NAME-corpus-refresh, NAME-evaluate.")] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create the deployments with their schedules paused.")] = False,
) -> None:
    """Create or update scheduled Prefect deployments of the flow for one recipe (full pipeline, corpus refresh, evaluation); a `prefect worker start --pool POOL` on a machine with this checkout runs them."""
    try:
        from flows.deploy import deploy as deploy_recipe

        schedules: dict[str, str | None] = {}
        for item in cron or []:
            which, sep, expression = item.partition("=")
            if not sep:
                raise ConfigError(f"--cron {item!r}: expected KIND=CRON, e.g. --cron 'full=0 3 * * 0'")
            schedules[which.strip()] = None if expression.strip().lower() == "none" else expression.strip()
        ids = deploy_recipe(config, set_ or [], pool=pool, kinds=_split_names(kind), schedules=schedules, timezone=timezone, name_prefix=name, paused=paused)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    typer.echo(f"{len(ids)} deployment(s) in work pool {pool!r}; start a worker with: prefect worker start --pool {pool}")


@app.command("save-recipe")
def save_recipe(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variable: Annotated[str, typer.Option("--variable", help="Name of the Prefect Variable.")] = "bertpipe_recipe",
) -> None:
    """Store the resolved recipe as a Prefect Variable: the `config` parameter infra/prefect/prefect.yaml deploys."""
    try:
        from flows.deploy import save_recipe as store_recipe

        store_recipe(config, set_ or [], variable=variable)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    typer.echo(f"recipe stored as Prefect Variable {variable!r}")


@app.command("demo-data")
def demo_data() -> None:
    """Print where the bundled sample data lives (real text shipped in the gensim and konlpy wheels)."""
    from bertcore import sample_data

    try:
        gensim_dir = sample_data.gensim_data_dir()
    except BertpipeError as exc:
        _fail(str(exc))
        return
    typer.echo(f"English Wikipedia dump (206 pages): {gensim_dir / sample_data.ENWIKI_DUMP}")
    typer.echo(f"News text (300 documents, one per line): {gensim_dir / sample_data.NEWS_TEXT}")
    typer.echo(f"Sentiment sentences (__label__pos|neg): {gensim_dir / sample_data.SENTIMENT}")
    try:
        typer.echo(f"Korean text (kolaw/, kobill/): {sample_data.konlpy_corpus_dir()}")
    except BertpipeError as exc:
        typer.echo(f"Korean text: not installed ({exc})")


def main() -> None:
    # Stage modules log through the standard logging module; show them in Prefect's logs.
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "pipelines,bertcore,flows")
    # no network here or on most clusters: the temporary API server must not phone home
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    app()


if __name__ == "__main__":
    sys.exit(main())
