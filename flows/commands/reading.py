"""The commands that only read, and change nothing: each stage's state (`status`), its
shards' hashes (`verify`), what it produced (`inspect`), the recipe as resolved
(`config show`), where the sample data is (`demo-data`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bertcore.errors import BertpipeError
from flows.commands.errors import one_line_errors
from flows.commands.options import ConfigOpt, SetOpt, load_recipe, split_names


def status(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Re-hash every shard and every local input file (default: only what changed size or mtime/ETag).",
        ),
    ] = False,
) -> None:
    """Per stage: complete / stale (inputs or config changed) / incomplete (shards gone) / damaged (bytes changed) /
    missing / running (pid, host, since: from the root's lease), with fingerprint, rows, size, the time its last run
    took (as the run summary shows it) and location."""
    with one_line_errors():
        cfg = load_recipe(config, set_)
        from pipelines.runner import Pipeline

        rows = Pipeline(cfg, verify=verify).status()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from bertcore.figures import duration, size

    typer.echo(f"{'stage':<10} {'state':<11} {'fingerprint':<21} {'rows':>9} {'size':>9} {'time':>7}  location")
    for r in rows:
        size_text = size(r["bytes"]) if r["bytes"] is not None else "-"
        rows_text = f"{r['rows']:,}" if r["rows"] else "-"  # a stage without records (evaluate's reports) shows none
        state = (
            f"running (pid {r['running']['pid']}, host {r['running']['host']}, since {r['running']['since']})"
            if r.get("running")
            else r["state"]
        )
        line = (
            f"{r['stage']:<10} {state:<11} {r['fingerprint'] or '-':<21} {rows_text:>9} {size_text:>9} "
            f"{duration(r['seconds']):>7}  {r['uri']}"
        )
        typer.echo(line)
        for reason in r.get("changed") or []:
            typer.echo(f"{'':<10} changed: {reason}")
        if r["state"] == "off":
            typer.echo(f"{'':<10} off: {r['note']}")


def inspect_stage(
    stage: Annotated[str, typer.Argument(help="corpus, vocab, examples, pretrain, distill or evaluate.")],
    config: ConfigOpt = None,
    set_: SetOpt = None,
    root: Annotated[
        str | None,
        typer.Option(
            "--root",
            metavar="URI",
            help="Run root to read (default: run.root of the recipe, or runs/demo without one).",
        ),
    ] = None,
    n: Annotated[int, typer.Option("--n", min=1, metavar="N", help="Documents or examples to show.")] = 3,
    split: Annotated[
        str, typer.Option("--split", metavar="SPLIT", help="train or validation (corpus, examples).")
    ] = "train",
    phase: Annotated[
        str | None,
        typer.Option("--phase", metavar="PHASE", help="Examples phase, e.g. seq128 (default: the first)."),
    ] = None,
    text: Annotated[str | None, typer.Option("--text", metavar="TEXT", help="vocab: how this text tokenizes.")] = None,
    dropped: Annotated[
        str | None,
        typer.Option(
            "--dropped",
            metavar="FILTER",
            help="corpus: samples of what this filter or drop reason removed (language, c4, ...).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Look at what a stage produced: corpus documents (or, with --dropped, what a filter removed), the vocabulary (and
    how --text tokenizes), examples decoded with their masks, segments and NSP label, pretraining checkpoints,
    evaluation scores."""
    with one_line_errors():
        from flows.inspect import Options, inspect
        from pipelines.storage import Storage

        if config is not None:
            cfg = load_recipe(config, set_)
            storage, run_root = Storage(cfg.storage), root or cfg.run.root
        else:  # no recipe: the root given, or the default one (runs/demo)
            from bertcore.config import RunConfig, StorageConfig, validate

            storage, run_root = Storage(StorageConfig()), validate(RunConfig, {"root": root} if root else {}).root
        data, lines = inspect(
            storage, run_root, stage, Options(n=n, split=split, phase=phase, text=text, dropped=dropped)
        )
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
        return
    for line in lines:
        typer.echo(line)


def config_show(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of YAML.")] = False,
) -> None:
    """Print the recipe as a run would use it: `extends` merged, `--set` applied, `{demo_data}` expanded, every default
    filled in; credentials masked."""
    with one_line_errors():
        cfg = load_recipe(config, set_)
    data = cfg.model_dump(mode="json")  # passwords inside URIs masked (bertcore/redact.py)
    for name in ("key", "secret"):  # never written out; shown only as set or not
        if getattr(cfg.storage, name) is not None:
            data["storage"][name] = "****"
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    import yaml

    typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())


def verify(
    stages: Annotated[list[str] | None, typer.Argument(help="Stages to check (default: all).")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Re-hash every shard of the stages against their manifests; exit 1 when any is damaged or missing."""
    with one_line_errors():
        cfg = load_recipe(config, set_)
        from pipelines.registry import select
        from pipelines.runner import Pipeline

        names = select(split_names(stages), None) if stages else None
        rows = Pipeline(cfg).verify_outputs(names)
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


def demo_data() -> None:
    """Print where the bundled sample data lives (real text shipped in the gensim and konlpy wheels, and bertpipe's own
    task files)."""
    from bertcore import sample_data

    with one_line_errors():
        gensim_dir = sample_data.gensim_data_dir()
    typer.echo(f"English Wikipedia dump (206 pages): {gensim_dir / sample_data.ENWIKI_DUMP}")
    typer.echo(f"News text (300 documents, one per line): {gensim_dir / sample_data.NEWS_TEXT}")
    typer.echo(f"Sentiment sentences (__label__pos|neg): {gensim_dir / sample_data.SENTIMENT}")
    try:
        typer.echo(f"Korean text (kolaw/, kobill/): {sample_data.konlpy_corpus_dir()}")
    except BertpipeError as exc:
        typer.echo(f"Korean text: not installed ({exc})")
    typer.echo(
        f"Korean review sentiment (120 sentences written for bertpipe): {sample_data.TASK_DATA / 'korean_reviews.tsv'}"
    )
