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

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from bertcore.errors import ConfigError
from bertcore.eval import metrics
from bertcore.eval.encoder import (
    Features,
    TaskModel,
    encode,
    freeze_lower_layers,
    load_encoder,
    load_tokenizer,
    parameter_groups,
    pooler_source,
)
from bertcore.eval.fractions import fraction_subset
from bertcore.eval.kinds.base import Feature, TaskKind
from bertcore.eval.readers import TaskDataError
from bertcore.eval.tasks import TaskConfig, fold_splits, infer_labels, read_split
from bertcore.rng import keyed_numpy, keyed_seed

__all__ = ["TaskModel", "compare_with_baseline", "encode", "fit", "load_encoder", "load_tokenizer", "predict"]
__all__ += ["run_seeds", "run_task"]


class TaskSettingError(ConfigError, ValueError):
    """A task setting the encoder cannot honour (a ValueError and a bertpipe ConfigError)."""


def device() -> torch.device:
    """The GPU when this process sees one (a Ray job given `num_gpus`), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


# --- training ------------------------------------------------------------------------------


def _optimizer(model: TaskModel, task: TaskConfig, total_steps: int):
    groups = parameter_groups(model, task.learning_rate, task.weight_decay, task.layer_lr_decay)
    optimizer = torch.optim.AdamW(groups, lr=task.learning_rate)
    warmup = int(task.warmup_fraction * total_steps)

    def factor(step: int) -> float:  # linear warm-up to the peak, then linear decay to zero
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class Trained:
    """What `_train` did: the mean loss of the last epoch run, the epochs run, and with
    early stopping the epoch whose weights were kept and its held-out score."""

    final_train_loss: float
    epochs: int
    best_epoch: int | None = None
    best_score: float | None = None
    losses: list[float] = field(default_factory=list)
    """The mean training loss of each epoch run."""


def _train(
    model: TaskModel,
    features: list[Feature],
    task: TaskConfig,
    pad_id: int,
    order: torch.Generator,
    stop_score=None,
    after_epoch=None,
) -> Trained:
    """Trains in place. stop_score: a callable scoring the model on the held-out part of
    the training data (higher is better) after each epoch; with it, training stops after
    `early_stopping_patience` epochs without improvement and the best epoch's weights are
    restored. after_epoch: a callable given the model after each epoch (before early
    stopping looks at it), to measure it; it must leave the model as it found it."""
    if task.freeze_encoder:
        model.encoder.requires_grad_(False)
    freeze_lower_layers(model.encoder, task.freeze_layers)
    steps_per_epoch = math.ceil(len(features) / task.batch_size)
    optimizer, schedule = _optimizer(model, task, task.epochs * steps_per_epoch)
    where = next(model.parameters()).device
    best: tuple[float, int, dict] | None = None
    loss, epoch, losses = float("nan"), 0, []
    for epoch in range(1, task.epochs + 1):
        model.train()
        if task.freeze_encoder:
            model.encoder.eval()  # fixed features: no dropout inside the encoder either
        permutation = torch.randperm(len(features), generator=order).tolist()
        step_losses = []
        for start in range(0, len(features), task.batch_size):
            batch = task.kind.batch([features[i] for i in permutation[start : start + task.batch_size]], pad_id, where)
            labels = batch.pop("labels")
            step_loss = task.kind.loss(model(**batch), labels)
            optimizer.zero_grad(set_to_none=True)
            step_loss.backward()
            nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            optimizer.step()
            schedule.step()
            step_losses.append(step_loss.item())
        loss = float(np.mean(step_losses))
        losses.append(loss)
        if after_epoch is not None:
            after_epoch(model, epoch)
        if stop_score is None:
            continue
        score = stop_score(model)
        if best is None or score > best[0]:
            best = (score, epoch, copy.deepcopy(model.state_dict()))
        elif epoch - best[1] >= task.early_stopping_patience:
            break
    if best is None:
        return Trained(loss, epoch, losses=losses)
    model.load_state_dict(best[2])
    return Trained(loss, epoch, best_epoch=best[1], best_score=best[0], losses=losses)


@torch.no_grad()
def mean_loss(model: TaskModel, kind: TaskKind, features: list[Feature], pad_id: int, batch_size: int) -> float:
    """The model's loss on `features` (the mean over batches weighted by their inputs), in eval mode."""
    model.eval()
    where = next(model.parameters()).device
    total = 0.0
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        batch = kind.batch(chunk, pad_id, where)
        labels = batch.pop("labels")
        total += float(kind.loss(model(**batch).float(), labels)) * len(chunk)
    return total / max(1, len(features))


@torch.no_grad()
def predict(model: TaskModel, kind: TaskKind, features: list[Feature], pad_id: int, batch_size: int) -> list:
    """Per feature: its logits as its kind splits them ((C,) for a pooled head, (T, C) cut
    to the feature's length for a per-token one)."""
    model.eval()
    where = next(model.parameters()).device
    outputs: list[np.ndarray] = []
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        batch = kind.batch(chunk, pad_id, where)
        batch.pop("labels")
        outputs += kind.split_outputs(model(**batch).float().cpu().numpy(), chunk)
    return outputs


# --- one run -------------------------------------------------------------------------------


def holdout_split(task: TaskConfig, examples: list, seed: int, run_key: str) -> tuple[list, list]:
    """(fit, held out) for early stopping: `early_stopping_fraction` of the examples (at
    least one, and of each label for classification), keyed by task, fold and seed."""
    rng = keyed_numpy(seed, task.name, run_key, "early-stopping")
    if task.kind.stratified:
        groups: dict[str, list[int]] = {}
        for i, e in enumerate(examples):
            groups.setdefault(e.label, []).append(i)
    else:
        groups = {"": list(range(len(examples)))}
    held: set[int] = set()
    for members in groups.values():
        if len(members) > 1:
            count = max(1, round(task.early_stopping_fraction * len(members)))
            held.update(int(i) for i in rng.choice(members, size=count, replace=False))
    if not held or len(held) == len(examples):
        raise TaskDataError(
            f"task {task.name!r}: too few training examples ({len(examples)}) to hold some out for early stopping"
        )
    return [e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held]


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
    keep: list | None = None,
) -> tuple[dict[str, dict[str, float]], Trained]:
    """Fine-tunes one model on `train` and scores it on each named set in `evaluate`;
    the model is appended to `keep` when given."""
    model, trained = fit(task, encoder_dir, tokenizer, labels, seed, random_init, train, run_key)
    scores = {name: score_examples(model, task, tokenizer, labels, examples) for name, examples in evaluate.items()}
    if keep is not None:
        keep.append(model)
    return scores, trained


def outputs_of(model: TaskModel, task: TaskConfig, tokenizer, labels: list[str], examples: list) -> tuple[list, object]:
    """(the model's outputs on `examples`, one per feature as the kind splits them; what the
    kind's `score` needs besides them)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    features, extra = task.kind.features(examples, tokenizer, task, labels)
    return predict(model, task.kind, features, pad_id, max(64, task.batch_size)), extra


def score_examples(
    model: TaskModel, task: TaskConfig, tokenizer, labels: list[str], examples: list
) -> dict[str, float]:
    """The kind's metrics of `model` on `examples`."""
    outputs, extra = outputs_of(model, task, tokenizer, labels, examples)
    return task.kind.score(task, labels, examples, outputs, extra)


def fit(
    task: TaskConfig,
    encoder_dir: str,
    tokenizer,
    labels: list[str],
    seed: int,
    random_init: bool,
    train: list,
    run_key: str,
    *,
    after_epoch=None,
) -> tuple[TaskModel, Trained]:
    """A task model fine-tuned on `train` as the task says (with early stopping, on a
    held-out part of `train`), with `seed`: init, dropout, batch order and the hold-out are
    keyed by seed, task and `run_key`; and what its training did. after_epoch: as `_train`'s."""
    kind = task.kind
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop_score = None
    if task.early_stopping_patience is not None:
        train, held = holdout_split(task, train, seed, run_key)

        def stop_score(model) -> float:
            return _finite(score_examples(model, task, tokenizer, labels, held)[kind.primary_metric])

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(keyed_seed(seed, task.name, run_key, "init"))
        encoder = load_encoder(encoder_dir, random_init=random_init, dropout=task.dropout)
        max_positions = getattr(encoder.config, "max_position_embeddings", None)
        if max_positions is not None and task.max_seq_length > max_positions:
            raise TaskSettingError(
                f"task {task.name!r}: max_seq_length {task.max_seq_length} exceeds the encoder's "
                f"max_position_embeddings {max_positions}"
            )
        head_dropout = task.dropout if task.dropout is not None else getattr(encoder.config, "hidden_dropout_prob", 0.1)
        features = Features(layers=task.layers, combine=task.combine, pooling=task.pooling)
        outputs = kind.num_outputs(labels)
        model = TaskModel(encoder, kind, outputs, head_dropout, features=features, window_pool=task.window_pool)
        model = model.to(device())
        train_features, _ = kind.features(train, tokenizer, task, labels)
        torch.manual_seed(keyed_seed(seed, task.name, run_key, "dropout"))
        order = torch.Generator().manual_seed(keyed_seed(seed, task.name, run_key, "order") % 2**63)
        trained = _train(model, train_features, task, pad_id, order, stop_score, after_epoch)
    return model, trained


def _finite(value: float) -> float:
    return value if math.isfinite(value) else -math.inf


def _read(task: TaskConfig) -> tuple[object, list[str], dict[str, list], dict[str, int], list[str]]:
    """(train ReadResult, labels, {split: examples} to score, {split: rows skipped}, problems)."""
    train = read_split(task, "train")
    labels = infer_labels(task, train.examples)
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
    return train, labels, evaluate, skipped, problems


def _fine_tune(
    task: TaskConfig,
    encoder_dir: str,
    tokenizer_dir: str,
    seed: int,
    random_init: bool,
    keep: list | None = None,
    fraction: float = 1.0,
    subset_seed: int = 0,
) -> dict:
    """The fine-tuning part of `run_task` (every kind that trains). `keep`: a list
    that receives the model fine-tuned on the whole training file, or its `fraction` (with
    cross-validation and no test file, one more run fits it). Each fit trains on
    `fraction` of its training examples, a nested subset keyed by (subset_seed, task, fit)."""
    tokenizer = load_tokenizer(tokenizer_dir)
    train, labels, evaluate, skipped, problems = _read(task)
    result: dict = {"baselines": {}}
    fitted: list[int] = []

    def fit(examples: list, run_key: str, scored: dict[str, list], keep_model: list | None = None):
        subset = fraction_subset(examples, fraction, task, subset_seed, run_key)
        fitted.append(len(subset))
        scores, trained = _fit_and_score(
            task, encoder_dir, tokenizer, labels, seed, random_init, subset, scored, run_key, keep_model
        )
        majority = {split: task.kind.majority(task, labels, subset, examples) for split, examples in scored.items()}
        return scores, trained, majority

    if task.cross_validation_folds is None:
        scores, trained, majority = fit(train.examples, "full", evaluate, keep)
        result.update(scores)
        result["baselines"].update(majority)
    else:
        per_fold, fold_majority = [], []
        for k, (train_idx, held_idx) in enumerate(fold_splits(task, train.examples)):
            held = [train.examples[i] for i in held_idx]
            scores, trained, majority = fit([train.examples[i] for i in train_idx], f"fold{k}", {"validation": held})
            per_fold.append(scores["validation"])
            fold_majority.append(majority["validation"])
        result["validation"] = {name: float(np.mean([f[name] for f in per_fold])) for name in per_fold[0]}
        result["baselines"]["validation"] = (
            None
            if fold_majority[0] is None
            else {n: float(np.mean([m[n] for m in fold_majority])) for n in fold_majority[0]}
        )
        if "test" in evaluate:
            scores, trained, majority = fit(train.examples, "full", {"test": evaluate["test"]}, keep)
            result.update(scores)
            result["baselines"].update(majority)
        elif keep is not None:  # the folds' models each miss a fold: fit one on everything to keep
            fit(train.examples, "full", {}, keep)
            fitted.pop()  # kept for export, not scored
    result["baselines"] = {
        split: {"majority": scores} for split, scores in result["baselines"].items() if scores is not None
    }
    read = {"train": train.examples, **({} if task.cross_validation_folds else evaluate)}
    long_inputs = {split: task.kind.long_inputs(tokenizer, examples, task) for split, examples in read.items()}
    if long_inputs["train"] is not None:  # a kind that counts them
        result["long_inputs"] = long_inputs
    result.update(
        labels=labels,
        train_examples=len(train.examples),
        fraction=fraction,
        fit_examples=fitted,
        skipped=skipped,
        skipped_problems=problems,
        final_train_loss=trained.final_train_loss,
        epochs_trained=trained.epochs,
        best_epoch=trained.best_epoch,
    )
    return result


def fine_tuned_model(
    task: TaskConfig,
    encoder_dir: str,
    tokenizer_dir: str,
    seed: int,
    *,
    random_init: bool = False,
    fold: int | None = None,
) -> TaskModel:
    """The model `run_task` would fine-tune on the whole training file (no folds), for
    diagnostics: what fine-tuning did to the encoder; with `fold` k, the model of
    cross-validation fold k instead (trained without that fold's examples)."""
    tokenizer = load_tokenizer(tokenizer_dir)
    train, labels, _, _, _ = _read(task)
    examples, run_key = train.examples, "full"
    if fold is not None:
        train_idx, _ = fold_splits(task, train.examples)[fold]
        examples, run_key = [train.examples[i] for i in train_idx], f"fold{fold}"
    kept: list[TaskModel] = []
    _fit_and_score(task, encoder_dir, tokenizer, labels, seed, random_init, examples, {}, run_key, keep=kept)
    return kept[0]


def run_task(
    task: TaskConfig,
    encoder_dir: str | None,
    tokenizer_dir: str,
    seed: int,
    *,
    random_init: bool,
    num_threads: int = 1,
    keep: list | None = None,
    fraction: float = 1.0,
    subset_seed: int = 0,
) -> dict:
    """Fine-tunes on `task` with one seed (word_similarity: scores the encoder's word
    vectors) and returns its metrics: {"task", "seed", "random_init", "validation":
    {metric: value}, "test": {...} (when a test file is set), "baselines": {split:
    {"majority": {metric: value}}} (classification and tagging), "folds", "labels",
    "train_examples", "fraction", "fit_examples" (examples each scored fit trained on),
    "long_inputs" (classification, regression: {split: long_input_counts}), "skipped":
    {split: rows}, "skipped_problems", "final_train_loss", "epochs_trained", "best_epoch",
    "pooler", "device", "seconds"}.

    encoder_dir: the Hugging Face folder of the pretrained encoder; None (only with
    random_init) takes config.json from tokenizer_dir, for a baseline with no checkpoint.
    random_init: same architecture, fresh weights (the no-pretraining baseline).
    With cross_validation_folds, "validation" holds the mean over folds and "test" comes
    from a model fine-tuned on the whole training file.
    keep: a list that receives the TaskModel fine-tuned on the whole training file (not
    for word_similarity, which trains nothing); the evaluate stage saves it for export.
    fraction: train on this share of the training examples (of each fold's, with
    cross-validation), a nested subset drawn with `subset_seed` (the run seed) and the
    task's name (bertcore/eval/fractions.py), the same for every seed and model.
    """
    if encoder_dir is None and not random_init:
        raise ValueError("encoder_dir is required unless random_init is true")
    encoder_dir = encoder_dir if encoder_dir is not None else tokenizer_dir
    if task.long_inputs == "whole":  # up to the model's own length (the modern family: 8,192 tokens)
        from bertcore.model.folder import read_config

        length = read_config(encoder_dir, "evaluate.tasks[*].long_inputs").max_sequence_length
        task = task.model_copy(update={"max_seq_length": length})
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        if task.kind.trains:
            result = _fine_tune(task, encoder_dir, tokenizer_dir, seed, random_init, keep, fraction, subset_seed)
        else:
            result = task.kind.score_encoder(task, encoder_dir, tokenizer_dir, seed, random_init=random_init)
    finally:
        torch.set_num_threads(threads)
    return {
        "task": task.name,
        "seed": seed,
        "random_init": random_init,
        "freeze_encoder": task.freeze_encoder,
        "folds": task.cross_validation_folds,
        **result,
        "pooler": pooler_source(encoder_dir, random_init=random_init),
        "device": str(device()),
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
        [
            run_task(task, encoder_dir, tokenizer_dir, s, random_init=random_init, num_threads=num_threads)
            for s in task.seeds
        ]
    )


def compare_with_baseline(task: TaskConfig, encoder_dir: str, tokenizer_dir: str, *, num_threads: int = 1) -> dict:
    """The pretrained encoder against the same architecture with random weights, over all
    seeds: {"pretrained": run_seeds(...), "random_init": run_seeds(...), "gain":
    {metric: median pretrained - median random_init} on validation}."""
    pretrained = run_seeds(task, encoder_dir, tokenizer_dir, random_init=False, num_threads=num_threads)
    baseline = run_seeds(task, encoder_dir, tokenizer_dir, random_init=True, num_threads=num_threads)
    return {"pretrained": pretrained, "random_init": baseline, "gain": baseline_gain(pretrained, baseline)}
