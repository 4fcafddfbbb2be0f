"""The `evaluate:` section of a run recipe: what the evaluate stage measures on the
pretrained model and how.

File URIs of tasks (and of the STS file) may use the `{demo_data}` and `{korean_data}`
placeholders of corpus inputs; they are expanded when the section is validated, so a
recipe, a `--set` override and a Prefect form all get the same paths.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from bertcore.eval.tasks import TaskConfig, expand_uri, known_encoding
from bertcore.section import Section


class IntrinsicConfig(Section):
    """Masked-LM and next-sentence scores on the examples stage's held-out sequences."""

    enabled: bool = True
    """Score MLM loss, perplexity and accuracy (and NSP/SOP accuracy) on examples/<phase>/validation/."""
    phases: list[str] | None = None
    """Examples phases to score (e.g. [seq128]); None: the phases the pretrain stage trained on, or every examples phase. Phases longer than the model's max_position_embeddings are left out."""
    batch_size: int = Field(32, ge=1)
    """Sequences per forward pass."""
    max_batches: int | None = Field(None, ge=1)
    """Most batches scored per phase (None: every validation sequence)."""


class StsConfig(Section):
    """A file of sentence pairs with a similarity score (STS-B style) for the embedding check."""

    file: str
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
    encoding: str = "utf-8"
    """Text encoding of the file."""
    on_error: Literal["raise", "skip"] = "raise"
    """raise: a malformed row stops with its file and line; skip: malformed rows are left out and counted."""

    @field_validator("file", mode="before")
    @classmethod
    def _placeholders(cls, value: Any) -> Any:
        return expand_uri(value)

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        return known_encoding(value)


class EmbeddingsConfig(Section):
    """Sentence embeddings straight from the encoder, [CLS] against mean pooling."""

    enabled: bool = True
    """Measure anisotropy (mean cosine of random sentence pairs) on held-out corpus sentences, and STS Spearman when `sts` is set."""
    sentences: int = Field(1000, ge=2)
    """Sentences drawn (seeded) from the corpus stage's validation split."""
    num_pairs: int = Field(1000, ge=1)
    """Random sentence pairs averaged for the anisotropy."""
    max_seq_length: int = Field(128, ge=8)
    """Tokens per sentence including special tokens; longer sentences are truncated."""
    sts: StsConfig | None = None
    """Optional STS-style file: Spearman correlation of cosine similarity with the gold scores."""


class EvaluateConfig(Section):
    """The evaluate stage (`evaluate:` in a run recipe): held-out pretraining scores,
    fine-tuning tasks against a randomly initialised baseline, sentence embeddings, and a
    report under <run.root>/eval/."""

    tasks: list[TaskConfig] = Field(default_factory=list)
    """Fine-tuning tasks (classification, regression, token_classification, qa), each run once per seed in its `seeds`."""
    baseline: bool = True
    """Also evaluate the same architecture with random weights (every task and seed, the MLM scores and the embeddings), so the report shows what pretraining bought."""
    intrinsic: IntrinsicConfig = Field(default_factory=IntrinsicConfig)
    """Masked-LM and NSP scores on the held-out examples."""
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    """Sentence-embedding check."""
    num_threads: int = Field(1, ge=1)
    """torch threads of each evaluation job (each Ray task reserves as many CPUs)."""

    @field_validator("tasks")
    @classmethod
    def _unique_names(cls, tasks: list[TaskConfig]) -> list[TaskConfig]:
        names = [t.name for t in tasks]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"task names must be unique (metrics are keyed by name); repeated: {', '.join(repeated)}")
        return tasks
