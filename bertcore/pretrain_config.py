"""The `pretrain:` config section: the model's shape (a named size with overrides, or an
existing model to continue from) on top of the training loop's settings
(bertcore/train_config.py: workers, precision, optimizer, phases, schedule, checkpoints,
divergence policy).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, ValidationError, model_validator

from bertcore.config import describe_errors
from bertcore.model.config import ModelConfig, SizeName
from bertcore.train_config import TrainingConfig

INIT_OVERRIDABLE = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")
"""model_overrides that a model continued from pretrain.init_from may take (its shape is its own)."""


class PretrainConfig(TrainingConfig):
    """Pretraining with DeepSpeed on Ray Train workers (`pretrain:` in a run recipe)."""

    SECTION: ClassVar[str] = "pretrain"

    init_from: str | None = None
    """Continue pretraining a Hugging Face BERT folder (local path or s3://...; BertForPreTraining, BertForMaskedLM or BertModel weights): its config.json sets the shape (model_size is then not used), heads it lacks (NSP) start fresh. Needs its vocabulary: vocab.source: pretrained."""
    model_size: SizeName = "base"
    """Published BERT shape: tiny (2x128), mini (4x256), small (4x512), medium (8x512), base (12x768), large (24x1024)."""
    model_overrides: dict[str, Any] = Field(default_factory=dict)
    """Any bertcore.model.config.ModelConfig field to change from the named size, e.g. {hidden_dropout_prob: 0.0}; vocab_size comes from the vocab stage. With init_from, only dropouts and initializer_range."""

    @model_validator(mode="after")
    def _consistent_model(self) -> PretrainConfig:
        if "vocab_size" in self.model_overrides:
            raise ValueError("pretrain.model_overrides.vocab_size: the vocabulary size comes from the vocab stage")
        if self.init_from is not None:
            fixed = sorted(set(self.model_overrides) - set(INIT_OVERRIDABLE))
            if fixed:
                raise ValueError(
                    f"pretrain.model_overrides.{fixed[0]}: the shape of a model continued from pretrain.init_from is its "
                    f"config.json's; only {', '.join(INIT_OVERRIDABLE)} may be overridden"
                )
            return self  # its positions are known once config.json is read
        try:
            shape = ModelConfig.named(self.model_size, 30522, **self.model_overrides)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"pretrain.model_overrides: {_one_line(exc)}") from None
        for i, phase in enumerate(self.phases):
            if phase.max_seq_length is not None and phase.max_seq_length > shape.max_position_embeddings:
                raise ValueError(
                    f"pretrain.phases[{i}].max_seq_length ({phase.max_seq_length}) exceeds the model's "
                    f"max_position_embeddings ({shape.max_position_embeddings}); raise "
                    "pretrain.model_overrides.max_position_embeddings or shorten the phase"
                )
        return self

    @property
    def max_position_embeddings(self) -> int | None:
        """The longest sequence the configured model can take; None with init_from (the
        folder's config.json decides, read when the stage runs)."""
        if self.init_from is not None:
            return None
        return self.build_model_config(30522).max_position_embeddings

    def build_model_config(self, vocab_size: int, pad_token_id: int = 0, base: ModelConfig | None = None) -> ModelConfig:
        """The model: model_size (or `base`, the config of init_from's model) with the
        vocabulary size, pad id and model_overrides."""
        if base is not None:
            return ModelConfig.model_validate({**base.model_dump(), "vocab_size": vocab_size, "pad_token_id": pad_token_id, **self.model_overrides})
        return ModelConfig.named(self.model_size, vocab_size, **{"pad_token_id": pad_token_id, **self.model_overrides})


def _one_line(exc: Exception) -> str:
    return describe_errors(exc) if isinstance(exc, ValidationError) else " ".join(str(exc).split())[:500]
