"""One diagnosis: a task's files read (malformed rows skipped and counted), the fine-tuning
runs the findings need, made in this process one after another, and every finding.

The evaluation split is the task's validation file, or, for a cross-validated task, its
first fold (the evaluate stage's `fold0`: the same held-out rows, the same keyed init and
batch order, so the first seed's fit is the evaluate stage's own). On it:

- the task's own fit for each seed (the first seed's also measured epoch by epoch: the loss
  curves, the errors, what fine-tuning did to the encoder), and random init for each seed;
- the learning-rate sweep: the first seed at each rate of the grid;
- out-of-fold predictions for every training row: `folds` fits, each on the other folds.

Fits for the task's settings: epochs, batch size, schedule, pooling and early stopping as
the recipe says. What the sweep and the seeds cost is `fits` fine-tunes of the task.
Everything is seeded: the same files, model and options give the same findings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bertcore.eval.config import TaskConfig
from bertcore.eval.diagnosis import data, errors, labels, optimisation, seeds, start
from bertcore.eval.diagnosis.findings import Finding, not_applicable, ordered
from bertcore.eval.tasks import check_task_files, fold_splits, infer_labels, read_split


@dataclass(frozen=True)
class Options:
    """How much the diagnosis measures (the command's options)."""

    folds: int = 5
    """Folds of the out-of-fold predictions that rank suspect labels."""
    learning_rates: tuple[float, ...] = optimisation.GRID
    """The sweep's grid; the task's own rate is added."""
    seeds: tuple[int, ...] | None = None
    """Fine-tuning seeds for the spread and the verdict; None: the task's."""
    worst: int = 20
    """Worst-scored evaluation examples listed."""
    mlm_texts: int = 256
    """Evaluation texts held-out MLM accuracy is measured on (forgetting)."""
    vocab_dir: str | None = None
    """The run's vocab folder, to compare its tokenizer with the model folder's; None: not compared."""
    num_threads: int = 1
    """torch threads of the fits."""


@dataclass
class Diagnosis:
    """Every finding of one task and model, and the tables behind them."""

    task: str
    kind: str
    metric: str
    model: str
    evaluated_on: str
    findings: list[Finding]
    suspects: list[labels.Suspect] = field(default_factory=list)
    suspect_score: str = ""
    leaks: list[data.Leak] = field(default_factory=list)
    sweep: list[optimisation.SweepPoint] = field(default_factory=list)
    curve: optimisation.Curve | None = None
    classes: list[str] | None = None
    confusion: list[list[int]] | None = None
    per_class: list[dict] = field(default_factory=list)
    worst: list[errors.Worst] = field(default_factory=list)
    fits: int = 0
    timings: dict[str, float] = field(default_factory=dict)


class _Clock:
    """Seconds per part of the diagnosis, and a progress line per fit."""

    def __init__(self, total: int, progress: Callable[[str], None]) -> None:
        self.total, self.done, self.progress = total, 0, progress
        self.timings: dict[str, float] = {}

    def fit(self, what: str, part: str, run: Callable):
        started = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - started
        self.done += 1
        self.timings[part] = self.timings.get(part, 0.0) + seconds
        self.progress(f"fit {self.done}/{self.total}: {what} ({seconds:.1f}s)")
        return result


def _read(task: TaskConfig):
    """(train examples, {split: examples} of validation and test, labels, {split: (skipped, problems)})."""
    lenient = task.model_copy(update={"on_error": "skip"})
    check_task_files(lenient)  # a file without usable rows (a missing column...) is one line naming it
    train = read_split(lenient, "train") if task.train is not None else None
    names = infer_labels(task, train.examples) if train is not None else []
    others, skipped = {}, {}
    if train is not None:
        skipped["train"] = (train.skipped, train.problems)
    for split in ("validation", "test"):
        if getattr(task, split) is not None:
            read = read_split(lenient, split, names or None)
            others[split], skipped[split] = read.examples, (read.skipped, read.problems)
    return (train.examples if train is not None else []), others, names, skipped


def diagnose(
    task: TaskConfig,
    model_dir: str,
    *,
    options: Options = Options(),
    progress: Callable[[str], None] = lambda line: None,
    model_name: str = "",
) -> Diagnosis:
    """Every finding of `task` fine-tuned from the model in `model_dir` (a Hugging Face
    folder with its tokenizer), worst first, and the tables behind them."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(options.num_threads)
    try:
        return _diagnose(task, model_dir, options, progress, model_name or model_dir)
    finally:
        torch.set_num_threads(threads)


def _diagnose(task: TaskConfig, model_dir: str, options: Options, progress, model_name: str) -> Diagnosis:
    from bertcore.eval.encoder import load_tokenizer

    kind, metric = task.kind, task.kind.primary_metric
    started = time.perf_counter()
    train, others, names, skipped = _read(task)
    tokenizer = load_tokenizer(model_dir)
    seed_list = list(options.seeds or task.seeds)
    held_rows = None  # the evaluation split's rows in their file: the validation file's own
    if task.validation is not None:
        fit_rows, held = train, others["validation"]
        run_key, evaluated_on = "full", f"the validation file ({len(held)} rows)"
    else:  # cross-validated: the evaluate stage's first fold, rows of the training file
        train_idx, held_rows = fold_splits(task, train)[0]
        fit_rows, held = [train[i] for i in train_idx], [train[i] for i in held_rows]
        run_key, evaluated_on = "fold0", f"cross-validation fold 1 ({len(held)} rows of the training file)"
    if not kind.trains:
        evaluated_on = f"the word pairs ({len(held)})"
    out = Diagnosis(task.name, kind.name, metric, model_name, evaluated_on, [])

    splits = {"train": train, **others} if train else dict(others)
    found: list[Finding] = [_leakage(task, train, others, out), data.rows_finding(kind, splits, skipped, task.on_error)]
    found.append(data.length_finding(kind, tokenizer, task, splits, _positions(model_dir)))
    if not kind.trains:
        texts = [" ".join(kind.text_parts(e)) for e in held[: options.mlm_texts]]
        checks = start.pipeline_checks(model_dir, options.vocab_dir, texts)
        found.append(start.pipeline_finding(checks, kind.pooled, task.pooling))
        out.findings = ordered(found + _untrained(task, model_dir, held, seed_list, progress, out))
        out.timings["total_s"] = time.perf_counter() - started
        return out

    grid = optimisation.rates(task.learning_rate, options.learning_rates)
    clock = _Clock(len(seed_list) * 2 + len(grid) - 1 + options.folds, progress)
    fits = _fits(task, model_dir, tokenizer, names, fit_rows, held, run_key, seed_list, grid, clock)
    entry = _entry(task, names, fit_rows, held, fits)
    score = entry["pretrained"]["validation"][metric]["median"]
    floor = (kind.majority(task, names, fit_rows, held) or {}).get(metric)
    found.append(data.balance_finding(kind, task, names, fit_rows, held, evaluated_on, score))

    ranked, fold_score = _suspects(task, model_dir, tokenizer, names, train, seed_list[0], options.folds, clock)
    out.suspects, out.suspect_score = ranked
    train_floor = (kind.majority(task, names, train, train) or {}).get(metric)
    margin = 2 * optimisation.noise(metric, fold_score, len(train))  # what the out-of-fold score must beat the floor by
    found.append(
        labels.suspect_finding(kind, out.suspects, out.suspect_score, options.folds, fold_score, train_floor, margin)
    )

    out.sweep = fits["sweep"]
    units = sum(len(one.given_classes) or 1 for one in fits["judged"])
    tolerance = optimisation.noise(metric, max(p.score for p in out.sweep), units)  # one standard error
    found.append(optimisation.sweep_finding(out.sweep, task.learning_rate, metric, tolerance, floor, fits["task_rate"]))
    out.curve = fits["curve"]
    found += optimisation.curve_findings(out.curve, metric, tolerance, task.early_stopping_patience, floor)

    texts = [" ".join(kind.text_parts(e)) for e in held[: options.mlm_texts]]
    checks = start.pipeline_checks(model_dir, options.vocab_dir, texts)
    found.append(start.pipeline_finding(checks, kind.pooled, task.pooling))
    found.append(_forgetting(task, model_dir, tokenizer, texts, fits["model"], clock))
    found.append(start.starting_point_finding(entry, metric))
    found.append(seeds.seeds_finding(entry, metric))

    judged = fits["judged"]
    out.classes = kind.classes(task, names)
    matrix = errors.confusion(judged, len(out.classes)) if out.classes else None
    out.confusion = matrix.tolist() if matrix is not None else None
    out.per_class = errors.per_class(matrix, out.classes) if matrix is not None else []
    out.worst = errors.worst(kind, held, judged, options.worst, held_rows)
    found.append(errors.errors_finding(kind, out.classes, matrix, out.per_class, out.worst, judged, evaluated_on))

    out.findings = ordered(found)
    out.fits, out.timings = clock.done, {**clock.timings, "total_s": time.perf_counter() - started}
    return out


def _positions(model_dir: str) -> int | None:
    import json
    import os

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as handle:
        return json.load(handle).get("max_position_embeddings")


def _leakage(task: TaskConfig, train: list, others: dict, out: Diagnosis) -> Finding:
    kind = task.kind
    if not train:
        return not_applicable("leakage", f"a {kind.name} task has no training file to leak from")
    if others:
        out.leaks = data.leaks(kind, train, others)
        return data.leakage_finding(out.leaks, {s: len(r) for s, r in others.items()}, cross_validated=False)
    folds = [held_idx for _, held_idx in fold_splits(task, train)]
    out.leaks = data.fold_leaks(kind, train, folds)
    return data.leakage_finding(out.leaks, {"train": len(train)}, cross_validated=True)


def _fits(task, model_dir, tokenizer, names, fit_rows, held, run_key, seed_list, grid, clock) -> dict:
    """The task's fit per seed (the first measured per epoch and judged), random init per
    seed, and the first seed at every other rate of the sweep."""
    from bertcore.eval import finetune

    kind, metric = task.kind, task.kind.primary_metric
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    features, extra = kind.features(held, tokenizer, task, names)
    curve = optimisation.Curve([], [], [])

    def measure(model, epoch: int) -> None:
        curve.evaluate.append(finetune.mean_loss(model, kind, features, pad, max(64, task.batch_size)))
        outputs = finetune.predict(model, kind, features, pad, max(64, task.batch_size))
        curve.scores.append(kind.score(task, names, held, outputs, extra)[metric])

    out: dict = {"pretrained": [], "random_init": [], "sweep": [], "curve": curve, "task_rate": []}
    for random_init in (False, True):
        label = "random init" if random_init else "pretrained"
        for seed in seed_list:
            first = seed == seed_list[0] and not random_init

            def run(seed=seed, random_init=random_init, first=first):
                return finetune.fit(
                    task,
                    model_dir,
                    tokenizer,
                    names,
                    seed,
                    random_init,
                    fit_rows,
                    run_key,
                    after_epoch=measure if first else None,
                )

            model, trained = clock.fit(f"{label}, seed {seed}", "seeds_s", run)
            outputs = finetune.predict(model, kind, features, pad, max(64, task.batch_size))
            scores = kind.score(task, names, held, outputs, extra)
            out["random_init" if random_init else "pretrained"].append((seed, scores, trained))
            if not random_init:
                out["task_rate"].append(optimisation.SweepPoint(task.learning_rate, scores[metric], trained.losses))
            if first:
                curve.train, curve.best_epoch = trained.losses, trained.best_epoch
                out["judged"] = kind.judge(task, names, held, outputs, extra)
                out["model"] = model
                out["sweep"].append(optimisation.SweepPoint(task.learning_rate, scores[metric], trained.losses))
    for lr in grid:
        if lr == task.learning_rate:
            continue
        at = task.model_copy(update={"learning_rate": lr})
        model, trained = clock.fit(
            f"learning rate {lr:g}",
            "sweep_s",
            lambda at=at: finetune.fit(at, model_dir, tokenizer, names, seed_list[0], False, fit_rows, run_key),
        )
        outputs = finetune.predict(model, kind, features, pad, max(64, task.batch_size))
        scores = kind.score(at, names, held, outputs, extra)
        out["sweep"].append(optimisation.SweepPoint(lr, scores[metric], trained.losses))
    out["sweep"].sort(key=lambda p: p.learning_rate)
    return out


def _entry(task: TaskConfig, names: list[str], fit_rows: list, held: list, fits: dict) -> dict:
    """The task entry bertcore/eval/summary.py judges, from the fits on the evaluation split."""
    from bertcore.eval.summary import task_entry

    majority = task.kind.majority(task, names, fit_rows, held)

    def run(seed: int, scores: dict, trained) -> dict:
        return {
            "seed": seed,
            "validation": scores,
            "labels": names,
            "train_examples": len(fit_rows),
            "fit_examples": [len(fit_rows)],
            "baselines": {} if majority is None else {"validation": {"majority": majority}},
            "skipped": {},
            "skipped_problems": [],
            "final_train_loss": trained.final_train_loss,
            "epochs_trained": trained.epochs,
            "best_epoch": trained.best_epoch,
        }

    runs = {model: [run(*fit) for fit in fits[model]] for model in ("pretrained", "random_init")}
    return task_entry(task, runs, "pretrained")


def _suspects(task, model_dir, tokenizer, names, train, seed, folds, clock):
    """((ranked suspects, what their score is), the out-of-fold models' mean primary metric):
    each training row judged by the model fine-tuned on the other folds."""
    from bertcore.eval import finetune

    kind, metric = task.kind, task.kind.primary_metric
    split = fold_splits(task.model_copy(update={"cross_validation_folds": folds}), train)
    judged: list = [None] * len(train)
    fold_scores = []
    for k, (train_idx, held_idx) in enumerate(split):
        rows = [train[i] for i in train_idx]
        model, _ = clock.fit(
            f"out-of-fold {k + 1}/{folds}",
            "out_of_fold_s",
            lambda rows=rows, k=k: finetune.fit(task, model_dir, tokenizer, names, seed, False, rows, f"oof{k}"),
        )
        held = [train[i] for i in held_idx]
        outputs, extra = finetune.outputs_of(model, task, tokenizer, names, held)
        fold_scores.append(kind.score(task, names, held, outputs, extra)[metric])
        for i, one in zip(held_idx, kind.judge(task, names, held, outputs, extra)):
            judged[i] = one
    return labels.rank(kind, train, judged), float(sum(fold_scores) / len(fold_scores))


def _forgetting(task, model_dir, tokenizer, texts, model, clock) -> Finding:
    from bertcore.errors import InputDataError
    from bertcore.model.folder import check_model_folder

    if task.freeze_encoder:
        return start.forgetting_finding(None, "", frozen=True)
    try:
        has_head = check_model_folder(model_dir, "--model").has_mlm_head
    except InputDataError as exc:
        return start.forgetting_finding(None, f"cannot read the model's MLM head ({exc})", frozen=False)
    if not has_head:
        return start.forgetting_finding(
            None, "the model has no MLM head (an encoder or embedding model) to read held-out MLM accuracy with", False
        )
    started = time.perf_counter()
    batches = start.mlm_batches(tokenizer, texts, seed=0, max_length=task.max_seq_length)
    measured = start.forgetting(
        model_dir, {k: v.detach().cpu() for k, v in model.encoder.state_dict().items()}, batches
    )
    clock.timings["forgetting_s"] = time.perf_counter() - started
    return start.forgetting_finding(measured, "", frozen=False)


def _untrained(task: TaskConfig, model_dir: str, held: list, seed_list: list[int], progress, out: Diagnosis):
    """A task that trains nothing (word similarity): the starting point by the rank test
    against random-init draws; the findings that need a fine-tune do not apply."""
    from bertcore.eval.summary import task_entry

    kind = task.kind
    runs = {"pretrained": [kind.score_encoder(task, model_dir, model_dir, seed_list[0], random_init=False)]}
    runs["random_init"] = []
    for seed in seed_list:
        runs["random_init"].append(kind.score_encoder(task, model_dir, model_dir, seed, random_init=True))
        progress(f"random init {len(runs['random_init'])}/{len(seed_list)}: seed {seed}")
    for model_runs in runs.values():
        for seed, one in zip(seed_list, model_runs):
            one["seed"] = seed
    entry = task_entry(task, runs, "pretrained")
    why = f"a {kind.name} task fine-tunes nothing"
    return [
        start.starting_point_finding(entry, kind.primary_metric),
        not_applicable("balance", f"a {kind.name} task has no classes, so no majority class to score"),
        not_applicable("suspect_labels", f"{why}: there are no out-of-fold predictions to judge its scores by"),
        not_applicable("learning_rate", f"{why}: no learning rate to sweep"),
        not_applicable("loss_curve", f"{why}: no loss to follow"),
        not_applicable("early_stopping", f"{why}: no epochs to stop after"),
        not_applicable("forgetting", f"{why}: the encoder is read as it is"),
        not_applicable("errors", f"{why}: its score is one correlation over all the pairs"),
        not_applicable(
            "seeds", f"{why}: the pretrained score is the same for every seed (random init draws are in starting_point)"
        ),
    ]
