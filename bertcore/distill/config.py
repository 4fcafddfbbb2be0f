"""The `distill:` config section: the teacher, the student's shape and start, the weights
and forms of the losses, the layer map, and (shared with pretrain, bertcore/train/config.py)
the training loop's settings. Imports neither torch nor the model code.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from bertcore.model.config import NAMED_SIZES, SizeName
from bertcore.section import DataFile, Section
from bertcore.train.config import TrainingConfig, TrainingPhase


class StudentConfig(Section):
    """The student's shape and starting point (`distill.student`). Fields left unset take
    the named size's value, or without a named size the teacher's (layers: half of them)."""

    model_size: SizeName | None = None
    """Published BERT shape of the student: tiny (2x128), mini (4x256), small (4x512), medium (8x512), base (12x768),
    large (24x1024); null: the teacher's shape with the fields below changed."""
    num_hidden_layers: int | None = Field(None, gt=0)
    """Transformer layers of the student; default: the named size's, else half the teacher's (rounded down, at least 1),
    as DistilBERT."""
    hidden_size: int | None = Field(None, gt=0)
    """Width of the student; default: the named size's, else the teacher's. Another width than the teacher's needs init:
    random (a learned projection then maps it for the hidden-state loss)."""
    num_attention_heads: int | None = Field(None, gt=0)
    """Attention heads per layer; default: the named size's, else the teacher's."""
    intermediate_size: int | None = Field(None, gt=0)
    """Feed-forward width; default: 4 x hidden_size with a named size, else the teacher's."""
    init: Literal["from_teacher", "random"] = "from_teacher"
    """from_teacher: the teacher's embeddings and MLM head, and for each student layer the teacher layer
    `distill.layer_map` pairs it with (every k-th layer, as DistilBERT); needs the teacher's width, heads and
    feed-forward size. random: BERT's seeded initialisation."""

    @model_validator(mode="after")
    def _shape(self) -> StudentConfig:
        hidden = self.hidden_size or (NAMED_SIZES[self.model_size][1] if self.model_size else None)
        heads = self.num_attention_heads or (NAMED_SIZES[self.model_size][2] if self.model_size else None)
        if hidden is not None and heads is not None and hidden % heads:
            raise ValueError(
                f"distill.student: hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads})"
            )
        return self

    def layers(self, teacher_layers: int) -> int:
        """The student's layer count once the teacher's is known."""
        if self.num_hidden_layers is not None:
            return self.num_hidden_layers
        if self.model_size is not None:
            return NAMED_SIZES[self.model_size][0]
        return max(1, teacher_layers // 2)


class DistillLoss(Section):
    """What a distillation step minimises (`distill.loss`): the weighted sum of the terms
    whose weight is above 0."""

    soft_targets: float = Field(1.0, ge=0.0)
    """Weight of the KL divergence from the teacher's to the student's masked-LM distribution at the masked positions,
    both softened by `temperature` and scaled by its square (Hinton et al. 2015; DistilBERT's L_ce). Skipped, with a
    note in the log and the manifest, when the teacher has no MLM head (a BertModel such as all-MiniLM-L6-v2)."""
    temperature: float = Field(2.0, gt=0.0)
    """Softmax temperature of the soft targets (DistilBERT: 2)."""
    hidden: float = Field(1.0, ge=0.0)
    """Weight of the hidden-state loss: each student layer's output against the teacher layer `distill.layer_map` pairs
    it with, at every real token (padding left out). A learned linear projection maps the student's width to the
    teacher's when they differ (trained and checkpointed with the student, not exported)."""
    hidden_metric: Literal["cosine", "mse"] = "cosine"
    """cosine: 1 - cosine similarity per token (DistilBERT's L_cos); mse: mean squared difference per element
    (TinyBERT)."""
    attention: float = Field(0.0, ge=0.0)
    """Weight of the attention-map loss (TinyBERT, MiniLM): each student layer's attention distributions against those
    of its paired teacher layer, over real query and key tokens. Per head when the head counts match; otherwise each
    side's distributions are averaged over its heads first. Computes attention explicitly (slower than the fused
    kernel)."""
    attention_metric: Literal["kl", "mse"] = "kl"
    """kl: KL divergence from the teacher's to the student's distribution per query (MiniLM); mse: mean squared
    difference of the probabilities (TinyBERT compares the scores before softmax)."""
    mlm: float = Field(1.0, ge=0.0)
    """Weight of the student's own masked-LM loss on the examples' labels (the hard targets; DistilBERT's L_mlm)."""

    @model_validator(mode="after")
    def _something(self) -> DistillLoss:
        if not any((self.soft_targets, self.hidden, self.attention, self.mlm)):
            raise ValueError(
                "distill.loss: every weight is 0; give at least one of soft_targets, hidden, attention, mlm "
                "a weight above 0"
            )
        return self


def _default_phases() -> list[TrainingPhase]:
    return [TrainingPhase(name="seq128", steps=100_000, batch_size=256)]


class DistillConfig(TrainingConfig):
    """Distillation of a smaller student from a teacher, with DeepSpeed on Ray Train
    workers (`distill:` in a run recipe); off unless `enabled`."""

    SECTION: ClassVar[str] = "distill"

    enabled: bool = False
    """Run the distill stage (after pretrain; evaluate then scores the teacher, the student and a student-sized random
    init)."""
    teacher: DataFile | None = None
    """The teacher: a Hugging Face BERT folder (local path or s3://...; BertForPreTraining, BertForMaskedLM or BertModel
    weights; `{minilm}` names the optional all-MiniLM-L6-v2), read like pretrain.init_from. null: the pretrain stage's
    model. A folder here leaves the pretrain stage out of the run, and the examples must be built with its vocabulary
    (vocab.source: pretrained)."""
    student: StudentConfig = Field(default_factory=StudentConfig)
    """The student's shape and starting point."""
    loss: DistillLoss = Field(default_factory=DistillLoss)
    """The loss terms and their weights."""
    layer_map: list[int] | None = Field(None, min_length=1)
    """The teacher layer (1 = the first) paired with each student layer, in order, for the hidden-state and attention
    losses and the from_teacher start; default: evenly spaced, ending at the teacher's last layer (3 of 6: [2, 4,
    6])."""
    phases: list[TrainingPhase] = Field(default_factory=_default_phases, min_length=1)
    """Phases in order, each with its own steps and global batch (default: 100k x 256 at seq128)."""

    @model_validator(mode="after")
    def _layer_map(self) -> DistillConfig:
        if self.layer_map is None:
            return self
        if min(self.layer_map) < 1:
            raise ValueError(f"distill.layer_map: teacher layers count from 1, got {self.layer_map}")
        known = self.student.num_hidden_layers or (
            NAMED_SIZES[self.student.model_size][0] if self.student.model_size else None
        )
        if known is not None and len(self.layer_map) != known:
            raise ValueError(
                f"distill.layer_map names {len(self.layer_map)} teacher layers but the student has {known} "
                "layers; give one per student layer"
            )
        return self


def default_layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """Evenly spaced teacher layers ending at the last: student layer i (1-based) pairs with
    round(i * L_teacher / L_student) (TinyBERT's uniform mapping)."""
    return [max(1, round(i * teacher_layers / student_layers)) for i in range(1, student_layers + 1)]
