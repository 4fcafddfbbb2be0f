"""Evaluate stage: the pretrained model's held-out MLM/NSP scores, tasks against a randomly
initialised model of the same size, and sentence embeddings, each beside what learning
nothing scores, with a verdict per task (bertcore/eval/summary.py), written as
`eval/metrics.json`, `eval/report.md` and `eval/plots/*.png` under the run root.

Ray shape: one task per job, all submitted together (at most `parallelism` in flight,
`evaluate.num_gpus` of a GPU each when set):
- intrinsic: one per (examples phase, pretrained | random init), over the phase's
  validation shards (and its training shards, for the unigram baseline);
- tasks: one per (task, seed, pretrained | random init); cross-validation folds run
  inside the job;
- embeddings: one per (pretrained | random init); fill-mask: one, pretrained.
Each finished job leaves `_progress/<job>.json` with its result, so an evaluation that
crashed, re-run with the same fingerprint, computes only the jobs still missing. Remote
files (model, task files) are copied to a per-content local cache in the worker that reads
them, because transformers and the task readers read local folders.

fingerprint = hash(code version + evaluate section without its file paths + pretrain,
examples and corpus fingerprints + run seed + the content signature of every task file),
so editing a task file in place re-runs the evaluation and moving it does not.

The module is a little over 500 lines: it is the one place that turns the section into
jobs, runs them on Ray and folds their results into metrics; the scoring, floors,
verdicts and report live in bertcore/eval.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import ray

from bertcore.errors import BertpipeError, ConfigError
from bertcore.eval import finetune, report, summary
from bertcore.eval.config import (
    TASK_FILES,
    EmbeddingsConfig,
    EvaluateConfig,
    IntrinsicConfig,
    SpeedConfig,
    TaskConfig,
)
from bertcore.examples_config import ExamplesConfig, PhaseConfig
from bertcore.export import HF_FILES, MODEL_DIR
from bertcore.metrics_log import METRICS
from bertcore.rng import keyed_numpy, keyed_seed
from pipelines.ray_runtime import run_tasks
from pipelines.shards import local_copy, local_folder, read_batches
from pipelines.stage import (
    External,
    Output,
    ShardInfo,
    Stage,
    StageDir,
    StageRun,
    Upstream,
)
from pipelines.storage import Storage, is_local

log = logging.getLogger(__name__)

SENTENCE_POOL = 50
"""Embedding sentences are sampled from at most this many times `embeddings.sentences` corpus sentences."""


# -- local copies -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """A model under evaluation: its name in metrics.json (pretrained; or teacher, student
    after distillation; random_init), the folder its encoder is read from (for random_init:
    the architecture's), the files read there, and whether its weights are fresh."""

    name: str
    uri: str
    files: tuple[str, ...]
    cache_key: str
    random_init: bool = False

    def local(self, storage: Storage) -> str:
        """A local folder with its files (the folder itself when it is local)."""
        return local_folder(storage, self.uri, list(self.files), self.cache_key)


def _local_file(storage: Storage, uri: str, file_keys: dict[str, str]) -> str:
    """A local path for a task or STS file. A local one is read where it is, under the
    name the recipe gave (local_copy would turn a file:// URI into a bare path); a remote
    one is cached per content, so an edited file is fetched again."""
    return uri if is_local(uri) else local_copy(storage, uri, f"eval-{file_keys[uri]}")


def _local_task(task: TaskConfig, storage: Storage, file_keys: dict[str, str]) -> tuple[TaskConfig, dict[str, str]]:
    """The task with its files as local paths, and {local path: original URI} for messages."""
    uris = {split: getattr(task, split) for split in TASK_FILES if getattr(task, split) is not None}
    update = {split: _local_file(storage, uri, file_keys) for split, uri in uris.items()}
    return task.model_copy(update=update), {update[split]: uri for split, uri in uris.items()}


def _original_paths(text: str, back: dict[str, str]) -> str:
    for local, uri in back.items():
        text = text.replace(local, uri)
    return text


def _threads(num_threads: int) -> None:
    import torch

    torch.set_num_threads(num_threads)


# -- Ray jobs -----------------------------------------------------------------------------------


UNIGRAM_ROWS = 200_000
"""Training sequences read to count token frequencies for the unigram MLM baseline."""


def _unigram_counts(storage: Storage, shard_uris: list[str], vocab: list[str]):
    """Token counts of the MLM targets of a phase's training shards (at most UNIGRAM_ROWS sequences)."""
    from bertcore.eval.baselines import target_counts

    specials = [i for i, token in enumerate(vocab) if token.startswith("[") and token.endswith("]")]
    batches = (batch for uri in shard_uris for batch in read_batches(storage, uri))
    return target_counts(batches, len(vocab), specials, max_rows=UNIGRAM_ROWS)


@ray.remote(max_retries=1)
def _intrinsic_job(
    model: Model,
    shard_uris: list[str],
    train_uris: list[str],
    phase: PhaseConfig,
    examples_cfg: ExamplesConfig,
    cfg: IntrinsicConfig,
    seed: int,
    storage: Storage,
    cache_key: str,
    num_threads: int,
) -> dict:
    """MLM/NSP scores of one phase's validation shards, with the unigram and label-balance baselines."""
    from bertcore.data import ExamplesLoader
    from bertcore.eval.finetune import device
    from bertcore.eval.intrinsic import held_out_scores, load_pretraining_model
    from bertcore.masking import VocabTables
    from bertcore.tokenizer import VOCAB_FILE, read_vocab

    _threads(num_threads)
    model_dir = model.local(storage)
    tokens = read_vocab(os.path.join(model_dir, VOCAB_FILE))
    model = load_pretraining_model(model_dir, random_init=model.random_init, seed=seed).to(device())
    mask_config = None
    if examples_cfg.masking == "dynamic":
        mask_config = examples_cfg.mask_config(phase, VocabTables.from_tokens(tokens))
    paths = [local_copy(storage, uri, cache_key) for uri in shard_uris]
    loader = ExamplesLoader(
        paths,
        cfg.batch_size,
        seed=keyed_seed(seed, "evaluate", "intrinsic", phase.name) >> 1,  # the dynamic masks: fixed, the same for both models
        masking=examples_cfg.masking,
        mask_config=mask_config,
        pad_id=model.cfg.pad_token_id,
        shuffle=False,
        even_batches=False,
    )
    counts = _unigram_counts(storage, train_uris, tokens) if train_uris else None
    scores = held_out_scores(model, loader, max_batches=cfg.max_batches, unigram_counts=counts)
    if not _has_nsp_head(model_dir):  # e.g. a distilled student: its NSP head would be random, its scores noise
        scores = {k: v for k, v in scores.items() if not k.startswith("nsp_")}
        scores["baselines"] = {**scores["baselines"], "nsp_balance": None}
    unigram = scores["baselines"]["unigram"]
    if unigram:
        unigram["token"] = tokens[unigram["token_id"]]
    return scores


def _has_nsp_head(model_dir: str) -> bool:
    """Whether the folder's model was exported with its next-sentence head (BertForPreTraining)."""
    import json

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as handle:
        return "BertForPreTraining" in (json.load(handle).get("architectures") or ["BertForPreTraining"])


@ray.remote(max_retries=1)
def _fill_mask_job(model: Model, sentences: list[str], count: int, seed: int, storage: Storage, num_threads: int) -> list[dict]:
    """The pretrained model's top guesses for one masked word in each of a few held-out sentences."""
    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.intrinsic import fill_mask, load_pretraining_model

    _threads(num_threads)
    model_dir = model.local(storage)
    return fill_mask(load_pretraining_model(model_dir), load_tokenizer(model_dir), sentences, seed=seed, count=count)


@ray.remote(max_retries=1)
def _finetune_job(
    task: TaskConfig, model: Model, tokenizer: Model, task_seed: int, storage: Storage, file_keys: dict[str, str], num_threads: int
) -> dict:
    """One fine-tuning run (all folds of one seed); file names in messages are the task's URIs.
    `tokenizer`: the model whose folder holds the tokenizer files (every model shares the vocabulary)."""
    local, back = _local_task(task, storage, file_keys)
    try:
        result = finetune.run_task(local, model.local(storage), tokenizer.local(storage), task_seed, random_init=model.random_init, num_threads=num_threads)
    except BertpipeError as exc:
        raise type(exc)(_original_paths(str(exc), back)) from None
    result["skipped_problems"] = [_original_paths(p, back) for p in result["skipped_problems"]]
    return result


@ray.remote(max_retries=1)
def _embeddings_job(
    model: Model, tokenizer: Model, sentences: list[str], cfg: EmbeddingsConfig, seed: int, storage: Storage, file_keys: dict[str, str], num_threads: int
) -> dict:
    """Anisotropy (and STS Spearman) for [CLS] and mean pooling."""
    from bertcore.eval.embeddings import embedding_report, read_sts

    pairs, skipped, problems = None, 0, []
    if cfg.sts is not None:
        path = _local_file(storage, cfg.sts.file, file_keys)
        try:
            read = read_sts(cfg.sts, path)
        except BertpipeError as exc:
            raise type(exc)(_original_paths(str(exc), {path: cfg.sts.file})) from None
        pairs, skipped = read.examples, read.skipped
        problems = [_original_paths(p, {path: cfg.sts.file}) for p in read.problems]
    scores = embedding_report(
        model.local(storage), tokenizer.local(storage), sentences, seed=seed, sts_pairs=pairs, num_pairs=cfg.num_pairs,
        max_seq_length=cfg.max_seq_length, random_init=model.random_init, num_threads=num_threads,
    )
    return {"scores": scores, "sts_pairs": len(pairs or []), "skipped": skipped, "skipped_problems": problems}


@ray.remote(max_retries=1)
def _speed_job(models: list[Model], cfg: SpeedConfig, seed: int, storage: Storage, num_threads: int) -> dict:
    """Sequences/s of each model's encoder forward, measured together (bertcore/eval/speed.py)."""
    from bertcore.eval.speed import measure

    folders = {m.name: (m.local(storage), m.random_init) for m in models}
    return measure(folders, batch_size=cfg.batch_size, seq_length=cfg.max_seq_length, passes=cfg.passes, seed=seed, threads=num_threads)


# -- planning -----------------------------------------------------------------------------------


@dataclass
class _Job:
    key: str
    """Name of the job's progress marker, e.g. finetune__sst2__pretrained__seed1."""
    kind: str
    model: Model
    phase: str | None = None
    task: TaskConfig | None = None
    task_seed: int = 0
    shards: list[str] = field(default_factory=list)
    train_shards: list[str] = field(default_factory=list)


def _absolute(uri: str) -> str:
    return os.path.abspath(os.path.expanduser(uri)) if is_local(uri) and "://" not in uri else uri


def identify(eval_cfg: EvaluateConfig, storage: Storage) -> External:
    """The task and STS files. Their identity is {config key: content signature}, not
    where they lie (the section's fingerprint leaves the paths out, see
    `task_location_free`), so a reinstall that moves the bundled files changes nothing;
    the value is (the section with absolute local paths, {file URI: signature}). A file
    that does not exist is a ConfigError naming its key."""
    signatures: dict[str, str] = {}
    identity: dict[str, str] = {}

    def check(uri: str, key: str) -> str:
        uri = _absolute(uri)
        try:
            fs, path = storage.fs(uri)
            found = fs.isfile(path)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot reach {uri} ({exc})") from None
        if not found:
            raise ConfigError(f"{key}: {uri} does not exist (or is a folder); fix the path in the evaluate section")
        signatures[uri] = identity[key.removeprefix("evaluate.")] = storage.signature(uri)
        return uri

    tasks = []
    for i, task in enumerate(eval_cfg.tasks):
        update = {s: check(getattr(task, s), f"evaluate.tasks[{i}].{s}") for s in TASK_FILES if getattr(task, s) is not None}
        tasks.append(task.model_copy(update=update))
    resolved = eval_cfg.model_copy(update={"tasks": tasks})
    sts = eval_cfg.embeddings.sts
    if eval_cfg.embeddings.enabled and sts is not None:
        sts = sts.model_copy(update={"file": check(sts.file, "evaluate.embeddings.sts.file")})
        resolved = resolved.model_copy(update={"embeddings": eval_cfg.embeddings.model_copy(update={"sts": sts})})
    return External(identity=identity, value=(resolved, signatures), summary=f"{len(signatures)} task file(s)")


def task_location_free(config: dict) -> dict:
    """The evaluate section's JSON without where its task and STS files are: `identify`
    puts their content signatures in the fingerprint instead."""
    out = dict(config)
    out["tasks"] = [{k: v for k, v in task.items() if k not in TASK_FILES} for task in config.get("tasks", [])]
    embeddings = dict(config.get("embeddings") or {})
    if isinstance(embeddings.get("sts"), dict):
        embeddings["sts"] = {k: v for k, v in embeddings["sts"].items() if k != "file"}
    out["embeddings"] = embeddings
    return out


def _sentences(storage: Storage, corpus: Upstream, cfg: EmbeddingsConfig, seed: int, notes: list[str]) -> list[str]:
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


def _training_log(storage: Storage, pretrain: Upstream) -> tuple[list[dict], dict | None]:
    uri = pretrain.path(METRICS)
    if not storage.exists(uri):
        return [], None
    records, bad = report.read_training_log(storage.read_text(uri).splitlines())
    summary = {"uri": uri, "records": len(records), "unreadable_lines": bad}
    if records:
        summary["first"], summary["last"] = records[0], records[-1]
    return records, summary


def check(cfg: EvaluateConfig, reads: dict[str, Any]) -> None:
    """What can be checked before anything runs: intrinsic phases are examples phases, and
    no task or embedding input is longer than the pretrained model's positions."""
    phases = [p.name for p in reads["examples"].phases]
    unknown = [p for p in cfg.intrinsic.phases or [] if p not in phases]
    if unknown:
        raise ValueError(f"evaluate.intrinsic.phases: {unknown} are not examples phases (have {phases})")
    pretrain = reads.get("pretrain")
    positions = pretrain.max_position_embeddings if pretrain is not None else None
    if positions is not None:  # None with pretrain.init_from or an external teacher: checked when the stage runs
        _check_lengths(cfg, positions, f"pretrain.model_size {pretrain.model_size}", ValueError)


def _check_lengths(cfg: EvaluateConfig, positions: int, model: str, error: type[Exception]) -> None:
    """No task or embedding input may be longer than the model's positions."""
    lengths = [(f"evaluate.tasks[{i}].max_seq_length", t.max_seq_length) for i, t in enumerate(cfg.tasks)]
    if cfg.embeddings.enabled:
        lengths.append(("evaluate.embeddings.max_seq_length", cfg.embeddings.max_seq_length))
    for key, length in lengths:
        if length > positions:
            raise error(f"{key} ({length}) exceeds the pretrained model's {positions} positions ({model})")


# -- the stage ----------------------------------------------------------------------------------


@dataclass
class _Plan:
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
    jobs: list[_Job] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    examples_cfg: ExamplesConfig | None = None
    sentences: list[str] = field(default_factory=list)


def _models(r: StageRun, baseline: bool) -> tuple[list[Model], Model, Upstream]:
    """The models to score, the subject, and the stage that trained it. After distillation:
    the teacher (the folder the distill stage recorded), the student and a random init of
    the student's architecture; otherwise the pretrained model and its random init."""
    if "distill" in r.inputs:
        distill = r.inputs["distill"]
        subject = Model("student", distill.path(MODEL_DIR), HF_FILES, f"eval-{distill.fingerprint}")
        models, trained = [_teacher(r, distill), subject], distill
    else:
        pretrain = r.inputs["pretrain"]
        subject = Model("pretrained", pretrain.path(MODEL_DIR), HF_FILES, f"eval-{pretrain.fingerprint}")
        models, trained = [subject], pretrain
    if not r.storage.exists(f"{subject.uri}/config.json"):
        stage = trained.dir.directory
        raise ConfigError(f"{subject.uri}: no exported model (config.json missing); re-run the {stage} stage (`bertpipe run --only {stage} --force`)")
    if baseline:
        models.append(Model("random_init", subject.uri, subject.files, subject.cache_key, random_init=True))
    return models, subject, trained


def _teacher(r: StageRun, distill: Upstream) -> Model:
    """The distill stage's teacher: its config.json and weights (the tokenizer is the student's)."""
    from pipelines.external import model_folder

    uri = distill.manifest.inputs.get("teacher")
    if uri is None:
        raise ConfigError(f"{distill.dir.uri}: the distill manifest names no teacher; re-run the distill stage (`bertpipe run --only distill --force`)")
    folder = model_folder(r.storage, uri, "distill.teacher")
    return Model("teacher", folder.uri, tuple(folder.files), folder.cache_key)


def run(r: StageRun) -> Output:
    """Evaluate pretrain/model/ (after distillation: the teacher, distill/model/ and a
    student-sized random init) and write eval/. Needs a running Ray (pipelines.ray_runtime.ensure_ray)."""
    resolved, signatures = r.external
    models, subject, trained = _models(r, resolved.baseline)
    from bertcore.eval.intrinsic import model_config_of

    configs = {m.name: model_config_of(os.path.dirname(local_copy(r.storage, f"{m.uri}/config.json", m.cache_key))) for m in models}
    _check_lengths(resolved, configs[subject.name].max_position_embeddings, f"{subject.uri}/config.json", ConfigError)
    plan = _Plan(resolved, signatures, models, subject, trained)
    _plan_jobs(plan, r, configs[subject.name].max_position_embeddings)

    t0 = time.perf_counter()
    results, reused = _run_jobs(plan, r)
    jobs_s = time.perf_counter() - t0

    for note in plan.notes:
        log.info("evaluate: %s", note)
    records, log_summary = _training_log(r.storage, trained)
    metrics = _metrics(plan, results, configs, log_summary, r.seed, r.fingerprint)
    metrics["timings"] = {"jobs_s": round(jobs_s, 3), "jobs": len(plan.jobs), "jobs_reused": reused}
    skipped = [{"file": uri, "reason": f"{n} malformed row(s) skipped (on_error: skip)"} for uri, n in metrics["skipped_rows"]["files"].items()]
    stats = summary.stats(metrics)
    return Output(
        shards=_write_outputs(r.dir, metrics, records),
        stats=stats,
        timings={"jobs_s": round(jobs_s, 3)},
        skipped=skipped,
        report="report.md",
        tables={"evaluation-scores": report.score_rows(metrics)},
        headline=report.headline(stats),
    )


def _plan_jobs(plan: _Plan, r: StageRun, max_positions: int) -> None:
    """One job per (intrinsic phase | task and seed | embeddings) and model; one speed job
    for the three models of a distillation."""
    cfg = plan.cfg
    if cfg.intrinsic.enabled:
        examples = r.inputs["examples"]
        from bertcore.eval.intrinsic import phases_to_score

        plan.examples_cfg = ExamplesConfig.model_validate(examples.manifest.config)
        trained = [p.get("name") for p in (plan.trained.manifest.config or {}).get("phases", []) if isinstance(p, dict)]
        phases = phases_to_score(cfg.intrinsic, plan.examples_cfg, trained, max_positions, plan.notes)
        for phase in phases:
            shards = [examples.path(s.path) for s in examples.manifest.shards_under(f"{phase.name}/validation/") if s.rows]
            if not shards:
                plan.notes.append(f"intrinsic: phase {phase.name} has no validation sequences")
                continue
            train = [examples.path(s.path) for s in examples.manifest.shards_under(f"{phase.name}/train/") if s.rows]
            for model in plan.models:
                if model.name != "teacher":  # the masked-LM skill of the subject against random init
                    plan.jobs.append(_Job(f"intrinsic__{phase.name}__{model.name}", "intrinsic", model, phase=phase.name, shards=shards, train_shards=train))
    for task in cfg.tasks:
        for model in plan.models:
            for task_seed in summary.seeds_of(task, model.random_init):
                plan.jobs.append(_Job(f"finetune__{task.name}__{model.name}__seed{task_seed}", "finetune", model, task=task, task_seed=task_seed))
    fill_mask = cfg.intrinsic.enabled and cfg.intrinsic.fill_mask > 0
    if cfg.embeddings.enabled or fill_mask:
        plan.sentences = _sentences(r.storage, r.inputs["corpus"], cfg.embeddings, r.seed, plan.notes)
    if plan.sentences and cfg.embeddings.enabled:
        for model in plan.models:
            plan.jobs.append(_Job(f"embeddings__{model.name}", "embeddings", model))
    if plan.sentences and fill_mask:
        plan.jobs.append(_Job(f"fill_mask__{plan.subject.name}", "fill_mask", plan.subject))
    if plan.subject.name == "student" and cfg.speed.enabled:
        plan.jobs.append(_Job("speed", "speed", plan.subject))


def _run_jobs(plan: _Plan, r: StageRun) -> tuple[dict[str, Any], int]:
    """Every job's result, and how many were read back from an interrupted attempt. The
    speed job runs last, alone, so no other job shares the machine while it times."""
    cfg, storage, seed = plan.cfg, r.storage, r.seed

    def submit(job: _Job) -> ray.ObjectRef:
        options = {"num_cpus": cfg.num_threads} | ({"num_gpus": cfg.num_gpus} if cfg.num_gpus else {})
        if job.kind == "intrinsic":
            return _intrinsic_job.options(**options).remote(
                job.model, job.shards, job.train_shards, plan.examples_cfg.phase(job.phase), plan.examples_cfg, cfg.intrinsic,
                seed, storage, job.model.cache_key, cfg.num_threads,
            )
        if job.kind == "fill_mask":
            return _fill_mask_job.options(**options).remote(job.model, plan.sentences, cfg.intrinsic.fill_mask, seed, storage, cfg.num_threads)
        if job.kind == "finetune":
            return _finetune_job.options(**options).remote(job.task, job.model, plan.subject, job.task_seed, storage, plan.signatures, cfg.num_threads)
        if job.kind == "speed":
            return _speed_job.options(num_cpus=cfg.num_threads).remote(plan.models, cfg.speed, seed, storage, cfg.num_threads)
        return _embeddings_job.options(**options).remote(
            job.model, plan.subject, plan.sentences, cfg.embeddings, seed, storage, plan.signatures, cfg.num_threads
        )

    results: dict[str, Any] = {}
    for job in plan.jobs:
        if (done := r.dir.done(job.key, r.fingerprint)) is not None:
            results[job.key] = done.result
    todo = [job for job in plan.jobs if job.key not in results]
    kinds = Counter(job.kind for job in todo)
    log.info(
        "evaluate: %d jobs to run (%s)%s, %d thread(s) each",
        len(todo), ", ".join(f"{n} {kind}" for kind, n in kinds.items()) or "none",
        f", {len(results)} kept from an interrupted attempt" if results else "", cfg.num_threads,
    )
    for batch, parallelism in (([j for j in todo if j.kind != "speed"], r.parallelism), ([j for j in todo if j.kind == "speed"], 1)):
        if not batch:
            continue

        def finished(index: int, result: Any, batch=batch) -> None:
            r.dir.complete(batch[index].key, r.fingerprint, [], result)

        for job, result in zip(batch, run_tasks(submit, batch, parallelism=parallelism, desc="evaluate", on_result=finished, unit="jobs")):
            results[job.key] = result
    return results, len(plan.jobs) - len(todo)


def _model_entry(model: Model, cfg, parameters: int) -> dict:
    return {"uri": model.uri, "parameters": parameters, "config": cfg.model_dump(mode="json"), "random_init": model.random_init}


def _metrics(plan: _Plan, results: dict[str, Any], configs: dict, log_summary, seed: int, fp: str) -> dict:
    """The metrics dictionary (eval/metrics.json): `models` names every model scored, and
    `subject` the one judged against random init (see bertcore/eval/report.py)."""
    import torch

    from bertcore.eval import distillation
    from bertcore.model import BertForPreTraining

    eval_cfg, jobs, subject = plan.cfg, plan.jobs, plan.subject.name
    with torch.device("meta"):  # counts parameters without allocating or initialising them
        models = {m.name: _model_entry(m, configs[m.name], BertForPreTraining(configs[m.name]).num_parameters()) for m in plan.models}
    metrics: dict[str, Any] = {
        "stage": "evaluate",
        "fingerprint": fp,
        "seed": seed,
        "baseline": eval_cfg.baseline,
        "subject": subject,
        "models": models,
        "model": models[subject],
        "pretraining_log": log_summary,
        "intrinsic": {},
        "fill_mask": results.get(f"fill_mask__{subject}", []),
        "tasks": {},
        "embeddings": None,
        "speed": results.get("speed"),
    }
    for job in jobs:
        if job.kind == "intrinsic":
            metrics["intrinsic"].setdefault(job.phase, {})[job.model.name] = results[job.key]

    files: Counter[str] = Counter()
    for task in eval_cfg.tasks:
        runs = {m.name: [results[f"finetune__{task.name}__{m.name}__seed{s}"] for s in summary.seeds_of(task, m.random_init)] for m in plan.models}
        entry = summary.task_entry(task, runs, subject)
        for split, n in entry["skipped"].items():
            if n:
                files[getattr(task, split)] += n
        metrics["tasks"][task.name] = entry

    embedding_jobs = [job for job in jobs if job.kind == "embeddings"]
    if embedding_jobs:
        first = results[embedding_jobs[0].key]
        metrics["embeddings"] = {"sentences": len(plan.sentences), "sts_pairs": first["sts_pairs"]}
        for job in embedding_jobs:
            metrics["embeddings"][job.model.name] = results[job.key]["scores"]
        if first["skipped"]:
            files[eval_cfg.embeddings.sts.file] += first["skipped"]
            metrics["embeddings"]["skipped_problems"] = first["skipped_problems"]
    metrics["skipped_rows"] = {"total": files.total(), "files": dict(files)}
    metrics["verdicts"] = summary.verdicts(metrics)
    if "teacher" in models:
        metrics["distillation"] = distillation.comparisons(metrics)
        metrics["verdicts"] += distillation.lines(metrics)
    metrics["notes"] = plan.notes
    return metrics


def _write_outputs(stage: StageDir, metrics: dict, records: list[dict]) -> list[ShardInfo]:
    """metrics.json, plots/*.png and report.md; returns them as the manifest's shards."""
    storage = stage.storage
    storage.remove(stage.path("plots"), recursive=True)  # a plot an earlier run drew may not apply now
    written = []
    plots: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bertpipe-eval-") as tmp:
        drawn = {
            "pretraining": report.plot_pretraining(records, os.path.join(tmp, "pretraining.png")),
            "tasks": report.plot_tasks(metrics["tasks"], os.path.join(tmp, "tasks.png")),
        }
        for name, ok in drawn.items():
            if ok:
                relative = f"plots/{name}.png"
                with open(os.path.join(tmp, f"{name}.png"), "rb") as handle:
                    written.append((relative, storage.write_bytes(stage.path(relative), handle.read())))
                plots[name] = relative
    metrics_bytes = report.json_dumps(metrics).encode()
    written.append(("metrics.json", storage.write_bytes(stage.path("metrics.json"), metrics_bytes)))
    written.append(("report.md", storage.write_bytes(stage.path("report.md"), report.render_markdown(metrics, plots).encode())))
    return [ShardInfo(path=relative, rows=0, bytes=w.bytes, sha256=w.sha256, stamp=w.stamp) for relative, w in written]


STAGE = Stage(
    "evaluate", EvaluateConfig, run, reads=("pretrain", "distill", "examples", "corpus"), directory="eval", identify=identify, check=check,
    fingerprint_config=task_location_free,
    writes="metrics.json, report.md, plots/*.png",
)
