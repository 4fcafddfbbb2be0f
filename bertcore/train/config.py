"""The settings of the one training loop (bertcore/train/trainer.py) that every training stage's
section shares: workers, precision, optimizer, phases, schedule, checkpoint cadence, time
budget, validation, tracking and the divergence policy. `pretrain:` (PretrainConfig) and
`distill:` (bertcore/distill/config.py) are TrainingConfigs with their own fields added
(PretrainConfig, at the end of this file: the model's shape, a named size with overrides or
an existing model to continue from);
`SECTION` names the section in messages.

`resume_key` hashes what decides a training trajectory, so a checkpoint resumes only into
a run that would have produced it; `check_phases` and `check_positions` are the checks of
the phases against the examples stage and the model that every training stage makes.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from bertcore.config import describe_errors
from bertcore.model.config import ModelConfig, SizeName
from bertcore.model.families import FAMILIES, Family, for_vocabulary
from bertcore.section import Name, Section
from bertcore.train.tracking import TrackingConfig

if TYPE_CHECKING:
    from bertcore.examples.config import ExamplesConfig


class ScheduleConfig(Section):
    """The learning-rate schedule: BERT's linear warmup and decay over the steps, or
    warmup-stable-decay (WSD) over the tokens seen (ModernBERT, Warner et al. 2024; Hu et
    al. 2024), for any family."""

    kind: Literal["linear", "wsd"] = "linear"
    """linear: warmup (warmup_steps / warmup_fraction) then linear decay to the last step; wsd: warmup over
    warmup_tokens, the peak rate until decay_tokens before total_tokens, then the decay."""
    warmup_tokens: float = Field(0.0, ge=0.0)
    """wsd: tokens (real ones, all workers) over which the rate rises linearly to learning_rate."""
    decay_tokens: float = Field(0.0, ge=0.0)
    """wsd: tokens of the decay at the end; its start is the end of the stable phase, where the pre-decay checkpoint
    is written and kept (checkpoints/step-NNNNNNN/ with name pre-decay in its marker)."""
    total_tokens: float | None = Field(None, gt=0.0)
    """wsd: the run's token budget; training stops when the tokens seen reach it (or at the end of the phases'
    steps, whichever comes first). Required with kind wsd."""
    decay: Literal["linear", "1-sqrt"] = "1-sqrt"
    """wsd: the decay's shape from the peak: linear, or 1 - sqrt(progress) (Hägele et al. 2024, ModernBERT's)."""
    final_lr_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    """wsd: the rate at the end of the decay as a share of learning_rate."""

    @model_validator(mode="after")
    def _wsd_budget(self) -> ScheduleConfig:
        if self.kind == "wsd":
            if self.total_tokens is None:
                raise ValueError("schedule.total_tokens: a wsd schedule needs the run's token budget")
            if self.warmup_tokens + self.decay_tokens > self.total_tokens:
                raise ValueError(
                    f"schedule: warmup_tokens ({self.warmup_tokens:.4g}) + decay_tokens ({self.decay_tokens:.4g}) "
                    f"exceed total_tokens ({self.total_tokens:.4g})"
                )
        return self

    @property
    def decay_start(self) -> float | None:
        """Tokens seen when the decay begins (wsd), None for the linear schedule."""
        return None if self.kind != "wsd" else self.total_tokens - self.decay_tokens


class TrainingPhase(Section):
    """One sequence-length phase of training; reads examples/<name>/train/."""

    name: Name
    """Phase name; must be one of the examples stage's phases (examples.phases[*].name), e.g. seq128."""
    steps: int = Field(ge=1)
    """Optimizer steps spent in this phase."""
    batch_size: int = Field(ge=1)
    """Global batch: sequences per optimizer step over all workers and accumulation steps."""
    max_seq_length: int | None = Field(None, ge=3)
    """Longest sequence of the phase (batches are padded to at most this); default: the examples phase's max_seq_length.
    At most the model's max_position_embeddings."""
    token_budget: int | None = Field(None, ge=1)
    """Packed, padding-free batches (bertcore/train/packing.py) of at most this many tokens per optimizer step over all
    workers and accumulation steps (whole sequences; each micro-batch holds at most token_budget / (num_workers x
    gradient_accumulation_steps)); batch_size then only bounds the loader's fallback. Needs a family that reads packed
    batches (modernbert)."""
    global_rope_theta: float | None = Field(None, gt=0.0)
    """Rotary base of the global attention layers during this phase (models with rotary positions); null: the model's
    (pretrain.model_overrides.global_rope_theta, 160,000 for modernbert). ModernBERT trains at 1,024 tokens with 10,000
    and raises it to 160,000 for its context extension."""


def _default_phases() -> list[TrainingPhase]:
    # Devlin et al. 2019: 1M steps of 256 sequences, 90% of them at 128 tokens.
    return [
        TrainingPhase(name="seq128", steps=900_000, batch_size=256),
        TrainingPhase(name="seq512", steps=100_000, batch_size=256),
    ]


# Fields that change neither the trajectory nor the data order: a checkpoint written with
# other values of these resumes (the rest must match, see `resume_key`).
RESUME_NEUTRAL = {
    "time_budget_s",
    "checkpoint_every",
    "keep_checkpoints",
    "resume",
    "log_every",
    "torch_threads",
    "peak_flops_per_device",
    "loader_processes",
    "data_cache_gb",
    "max_failures",
    "min_workers",
    "rejoin_timeout_s",
    "validation_batches",
    "eval_every",
    "tracking",
}


class TrainingConfig(Section):
    """The training loop's settings, shared by every training stage's section."""

    SECTION: ClassVar[str] = "train"
    """The recipe key of the section (pretrain, distill), for messages and resume keys."""

    num_workers: int = Field(2, ge=1)
    """Data-parallel workers (Ray Train), one per GPU or one CPU process each."""
    use_gpu: bool = False
    """One GPU per worker with NCCL; false runs on CPU with gloo (DS_ACCELERATOR=cpu)."""
    zero_stage: int = Field(0, ge=0, le=3)
    """DeepSpeed ZeRO stage: 0 plain data parallel, 1 optimizer states, 2 + gradients, 3 + parameters partitioned."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Training precision: fp32, bf16 (fp32 master weights), fp16 (GPU only, dynamic loss scaling)."""
    optimizer: Literal["adamw", "lamb"] = "adamw"
    """adamw (DeepSpeed's; see torch_adam) or lamb (You et al. 2020; DeepSpeed's fused LAMB on GPU, a client optimizer
    on CPU; needs zero_stage 0)."""
    torch_adam: bool = True
    """adamw only: use torch.optim.AdamW; false uses DeepSpeed's fused Adam (on GPU FusedAdam, which nvcc compiles the
    first time; on CPU gcc compiles its CPU Adam, minutes)."""
    learning_rate: float = Field(1e-4, gt=0.0)
    """Peak learning rate, reached at the end of warmup."""
    betas: tuple[float, float] = Field((0.9, 0.999), strict=False)  # a YAML or JSON list is a tuple here
    """Adam/LAMB moment decay rates (beta1, beta2)."""
    eps: float = Field(1e-6, gt=0.0)
    """Adam/LAMB epsilon (BERT: 1e-6)."""
    weight_decay: float = Field(0.01, ge=0.0)
    """Decoupled weight decay; biases and LayerNorm parameters are exempt, as in BERT."""
    warmup_steps: int | None = Field(None, ge=0)
    """Linear warmup length in optimizer steps; give this or warmup_fraction (default: 1% of all steps, as BERT's 10k of
    1M)."""
    warmup_fraction: float | None = Field(None, ge=0.0, lt=1.0)
    """Linear warmup as a share of all steps (all phases); give this or warmup_steps."""
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    """The learning-rate schedule: linear (BERT's, over steps, with warmup_steps / warmup_fraction) or wsd
    (warmup-stable-decay over tokens)."""
    phases: list[TrainingPhase] = Field(default_factory=_default_phases, min_length=1)
    """Phases in order, each with its own steps and global batch (default: BERT's 900k x 256 at seq128, 100k x 256 at
    seq512)."""
    gradient_accumulation_steps: int = Field(1, ge=1)
    """Micro-batches accumulated per optimizer step on each worker."""
    max_grad_norm: float = Field(1.0, gt=0.0)
    """Gradients are clipped to this global L2 norm before each update."""
    checkpoint_every: int = Field(1000, ge=1)
    """Write a checkpoint every this many optimizer steps (and always at the end)."""
    keep_checkpoints: int = Field(3, ge=1)
    """Complete checkpoints kept; older ones are deleted after a newer one is complete."""
    resume: Literal["auto", "never"] = "auto"
    """auto: continue from the latest complete checkpoint; never: delete the checkpoints and start over."""
    time_budget_s: float | None = Field(None, gt=0.0)
    """Wall-clock budget of one invocation: when spent, training stops after the current step, checkpoints and
    exports."""
    log_every: int = Field(10, ge=1)
    """Steps between progress lines (rank 0 logs those steps' mean loss and MLM accuracy, tokens/s, MFU where known,
    ETA) and tracker points (TensorBoard, MLflow, W&B); metrics.jsonl gets every step."""
    peak_flops_per_device: float | None = Field(None, gt=0.0)
    """Peak FLOP/s of one device for the MFU estimate; default: a table of known GPUs (none for CPUs, then MFU is
    null)."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """When a micro-batch loss is NaN/inf or a spike: stop with an error naming the step, or skip the batch."""
    loss_spike_factor: float | None = Field(4.0, gt=1.0)
    """After warmup, a micro-batch loss above this multiple of the running mean loss is a spike (handled per
    on_nonfinite); null: no spike check."""
    torch_threads: int | None = Field(None, ge=1)
    """torch intra-op threads per worker (default: what Ray gives the worker)."""
    loader_processes: int = Field(0, ge=0)
    """DataLoader processes per worker that read and collate batches (0: in the training process)."""
    shuffle_window_shards: int = Field(16, ge=1)
    """Examples shards read at a time: each epoch orders the shards by a keyed shuffle, then shuffles the records of
    this many shards together (the window); a worker holds one window (and the next, fetched ahead), never the whole
    data set. Larger mixes more; it shapes the data order, so a checkpoint resumes only with the same value."""
    data_cache_gb: float = Field(4.0, gt=0.0)
    """Local disk per machine for examples shards when run.root is remote (s3://...): the ranks of a machine share one
    cache, download each shard once, and evict it when their windows move on; it must hold two windows of the largest
    shards and the validation window (checked before training starts). The folder is removed when training ends."""
    validation_batches: int = Field(20, ge=0)
    """Batches per worker of a fixed sample of the current phase's validation examples, evaluated every eval_every steps
    and at the end (validation.jsonl); 0 skips validation."""
    eval_every: int | None = Field(1000, ge=1)
    """Validate on the held-out sample every this many optimizer steps (and always at the end); null: only at the
    end."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Experiment tracking: TensorBoard always, MLflow and W&B when enabled."""
    max_failures: int = Field(3, ge=0)
    """Times the stage restarts its workers after a lost worker or node, in the same run, from the latest checkpoint; 0
    fails at once."""
    min_workers: int | None = Field(None, ge=1)
    """Fewest workers to go on with after a lost node, keeping the global batch by gradient accumulation (default 1);
    the same as num_workers: never fewer."""
    rejoin_timeout_s: float = Field(120.0, ge=0.0)
    """After a lost node, seconds to wait for the cluster to hold num_workers workers again before going on with
    fewer."""

    @property
    def data_cache_bytes(self) -> int:
        return int(self.data_cache_gb * 1e9)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"each beta must be in [0, 1), got {list(betas)}")
        return betas

    @field_validator("phases")
    @classmethod
    def _unique_phase_names(cls, phases: list[TrainingPhase]) -> list[TrainingPhase]:
        names = [p.name for p in phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        return phases

    @model_validator(mode="after")
    def _consistent_loop(self) -> TrainingConfig:
        key = self.SECTION
        if self.precision == "fp16" and not self.use_gpu:
            raise ValueError(
                f"{key}.precision=fp16 needs a GPU ({key}.use_gpu=true); DeepSpeed has no fp16 on CPU: use bf16 or fp32"
            )
        if self.optimizer == "lamb" and self.zero_stage != 0:
            raise ValueError(
                f"{key}.optimizer=lamb needs {key}.zero_stage=0 (got {self.zero_stage}): ZeRO flattens the "
                "parameters, so LAMB's per-layer trust ratios would be computed over partitions"
            )
        if self.warmup_steps is not None and self.warmup_fraction is not None:
            raise ValueError(f"{key}.warmup_steps and {key}.warmup_fraction are both set; keep one")
        if self.warmup_steps is not None and self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"{key}.warmup_steps ({self.warmup_steps}) must be below the total steps of {key}.phases "
                f"({self.total_steps})"
            )
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ValueError(
                f"{key}.min_workers ({self.min_workers}) must not exceed {key}.num_workers ({self.num_workers})"
            )
        if self.schedule.kind == "wsd" and (self.warmup_steps is not None or self.warmup_fraction is not None):
            raise ValueError(
                f"{key}.warmup_steps / warmup_fraction belong to the linear schedule; a wsd schedule warms up over "
                f"{key}.schedule.warmup_tokens"
            )
        per_step = self.num_workers * self.gradient_accumulation_steps
        for i, phase in enumerate(self.phases):
            if phase.token_budget is not None and phase.token_budget % per_step:
                raise ValueError(
                    f"{key}.phases[{i}].token_budget ({phase.token_budget}) must be a multiple of {key}.num_workers x "
                    f"{key}.gradient_accumulation_steps ({per_step})"
                )
            if phase.batch_size % per_step:
                raise ValueError(
                    f"{key}.phases[{i}].batch_size ({phase.batch_size}) must be a multiple of {key}.num_workers x "
                    f"{key}.gradient_accumulation_steps ({self.num_workers} x "
                    f"{self.gradient_accumulation_steps} = {per_step})"
                )
        return self

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    @property
    def warmup(self) -> int:
        """Warmup length in optimizer steps."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(round((0.01 if self.warmup_fraction is None else self.warmup_fraction) * self.total_steps))

    def micro_batch_size(self, phase: TrainingPhase) -> int:
        """Sequences per forward pass on one worker."""
        return phase.batch_size // (self.num_workers * self.gradient_accumulation_steps)

    def micro_token_budget(self, phase: TrainingPhase) -> int | None:
        """Tokens per packed micro-batch on one worker (None: the phase batches by sequences)."""
        if phase.token_budget is None:
            return None
        return phase.token_budget // (self.num_workers * self.gradient_accumulation_steps)

    def phase_at(self, step: int) -> int:
        """Index of the phase that the 0-based optimizer step `step` belongs to."""
        end = 0
        for i, phase in enumerate(self.phases):
            end += phase.steps
            if step < end:
                return i
        raise ValueError(f"step {step} is past the last phase ({self.total_steps} steps)")

    def check_phases(self, examples: ExamplesConfig) -> list[int]:
        """Every phase names an examples phase and is at least as long as its sequences
        (ValueError naming the key); returns each phase's sequence length."""
        key = self.SECTION
        produced = {p.name: p for p in examples.phases}
        lengths = []
        for i, phase in enumerate(self.phases):
            source = produced.get(phase.name)
            if source is None:
                raise ValueError(
                    f"{key}.phases[{i}].name: the examples stage has no phase {phase.name!r} (it made "
                    f"{sorted(produced)}); use one of those names or add the phase to examples.phases"
                )
            if phase.max_seq_length is not None and phase.max_seq_length < source.max_seq_length:
                raise ValueError(
                    f"{key}.phases[{i}].max_seq_length ({phase.max_seq_length}) is shorter than the examples of phase "
                    f"{phase.name} (examples.phases max_seq_length {source.max_seq_length}); make it at "
                    "least that, or leave it out"
                )
            lengths.append(phase.max_seq_length or source.max_seq_length)
        return lengths

    def check_positions(self, lengths: list[int], positions: int, remedy: str) -> None:
        """Every phase's sequences (`lengths`, phase by phase) fit the model's positions."""
        for i, (phase, length) in enumerate(zip(self.phases, lengths)):
            if length > positions:
                raise ValueError(
                    f"{self.SECTION}.phases[{i}]: phase {phase.name} has sequences of {length} tokens but "
                    f"the model has {positions} positions; {remedy}"
                )

    def resume_key(self, inputs: dict[str, Any]) -> str:
        """Hash of what decides the trajectory: this section minus the fields that do not
        (budget, checkpoint cadence, logging, ...) plus the input fingerprints and seed.
        A checkpoint resumes only into a run with the same key."""
        section = self.model_dump(mode="json", exclude=RESUME_NEUTRAL)
        payload = json.dumps({self.SECTION: section, "inputs": inputs}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:20]


INIT_OVERRIDABLE = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")
"""model_overrides that a model continued from pretrain.init_from may take (its shape is its own)."""


FamilyName = Literal["auto", "bert", "roberta", "modernbert"]


class PretrainConfig(TrainingConfig):
    """Pretraining with DeepSpeed on Ray Train workers (`pretrain:` in a run recipe)."""

    SECTION: ClassVar[str] = "pretrain"

    init_from: str | None = None
    """Continue pretraining a Hugging Face encoder folder (local path or s3://...; BertForPreTraining, BertForMaskedLM,
    BertModel, RobertaForMaskedLM or ModernBertForMaskedLM weights): its config.json sets the family and the shape
    (family and model_size are then not used), heads it lacks (NSP) start fresh. Needs its vocabulary: vocab.source:
    pretrained."""
    family: FamilyName = "auto"
    """The model family (bertcore/model/families/): auto (the vocabulary decides: WordPiece makes a BERT, byte-level
    BPE a RoBERTa), bert, roberta, or modernbert (the modern encoder: rotary positions, GeGLU, pre-norm, local/global
    attention, MLM only; any vocabulary)."""
    model_size: SizeName = "base"
    """Named shape of the family: BERT's tiny (2x128), mini (4x256), small (4x512), medium (8x512), base (12x768),
    large (24x1024); modernbert's tiny (3x128), mini (6x256), small (12x512), base (22x768, the paper's), large
    (28x1024)."""
    model_overrides: dict[str, Any] = Field(default_factory=dict)
    """Any bertcore.model.config.ModelConfig field to change from the named size, e.g. {hidden_dropout_prob: 0.0};
    vocab_size comes from the vocab stage. With init_from, only dropouts and initializer_range."""

    @model_validator(mode="after")
    def _consistent_model(self) -> PretrainConfig:
        if "vocab_size" in self.model_overrides:
            raise ValueError("pretrain.model_overrides.vocab_size: the vocabulary size comes from the vocab stage")
        if "model_type" in self.model_overrides:
            raise ValueError(
                "pretrain.model_overrides.model_type: set pretrain.family instead (auto: the vocabulary decides)"
            )
        if self.init_from is not None:
            fixed = sorted(set(self.model_overrides) - set(INIT_OVERRIDABLE))
            if fixed:
                raise ValueError(
                    f"pretrain.model_overrides.{fixed[0]}: the shape of a model continued from "
                    "pretrain.init_from is its "
                    f"config.json's; only {', '.join(INIT_OVERRIDABLE)} may be overridden"
                )
            return self  # its positions are known once config.json is read
        try:
            shape = self.build_model_config(30522)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"pretrain.model_overrides: {_one_line(exc)}") from None
        for i, phase in enumerate(self.phases):
            if phase.max_seq_length is not None and phase.max_seq_length > shape.max_position_embeddings:
                raise ValueError(
                    f"pretrain.phases[{i}].max_seq_length ({phase.max_seq_length}) exceeds the model's "
                    f"max_position_embeddings ({shape.max_position_embeddings}); raise "
                    "pretrain.model_overrides.max_position_embeddings or shorten the phase"
                )
        self.check_family(shape.family)
        return self

    def check_family(self, family: Family) -> None:
        """The phases ask only what the family does: packed batches (token_budget) of a
        family that reads them, a rotary base of one with rotary positions."""
        for i, phase in enumerate(self.phases):
            if phase.token_budget is not None and "cu_seqlens" not in family.batch_keys:
                raise ValueError(
                    f"pretrain.phases[{i}].token_budget: the {family.name} family reads padded batches; give "
                    "batch_size only, or pretrain.family: modernbert"
                )
            if phase.global_rope_theta is not None and not family.rotary:
                raise ValueError(
                    f"pretrain.phases[{i}].global_rope_theta: the {family.name} family has no rotary positions"
                )

    def family_for(self, layout: str) -> Family:
        """The family this section makes with a vocabulary of `layout` (bert: WordPiece,
        roberta: byte-level BPE); ValueError naming pretrain.family when they disagree."""
        return for_vocabulary(self.family, layout)

    @property
    def max_position_embeddings(self) -> int | None:
        """The longest sequence the configured model can take; None with init_from (the
        folder's config.json decides, read when the stage runs)."""
        if self.init_from is not None:
            return None
        return self.build_model_config(30522).max_position_embeddings

    def build_model_config(
        self, vocab_size: int, pad_token_id: int = 0, base: ModelConfig | None = None, layout: str = "bert"
    ) -> ModelConfig:
        """The model: model_size of the family (`family_for(layout)`; or `base`, the config
        of init_from's model, which brings its own family) with the vocabulary size, pad id
        and model_overrides; the family sets what the vocabulary decides (RoBERTa's
        positions, one token type and LayerNorm epsilon)."""
        if base is not None:
            return ModelConfig.model_validate(
                {**base.model_dump(), "vocab_size": vocab_size, "pad_token_id": pad_token_id, **self.model_overrides}
            )
        family = FAMILIES[self.family] if self.family != "auto" else self.family_for(layout)
        fields = {**family.vocabulary_fields(pad_token_id), "model_type": family.name}
        return ModelConfig.named(self.model_size, vocab_size, **{**fields, **self.model_overrides})


def _one_line(exc: Exception) -> str:
    return describe_errors(exc) if isinstance(exc, ValidationError) else " ".join(str(exc).split())[:500]
