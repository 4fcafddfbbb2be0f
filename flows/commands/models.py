"""The commands that put a run's model to use outside bertpipe: `export` writes it as files
(a Hugging Face folder, ONNX), `serve` answers HTTP requests with it."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from flows import logs
from flows.commands.errors import one_line_errors
from flows.commands.options import ConfigOpt, SetOpt, load_recipe


class ExportFormat(str, Enum):
    hf = "hf"
    onnx = "onnx"


def export(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    format_: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            metavar="hf|onnx",
            help=(
                "hf: a Hugging Face folder from a pretraining checkpoint; onnx: ONNX Runtime files from a "
                "stage's model folder, checked against PyTorch."
            ),
        ),
    ] = ExportFormat.hf,
    step: Annotated[
        int | None,
        typer.Option("--step", metavar="N", help="hf: checkpoint step to export (default: the latest complete one)."),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            metavar="URI",
            help=(
                "Output folder or URI (default: <run.root>/pretrain/model for hf, "
                "<run.root>/onnx/<stage>[-<task>] for onnx)."
            ),
        ),
    ] = None,
    quantize: Annotated[
        str | None,
        typer.Option(
            "--quantize",
            metavar="int8",
            help=(
                "onnx: int8 also writes model.int8.onnx (ONNX Runtime dynamic quantization) and checks its predictions."
            ),
        ),
    ] = None,
    stage: Annotated[
        str | None,
        typer.Option(
            "--stage",
            metavar="STAGE",
            help="onnx: the stage whose model/ to export (default: distill when the recipe distils, else pretrain).",
        ),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            metavar="TASK",
            help=(
                "onnx: add the head of this evaluate task (the model the evaluate stage fine-tuned on it) and a "
                "logits output."
            ),
        ),
    ] = None,
    check_sentences: Annotated[
        int,
        typer.Option(
            "--check-sentences", min=2, metavar="N", help="onnx: held-out corpus sentences the export is checked on."
        ),
    ] = 256,
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance", min=0.0, metavar="X", help="onnx: largest |difference| from PyTorch the fp32 graph may show."
        ),
    ] = 1e-3,
) -> None:
    """Export a model: a Hugging Face folder (config.json, model.safetensors, tokenizer files) from a pretraining
    checkpoint, or with --format onnx an ONNX encoder (dynamic batch and sequence axes; int8 with --quantize int8; a
    task head with --task) checked with ONNX Runtime against PyTorch on held-out sentences, its figures in the folder's
    _manifest.json."""
    with one_line_errors():
        from flows import exporting

        onnx = format_ is ExportFormat.onnx
        exporting.check_options(onnx, step, quantize, stage, task)
        cfg = load_recipe(config, set_)
        from pipelines.lease import RootLease
        from pipelines.runner import Pipeline

        pipeline = Pipeline(cfg)
        out = exporting.target(cfg, pipeline.storage, onnx, stage, task, out)
        with RootLease(pipeline.storage, cfg.run.root, "bertpipe export"):
            if onnx:
                lines = exporting.export_onnx(cfg, pipeline, stage, task, quantize, out, check_sentences, tolerance)
            else:
                lines = exporting.export_hf(cfg, pipeline, step, out)
    for line in lines:
        typer.echo(line)


class ServeFormat(str, Enum):
    onnx = "onnx"
    torch = "torch"


def serve(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    stage: Annotated[
        str | None,
        typer.Option(
            "--stage",
            metavar="STAGE",
            help=(
                "pretrain, distill (the student) or evaluate with --task (default: distill when the recipe "
                "distils, else pretrain)."
            ),
        ),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            metavar="TASK",
            help="Serve the model the evaluate stage fine-tuned on this task: /predict gives its labels and scores.",
        ),
    ] = None,
    format_: Annotated[
        ServeFormat,
        typer.Option(
            "--format",
            metavar="onnx|torch",
            help=(
                "onnx: the `bertpipe export --format onnx` folder in ONNX Runtime; torch: the stage's model "
                "folder in PyTorch."
            ),
        ),
    ] = ServeFormat.onnx,
    quantize: Annotated[
        str | None, typer.Option("--quantize", metavar="int8", help="onnx: serve the int8 graph (model.int8.onnx).")
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="ADDRESS",
            help="Address the HTTP port listens on; any other than 127.0.0.1 opens the model to the network.",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, metavar="N", help="HTTP port.")] = 8000,
    replicas: Annotated[
        int,
        typer.Option(
            "--replicas",
            min=1,
            metavar="N",
            help="More than 1: N replicas behind Ray Serve, each with serve.threads CPUs (also with ray.address set).",
        ),
    ] = 1,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            "--api-key",
            metavar="KEY",
            help=(
                "Require `Authorization: Bearer KEY` on every route but /health (repeatable; default: "
                "BERTPIPE_API_KEY, comma-separated)."
            ),
        ),
    ] = None,
) -> None:
    """Serve the model a run made over HTTP until Ctrl-C: OpenAI's POST /v1/embeddings; text-embeddings-inference's POST
    /embed, /, /predict (texts or pairs), /tokenize; POST /fill-mask; GET /health, /metrics (Prometheus), /info.
    In-process (one uvicorn process) by default; with --replicas N > 1 or ray.address set, N replicas behind Ray Serve.
    Requests are batched adaptively; a full queue answers 429 (the recipe's serve: section)."""
    with one_line_errors():
        cfg = load_recipe(config, set_)
        from bertcore.inference.batch_choice import BatchChoice
        from pipelines.serve import launch, source
        from pipelines.serve.keys import Keys
        from pipelines.storage import Storage

        keys = Keys.from_options(api_key)
        storage = Storage(cfg.storage)
        served = source.resolve(cfg, storage, stage=stage, task=task, fmt=format_.value, quantize=quantize)
        serving = launch.mode(cfg, replicas)
        launch.serve(
            cfg,
            storage,
            served,
            host=host,
            port=port,
            replicas=replicas,
            keys=keys,
            on_ray=logs.route_ray_output,
            started=lambda url, threads: typer.echo(
                launch.start_line(
                    served.identity,
                    url,
                    host,
                    serving,
                    replicas,
                    threads,
                    bool(keys),
                    BatchChoice.of(cfg.serve).describe(),
                )
            ),
        )
