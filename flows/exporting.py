"""What `bertpipe export` does after parsing its options (flows/commands/models.py holds
the command): options that do not fit the format, where it may write, and the two
exports. Nothing heavy is imported until an export runs."""

from __future__ import annotations

from bertcore.errors import ConfigError
from flows import logs


def check_options(onnx: bool, step: int | None, quantize: str | None, stage: str | None, task: str | None) -> None:
    """Options that do not fit --format, as one ConfigError."""
    if quantize is not None and quantize != "int8":
        raise ConfigError(f"--quantize {quantize}: the one quantization is int8")
    if not onnx:
        given = [
            name
            for name, value in (("--quantize", quantize), ("--stage", stage), ("--task", task))
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"{', '.join(given)} need{'s' if len(given) == 1 else ''} --format onnx (the hf export "
                "writes a pretraining checkpoint as it is)"
            )
    elif step is not None:
        raise ConfigError("--step is for --format hf: the ONNX export reads the stage's exported model/ folder")


def target(cfg, storage, onnx: bool, stage: str | None, task: str | None, out: str | None) -> str | None:
    """Where the export will write, refused now (before the lease, torch or Ray) unless it is
    a new folder or an earlier export's (pipelines/export/target.py); None: the hf export's
    default, the pretrain stage's own model/."""
    from bertcore.model.hf_files import MLM_SUFFIX
    from pipelines.export import onnx as onnx_export
    from pipelines.export.target import check_target

    if onnx:
        default = onnx_export.default_out(
            cfg.run.root, onnx_export.check_stage(stage or onnx_export.default_stage(cfg)), task
        )
        return check_target(storage, cfg.run.root, out or default, default=default)
    if out is None:
        return None
    return check_target(
        storage, cfg.run.root, out, twins=(MLM_SUFFIX,), default=f"{cfg.run.root.rstrip('/')}/exports/model"
    )


def export_hf(cfg, pipeline, step: int | None, out: str | None) -> list[str]:
    from bertcore.vocab.morphemes import PRE_TOKENIZER_KEY, run_note
    from pipelines.ray_runtime import ensure_ray
    from pipelines.registry import REGISTRY
    from pipelines.runner import upstream
    from pipelines.stages.pretrain import work as pretrain

    inputs = upstream(REGISTRY["pretrain"], cfg.run.root, pipeline.storage)
    ensure_ray(cfg.ray)
    logs.route_ray_output()
    written = pretrain.export_model(pipeline.dir("pretrain"), inputs, step=step, out=out)
    lines = [str(item["uri"]) for item in written]
    split = inputs["vocab"].manifest.stats.get(PRE_TOKENIZER_KEY)
    if split:  # a Korean morpheme vocabulary: AutoTokenizer alone would not split as in training
        lines.append(run_note(split, lines[0].rsplit("/", 1)[0]))
    return lines


def export_onnx(
    cfg,
    pipeline,
    stage: str | None,
    task: str | None,
    quantize: str | None,
    out: str | None,
    sentences: int,
    tolerance: float,
) -> list[str]:
    from bertcore.config import resolved_yaml
    from pipelines.export import onnx as onnx_export
    from pipelines.stage_dir import MANIFEST

    uri, manifest = onnx_export.export_onnx(
        cfg,
        pipeline.storage,
        stage=stage,
        task=task,
        int8=quantize == "int8",
        out=out,
        sentences=sentences,
        tolerance=tolerance,
        resolved_config=resolved_yaml(cfg),
    )
    files = [f"{uri.rstrip('/')}/{name}" for name in [shard.path for shard in manifest.shards] + [MANIFEST]]
    return files + onnx_export.summary_lines(manifest)
