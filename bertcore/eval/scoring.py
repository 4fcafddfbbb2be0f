"""Scores of one fine-tuned model's predictions, and of the majority-class predictor
beside it, per task type (classification and regression texts, tagged words, QA spans).

Every function takes the gold examples and the model's outputs as plain arrays, so the
same scoring serves a fine-tuning run, a cross-validation fold and a test.
"""

from __future__ import annotations

import numpy as np

from bertcore.eval import baselines, metrics, qa
from bertcore.eval.config import TaskConfig
from bertcore.eval.tasks import QAExample, TaggedSentence, TextExample


def score_labels(task: TaskConfig, labels: list[str], gold: list[str], predicted: list[str]) -> dict[str, float]:
    out = {
        "accuracy": metrics.accuracy(gold, predicted),
        "macro_f1": metrics.f1(gold, predicted, average="macro"),
        "mcc": metrics.matthews(gold, predicted),
    }
    if len(labels) == 2:
        out["f1"] = metrics.f1(gold, predicted, pos_label=task.positive_label or labels[1])
    return out


def score_text(task: TaskConfig, labels: list[str], examples: list[TextExample], outputs: list[np.ndarray]) -> dict[str, float]:
    if task.type == "regression":
        gold = [float(e.label) for e in examples]
        predicted = [float(o[0]) for o in outputs]
        return {
            "pearson": metrics.pearson(gold, predicted),
            "spearman": metrics.spearman(gold, predicted),
            "mse": float(np.mean((np.asarray(gold) - np.asarray(predicted)) ** 2)),
        }
    return score_labels(task, labels, [e.label for e in examples], [labels[int(np.argmax(o))] for o in outputs])


def score_tokens(task, labels, examples: list[TaggedSentence], outputs, first_pieces) -> dict[str, float]:
    outside = "O" if "O" in labels else labels[0]
    predicted = []
    for logits, first in zip(outputs, first_pieces):
        # A word cut off by truncation is predicted O, so it costs recall rather than vanishing.
        predicted.append([outside if p is None else labels[int(np.argmax(logits[p]))] for p in first])
    return metrics.entity_scores([list(e.tags) for e in examples], predicted, scheme=task.tag_scheme)


def score_qa(task, examples: list[QAExample], outputs, windows) -> dict[str, float]:
    spans = qa.decode_spans(
        examples,
        windows,
        [o[:, 0] for o in outputs],
        [o[:, 1] for o in outputs],
        n_best=task.n_best,
        max_answer_length=task.max_answer_length,
    )
    golds = {e.id: [a.text for a in e.answers] for e in examples}
    answers = qa.final_answers(spans, version_2=task.version_2, null_score_threshold=task.null_score_threshold)
    out = metrics.squad_scores(answers, golds)
    if task.version_2:
        out.update(qa.best_null_threshold(spans, golds))
    return out


def majority_scores(task: TaskConfig, labels: list[str], train: list, evaluate: list) -> dict[str, float] | None:
    """Scores of always predicting the training data's most frequent label (tag), the
    floor a model that learned nothing reaches; None for regression and QA."""
    if task.type == "classification":
        majority = baselines.most_frequent([e.label for e in train])
        return score_labels(task, labels, [e.label for e in evaluate], [majority] * len(evaluate))
    if task.type == "token_classification":
        majority = baselines.most_frequent([t for e in train for t in e.tags])
        return metrics.entity_scores([list(e.tags) for e in evaluate], [[majority] * len(e.tags) for e in evaluate], scheme=task.tag_scheme)
    return None
