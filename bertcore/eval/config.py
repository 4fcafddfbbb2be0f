"""The `evaluate:` section of a run recipe: what the evaluate stage measures on the
pretrained model and how, including each fine-tuning task (`TaskConfig`).

File URIs of tasks (and of the STS file) may use the `{demo_data}` and `{korean_data}`
placeholders of corpus inputs; they are expanded when the section is validated, so a
recipe, a `--set` override and a Prefect form all get the same paths.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from bertcore.eval.kinds import KINDS, TaskKind
from bertcore.eval.settings import InputLength, TaskSettings
from bertcore.section import DataFile, Encoding, Section

TaskType = Literal[tuple(KINDS)]
"""The names of the task kinds (bertcore/eval/kinds/)."""


def _listed(names: list[str]) -> str:
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + f" and {names[-1]}"


class TaskConfig(TaskSettings):
    """One task: its files, how to read them, and how to fine-tune on them (the settings of
    bertcore/eval/settings.py); its `type` names its kind, which checks the rest."""

    type: TaskType = Field(description=", ".join(f"{kind.name} ({kind.summary})" for kind in KINDS.values()) + ".")

    @property
    def kind(self) -> TaskKind:
        """What the task's type does: reads its files, builds its model inputs, scores it."""
        return KINDS[self.type]

    @model_validator(mode="after")
    def _consistent(self) -> TaskConfig:
        kind = self.kind
        kind.check(self)
        if kind.trains:
            self._check_training()
        self._check_windows_and_fractions()
        if self.format not in kind.formats:
            allowed = ", ".join(kind.formats)
            raise ValueError(f"format {self.format!r} cannot hold a {self.type} task; use one of {allowed}")
        if self.validation is None and self.cross_validation_folds is None:
            raise ValueError("validation is not set: give a validation file or cross_validation_folds")
        if self.validation is not None and self.cross_validation_folds is not None:
            raise ValueError("set either validation or cross_validation_folds, not both")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ValueError("labels contains duplicates")
        columns = (self.text_a, self.text_b, self.label_column, *(self.choices or []))
        if self.format in ("tsv", "csv") and not self.header:
            named = [c for c in columns if isinstance(c, str)]
            if named:
                raise ValueError(f"header is false, so columns must be 0-based indexes, not names ({named[0]!r})")
        if self.format == "jsonl":
            indexed = [c for c in columns if isinstance(c, int)]
            if indexed:
                raise ValueError("jsonl columns are field names, not indexes")
        if self.positive_label is not None and self.labels is not None and self.positive_label not in self.labels:
            raise ValueError(f"positive_label {self.positive_label!r} is not in labels")
        if isinstance(self.layers, list) and not self.layers:
            raise ValueError('layers is empty: give hidden-state indexes (e.g. [-1]) or "all"')
        if self.pooling == "pooler" and self.layers != [-1] and kind.pooled:
            raise ValueError(
                "pooling 'pooler' reads the last layer only; with other layers use pooling 'cls' or 'mean'"
            )
        return self

    def _check_training(self) -> None:
        if self.train is None:
            raise ValueError("train is not set: give the training file")
        if self.freeze_encoder and self.freeze_layers:
            raise ValueError("freeze_encoder already freezes every layer; leave freeze_layers at 0")

    def _check_windows_and_fractions(self) -> None:
        if self.long_inputs == "windows" and not self.kind.windowed:
            windowed = _listed([kind.name for kind in KINDS.values() if kind.windowed])
            raise ValueError(
                f"long_inputs windows is for {windowed}; a {self.type} task truncates (qa: set doc_stride)"
            )
        bad = [f for f in self.train_fractions if not 0.0 < f <= 1.0]
        if bad:
            raise ValueError(f"train_fractions must lie in (0, 1] (1.0: the whole training file); got {bad[0]}")
        if len(set(self.train_fractions)) != len(self.train_fractions):
            raise ValueError("train_fractions contains duplicates")
        if self.train_fractions != sorted(self.train_fractions):
            raise ValueError(f"train_fractions must be in increasing order, e.g. {sorted(self.train_fractions)}")
        if not self.kind.trains and self.train_fractions != [1.0]:
            raise ValueError(f"a {self.type} task trains nothing, so train_fractions does not apply; leave it at [1.0]")


class IntrinsicConfig(Section):
    """Masked-LM and next-sentence scores on the examples stage's held-out sequences."""

    enabled: bool = True
    """Score MLM loss, perplexity and accuracy (and NSP/SOP accuracy) on examples/<phase>/validation/."""
    phases: list[str] | None = None
    """Examples phases to score (e.g. [seq128]); None: the phases the pretrain stage trained on, or every examples
    phase. Phases longer than the model's max_position_embeddings are left out."""
    batch_size: int = Field(32, ge=1)
    """Sequences per forward pass."""
    max_batches: int | None = Field(None, ge=1)
    """Most batches scored per phase (None: every validation sequence)."""
    masked_lm_prob: float | None = Field(None, gt=0.0, lt=1.0)
    """Share of each held-out sequence masked when the examples are dynamically masked (None: examples.masked_lm_prob).
    0.15 scores a model trained at another rate (the modern family's 30%) as BERT's figures are scored."""
    fill_mask: int = Field(5, ge=0)
    """Held-out corpus sentences shown in the report with one word masked and the pretrained model's top predictions (0:
    none)."""


class StsConfig(Section):
    """A file of sentence pairs with a similarity score (STS-B style) for the embedding check."""

    file: DataFile
    """Local path or fsspec URI (.gz/.bz2/.xz are decompressed)."""
    format: Literal["tsv", "csv", "jsonl"] = "tsv"
    """tsv (GLUE's STS-B files as they are), csv or jsonl."""
    text_a: str | int = "sentence1"
    """Column of the first sentence: a header name or a 0-based index."""
    text_b: str | int = "sentence2"
    """Column of the second sentence."""
    score_column: str | int = "score"
    """Column of the gold similarity score."""
    header: bool = True
    """tsv/csv: the first line names the columns."""
    encoding: Encoding = "utf-8"
    """Text encoding of the file."""
    on_error: Literal["raise", "skip"] = "raise"
    """raise: a malformed row stops with its file and line; skip: malformed rows are left out and counted."""


class EmbeddingsConfig(InputLength):
    """Sentence embeddings straight from the encoder, [CLS] against mean pooling; a sentence
    longer than max_seq_length is cut, or read in windows (InputLength)."""

    enabled: bool = True
    """Measure anisotropy (mean cosine of random sentence pairs) on held-out corpus sentences, and STS Spearman when
    `sts` is set."""
    sentences: int = Field(1000, ge=2)
    """Sentences drawn (seeded) from the corpus stage's validation split."""
    num_pairs: int = Field(1000, ge=1)
    """Random sentence pairs averaged for the anisotropy."""
    sts: StsConfig | None = None
    """Optional STS-style file: Spearman correlation of cosine similarity with the gold scores."""


class SpeedConfig(Section):
    """Inference speed of the models an evaluation of a distillation compares (teacher,
    student, random init), measured on the evaluating machine: the encoder forward on the
    same batch, with the same threads (evaluate.num_threads), interleaved."""

    enabled: bool = True
    """Measure it when the distill stage ran (the report's "at 2.3x its speed")."""
    batch_size: int = Field(32, ge=1)
    """Sequences per forward pass."""
    max_seq_length: int = Field(128, ge=8)
    """Tokens per sequence, every one a real token."""
    passes: int = Field(5, ge=1)
    """Timed passes per model after a warm-up pass; the median counts."""


class EvaluateConfig(Section):
    """The evaluate stage (`evaluate:` in a run recipe): held-out pretraining scores,
    fine-tuning tasks against a randomly initialised baseline, sentence embeddings, and a
    report under <run.root>/eval/."""

    tasks: list[TaskConfig] = Field(default_factory=list)
    """Tasks (each of a kind: tasks[].type), each run once per seed in its `seeds`."""
    baseline: bool = True
    """Also evaluate the same architecture with random weights (every task and seed, the MLM scores and the embeddings),
    so the report shows what pretraining bought; after distillation, the student's architecture."""
    intrinsic: IntrinsicConfig = Field(default_factory=IntrinsicConfig)
    """Masked-LM and NSP scores on the held-out examples."""
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    """Sentence-embedding check."""
    speed: SpeedConfig = Field(default_factory=SpeedConfig)
    """Inference speed of teacher, student and random init (only when the distill stage ran)."""
    num_threads: int = Field(1, ge=1)
    """torch threads of each evaluation job (each Ray task reserves as many CPUs)."""
    num_gpus: float = Field(0.0, ge=0.0)
    """GPUs each evaluation job reserves from Ray (a fraction lets jobs share one). A job runs on the GPU Ray gives it;
    with 0 it runs on the CPU."""

    @classmethod
    def fingerprint_json(cls, config: dict) -> dict:
        """Also leaves out the task settings added later that sit at their default (TaskConfig.ADDED_LATER)."""
        config = super().fingerprint_json(config)
        if isinstance(config.get("tasks"), list):
            tasks = [TaskConfig.fingerprint_json(t) if isinstance(t, dict) else t for t in config["tasks"]]
            config = {**config, "tasks": tasks}
        return config

    @field_validator("tasks")
    @classmethod
    def _unique_names(cls, tasks: list[TaskConfig]) -> list[TaskConfig]:
        names = [t.name for t in tasks]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"task names must be unique (metrics are keyed by name); repeated: {', '.join(repeated)}")
        return tasks
