"""Fine-tuning on CPU: a task head on a pretrained (or freshly initialised) encoder,
trained and scored with one seed.

Encoder choice: the encoder is whatever `transformers.AutoModel` loads from a local
Hugging Face folder (the pretrain stage's `model/`; a BertForPreTraining checkpoint loads
as its BertModel, the MLM/NSP heads are dropped). `TaskModel` itself accepts any
nn.Module called as encoder(input_ids=, attention_mask=, token_type_ids=) that returns
(B, T, H) hidden states or an object with `last_hidden_state`. The no-pretraining
baseline (`random_init=True`) builds the same architecture from the folder's config.json
with fresh weights, so the comparison isolates what pretraining contributed.

Determinism: weight initialisation, dropout and batch order all draw from generators
keyed by (seed, task name, purpose), inside a forked torch RNG, so a run is reproducible
given the seed and thread count and leaves the caller's global RNG untouched.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from bertcore.eval import metrics, qa
from bertcore.errors import ConfigError
from bertcore.eval.tasks import (
    QAExample,
    TaggedSentence,
    TaskConfig,
    TaskDataError,
    TextExample,
    fold_splits,
    infer_labels,
    read_split,
)
from bertcore.rng import keyed_seed

class TaskSettingError(ConfigError, ValueError):
    """A task setting the encoder cannot honour (a ValueError and a bertpipe ConfigError)."""


# --- loading -------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_transformers():
    # Loading a pretraining checkpoint as a bare encoder prints a report of the unused
    # MLM/NSP head weights and a progress bar; both are expected here.
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_tokenizer(tokenizer_dir: str):
    """The fast tokenizer saved in a local folder (tokenizer.json required: QA needs offsets)."""
    from transformers import AutoTokenizer

    with _quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if not tokenizer.is_fast:
        raise ValueError(f"{tokenizer_dir}: no fast tokenizer (tokenizer.json) found; the pretrain stage's model/ folder has one")
    return tokenizer


def load_encoder(encoder_dir: str, *, random_init: bool = False) -> nn.Module:
    """The encoder in a local Hugging Face folder; with random_init, the same architecture
    with fresh weights (initialised from the global torch RNG, which the caller seeds)."""
    from transformers import AutoConfig, AutoModel

    with _quiet_transformers():
        if random_init:
            return AutoModel.from_config(AutoConfig.from_pretrained(encoder_dir))
        return AutoModel.from_pretrained(encoder_dir)


def encode(encoder: nn.Module, input_ids, attention_mask, token_type_ids) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(hidden (B, T, H), pooled (B, H) or None) from any supported encoder."""
    out = encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    if isinstance(out, torch.Tensor):
        return out, None
    return out.last_hidden_state, getattr(out, "pooler_output", None)


# --- model ---------------------------------------------------------------------------------


class TaskModel(nn.Module):
    """Encoder + one linear head. Sequence tasks read BERT's pooled [CLS] output (the
    encoder's pooler when it has one, else the first token's hidden state); token tasks
    and QA read every position."""

    def __init__(
        self, encoder: nn.Module, task_type: str, num_outputs: int, dropout: float = 0.1, hidden_size: int | None = None
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.task_type = task_type
        hidden = hidden_size or getattr(getattr(encoder, "config", None), "hidden_size", None)
        if hidden is None:
            raise ValueError("TaskModel: pass hidden_size for an encoder without config.hidden_size")
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, num_outputs)

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        hidden, pooled = encode(self.encoder, input_ids, attention_mask, token_type_ids)  # (B, T, H), (B, H)
        if self.task_type in ("classification", "regression"):
            features = pooled if pooled is not None else hidden[:, 0]
            return self.head(self.dropout(features))  # (B, C) or (B, 1)
        return self.head(self.dropout(hidden))  # (B, T, C) tags, or (B, T, 2) start/end


# --- features ------------------------------------------------------------------------------


@dataclass
class _Feature:
    input_ids: list[int]
    token_type_ids: list[int]
    label: object  # int | float | list[int] (per token, -100 = not scored) | tuple[int, int] (QA)


def _text_features(examples: Sequence[TextExample], tokenizer, task: TaskConfig, labels: list[str]) -> list[_Feature]:
    index = {label: i for i, label in enumerate(labels)}
    encoded = tokenizer(
        [e.text_a for e in examples],
        [e.text_b for e in examples] if any(e.text_b is not None for e in examples) else None,
        truncation=True,
        max_length=task.max_seq_length,
        return_token_type_ids=True,
    )
    return [
        _Feature(ids, types, float(e.label) if task.type == "regression" else index[e.label])
        for ids, types, e in zip(encoded["input_ids"], encoded["token_type_ids"], examples)
    ]


def _token_features(examples: Sequence[TaggedSentence], tokenizer, task: TaskConfig, labels: list[str]):
    """Features plus, per sentence, the position of each word's first sub-token (None when
    truncation cut the word off): only that piece is trained and read, as in BERT's NER."""
    index = {label: i for i, label in enumerate(labels)}
    encoded = tokenizer(
        [list(e.words) for e in examples],
        is_split_into_words=True,
        truncation=True,
        max_length=task.max_seq_length,
        return_token_type_ids=True,
    )
    features, first_pieces = [], []
    for i, example in enumerate(examples):
        word_ids = encoded.word_ids(i)
        first = [None] * len(example.words)
        token_labels = [-100] * len(word_ids)
        for position, word in enumerate(word_ids):
            if word is not None and first[word] is None:
                first[word] = position
                token_labels[position] = index[example.tags[word]]
        features.append(_Feature(encoded["input_ids"][i], encoded["token_type_ids"][i], token_labels))
        first_pieces.append(first)
    return features, first_pieces


def _qa_features(examples: Sequence[QAExample], tokenizer, task: TaskConfig):
    windows = qa.build_windows(
        examples,
        tokenizer,
        max_seq_length=task.max_seq_length,
        doc_stride=task.doc_stride,
        max_query_length=task.max_query_length,
    )
    features = [_Feature(w.input_ids, w.token_type_ids, (w.start_position, w.end_position)) for w in windows]
    return features, windows


def _batch(features: Sequence[_Feature], pad_id: int, task_type: str) -> dict[str, torch.Tensor]:
    """Pads to the longest feature in the batch (B, T); padding costs little on CPU this way."""
    width = max(len(f.input_ids) for f in features)
    ids = torch.full((len(features), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(features), width), dtype=torch.long)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for row, f in enumerate(features):
        n = len(f.input_ids)
        ids[row, :n] = torch.tensor(f.input_ids)
        types[row, :n] = torch.tensor(f.token_type_ids)
        mask[row, :n] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if task_type == "classification":
        batch["labels"] = torch.tensor([f.label for f in features], dtype=torch.long)
    elif task_type == "regression":
        batch["labels"] = torch.tensor([f.label for f in features], dtype=torch.float)
    elif task_type == "token_classification":
        labels = torch.full((len(features), width), -100, dtype=torch.long)
        for row, f in enumerate(features):
            labels[row, : len(f.label)] = torch.tensor(f.label)
        batch["labels"] = labels
    else:
        batch["labels"] = torch.tensor([f.label for f in features], dtype=torch.long)  # (B, 2) start, end
    return batch


def _loss(logits: torch.Tensor, labels: torch.Tensor, task_type: str) -> torch.Tensor:
    if task_type == "classification":
        return nn.functional.cross_entropy(logits, labels)
    if task_type == "regression":
        return nn.functional.mse_loss(logits.squeeze(-1), labels)
    if task_type == "token_classification":
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    start, end = logits.unbind(-1)  # (B, T) each
    return (nn.functional.cross_entropy(start, labels[:, 0]) + nn.functional.cross_entropy(end, labels[:, 1])) / 2


# --- training ------------------------------------------------------------------------------


def _optimizer(model: TaskModel, task: TaskConfig, total_steps: int):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if name.endswith("bias") or "LayerNorm" in name or "norm" in name.lower() else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": task.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=task.learning_rate,
    )
    warmup = int(task.warmup_fraction * total_steps)

    def factor(step: int) -> float:  # linear warm-up to the peak, then linear decay to zero
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _train(model: TaskModel, features: list[_Feature], task: TaskConfig, pad_id: int, order: torch.Generator) -> float:
    """Trains in place; returns the mean loss of the last epoch."""
    steps_per_epoch = math.ceil(len(features) / task.batch_size)
    optimizer, schedule = _optimizer(model, task, task.epochs * steps_per_epoch)
    model.train()
    if task.freeze_encoder:
        model.encoder.requires_grad_(False)
        model.encoder.eval()  # fixed features: no dropout inside the encoder either
    last_epoch_loss = float("nan")
    for _ in range(task.epochs):
        permutation = torch.randperm(len(features), generator=order).tolist()
        losses = []
        for start in range(0, len(features), task.batch_size):
            batch = _batch([features[i] for i in permutation[start : start + task.batch_size]], pad_id, task.type)
            labels = batch.pop("labels")
            loss = _loss(model(**batch), labels, task.type)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
        last_epoch_loss = float(np.mean(losses))
    return last_epoch_loss


@torch.no_grad()
def _predict(model: TaskModel, features: list[_Feature], pad_id: int, task_type: str, batch_size: int) -> list[np.ndarray]:
    """Per feature: logits (C,), (1,), (T, C) or (T, 2), cut to the feature's length."""
    model.eval()
    outputs: list[np.ndarray] = []
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        batch = _batch(chunk, pad_id, task_type)
        batch.pop("labels")
        logits = model(**batch).float().numpy()
        for row, f in enumerate(chunk):
            outputs.append(logits[row] if task_type in ("classification", "regression") else logits[row, : len(f.input_ids)])
    return outputs


# --- scoring -------------------------------------------------------------------------------


def _score_text(task: TaskConfig, labels: list[str], examples: list[TextExample], outputs: list[np.ndarray]) -> dict[str, float]:
    if task.type == "regression":
        gold = [float(e.label) for e in examples]
        predicted = [float(o[0]) for o in outputs]
        return {
            "pearson": metrics.pearson(gold, predicted),
            "spearman": metrics.spearman(gold, predicted),
            "mse": float(np.mean((np.asarray(gold) - np.asarray(predicted)) ** 2)),
        }
    gold = [e.label for e in examples]
    predicted = [labels[int(np.argmax(o))] for o in outputs]
    out = {
        "accuracy": metrics.accuracy(gold, predicted),
        "macro_f1": metrics.f1(gold, predicted, average="macro"),
        "mcc": metrics.matthews(gold, predicted),
    }
    if len(labels) == 2:
        out["f1"] = metrics.f1(gold, predicted, pos_label=task.positive_label or labels[1])
    return out


def _score_tokens(task, labels, examples: list[TaggedSentence], outputs, first_pieces) -> dict[str, float]:
    outside = "O" if "O" in labels else labels[0]
    predicted = []
    for logits, first in zip(outputs, first_pieces):
        # A word cut off by truncation is predicted O, so it costs recall rather than vanishing.
        predicted.append([outside if p is None else labels[int(np.argmax(logits[p]))] for p in first])
    return metrics.entity_scores([list(e.tags) for e in examples], predicted, scheme=task.tag_scheme)


def _score_qa(task, examples: list[QAExample], outputs, windows) -> dict[str, float]:
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


# --- one run -------------------------------------------------------------------------------


def _fit_and_score(
    task: TaskConfig,
    encoder_dir: str,
    tokenizer,
    labels: list[str],
    seed: int,
    random_init: bool,
    train: list,
    evaluate: dict[str, list],
    run_key: str,
) -> tuple[dict[str, dict[str, float]], float]:
    """Fine-tunes one model on `train` and scores it on each named set in `evaluate`."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def featurize(examples):
        if task.type == "qa":
            return _qa_features(examples, tokenizer, task)
        if task.type == "token_classification":
            return _token_features(examples, tokenizer, task, labels)
        return _text_features(examples, tokenizer, task, labels), None

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(keyed_seed(seed, task.name, run_key, "init"))
        encoder = load_encoder(encoder_dir, random_init=random_init)
        max_positions = getattr(encoder.config, "max_position_embeddings", None)
        if max_positions is not None and task.max_seq_length > max_positions:
            raise TaskSettingError(
                f"task {task.name!r}: max_seq_length {task.max_seq_length} exceeds the encoder's max_position_embeddings {max_positions}"
            )
        outputs = 2 if task.type == "qa" else 1 if task.type == "regression" else len(labels)
        model = TaskModel(encoder, task.type, outputs, getattr(encoder.config, "hidden_dropout_prob", 0.1))
        train_features, _ = featurize(train)
        torch.manual_seed(keyed_seed(seed, task.name, run_key, "dropout"))
        order = torch.Generator().manual_seed(keyed_seed(seed, task.name, run_key, "order") % 2**63)
        loss = _train(model, train_features, task, pad_id, order)

        scores = {}
        for name, examples in evaluate.items():
            features, extra = featurize(examples)
            predictions = _predict(model, features, pad_id, task.type, max(64, task.batch_size))
            if task.type == "qa":
                scores[name] = _score_qa(task, examples, predictions, extra)
            elif task.type == "token_classification":
                scores[name] = _score_tokens(task, labels, examples, predictions, extra)
            else:
                scores[name] = _score_text(task, labels, examples, predictions)
    return scores, loss


def run_task(
    task: TaskConfig,
    encoder_dir: str | None,
    tokenizer_dir: str,
    seed: int,
    *,
    random_init: bool,
    num_threads: int = 1,
) -> dict:
    """Fine-tunes on `task` with one seed and returns its metrics:
    {"task", "seed", "random_init", "validation": {metric: value}, "test": {...} (when a
    test file is set), "folds", "labels", "train_examples", "skipped": {split: rows},
    "skipped_problems", "final_train_loss", "seconds"}.

    encoder_dir: the Hugging Face folder of the pretrained encoder; None (only with
    random_init) takes config.json from tokenizer_dir, for a baseline with no checkpoint.
    random_init: same architecture, fresh weights (the no-pretraining baseline).
    With cross_validation_folds, "validation" holds the mean over folds and "test" comes
    from a model fine-tuned on the whole training file.
    """
    if encoder_dir is None and not random_init:
        raise ValueError("encoder_dir is required unless random_init is true")
    encoder_dir = encoder_dir if encoder_dir is not None else tokenizer_dir
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
        train = read_split(task, "train")
        labels = infer_labels(task, train.examples) if task.type in ("classification", "token_classification") else []
        skipped = {"train": train.skipped}
        problems = list(train.problems)
        evaluate: dict[str, list] = {}
        for split in ("validation", "test"):
            if getattr(task, split) is not None:
                read = read_split(task, split, labels or None)
                evaluate[split] = read.examples
                skipped[split] = read.skipped
                problems += read.problems
        if not train.examples:
            raise TaskDataError(f"{task.train}: no usable training examples")

        result: dict = {}
        if task.cross_validation_folds is None:
            scores, loss = _fit_and_score(task, encoder_dir, tokenizer, labels, seed, random_init, train.examples, evaluate, "full")
            result.update(scores)
        else:
            per_fold = []
            for k, (train_idx, held_idx) in enumerate(fold_splits(task, train.examples)):
                fold_train = [train.examples[i] for i in train_idx]
                held = {"validation": [train.examples[i] for i in held_idx]}
                scores, loss = _fit_and_score(task, encoder_dir, tokenizer, labels, seed, random_init, fold_train, held, f"fold{k}")
                per_fold.append(scores["validation"])
            result["validation"] = {name: float(np.mean([f[name] for f in per_fold])) for name in per_fold[0]}
            if "test" in evaluate:
                scores, loss = _fit_and_score(task, encoder_dir, tokenizer, labels, seed, random_init, train.examples, {"test": evaluate["test"]}, "full")
                result.update(scores)
    finally:
        torch.set_num_threads(threads)
    return {
        "task": task.name,
        "seed": seed,
        "random_init": random_init,
        "freeze_encoder": task.freeze_encoder,
        **result,
        "folds": task.cross_validation_folds,
        "labels": labels,
        "train_examples": len(train.examples),
        "skipped": skipped,
        "skipped_problems": problems,
        "final_train_loss": loss,
        "seconds": time.perf_counter() - started,
    }


def summarize_seeds(runs: Sequence[dict]) -> dict:
    """{"runs": runs, "validation": {metric: {median, min, max, std, n, n_nan}}, "test":
    {...} when present} for `run_task` results of one model over several seeds."""
    out: dict = {"runs": list(runs)}
    for split in ("validation", "test"):
        if split in runs[0]:
            out[split] = metrics.summarize_runs([r[split] for r in runs])
    return out


def baseline_gain(pretrained: dict, baseline: dict) -> dict[str, float]:
    """{metric: median pretrained - median random_init} on validation, for two
    `summarize_seeds` results."""
    return {
        name: pretrained["validation"][name]["median"] - baseline["validation"][name]["median"]
        for name in pretrained["validation"]
        if name in baseline["validation"]
    }


def run_seeds(
    task: TaskConfig, encoder_dir: str | None, tokenizer_dir: str, *, random_init: bool, num_threads: int = 1
) -> dict:
    """`run_task` for every seed in task.seeds, summarised by `summarize_seeds`."""
    return summarize_seeds(
        [run_task(task, encoder_dir, tokenizer_dir, s, random_init=random_init, num_threads=num_threads) for s in task.seeds]
    )


def compare_with_baseline(task: TaskConfig, encoder_dir: str, tokenizer_dir: str, *, num_threads: int = 1) -> dict:
    """The pretrained encoder against the same architecture with random weights, over all
    seeds: {"pretrained": run_seeds(...), "random_init": run_seeds(...), "gain":
    {metric: median pretrained - median random_init} on validation}."""
    pretrained = run_seeds(task, encoder_dir, tokenizer_dir, random_init=False, num_threads=num_threads)
    baseline = run_seeds(task, encoder_dir, tokenizer_dir, random_init=True, num_threads=num_threads)
    return {"pretrained": pretrained, "random_init": baseline, "gain": baseline_gain(pretrained, baseline)}
