"""The `examples:` config section: objective, phases, pair and masking settings, and the
length bins that group an examples shard's records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from bertcore.section import Name, Section

if TYPE_CHECKING:  # numpy and torch come with them; recipes load this section and must stay fast
    from bertcore.examples.masking import MaskConfig, VocabTables
    from bertcore.examples.pairs import PairConfig

Objective = Literal["bert", "roberta", "sop"]
UINT16_MAX = 65_535


class PhaseConfig(Section):
    """One sequence-length phase; its examples go to examples/<name>/."""

    name: Name
    """Directory name of the phase, e.g. seq128."""
    max_seq_length: int = Field(ge=3, le=UINT16_MAX)
    """Tokens per sequence including [CLS] and [SEP]."""
    max_predictions_per_seq: int = Field(ge=1)
    """Most masked positions per sequence (Google: about max_seq_length * masked_lm_prob)."""


def _default_phases() -> list[PhaseConfig]:
    # BERT's schedule: most steps at 128 tokens, the last ones at 512.
    return [
        PhaseConfig(name="seq128", max_seq_length=128, max_predictions_per_seq=20),
        PhaseConfig(name="seq512", max_seq_length=512, max_predictions_per_seq=80),
    ]


class ExamplesConfig(Section):
    """Corpus documents to training sequences: NSP/SOP pairs or packed sentences, masked."""

    objective: Objective = "bert"
    """bert: NSP pairs as Google's create_pretraining_data; sop: ALBERT sentence-order pairs; roberta: packed sentences,
    no NSP."""
    max_seq_length: int = Field(512, ge=3, le=UINT16_MAX)
    """Longest sequence of any phase. Setting it without `phases` replaces the default schedule (seq128 + seq512) by one
    phase named seq<N>."""
    max_predictions_per_seq: int | None = Field(None, ge=1)
    """For the single phase made from max_seq_length only (default: ceil(max_seq_length * masked_lm_prob)); with
    `phases`, set it per phase."""
    phases: list[PhaseConfig] = Field(default_factory=_default_phases, min_length=1, validate_default=True)
    """Sequence-length phases, each written to examples/<name>/ (default: seq128 with 20 predictions, seq512 with
    80)."""
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0)
    """Probability that a document (per pass) gets a random shorter target length. Default 0.1 (Google), 0 for
    roberta."""
    dupe_factor: int = Field(10, ge=1)
    """Passes over the corpus, each with new pairs and masks. Default 10 (Google), 1 for roberta with dynamic masking
    (the loader re-masks each epoch)."""
    masked_lm_prob: float = Field(0.15, gt=0.0, lt=1.0)
    """Share of each sequence's tokens (specials counted) that are prediction targets."""
    whole_word_mask: bool = False
    """Mask whole words: a `##` piece is masked together with the word it continues."""
    span_masking: bool = False
    """SpanBERT: mask spans of whole words, geometric length (p=0.2, at most 10 words)."""
    masking: Literal["static", "dynamic"] = "static"
    """static: masks are drawn here and stored; dynamic: stored unmasked, the data loader draws a new mask each epoch.
    Default static, dynamic for roberta."""
    doc_sentences: bool = False
    """roberta only: DOC-SENTENCES (a sequence never crosses a document boundary) instead of FULL-SENTENCES."""
    random_next_shards: int = Field(4, ge=0)
    """bert: other corpus shards of the split, besides a shard's own, whose documents its random next sentences come
    from (a keyed sample per phase, split and shard; all of them when the split has no more). A task reads its own token
    shard and these: at most random_next_shards + 1 of them, whatever the corpus size. Google's script draws from the
    files one process reads; 0 draws from the shard's own documents only (as LDDL)."""
    length_bins: list[int] = Field(default_factory=lambda: [32, 64, 128, 256, 512], min_length=1, validate_default=True)
    """Upper bounds of the length bins; a shard holds records of one bin so batches waste little padding."""

    @model_validator(mode="before")
    @classmethod
    def _defaults_from_objective(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        roberta = data.get("objective") == "roberta"
        data.setdefault("short_seq_prob", 0.0 if roberta else 0.1)
        data.setdefault("masking", "dynamic" if roberta else "static")
        data.setdefault("dupe_factor", 1 if roberta and data["masking"] == "dynamic" else 10)
        has_length = data.get("max_seq_length") is not None
        if "phases" not in data and has_length:
            length = data["max_seq_length"]
            if isinstance(length, int) and not isinstance(length, bool):
                prob = data.get("masked_lm_prob", 0.15)
                predictions = data.pop("max_predictions_per_seq", None)
                if predictions is None and isinstance(prob, (int, float)):
                    predictions = max(1, math.ceil(length * prob - 1e-9))
                data["phases"] = [
                    {"name": f"seq{length}", "max_seq_length": length, "max_predictions_per_seq": predictions}
                ]
        elif not has_length and isinstance(data.get("phases", []), list):
            lengths = [
                p.get("max_seq_length") if isinstance(p, dict) else getattr(p, "max_seq_length", None)
                for p in data.get("phases") or _default_phases()
            ]
            if lengths and all(isinstance(n, int) for n in lengths):
                data["max_seq_length"] = max(lengths)
        return data

    @field_validator("phases")
    @classmethod
    def _phases_fit(cls, phases: list[PhaseConfig], info: ValidationInfo) -> list[PhaseConfig]:
        names = [p.name for p in phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        least = 3 if info.data.get("objective") == "roberta" else 5
        for p in phases:
            if p.max_seq_length < least:
                raise ValueError(f"phase {p.name}: max_seq_length must be at least {least} ([CLS] A [SEP] B [SEP])")
            if p.max_predictions_per_seq > p.max_seq_length:
                raise ValueError(f"phase {p.name}: max_predictions_per_seq exceeds max_seq_length")
        if info.data.get("max_predictions_per_seq") is not None:
            raise ValueError("with `phases`, set max_predictions_per_seq per phase, not at the top of examples")
        longest = info.data.get("max_seq_length")
        if longest is not None and longest != max(p.max_seq_length for p in phases):
            raise ValueError(
                f"max_seq_length ({longest}) must equal the longest phase ({max(p.max_seq_length for p in phases)}); "
                "set one of them"
            )
        return phases

    @field_validator("doc_sentences")
    @classmethod
    def _doc_sentences_roberta(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("objective") != "roberta":
            raise ValueError("doc_sentences applies to objective roberta only")
        return value

    @field_validator("length_bins")
    @classmethod
    def _bins_cover(cls, bins: list[int], info: ValidationInfo) -> list[int]:
        if any(b <= 0 for b in bins) or any(x >= y for x, y in zip(bins, bins[1:])):
            raise ValueError(f"must be positive and strictly increasing, got {bins}")
        longest = info.data.get("max_seq_length")
        if longest is not None and bins[-1] < longest:
            raise ValueError(f"the last bin ({bins[-1]}) must be at least max_seq_length ({longest}); add {longest}")
        return bins

    @model_validator(mode="after")
    def _consistent(self) -> ExamplesConfig:
        # The field validators check this at construction; this also covers assignments.
        longest = max(p.max_seq_length for p in self.phases)
        if self.max_seq_length != longest:
            raise ValueError(
                f"max_seq_length ({self.max_seq_length}) must equal the longest phase in phases ({longest})"
            )
        if self.length_bins[-1] < longest:
            raise ValueError(
                f"length_bins: the last bin ({self.length_bins[-1]}) must be at least max_seq_length ({longest})"
            )
        return self

    @property
    def has_nsp(self) -> bool:
        """Whether the examples carry a sentence-pair label (NSP, or SOP for sop) that
        trains the pooler and the seq_relationship head."""
        return self.objective != "roberta"

    def phase(self, name: str) -> PhaseConfig:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"examples.phases has no phase {name!r} (have {[p.name for p in self.phases]})")

    def pair_config(self, phase: PhaseConfig, separators: int = 1) -> PairConfig:
        """How the phase's sequences are built; `separators` between A and B: 1 ([SEP]), 2
        (RoBERTa's </s></s>, SpecialIds.separators)."""
        from bertcore.examples.pairs import PairConfig

        return PairConfig(
            max_seq_length=phase.max_seq_length,
            short_seq_prob=self.short_seq_prob,
            objective=self.objective,
            doc_sentences=self.doc_sentences,
            separators=separators,
        )

    def mask_config(self, phase: PhaseConfig, vocab: VocabTables) -> MaskConfig:
        from bertcore.examples.masking import MaskConfig

        return MaskConfig(
            vocab=vocab,
            masked_lm_prob=self.masked_lm_prob,
            max_predictions_per_seq=phase.max_predictions_per_seq,
            whole_word_mask=self.whole_word_mask,
            span=self.span_masking,
        )

    def length_bin(self, lengths):
        """The length bin of each length (see `length_bin`)."""
        return length_bin(lengths, self.length_bins)


def length_bin(lengths, bins: Sequence[int]):
    """The bin of a length, or of each in an array: the smallest bound >= it. Records of
    one bin share an examples shard, and a training batch."""
    import numpy as np

    bounds = np.asarray(sorted(bins))
    index = np.searchsorted(bounds, lengths, side="left")
    if np.any(index >= len(bounds)):
        raise ValueError(f"a record of length {int(np.max(lengths))} exceeds the last length bin {bounds[-1]}")
    return bounds[index]
