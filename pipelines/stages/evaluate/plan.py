"""The evaluate stage's plan: which models it scores (the pretrained model, or after
distillation the teacher, the student, its start and a random init) and the jobs it runs
on them (intrinsic, fine-tuning per task, train fraction and seed, embeddings, fill-mask,
speed), each with the name of its progress marker and what it is expected to cost (for
the stage's ETA: tokens passed through the model, forward and backward, times the model's
size). Task files are checked here, before any job starts, so an unusable file or fraction
is one line naming it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from bertcore.errors import ConfigError, InputDataError
from bertcore.eval import summary
from bertcore.eval.config import EmbeddingsConfig, EvaluateConfig, TaskConfig
from bertcore.eval.distillation import START
from bertcore.eval.fractions import check_fractions
from bertcore.eval.tasks import check_task_files
from bertcore.examples.config import ExamplesConfig
from bertcore.model.hf_files import START_DIR
from bertcore.rng import keyed_numpy
from bertcore.train.export import HF_FILES, MODEL_DIR
from bertcore.train.shard_cache import ShardRef
from pipelines.progress import Cost
from pipelines.shards import read_batches
from pipelines.stage import StageRun, Upstream
from pipelines.stages.evaluate.jobs import Model, local_task, original_paths
from pipelines.storage import Storage

log = logging.getLogger(__name__)


SENTENCE_POOL = 50
"""Embedding sentences are sampled from at most this many times `embeddings.sentences` corpus sentences."""


@dataclass
class Job:
    key: str
    """Name of the job's progress marker, e.g. finetune__sst2__pretrained__seed1."""
    kind: str
    model: Model
    phase: str | None = None
    task: TaskConfig | None = None
    task_seed: int = 0
    fraction: float = 1.0
    """finetune: the share of the training examples it fine-tunes on."""
    keep_model: bool = False
    """finetune: save the model fine-tuned on the whole training file (heads/)."""
    shards: list[ShardRef] = field(default_factory=list)
    """intrinsic: the phase's validation shards, read through a cache the job removes."""
    train_shards: list[str] = field(default_factory=list)
    cost: Cost = field(default_factory=lambda: Cost(1.0))
    """What the job is expected to cost (`job_cost`), for the stage's ETA."""


def finetune_key(task: str, model: str, fraction: float, seed: int) -> str:
    """A fine-tuning job's marker name (a fraction as Python writes it, so two fractions
    never share one); on the whole training file, the name it had before train_fractions."""
    share = "" if fraction >= 1.0 else f"__fraction{float(fraction)!r}"
    return f"finetune__{task}__{model}{share}__seed{seed}"


def embedding_sentences(
    storage: Storage, corpus: Upstream, cfg: EmbeddingsConfig, seed: int, notes: list[str]
) -> list[str]:
    """Up to cfg.sentences held-out corpus sentences, sampled with a keyed RNG from the first
    SENTENCE_POOL x that many of the validation split (in shard order)."""
    pool: list[str] = []
    limit = SENTENCE_POOL * cfg.sentences
    for shard in corpus.manifest.shards_under("validation/"):
        for batch in read_batches(storage, corpus.path(shard.path)):
            pool.extend(s for doc in batch.column("sentences").to_pylist() for s in doc if s.strip())
            if len(pool) >= limit:
                break
        if len(pool) >= limit:
            break
    pool = pool[:limit]
    if len(pool) < 2:
        notes.append("embeddings: the corpus validation split has fewer than 2 sentences; skipped")
        return []
    rng = keyed_numpy(seed, "evaluate", "embedding-sentences")
    chosen = sorted(rng.choice(len(pool), size=min(cfg.sentences, len(pool)), replace=False))
    return [pool[i] for i in chosen]


@dataclass
class Plan:
    """The jobs of one evaluation and what they share."""

    cfg: EvaluateConfig
    """The section with local absolute file paths."""
    signatures: dict[str, str]
    models: list[Model]
    """pretrained (or teacher and student), then random_init when the baseline runs."""
    subject: Model
    """The model judged against random init: pretrained, or the student after distillation.
    Its folder holds the tokenizer files every model shares."""
    trained: Upstream
    """The stage that trained the subject (pretrain or distill): its phases and training log."""
    jobs: list[Job] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    masked_lm: bool = True
    """Whether the subject's folder holds an MLM head (an embedding model, the student of one, has none)."""
    sizes: dict[str, float] = field(default_factory=dict)
    """Per model name, its compute per token (layers x hidden size squared; 1 when unknown)."""

    def size(self, model: Model) -> float:
        return self.sizes.get(model.name, 1.0)

    examples_cfg: ExamplesConfig | None = None
    sentences: list[str] = field(default_factory=list)


def models_of(r: StageRun, baseline: bool) -> tuple[list[Model], Model, Upstream]:
    """The models to score, the subject, and the stage that trained it. After distillation:
    the teacher (the folder the distill stage recorded), the student, the student's start
    (distill/student-start/: before its first step) and a random init of the student's
    architecture; otherwise the pretrained model and its random init."""
    if "distill" in r.inputs:
        distill = r.inputs["distill"]
        subject = Model("student", distill.path(MODEL_DIR), _model_files(distill), f"eval-{distill.fingerprint}")
        models, trained = [_teacher(r, distill), subject], distill
        if distill.manifest.shards_under(f"{START_DIR}/"):  # a distill stage of before the start was kept has none
            models.append(Model(START, distill.path(START_DIR), HF_FILES, f"eval-start-{distill.fingerprint}"))
    else:
        pretrain = r.inputs["pretrain"]
        subject = Model("pretrained", pretrain.path(MODEL_DIR), _model_files(pretrain), f"eval-{pretrain.fingerprint}")
        models, trained = [subject], pretrain
    if not r.storage.exists(f"{subject.uri}/config.json"):
        stage = trained.dir.directory
        raise ConfigError(
            f"{subject.uri}: no exported model (config.json missing); re-run the {stage} stage (`bertpipe "
            f"run --only {stage} --force`)"
        )
    if baseline:
        models.append(Model("random_init", subject.uri, subject.files, subject.cache_key, random_init=True))
    return models, subject, trained


def _model_files(trained: Upstream) -> tuple[str, ...]:
    """The files of the stage's model/ folder as its manifest lists them (a RoBERTa export
    has vocab.json and merges.txt where a BERT one has vocab.txt)."""
    listed = tuple(s.path.removeprefix(MODEL_DIR + "/") for s in trained.manifest.shards_under(MODEL_DIR + "/"))
    return listed or HF_FILES


def _teacher(r: StageRun, distill: Upstream) -> Model:
    """The distill stage's teacher: its config.json and weights (the tokenizer is the student's),
    as the distill stage read them: evaluate's fingerprint covers the teacher's content
    through the distill stage's, so a teacher changed since is refused, not scored."""
    from pipelines.external import model_folder

    uri = distill.manifest.inputs.get("teacher")
    if uri is None:
        raise ConfigError(
            f"{distill.dir.uri}: the distill manifest names no teacher; re-run the distill stage (`bertpipe "
            "run --only distill --force`)"
        )
    folder = model_folder(r.storage, uri, "distill.teacher", sentence_files=True)
    learned = (distill.manifest.inputs.get("external") or {}).get("teacher")  # what the distill fingerprint covers
    if learned is not None and learned != folder.identity:
        changed = sorted(k for k in {*learned, *folder.identity} if learned.get(k) != folder.identity.get(k))
        raise ConfigError(
            f"distill.teacher: {', '.join(changed)} changed since the distill stage ran, so its student "
            "learned from other weights; "
            "run `bertpipe run --only distill,evaluate` (evaluate compares a student with the teacher it learned from)"
        )
    return Model("teacher", folder.uri, tuple(folder.files), folder.cache_key)


def check_files(task: TaskConfig, key: str, storage, signatures: dict[str, str]) -> dict[str, int]:
    """`check_task_files` and `check_fractions` on local copies of the task's files: the
    number of examples per split; messages name the recipe's URIs and `key`, the task's
    place in the recipe."""
    local, back = local_task(task, storage, signatures)
    try:
        counts = check_task_files(local)
        check_fractions(local, f"{key}.train_fractions")
    except InputDataError as exc:
        raise type(exc)(original_paths(str(exc), back)) from None
    return counts


def finetune_cost(task: TaskConfig, counts: dict[str, int], fraction: float, size: float) -> float:
    """Tokens a fine-tuning job passes through the model (at most max_seq_length an example;
    training counts three passes, forward and backward), times the model's size: each fold's
    training share for `epochs`, then what it scores. A task that does not train scores only."""
    train, scored = counts.get("train", 0), counts.get("validation", 0) + counts.get("test", 0)
    trained = 0.0
    if task.kind.trains:
        folds = task.cross_validation_folds
        trained = (folds - 1 if folds else 1) * train * fraction * task.epochs
        scored += train if folds else 0
    return (3 * trained + scored) * task.max_seq_length * size


def plan_jobs(plan: Plan, r: StageRun, max_positions: int) -> None:
    """One job per (intrinsic phase | task and seed | embeddings) and model; one speed job
    for the three models of a distillation."""
    cfg = plan.cfg
    masked_lm = cfg.intrinsic.enabled and plan.masked_lm
    if cfg.intrinsic.enabled and not plan.masked_lm:
        plan.notes.append(
            f"intrinsic: the {plan.subject.name} has no MLM head (an embedding model, as its teacher), so "
            "held-out MLM and fill-mask are not scored"
        )
    if masked_lm:
        examples = r.inputs["examples"]
        from bertcore.eval.intrinsic import phases_to_score

        plan.examples_cfg = ExamplesConfig.model_validate(examples.manifest.config)
        trained = [p.get("name") for p in (plan.trained.manifest.config or {}).get("phases", []) if isinstance(p, dict)]
        phases = phases_to_score(cfg.intrinsic, plan.examples_cfg, trained, max_positions, plan.notes)
        for phase in phases:
            validation = [s for s in examples.manifest.shards_under(f"{phase.name}/validation/") if s.rows]
            if not validation:
                plan.notes.append(f"intrinsic: phase {phase.name} has no validation sequences")
                continue
            shards = [examples.ref(s) for s in validation]
            train = [examples.path(s.path) for s in examples.manifest.shards_under(f"{phase.name}/train/") if s.rows]
            rows = sum(s.rows for s in validation)
            if cfg.intrinsic.max_batches is not None:
                rows = min(rows, cfg.intrinsic.max_batches * cfg.intrinsic.batch_size)
            for model in plan.models:
                if model is plan.subject or model.random_init:  # the masked-LM skill of the subject against random init
                    units = rows * plan.examples_cfg.phase(phase.name).max_seq_length * plan.size(model)
                    plan.jobs.append(
                        Job(
                            f"intrinsic__{phase.name}__{model.name}",
                            "intrinsic",
                            model,
                            phase=phase.name,
                            shards=shards,
                            train_shards=train,
                            cost=Cost(units, (f"intrinsic/{phase.name}", "intrinsic")),
                        )
                    )
    for i, task in enumerate(cfg.tasks):
        counts = check_files(
            task, f"evaluate.tasks[{i}]", r.storage, plan.signatures
        )  # an unusable file or fraction is one line, before any job starts
        for fraction in task.train_fractions:
            for model in plan.models:
                cost = Cost(
                    finetune_cost(task, counts, fraction, plan.size(model)),
                    (
                        f"finetune/{task.name}/{fraction}/{model.name}",
                        f"finetune/{task.name}/{fraction}",
                        f"finetune/{task.name}",
                        "finetune",
                    ),
                )
                for task_seed in summary.seeds_of(task, model.random_init):
                    # the kept model: the subject's first seed on the largest fraction (the whole file by default)
                    keep = model is plan.subject and task.kind.trains and task_seed == task.seeds[0]
                    keep = keep and fraction == task.train_fractions[-1]
                    key = finetune_key(task.name, model.name, fraction, task_seed)
                    plan.jobs.append(
                        Job(
                            key,
                            "finetune",
                            model,
                            task=task,
                            task_seed=task_seed,
                            fraction=fraction,
                            keep_model=keep,
                            cost=cost,
                        )
                    )
    fill_mask = masked_lm and cfg.intrinsic.fill_mask > 0
    if cfg.embeddings.enabled or fill_mask:
        plan.sentences = embedding_sentences(r.storage, r.inputs["corpus"], cfg.embeddings, r.seed, plan.notes)
    if plan.sentences and cfg.embeddings.enabled:
        for model in plan.models:
            units = len(plan.sentences) * cfg.embeddings.max_seq_length * plan.size(model)
            plan.jobs.append(Job(f"embeddings__{model.name}", "embeddings", model, cost=Cost(units, ("embeddings",))))
    if plan.sentences and fill_mask:
        units = cfg.intrinsic.fill_mask * 128 * plan.size(plan.subject)
        plan.jobs.append(Job(f"fill_mask__{plan.subject.name}", "fill_mask", plan.subject, cost=Cost(units)))
    if plan.subject.name == "student" and cfg.speed.enabled:
        plan.jobs.append(Job("speed", "speed", plan.subject))
