"""RoBERTa (Liu et al. 2019): BERT's encoder with three differences of data, not of
architecture: position ids start after the padding id (real tokens at pad_token_id + 1,
+ 2, ..., padding at pad_token_id: 514 positions for 512 tokens with <pad> = 1), one token
type, and LayerNorm epsilon 1e-5. The model is bertcore/model/bert.py's BertForPreTraining
with `model_type: roberta`; a byte-level BPE vocabulary makes one. It is exported as
transformers' RobertaForMaskedLM (`roberta.*`, `lm_head.*`), never with an NSP head
(transformers has no RoBERTa class that holds one).
"""

from __future__ import annotations

from typing import Any

from bertcore.errors import InputDataError
from bertcore.model.families.base import Head, ModelConfig
from bertcore.model.families.bert import Bert

ROBERTA_NAMES = (
    ("bert.", "roberta."),
    ("cls.predictions.transform.dense.", "lm_head.dense."),
    ("cls.predictions.transform.LayerNorm.", "lm_head.layer_norm."),
    ("cls.predictions.decoder.", "lm_head.decoder."),
    ("cls.predictions.bias", "lm_head.bias"),
)
"""bertcore's (BertForPreTraining's) name prefix -> transformers' RobertaForMaskedLM's."""
ROBERTA_UNEXPORTED = ("bert.pooler.", "cls.seq_relationship.")
"""Entries RobertaForMaskedLM has no place for (it has neither a pooler nor an NSP head)."""


def roberta_shape(pad_token_id: int, max_length: int = 512) -> dict[str, Any]:
    """RoBERTa's departures from a named BERT shape, for a vocabulary whose <pad> has id
    `pad_token_id` and sequences of up to `max_length` tokens (roberta-base: 514 positions)."""
    return {
        "model_type": "roberta",
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "pad_token_id": pad_token_id,
        "max_position_embeddings": max_length + pad_token_id + 1,
    }


def roberta_name(key: str) -> str | None:
    """transformers' RobertaForMaskedLM name of a bertcore state-dict entry; None for the
    pooler and the NSP head, which it does not hold."""
    if key.startswith(ROBERTA_UNEXPORTED):
        return None
    for ours, theirs in ROBERTA_NAMES:
        if key.startswith(ours):
            return theirs + key[len(ours) :]
    raise ValueError(f"{key} has no RobertaForMaskedLM name")


def from_roberta_name(key: str) -> str:
    """bertcore's name of a transformers RoBERTa entry (`roberta.*`, `lm_head.*`); other names unchanged."""
    for ours, theirs in ROBERTA_NAMES:
        if key.startswith(theirs):
            return ours + key[len(theirs) :]
    return key


class Roberta(Bert):
    name = "roberta"
    vocab_layout = "roberta"
    # the module holds BERT's pooler and NSP head (unused without NSP labels); no export keeps them
    nsp_head = False

    def vocabulary_fields(self, pad_token_id: int) -> dict[str, Any]:
        return roberta_shape(pad_token_id)

    def position_offset(self, cfg: ModelConfig) -> int:
        return cfg.pad_token_id + 1

    def architecture(self, head: Head) -> str:
        if head == "encoder":
            raise InputDataError(
                "a RoBERTa student cannot be exported as an embedding model yet (only a BERT one); "
                "distil from a BERT teacher, or from a teacher with a masked-LM head"
            )
        return "RobertaForMaskedLM"

    def hf_config(self, cfg: ModelConfig, head: Head, specials: Any = None) -> dict[str, Any]:
        return {
            "architectures": [self.architecture(head)],
            "model_type": "roberta",
            **self._hf_fields(cfg),
            "tie_word_embeddings": True,
        }

    def exported_name(self, key: str, head: Head) -> str | None:
        return roberta_name(key)

    def canonical_name(self, key: str, prefixed: bool) -> str:
        return from_roberta_name(super().canonical_name(key, prefixed))

    def is_prefixed(self, names) -> bool:
        return any(k.startswith(("bert.", "cls.", "roberta.", "lm_head.")) for k in names)


ROBERTA = Roberta()
