"""The model families and their registry: one module per family (bert.py, roberta.py,
modernbert.py), each a `Family` (base.py) that says how it builds, loads, exports and
names its weights. Code outside this folder holds a Family, from `family(name)` (a
ModelConfig's `model_type`) or `for_vocabulary` (what a recipe and a vocabulary choose),
and never compares family names.

Light: no torch at import (a family imports its model inside `build`).
"""

from __future__ import annotations

from bertcore.model.families.base import Family, Head, Shape
from bertcore.model.families.bert import BERT
from bertcore.model.families.modernbert import MODERNBERT
from bertcore.model.families.roberta import ROBERTA

__all__ = ["FAMILIES", "Family", "Head", "Shape", "family", "for_vocabulary"]

FAMILIES: dict[str, Family] = {f.name: f for f in (BERT, ROBERTA, MODERNBERT)}
"""Every family by its model_type."""
AUTO = "auto"
"""A recipe's family when the vocabulary decides: WordPiece makes a BERT, byte-level BPE a RoBERTa."""


def family(name: str) -> Family:
    """The family whose model_type is `name`; ValueError naming the families there are."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; bertcore builds {', '.join(FAMILIES)}") from None


def for_vocabulary(requested: str, layout: str, key: str = "pretrain.family") -> Family:
    """The family a recipe's `requested` family (or `auto`) makes with a vocabulary of
    `layout` (bert: WordPiece, roberta: byte-level BPE); ValueError naming `key` when the
    two disagree."""
    if requested == AUTO:
        return next(f for f in FAMILIES.values() if f.vocab_layout == layout)
    chosen = family(requested)
    if chosen.vocab_layout not in (None, layout):
        needs = "byte-level BPE" if chosen.vocab_layout == "roberta" else "WordPiece"
        raise ValueError(
            f"{key}: the {chosen.name} family needs a {needs} vocabulary; set vocab.model to match, or {key}: auto"
        )
    return chosen
