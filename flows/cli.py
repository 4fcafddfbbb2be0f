"""The `bertpipe` command line. Each command is one typed function; its docstring is the help."""

from __future__ import annotations

import json
import logging
import os
import sys
from enum import Enum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from bertcore.errors import BertpipeError, ConfigError
from flows import logs

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    help="bertpipe: raw text to a pretrained, evaluated BERT-family encoder.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings=HELP_OPTIONS,
    rich_markup_mode=None,
)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", metavar="FILE", help="Run recipe (YAML).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="Override one key, e.g. --set examples.max_seq_length=512 (repeatable).")]


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
        LogFormat, typer.Option("--log-format", envvar="BERTPIPE_LOG_FORMAT", help="text for people, or json: one JSON object per line (logs on stderr, `run`'s summary on stdout).")
    ] = LogFormat.text,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="Also bertpipe's DEBUG lines (-vv: Prefect's too).")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors (and the command's result).")] = False,
    show_version: Annotated[bool, typer.Option("--version", callback=_versions, is_eager=True, help="Print the versions and exit.")] = False,
) -> None:
    """bertpipe: raw text to a pretrained, evaluated BERT-family encoder."""
    logs.setup(-1 if quiet else verbose, log_format.value)


def _fail(message: str, hint: str | None = None) -> None:
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
        _fail(
            f"Prefect's temporary API server did not answer within {os.environ.get(EPHEMERAL_TIMEOUT, '?')} s "
            f"(a busy machine?); set {EPHEMERAL_TIMEOUT} higher, or PREFECT_API_URL to a running Prefect server"
        )


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
        line = logs.json_line(logging.ERROR, message, event="error") if logs.configured() == "json" else f"bertpipe: error: {message}"
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            if "ray" in sys.modules:  # Ray's processes, gracefully; at most 15 s
                import threading

                threading.Timer(15, os._exit, args=(128 + signum,)).start()
                sys.modules["ray"].shutdown()
        finally:
            os._exit(128 + signum)

    stop.bertpipe_stops_the_run = True  # type: ignore[attr-defined]  # pipelines/stages/pretrain/work.py keeps it in place
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def _load(config: Path | None, overrides: list[str] | None):
    from pipelines.registry import load_config

    return load_config(config, overrides or [])


def _split_names(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


@app.command(short_help="Run the pipeline, or some of its stages.")
def run(
    config: ConfigOpt = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", metavar="STAGE[,STAGE]", help="Run only these stages (repeatable or comma-separated).")] = None,
    from_stage: Annotated[Optional[str], typer.Option("--from", metavar="STAGE", help="Run this stage and every stage after it.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Recompute the selected stages from nothing, even if complete: pretrain and distill delete their checkpoints and train from step 0 (a plain rerun resumes).")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Re-hash every shard before trusting it, and every local input file (default: only what changed size or mtime/ETag).")] = False,
    set_: SetOpt = None,
) -> None:
    """Run the pipeline (or some of its stages) as the Prefect flow `bert_pretraining`."""
    try:
        cfg = _load(config, set_)
        from pipelines.registry import select

        stages = select(_split_names(only), from_stage, cfg.off)  # validate names before starting anything
        from pipelines.runner import Pipeline

        Pipeline(cfg).preflight(stages)  # a held root, a missing upstream: refused before Prefect and Ray start
        from flows import reaper
        from flows.pipeline import bert_pretraining

        _stop_when_interrupted()
        reaper.start()  # if this process is killed outright, Prefect's server and Ray go with it

        state = bert_pretraining(cfg, only=_split_names(only), from_stage=from_stage, force=force, verify=verify, return_state=True)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    except RuntimeError as exc:
        _fail_if_no_prefect_server(exc)
        raise
    if state.is_failed():
        _fail(state.message or "the flow failed", hint=f"logs above; stage outputs under {cfg.run.root}")
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


class ExportFormat(str, Enum):
    hf = "hf"
    onnx = "onnx"


@app.command(short_help="Export a model: a Hugging Face folder, or ONNX files (fp32, int8) checked against PyTorch.")
def export(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    format_: Annotated[ExportFormat, typer.Option("--format", metavar="hf|onnx", help="hf: a Hugging Face folder from a pretraining checkpoint; onnx: ONNX Runtime files from a stage's model folder, checked against PyTorch.")] = ExportFormat.hf,
    step: Annotated[Optional[int], typer.Option("--step", metavar="N", help="hf: checkpoint step to export (default: the latest complete one).")] = None,
    out: Annotated[Optional[str], typer.Option("--out", metavar="URI", help="Output folder or URI (default: <run.root>/pretrain/model for hf, <run.root>/onnx/<stage>[-<task>] for onnx).")] = None,
    quantize: Annotated[Optional[str], typer.Option("--quantize", metavar="int8", help="onnx: int8 also writes model.int8.onnx (ONNX Runtime dynamic quantization) and checks its predictions.")] = None,
    stage: Annotated[Optional[str], typer.Option("--stage", metavar="STAGE", help="onnx: the stage whose model/ to export (default: distill when the recipe distils, else pretrain).")] = None,
    task: Annotated[Optional[str], typer.Option("--task", metavar="TASK", help="onnx: add the head of this evaluate task (the model the evaluate stage fine-tuned on it) and a logits output.")] = None,
    check_sentences: Annotated[int, typer.Option("--check-sentences", min=2, metavar="N", help="onnx: held-out corpus sentences the export is checked on.")] = 256,
    tolerance: Annotated[float, typer.Option("--tolerance", min=0.0, metavar="X", help="onnx: largest |difference| from PyTorch the fp32 graph may show.")] = 1e-3,
) -> None:
    """Export a model: a Hugging Face folder (config.json, model.safetensors, tokenizer files) from a pretraining checkpoint, or with --format onnx an ONNX encoder (dynamic batch and sequence axes; int8 with --quantize int8; a task head with --task) checked with ONNX Runtime against PyTorch on held-out sentences, its figures in the folder's _manifest.json."""
    try:
        from flows import exporting

        onnx = format_ is ExportFormat.onnx
        exporting.check_options(onnx, step, quantize, stage, task)
        cfg = _load(config, set_)
        from pipelines.lease import RootLease
        from pipelines.runner import Pipeline

        pipeline = Pipeline(cfg)
        out = exporting.target(cfg, pipeline.storage, onnx, stage, task, out)
        with RootLease(pipeline.storage, cfg.run.root, "bertpipe export"):
            if onnx:
                lines = exporting.export_onnx(cfg, pipeline, stage, task, quantize, out, check_sentences, tolerance)
            else:
                lines = exporting.export_hf(cfg, pipeline, step, out)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    for line in lines:
        typer.echo(line)


class ServeFormat(str, Enum):
    onnx = "onnx"
    torch = "torch"


@app.command(short_help="Serve a run's model over HTTP (Ray Serve): embeddings, classification, masked words.")
def serve(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    stage: Annotated[Optional[str], typer.Option("--stage", metavar="STAGE", help="pretrain, distill (the student) or evaluate with --task (default: distill when the recipe distils, else pretrain).")] = None,
    task: Annotated[Optional[str], typer.Option("--task", metavar="TASK", help="Serve the model the evaluate stage fine-tuned on this task: /classify gives its labels and scores.")] = None,
    format_: Annotated[ServeFormat, typer.Option("--format", metavar="onnx|torch", help="onnx: the `bertpipe export --format onnx` folder in ONNX Runtime; torch: the stage's model folder in PyTorch.")] = ServeFormat.onnx,
    quantize: Annotated[Optional[str], typer.Option("--quantize", metavar="int8", help="onnx: serve the int8 graph (model.int8.onnx).")] = None,
    host: Annotated[str, typer.Option("--host", metavar="ADDRESS", help="Address the HTTP proxy listens on; any other than 127.0.0.1 opens the model to the network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, metavar="N", help="HTTP port.")] = 8000,
    replicas: Annotated[int, typer.Option("--replicas", min=1, metavar="N", help="Model replicas, each with serve.threads CPUs.")] = 1,
) -> None:
    """Serve the model a run made over HTTP through Ray Serve (embedded Ray, or the cluster at ray.address), until Ctrl-C: POST /embed, /classify, /fill-mask; GET /health, /metrics (Prometheus), /info. Requests are batched by a token budget and a wait deadline (the recipe's serve: section)."""
    try:
        cfg = _load(config, set_)
        from pipelines.serve import launch, source
        from pipelines.storage import Storage

        storage = Storage(cfg.storage)
        served = source.resolve(cfg, storage, stage=stage, task=task, fmt=format_.value, quantize=quantize)
        launch.serve(
            cfg, storage, served, host=host, port=port, replicas=replicas, on_ray=logs.route_ray_output,
            started=lambda url, threads: typer.echo(launch.start_line(served.identity, url, host, replicas, threads)),
        )
    except BertpipeError as exc:
        _fail(str(exc))


@app.command(short_help="Each stage's state: complete, stale, incomplete, damaged, missing.")
def status(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Re-hash every shard and every local input file (default: only what changed size or mtime/ETag).")] = False,
) -> None:
    """Per stage: complete / stale (inputs or config changed) / incomplete (shards gone) / damaged (bytes changed) / missing / running (pid, host, since: from the root's lease), with fingerprint, rows, size, the time its last run took (as the run summary shows it) and location."""
    try:
        cfg = _load(config, set_)
        from pipelines.runner import Pipeline

        rows = Pipeline(cfg, verify=verify).status()
    except BertpipeError as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from bertcore.figures import duration, size

    typer.echo(f"{'stage':<10} {'state':<11} {'fingerprint':<21} {'rows':>9} {'size':>9} {'time':>7}  location")
    for r in rows:
        size_text = size(r["bytes"]) if r["bytes"] is not None else "-"
        rows_text = f"{r['rows']:,}" if r["rows"] else "-"  # a stage without records (evaluate's reports) shows none
        state = f"running (pid {r['running']['pid']}, host {r['running']['host']}, since {r['running']['since']})" if r.get("running") else r["state"]
        line = f"{r['stage']:<10} {state:<11} {r['fingerprint'] or '-':<21} {rows_text:>9} {size_text:>9} {duration(r['seconds']):>7}  {r['uri']}"
        typer.echo(line)
        for reason in r.get("changed") or []:
            typer.echo(f"{'':<10} changed: {reason}")
        if r["state"] == "off":
            typer.echo(f"{'':<10} off: {r['note']}")


@app.command("inspect", short_help="Look at what a stage produced.")
def inspect_stage(
    stage: Annotated[str, typer.Argument(help="corpus, vocab, examples, pretrain, distill or evaluate.")],
    config: ConfigOpt = None,
    set_: SetOpt = None,
    root: Annotated[Optional[str], typer.Option("--root", metavar="URI", help="Run root to read (default: run.root of the recipe, or runs/demo without one).")] = None,
    n: Annotated[int, typer.Option("--n", min=1, metavar="N", help="Documents or examples to show.")] = 3,
    split: Annotated[str, typer.Option("--split", metavar="SPLIT", help="train or validation (corpus, examples).")] = "train",
    phase: Annotated[Optional[str], typer.Option("--phase", metavar="PHASE", help="Examples phase, e.g. seq128 (default: the first).")] = None,
    text: Annotated[Optional[str], typer.Option("--text", metavar="TEXT", help="vocab: how this text tokenizes.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Look at what a stage produced: corpus documents, the vocabulary (and how --text tokenizes), examples decoded with their masks, segments and NSP label, pretraining checkpoints, evaluation scores."""
    try:
        from flows.inspect import Options, inspect
        from pipelines.storage import Storage

        if config is not None:
            cfg = _load(config, set_)
            storage, run_root = Storage(cfg.storage), root or cfg.run.root
        else:  # no recipe: the root given, or the default one (runs/demo)
            from bertcore.config import RunConfig, StorageConfig, validate

            storage, run_root = Storage(StorageConfig()), validate(RunConfig, {"root": root} if root else {}).root
        data, lines = inspect(storage, run_root, stage, Options(n=n, split=split, phase=phase, text=text))
    except BertpipeError as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
        return
    for line in lines:
        typer.echo(line)


config_app = typer.Typer(help="The run recipe.", no_args_is_help=True, context_settings=HELP_OPTIONS, rich_markup_mode=None)
app.add_typer(config_app, name="config")


@config_app.command("show", short_help="Print the recipe as a run would use it.")
def config_show(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of YAML.")] = False,
) -> None:
    """Print the recipe as a run would use it: `extends` merged, `--set` applied, `{demo_data}` expanded, every default filled in; credentials masked."""
    try:
        cfg = _load(config, set_)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    data = cfg.model_dump(mode="json")  # passwords inside URIs masked (bertcore/redact.py)
    for name in ("key", "secret"):  # never written out; shown only as set or not
        if getattr(cfg.storage, name) is not None:
            data["storage"][name] = "****"
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    import yaml

    typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())


@app.command(short_help="Re-hash every shard against its manifest.")
def verify(
    stages: Annotated[Optional[list[str]], typer.Argument(help="Stages to check (default: all).")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Re-hash every shard of the stages against their manifests; exit 1 when any is damaged or missing."""
    try:
        cfg = _load(config, set_)
        from pipelines.registry import select
        from pipelines.runner import Pipeline

        names = select(_split_names(stages), None) if stages else None
        rows = Pipeline(cfg).verify_outputs(names)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            checked = f"{r['shards']} shards" if "shards" in r else "-"
            typer.echo(f"{r['stage']:<10} {r['state']:<11} {checked:>12}  {r['uri']}")
            for path, state in sorted(r["problems"].items()):
                typer.echo(f"  {state:<8} {path}")
            if r["note"]:
                typer.echo(f"  {r['note']}")
    if any(r["state"] in ("damaged", "incomplete") for r in rows):
        raise typer.Exit(code=1)


@app.command(short_help="Create or update scheduled Prefect deployments.")
def deploy(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    pool: Annotated[str, typer.Option("--pool", metavar="NAME", help="Prefect work pool of type process; created if missing.")] = "bertpipe",
    kind: Annotated[Optional[list[str]], typer.Option("--kind", metavar="KIND[,KIND]", help="Deployments to create or update: full, corpus-refresh, evaluate (repeatable or comma-separated; default: all).")] = None,
    cron: Annotated[Optional[list[str]], typer.Option("--cron", metavar="KIND=CRON", help="Schedule of one deployment as KIND=CRON, e.g. --cron 'full=0 3 * * 0'; KIND=none leaves it unscheduled (repeatable).")] = None,
    timezone: Annotated[str, typer.Option("--timezone", metavar="TZ", help="IANA time zone of the schedules.")] = "UTC",
    name: Annotated[Optional[str], typer.Option("--name", metavar="PREFIX", help="Deployment name prefix (default: the recipe's file name), giving NAME-full, NAME-corpus-refresh, NAME-evaluate.")] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create the deployments with their schedules paused.")] = False,
    crash_after: Annotated[Optional[float], typer.Option("--crash-after", metavar="SECONDS", help="A run without heartbeats (every 30 s) for this long is marked crashed and rescheduled (default: infra/prefect/automations.yaml, 90).")] = None,
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
        ids = deploy_recipe(config, set_ or [], pool=pool, kinds=_split_names(kind), schedules=schedules, timezone=timezone, name_prefix=name, paused=paused, crash_after_s=crash_after)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    except RuntimeError as exc:
        _fail_if_no_prefect_server(exc)
        raise
    typer.echo(f"{len(ids)} deployment(s) in work pool {pool!r}; start a worker with: prefect worker start --pool {pool}")


@app.command("save-recipe", short_help="Store the resolved recipe as a Prefect Variable.")
def save_recipe(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variable: Annotated[str, typer.Option("--variable", metavar="NAME", help="Name of the Prefect Variable.")] = "bertpipe_recipe",
) -> None:
    """Store the resolved recipe as a Prefect Variable: the `config` parameter infra/prefect/prefect.yaml deploys."""
    try:
        from flows.deploy import save_recipe as store_recipe

        store_recipe(config, set_ or [], variable=variable)
    except BertpipeError as exc:
        _fail(str(exc))
        return
    except RuntimeError as exc:
        _fail_if_no_prefect_server(exc)
        raise
    typer.echo(f"recipe stored as Prefect Variable {variable!r}")


@app.command("demo-data", short_help="Print where the bundled sample data lives.")
def demo_data() -> None:
    """Print where the bundled sample data lives (real text shipped in the gensim and konlpy wheels, and bertpipe's own task files)."""
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
    typer.echo(f"Korean review sentiment (120 sentences written for bertpipe): {sample_data.TASK_DATA / 'korean_reviews.tsv'}")


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
