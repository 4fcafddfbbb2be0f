"""Pretrain stage's work (its declaration is pipelines/stages/pretrain/__init__.py): examples +
vocab -> DeepSpeed checkpoints, `model/` (Hugging Face layout, of the family
bertcore/model/families/ says: a BERT with NSP beside its BertForMaskedLM twin `model-mlm/`;
a RoBERTa as a RobertaForMaskedLM; the modern encoder as a ModernBertForMaskedLM; with a wsd
schedule also `model-pre-decay/`, the checkpoint at the end of the stable phase) and
`metrics.jsonl` under `<run.root>/pretrain/`.

Ray shape: the training stages' shared launch (pipelines/training/launch.py): a Ray Train
TorchTrainer whose workers each run bertcore.train.trainer.Trainer with the pretraining
objective (bertcore.train.objectives.Pretraining, MLM + NSP), then one Ray task that
consolidates the final checkpoint into `model/`. The driver only checks inputs, decides
about resuming, and writes the manifest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bertcore.errors import ConfigError
from bertcore.examples.config import ExamplesConfig
from bertcore.model.config import ModelConfig
from bertcore.train.config import PretrainConfig
from pipelines.external import ExternalFolder
from pipelines.stage import Output, StageRun, Upstream
from pipelines.stage_dir import StageDir
from pipelines.stage_files import stage_files
from pipelines.storage import Storage
from pipelines.training.export import export_model as export_training_model
from pipelines.training.export import model_shards
from pipelines.training.inputs import Inputs, read_inputs
from pipelines.training.launch import WorkerJob, prepare_checkpoints, train_and_export
from pipelines.training.stats import headline

log = logging.getLogger(__name__)

PRE_DECAY_DIR = "model-pre-decay"
"""Beside model/: the export of a wsd schedule's pre-decay checkpoint (the weights a domain anneal starts from)."""


# -- continued pretraining --------------------------------------------------------------------


def _init_model_config(cfg: PretrainConfig, init: ExternalFolder, inputs: Inputs, storage: Storage) -> ModelConfig:
    """The model of a continued run: init_from's shape, checked against the vocabulary and
    the phases' sequence lengths."""
    from bertcore.model.folder import check_model_folder

    base = check_model_folder(
        init.local(storage), "pretrain.init_from"
    ).config  # config against the weights' header, before any worker
    layout = inputs.vocab.special.layout
    if base.family.vocab_layout not in (None, layout):
        raise ConfigError(
            f"pretrain.init_from: the model at {init.uri} is a {base.model_type} model but the vocabulary is "
            f"{layout}'s "
            f"({'byte-level BPE' if layout == 'roberta' else 'WordPiece'}); adopt the model's own vocabulary "
            "with the matching vocab.model"
        )
    try:
        cfg.check_family(base.family)
    except ValueError as exc:
        raise ConfigError(f"{exc} (pretrain.init_from: {init.uri} is a {base.model_type} model)") from None
    if base.vocab_size != inputs.vocab.vocab_size:
        raise ConfigError(
            f"pretrain.init_from: the model at {init.uri} has {base.vocab_size} word embeddings but the "
            "vocab stage's vocabulary "
            f"has {inputs.vocab.vocab_size} entries; adopt the model's vocabulary (vocab.source: pretrained, "
            "vocab.pretrained unset)"
        )
    try:
        cfg.check_positions([p.max_seq_length for p in cfg.phases], base.max_sequence_length, "shorten the phase")
    except ValueError as exc:
        raise ConfigError(f"{exc} (pretrain.init_from: {init.uri})") from None
    return cfg.build_model_config(inputs.vocab.vocab_size, inputs.vocab.special.pad, base=base)


# -- the objective, as the workers and the export task build it ---------------------------------


@dataclass
class PretrainSpec:
    """Pretraining (MLM + NSP) of `model_config`, from init_from's weights when given."""

    model_config: dict
    nsp: bool
    """Whether the examples carry NSP labels: the export is then a BertForPreTraining (and its BertForMaskedLM twin),
    else a BertForMaskedLM (a RoBERTa model: a RobertaForMaskedLM either way)."""
    init: ExternalFolder | None = None
    sentence = None  # pretraining exports a masked-LM model, never an embedding model

    def objective(self, storage: Storage):
        from bertcore.model.pretrained import read_weights
        from bertcore.train.objectives import Pretraining

        weights = read_weights(self.init.local(storage)) if self.init is not None else None
        return Pretraining(ModelConfig.model_validate(self.model_config), init_state_dict=weights)

    def exportable(self, checkpoint_dir: str, marker: dict) -> dict:
        from bertcore.train.export import consolidate_checkpoint

        return consolidate_checkpoint(checkpoint_dir, ModelConfig.model_validate(marker["model_config"]))


def export_model(
    stage: StageDir, inputs: dict[str, Upstream], *, step: int | None = None, out: str | None = None
) -> list[dict]:
    """Write the Hugging Face folder of checkpoint `step` (default: the latest complete
    one) to `out` (default: <root>/pretrain/model/), and with NSP its BertForMaskedLM twin
    beside it (`out`-mlm); returns the files written. `inputs`: the examples and vocab
    outputs it was trained on (an objective without NSP exports a BertForMaskedLM only).
    Needs Ray (ensure_ray) for the one task that does the work."""
    nsp = ExamplesConfig.model_validate(inputs["examples"].manifest.config).has_nsp
    return export_training_model(stage, PretrainSpec({}, nsp), inputs["vocab"], step=step, out=out)


# -- the stage ------------------------------------------------------------------------------


def run(r: StageRun) -> Output:
    """Train (resuming per pretrain.resume), export the final checkpoint to model/, and
    list model/ and metrics.jsonl as the stage's shards. With pretrain.resume=auto a
    finished checkpoint is re-exported rather than retrained (resume=never retrains).
    Ray must be running (pipelines.ray_runtime.ensure_ray)."""
    from bertcore.train.checkpoint import PRE_DECAY, latest_checkpoint, named_checkpoint

    cfg, inputs = read_inputs(r.section, r.inputs["examples"], r.inputs["vocab"], r.storage)
    init: ExternalFolder | None = r.external
    files = stage_files(r.storage, r.dir.uri, "driver")
    trajectory = {"examples": inputs.examples_fingerprint, "vocab": inputs.vocab_fingerprint, "seed": r.seed}
    resume_key = cfg.resume_key({**trajectory, **({"init": init.identity} if init else {})})
    if init is not None:
        model_cfg = _init_model_config(cfg, init, inputs, r.storage)
    else:
        model_cfg = cfg.build_model_config(
            inputs.vocab.vocab_size, inputs.vocab.special.pad, layout=inputs.vocab.special.layout
        )
        try:
            cfg.check_positions(
                [p.max_seq_length for p in cfg.phases],
                model_cfg.max_sequence_length,
                "raise pretrain.model_overrides.max_position_embeddings",
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    prepare_checkpoints(cfg, files, resume_key, r.dir, force=r.force)
    spec = PretrainSpec(model_cfg.model_dump(mode="json"), inputs.examples.has_nsp, init)
    job = WorkerJob.of_stage(r, cfg, spec, resume_key, inputs)
    log.info("%s", _start_line(cfg, model_cfg, init, latest_checkpoint(files)))
    marker, shards, stats = train_and_export(cfg, job, r.dir, r.inputs["vocab"])
    pre_decay = named_checkpoint(files, PRE_DECAY)
    if pre_decay is not None:  # the end of a wsd schedule's stable phase: where a domain anneal starts
        out = r.dir.path(PRE_DECAY_DIR)
        shards += model_shards(export_training_model(r.dir, spec, r.inputs["vocab"], step=pre_decay["step"], out=out))
        stats["pre_decay"] = {"step": pre_decay["step"], "tokens_seen": pre_decay["tokens_seen"], "model": out}
    if init is not None:
        stats["init_from"] = {"uri": init.uri, **(marker.get("init") or {})}
    return Output(shards=shards, stats=stats, headline=headline(stats))


def _start_line(cfg: PretrainConfig, model_cfg: ModelConfig, init: ExternalFolder | None, start: dict | None) -> str:
    """pretrain: tiny model (2 layers, hidden 128) from scratch on 2 CPU workers, ZeRO-2 fp32 adamw; seq128 600 steps x
    32 With init_from, the model is the folder's (its config.json gives the shape) and the run continues it."""
    shape = model_cfg.family.describe(model_cfg)
    model = f"the model in {init.uri} ({shape}, from its config.json)" if init else f"{cfg.model_size} model ({shape})"
    origin = f"resuming from step {start['step']}" if start else ("continued" if init else "from scratch")
    hardware = (
        f"{cfg.num_workers} {'GPU' if cfg.use_gpu else 'CPU'} workers, ZeRO-{cfg.zero_stage} {cfg.precision} "
        f"{cfg.optimizer}"
    )
    phases = ", ".join(f"{p.name} {p.steps} steps x {p.batch_size}" for p in cfg.phases)
    return f"pretrain: {model} {origin} on {hardware}; {phases}"
