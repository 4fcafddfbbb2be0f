"""Pretrain stage: examples + vocab -> DeepSpeed checkpoints, `model/` (Hugging Face
layout) and `metrics.jsonl` under `<run.root>/pretrain/`.

Ray shape: the training stages' shared launch (pipelines/training.py): a Ray Train
TorchTrainer whose workers each run bertcore.trainer.Trainer with the pretraining
objective (bertcore.objectives.Pretraining, MLM + NSP), then one Ray task that
consolidates the final checkpoint into `model/`. The driver only checks inputs, decides
about resuming, and writes the manifest.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from bertcore.errors import ConfigError
from bertcore.examples_config import ExamplesConfig
from bertcore.pretrain_config import PretrainConfig
from pipelines.external import ExternalFolder, model_folder
from pipelines.stage import External, Output, Stage, StageDir, StageRun, Upstream
from pipelines.stage_files import stage_files
from pipelines.storage import Storage, join
from pipelines.training import (
    Inputs,
    WorkerJob,
    check_phases,
    check_positions,
    headline,
    prepare_checkpoints,
    read_inputs,
    train_and_export,
    worker_env,
)
from pipelines.training import export_model as export_training_model

log = logging.getLogger(__name__)

METRICS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")
"""Step-record fields the manifest statistics summarise."""


# -- inputs ---------------------------------------------------------------------------------


def check(cfg: PretrainConfig, reads: dict[str, Any]) -> None:
    """pretrain.phases against the examples section: every phase names an examples phase,
    is at least as long as its sequences, and fits the model's positions; init_from needs
    an adopted vocabulary. Run when the config loads, and again against what the examples
    and vocab stages recorded before training."""
    lengths = check_phases(cfg, reads["examples"])
    if cfg.init_from is not None and reads["vocab"].source != "pretrained":
        raise ValueError(
            "pretrain.init_from: a model continues pretraining on its own vocabulary; set vocab.source: pretrained "
            "(vocab.pretrained then defaults to pretrain.init_from)"
        )
    if cfg.init_from is None:  # else the positions are config.json's, checked when the stage runs
        check_positions(cfg, lengths, cfg.max_position_embeddings,
                        "raise pretrain.model_overrides.max_position_embeddings or shorten the phase")


# -- continued pretraining --------------------------------------------------------------------


def identify(cfg: PretrainConfig, storage: Storage) -> External | None:
    """The content identity of pretrain.init_from's config.json and weights (None without it)."""
    if cfg.init_from is None:
        return None
    init = model_folder(storage, cfg.init_from, "pretrain.init_from")
    return External(identity={"init_from": init.identity}, value=init)


def _init_model_config(cfg: PretrainConfig, init: ExternalFolder, inputs: Inputs, storage: Storage):
    """The model of a continued run: init_from's shape, checked against the vocabulary and
    the phases' sequence lengths."""
    from bertcore.pretrained import CONFIG_FILE, model_config
    from pipelines.shards import local_copy

    base = model_config(os.path.dirname(local_copy(storage, join(init.uri, CONFIG_FILE), init.cache_key)))
    if base.vocab_size != inputs.vocab.vocab_size:
        raise ConfigError(
            f"pretrain.init_from: the model at {init.uri} has {base.vocab_size} word embeddings but the vocab stage's vocabulary "
            f"has {inputs.vocab.vocab_size} entries; adopt the model's vocabulary (vocab.source: pretrained, vocab.pretrained unset)"
        )
    try:
        check_positions(cfg, [p.max_seq_length for p in cfg.phases], base.max_position_embeddings, "shorten the phase")
    except ValueError as exc:
        raise ConfigError(f"{exc} (pretrain.init_from: {init.uri})") from None
    return cfg.build_model_config(inputs.vocab.vocab_size, inputs.vocab.special.pad, base=base)


# -- the objective, as the workers and the export task build it ---------------------------------


@dataclass
class PretrainSpec:
    """Pretraining (MLM + NSP) of `model_config`, from init_from's weights when given."""

    model_config: dict
    nsp: bool
    """Whether the examples carry NSP labels: the export is then a BertForPreTraining, else a BertForMaskedLM."""
    init: ExternalFolder | None = None

    def objective(self, storage: Storage):
        from bertcore.model import ModelConfig
        from bertcore.objectives import Pretraining
        from bertcore.pretrained import read_weights

        weights = read_weights(self.init.local(storage)) if self.init is not None else None
        return Pretraining(ModelConfig.model_validate(self.model_config), init_state_dict=weights)

    def exportable(self, checkpoint_dir: str, marker: dict) -> dict:
        from bertcore.export import consolidate_checkpoint
        from bertcore.model import ModelConfig

        return consolidate_checkpoint(checkpoint_dir, ModelConfig.model_validate(marker["model_config"]))


def export_model(stage: StageDir, inputs: dict[str, Upstream], *, step: int | None = None, out: str | None = None) -> list[dict]:
    """Write the Hugging Face folder of checkpoint `step` (default: the latest complete
    one) to `out` (default: <root>/pretrain/model/); returns the files written. `inputs`:
    the examples and vocab outputs it was trained on (an objective without NSP exports a
    BertForMaskedLM). Needs Ray (ensure_ray) for the one task that does the work."""
    nsp = ExamplesConfig.model_validate(inputs["examples"].manifest.config).has_nsp
    return export_training_model(stage, PretrainSpec({}, nsp), inputs["vocab"], step=step, out=out)


# -- the stage ------------------------------------------------------------------------------


def run(r: StageRun) -> Output:
    """Train (resuming per pretrain.resume), export the final checkpoint to model/, and
    list model/ and metrics.jsonl as the stage's shards. With pretrain.resume=auto a
    finished checkpoint is re-exported rather than retrained (resume=never retrains).
    Ray must be running (pipelines.ray_runtime.ensure_ray)."""
    from bertcore.checkpoint import latest_checkpoint

    cfg, inputs = read_inputs(r.section, r.inputs["examples"], r.inputs["vocab"], r.storage)
    init: ExternalFolder | None = r.external
    files = stage_files(r.storage, r.dir.uri, "driver")
    trajectory = {"examples": inputs.examples_fingerprint, "vocab": inputs.vocab_fingerprint, "seed": r.seed}
    resume_key = cfg.resume_key({**trajectory, **({"init": init.identity} if init else {})})
    if init is not None:
        model_cfg = _init_model_config(cfg, init, inputs, r.storage)
    else:
        model_cfg = cfg.build_model_config(inputs.vocab.vocab_size, inputs.vocab.special.pad)
    prepare_checkpoints(cfg, files, resume_key, r.dir)
    spec = PretrainSpec(model_cfg.model_dump(mode="json"), inputs.examples.has_nsp, init)
    job = WorkerJob(cfg=cfg, spec=spec, seed=r.seed, resume_key=resume_key, storage=r.storage, stage_uri=r.dir.uri,
                    inputs=inputs, env=worker_env(cfg))
    start = latest_checkpoint(files)
    log.info(
        "pretrain: %s model (%d layers, hidden %d) on %d %s workers, ZeRO-%d %s %s; %s; %s",
        cfg.model_size, model_cfg.num_hidden_layers, model_cfg.hidden_size, cfg.num_workers, "GPU" if cfg.use_gpu else "CPU",
        cfg.zero_stage, cfg.precision, cfg.optimizer,
        ", ".join(f"{p.name} {p.steps} steps x {p.batch_size}" for p in cfg.phases),
        f"resuming from step {start['step']}" if start else "from scratch",
    )
    marker, shards, stats = train_and_export(cfg, job, r.dir, r.inputs["vocab"], METRICS)
    if init is not None:
        stats["init_from"] = {"uri": init.uri, **(marker.get("init") or {})}
    return Output(shards=shards, stats=stats, headline=headline(stats))


def off(sections: dict[str, Any]) -> str | None:
    """Nothing is pretrained when the recipe distils an external teacher."""
    distill = sections["distill"]
    if distill.enabled and distill.teacher is not None:
        return f"distill.teacher ({distill.teacher}) is the teacher, so nothing is pretrained"
    return None


# Not resumable unit by unit: checkpoints are its units, and a rerun resumes from the latest complete one.
STAGE = Stage(
    "pretrain", PretrainConfig, run, reads=("examples", "vocab"), check=check, identify=identify, off=off, resumable=False,
    verify_inputs=True,
    writes="DeepSpeed checkpoints/step-NNNNNNN/, model/ (Hugging Face layout), metrics.jsonl",
)
