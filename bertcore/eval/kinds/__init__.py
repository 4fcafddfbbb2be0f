"""Task kinds: one module per kind of fine-tuning task, each behind the interface of
base.py (read and check its files, build features, the head's outputs and loss, decode
and score outputs, the floors, what serving needs), and the registry below, the one place
that maps a task's `type` to its kind. Adding a kind is one module here and one line in
KINDS; code outside this folder asks a task's kind (`TaskConfig.kind`, `get(name)`) and
never compares its name.

- classification.py, regression.py: a label or a number per text or pair (text.py: what they share)
- token_classification.py: a tag per word (CoNLL)
- qa.py: extractive answer spans (SQuAD), with its windows and span decoding
- word_similarity.py: word pairs scored by the encoder's word vectors, nothing trained
- multiple_choice.py: a context and N candidates, one right (SWAG, COPA)

May import: the readers, settings and windows modules of bertcore/eval, and, inside the
functions that need them, torch, numpy and the eval modules that load and score models
(encoder, metrics, baselines, embeddings). Must not import: bertcore/eval/config.py,
tasks.py, finetune.py, fractions.py, summary.py, report.py or scores.py (they ask the
kinds), nor anything heavy at module level: loading a recipe imports this registry.
"""

from __future__ import annotations

from bertcore.eval.kinds.base import TaskKind
from bertcore.eval.kinds.classification import Classification
from bertcore.eval.kinds.multiple_choice import MultipleChoice
from bertcore.eval.kinds.qa import ExtractiveQA
from bertcore.eval.kinds.regression import Regression
from bertcore.eval.kinds.token_classification import TokenClassification
from bertcore.eval.kinds.word_similarity import WordSimilarity

KINDS: dict[str, TaskKind] = {
    kind.name: kind
    for kind in (
        Classification(),
        Regression(),
        TokenClassification(),
        ExtractiveQA(),
        WordSimilarity(),
        MultipleChoice(),
    )
}
"""Every task kind by its name, in the order the recipe reference lists them."""


def get(name: str) -> TaskKind:
    """The kind named `name` (a task's `type`, or the type a saved head records)."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown task type {name!r}; the task types are {', '.join(KINDS)}") from None
