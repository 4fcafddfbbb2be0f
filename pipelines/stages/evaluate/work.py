"""Evaluate stage: the pretrained model's held-out MLM/NSP scores, tasks against a randomly
initialised model of the same size, and sentence embeddings, each beside what learning
nothing scores, with a verdict per task (bertcore/eval/summary.py), written as
`eval/metrics.json`, `eval/report.md` and `eval/plots/*.png` under the run root; the
scores and verdicts also go to the trackers the training used (TensorBoard files under
`eval/tensorboard/`, the MLflow and W&B runs; bertcore/train/tracking.py).

After distillation (the distill stage ran) the models are four: the teacher, the student
(the "subject", judged against random init as the pretrained model is otherwise), the
student's start (distill/student-start/, before its first distillation step) and a random
init of the student's architecture; the report adds what the student keeps of the
teacher's gain, how much of its own gain the start already had and how much training
added, and the speed of each, measured here (bertcore/eval/distillation.py). A subject
without an MLM head (the student of an embedding teacher) gets no held-out MLM or
fill-mask scores.

Ray shape: one task per job, all submitted together (at most `parallelism` in flight,
`evaluate.num_gpus` of a GPU each when set):
- intrinsic: one per (examples phase, subject | random init), over the phase's
  validation shards (and its training shards, for the unigram baseline);
- tasks: one per (task, seed, model); cross-validation folds run inside the job; the job
  of a task's first seed on the subject also keeps the model fine-tuned on the whole
  training file, `heads/<subject>/<task>.safetensors` (bertcore/eval/heads.py), which
  `bertpipe export --task` puts on the exported encoder;
- embeddings: one per model; fill-mask: one, the subject; speed (after distillation): one,
  after the others, alone (the student's start is not timed: it has the student's shape).
Each finished job leaves `_progress/<job>.json` with its result, so an evaluation that
crashed, re-run with the same fingerprint, computes only the jobs still missing. Remote
files (model, task files) are copied to a per-content local cache in the worker that reads
them, because transformers and the task readers read local folders.

fingerprint = hash(code version + evaluate section without its file paths + pretrain (or
distill), examples and corpus fingerprints + run seed + the content signature of every task file),
so editing a task file in place re-runs the evaluation and moving it does not.

This module turns the section and the models (two, or three after distillation) into
jobs, runs them on Ray and folds their results into metrics; the jobs themselves are in
pipelines/stages/evaluate/jobs.py, and the scoring, floors, verdicts, three-way comparisons and
report in bertcore/eval.
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

from bertcore.train import metrics_log
from bertcore.errors import ConfigError, InputDataError
from bertcore.eval import distillation, report, summary
from bertcore.eval.plots import plot_pretraining, plot_tasks
from bertcore.eval.config import TRAINED_TYPES, EmbeddingsConfig, EvaluateConfig, TaskConfig
from bertcore.eval.tasks import check_task_files
from bertcore.examples.config import ExamplesConfig
from bertcore.eval.distillation import START
from bertcore.model.hf_files import START_DIR
from bertcore.train.export import HF_FILES, MODEL_DIR
from bertcore.train.metrics_log import METRICS, VALIDATION
from bertcore.rng import keyed_numpy
from pipelines.stages.evaluate.jobs import (
    Model,
    embeddings_job,
    fill_mask_job,
    finetune_job,
    has_mlm_head,
    intrinsic_job,
    local_task,
    original_paths,
    speed_job,
)
from pipelines.ray_runtime import run_tasks
from pipelines.shards import local_copy, read_batches
from pipelines.stage import Output, StageRun, Upstream
from pipelines.stage_dir import ShardInfo, StageDir
from pipelines.stages.evaluate import check_lengths
from pipelines.storage import Storage

log = logging.getLogger(__name__)

SENTENCE_POOL = 50
"""Embedding sentences are sampled from at most this many times `embeddings.sentences` corpus sentences."""


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
    keep_model: bool = False
    """finetune: save the model fine-tuned on the whole training file (heads/)."""
    shards: list[str] = field(default_factory=list)
    train_shards: list[str] = field(default_factory=list)




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


def _training_log(storage: Storage, pretrain: Upstream) -> tuple[list[dict], list[dict], dict | None]:
    """The pretraining log's records, its validations, and what the report says of them:
    where the log is (relative to run.root), its final figures (the means over the last
    logging interval, bertcore.train.metrics_log), the last validation and the loss jumps."""
    uri = pretrain.path(METRICS)
    if not storage.exists(uri):
        return [], [], None
    records, bad = report.read_training_log(storage.read_text(uri).splitlines())
    validations: list[dict] = []
    if storage.exists(pretrain.path(VALIDATION)):
        validations, _ = report.read_training_log(storage.read_text(pretrain.path(VALIDATION)).splitlines())
    every = int((pretrain.manifest.config or {}).get("log_every") or 1)
    summary = {
        "uri": f"{pretrain.dir.directory}/{METRICS}",
        "records": len(records),
        "unreadable_lines": bad,
        "log_every": every,
        "final": metrics_log.final(records, every),
        "loss_jumps": [{"step": r["step"], "loss": r["loss"], **r["loss_jump"]} for r in records if r.get("loss_jump")],
        "validations": len(validations),
        "validation": validations[-1] if validations else None,
    }
    return records, validations, summary


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
    masked_lm: bool = True
    """Whether the subject's folder holds an MLM head (an embedding model, the student of one, has none)."""
    examples_cfg: ExamplesConfig | None = None
    sentences: list[str] = field(default_factory=list)


def _models(r: StageRun, baseline: bool) -> tuple[list[Model], Model, Upstream]:
    """The models to score, the subject, and the stage that trained it. After distillation:
    the teacher (the folder the distill stage recorded), the student, the student's start
    (distill/student-start/: before its first step) and a random init of the student's
    architecture; otherwise the pretrained model and its random init."""
    if "distill" in r.inputs:
        distill = r.inputs["distill"]
        subject = Model("student", distill.path(MODEL_DIR), HF_FILES, f"eval-{distill.fingerprint}")
        models, trained = [_teacher(r, distill), subject], distill
        if distill.manifest.shards_under(f"{START_DIR}/"):  # a distill stage of before the start was kept has none
            models.append(Model(START, distill.path(START_DIR), HF_FILES, f"eval-start-{distill.fingerprint}"))
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
    """The distill stage's teacher: its config.json and weights (the tokenizer is the student's),
    as the distill stage read them: evaluate's fingerprint covers the teacher's content
    through the distill stage's, so a teacher changed since is refused, not scored."""
    from pipelines.external import model_folder

    uri = distill.manifest.inputs.get("teacher")
    if uri is None:
        raise ConfigError(f"{distill.dir.uri}: the distill manifest names no teacher; re-run the distill stage (`bertpipe run --only distill --force`)")
    folder = model_folder(r.storage, uri, "distill.teacher", sentence_files=True)
    learned = (distill.manifest.inputs.get("external") or {}).get("teacher")  # what the distill fingerprint covers
    if learned is not None and learned != folder.identity:
        changed = sorted(k for k in {*learned, *folder.identity} if learned.get(k) != folder.identity.get(k))
        raise ConfigError(
            f"distill.teacher: {', '.join(changed)} changed since the distill stage ran, so its student learned from other weights; "
            "run `bertpipe run --only distill,evaluate` (evaluate compares a student with the teacher it learned from)"
        )
    return Model("teacher", folder.uri, tuple(folder.files), folder.cache_key)


def run(r: StageRun) -> Output:
    """Evaluate pretrain/model/ (after distillation: the teacher, distill/model/ and a
    student-sized random init) and write eval/. Needs a running Ray (pipelines.ray_runtime.ensure_ray)."""
    resolved, signatures = r.external
    models, subject, trained = _models(r, resolved.baseline)
    from bertcore.eval.intrinsic import model_config_of

    folders = {m.name: os.path.dirname(local_copy(r.storage, f"{m.uri}/config.json", m.cache_key)) for m in models}
    configs = {name: model_config_of(folder) for name, folder in folders.items()}
    check_lengths(resolved, configs[subject.name].max_position_embeddings, f"{subject.uri}/config.json", ConfigError)
    plan = _Plan(resolved, signatures, models, subject, trained, masked_lm=has_mlm_head(folders[subject.name]))
    _plan_jobs(plan, r, configs[subject.name].max_position_embeddings)

    t0 = time.perf_counter()
    results, reused = _run_jobs(plan, r)
    jobs_s = time.perf_counter() - t0

    for note in plan.notes:
        log.info("evaluate: %s", note)
    records, validations, log_summary = _training_log(r.storage, trained)
    metrics = _metrics(plan, results, configs, log_summary, r.seed, r.fingerprint)
    for model in metrics["models"].values():  # relative to run.root when a stage wrote it: the report survives a move
        model["uri"] = next((f"{up.dir.directory}/{folder}" for up in r.inputs.values() for folder in (MODEL_DIR, START_DIR)
                             if model["uri"] == up.path(folder)), model["uri"])
    metrics["timings"] = {"jobs_s": round(jobs_s, 3), "jobs": len(plan.jobs), "jobs_reused": reused}
    skipped = [{"file": uri, "reason": f"{n} malformed row(s) skipped (on_error: skip)"} for uri, n in metrics["skipped_rows"]["files"].items()]
    stats = summary.stats(metrics)
    return Output(
        shards=_write_outputs(r.dir, metrics, records, validations) + _track(r, trained, metrics) + _saved_models(results),
        stats=stats,
        timings={"jobs_s": round(jobs_s, 3)},
        skipped=skipped,
        report="report.md",
        tables={"evaluation-scores": report.score_rows(metrics)},
        headline=report.headline(stats),
    )


def _check_files(task: TaskConfig, storage, signatures: dict[str, str]) -> None:
    """`check_task_files` on local copies of the task's files; messages name the recipe's URIs."""
    local, back = local_task(task, storage, signatures)
    try:
        check_task_files(local)
    except InputDataError as exc:
        raise type(exc)(original_paths(str(exc), back)) from None


def _plan_jobs(plan: _Plan, r: StageRun, max_positions: int) -> None:
    """One job per (intrinsic phase | task and seed | embeddings) and model; one speed job
    for the three models of a distillation."""
    cfg = plan.cfg
    masked_lm = cfg.intrinsic.enabled and plan.masked_lm
    if cfg.intrinsic.enabled and not plan.masked_lm:
        plan.notes.append(f"intrinsic: the {plan.subject.name} has no MLM head (an embedding model, as its teacher), so held-out MLM and fill-mask are not scored")
    if masked_lm:
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
                if model is plan.subject or model.random_init:  # the masked-LM skill of the subject against random init
                    plan.jobs.append(_Job(f"intrinsic__{phase.name}__{model.name}", "intrinsic", model, phase=phase.name, shards=shards, train_shards=train))
    for task in cfg.tasks:
        _check_files(task, r.storage, plan.signatures)  # an empty or unusable file is one line naming it, before any job starts
        for model in plan.models:
            for task_seed in summary.seeds_of(task, model.random_init):
                keep = model is plan.subject and task.type in TRAINED_TYPES and task_seed == task.seeds[0]
                plan.jobs.append(_Job(f"finetune__{task.name}__{model.name}__seed{task_seed}", "finetune", model, task=task, task_seed=task_seed, keep_model=keep))
    fill_mask = masked_lm and cfg.intrinsic.fill_mask > 0
    if cfg.embeddings.enabled or fill_mask:
        plan.sentences = _sentences(r.storage, r.inputs["corpus"], cfg.embeddings, r.seed, plan.notes)
    if plan.sentences and cfg.embeddings.enabled:
        for model in plan.models:
            plan.jobs.append(_Job(f"embeddings__{model.name}", "embeddings", model))
    if plan.sentences and fill_mask:
        plan.jobs.append(_Job(f"fill_mask__{plan.subject.name}", "fill_mask", plan.subject))
    if plan.subject.name == "student" and cfg.speed.enabled:
        plan.jobs.append(_Job("speed", "speed", plan.subject))


def _saved_models(results: dict[str, Any]) -> list[ShardInfo]:
    """The fine-tuned models the jobs saved (heads/), as shard records."""
    return [ShardInfo(**result["saved"]) for result in results.values() if isinstance(result, dict) and result.get("saved")]


def _run_jobs(plan: _Plan, r: StageRun) -> tuple[dict[str, Any], int]:
    """Every job's result, and how many were read back from an interrupted attempt. The
    speed job runs last, alone, so no other job shares the machine while it times."""
    cfg, storage, seed = plan.cfg, r.storage, r.seed

    def submit(job: _Job) -> ray.ObjectRef:
        options = {"num_cpus": cfg.num_threads} | ({"num_gpus": cfg.num_gpus} if cfg.num_gpus else {})
        if job.kind == "intrinsic":
            return intrinsic_job.options(**options).remote(
                job.model, job.shards, job.train_shards, plan.examples_cfg.phase(job.phase), plan.examples_cfg, cfg.intrinsic,
                seed, storage, job.model.cache_key, cfg.num_threads,
            )
        if job.kind == "fill_mask":
            return fill_mask_job.options(**options).remote(job.model, plan.sentences, cfg.intrinsic.fill_mask, seed, storage, cfg.num_threads)
        if job.kind == "finetune":
            return finetune_job.options(**options).remote(
                job.task, job.model, plan.subject, job.task_seed, storage, plan.signatures, cfg.num_threads, r.dir if job.keep_model else None,
            )
        if job.kind == "speed":  # the student's start has the student's architecture: its speed is the student's
            timed = [m for m in plan.models if m.name != START]
            return speed_job.options(num_cpus=cfg.num_threads).remote(timed, cfg.speed, seed, storage, cfg.num_threads)
        return embeddings_job.options(**options).remote(
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
    batches = (([j for j in todo if j.kind != "speed"], r.parallelism, "evaluate"), ([j for j in todo if j.kind == "speed"], 1, "evaluate: speed"))
    for batch, parallelism, desc in batches:
        if not batch:
            continue

        def finished(index: int, result: Any, batch=batch) -> None:
            r.dir.complete(batch[index].key, r.fingerprint, _saved_models({batch[index].key: result}), result)

        for job, result in zip(batch, run_tasks(submit, batch, parallelism=parallelism, desc=desc, on_result=finished, unit="jobs")):
            results[job.key] = result
    return results, len(plan.jobs) - len(todo)


def _model_entry(model: Model, cfg, parameters: int) -> dict:
    return {"uri": model.uri, "parameters": parameters, "config": cfg.model_dump(mode="json"), "random_init": model.random_init}


def _metrics(plan: _Plan, results: dict[str, Any], configs: dict, log_summary, seed: int, fp: str) -> dict:
    """The metrics dictionary (eval/metrics.json): `models` names every model scored, and
    `subject` the one judged against random init (see bertcore/eval/report.py)."""
    import torch

    from bertcore.model.bert import BertForPreTraining

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
        entry["saved_model"] = next((run["saved"]["path"] for run in runs[subject] if run.get("saved")), None)
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


def _track(r: StageRun, pretrain: Upstream, metrics: dict) -> list[ShardInfo]:
    """The scores and verdicts to the trackers the training used (`pretrain`: the stage
    that trained the subject, pretrain or distill; its recorded `tracking` section and the
    run ids in its tracking.json): TensorBoard files published under eval/tensorboard/,
    W&B's offline files under eval/wandb/; returns them as shards."""
    from bertcore.train.tracking import TrackingConfig, evaluation_scalars, log_evaluation

    storage = r.storage
    cfg = TrackingConfig.model_validate((pretrain.manifest.config or {}).get("tracking") or {})
    state_uri = pretrain.path(metrics_log.TRACKING_STATE)
    state = storage.read_json(state_uri) if storage.exists(state_uri) else {}
    verdicts: dict[str, str] = {}
    for phase, scores in metrics["intrinsic"].items():
        subject = metrics["subject"]
        lines = (("MLM", summary.mlm_verdict(phase, scores, subject)), ("NSP", summary.nsp_verdict(phase, scores, subject)))
        verdicts.update({f"{phase} {what}": line for what, line in lines if line})
    verdicts.update({name: task["verdict"]["text"] for name, task in metrics["tasks"].items()})
    verdicts.update({f"{label} distilled": line for label, line in zip(metrics.get("distillation") or {}, distillation.lines(metrics))})
    shards = []
    for folder in ("tensorboard", "wandb"):
        storage.remove(r.dir.path(folder), recursive=True)  # the tracker files of this evaluation only
    with tempfile.TemporaryDirectory(prefix="bertpipe-eval-tracking-") as tmp:
        log_evaluation(
            cfg, state, step=int(pretrain.manifest.stats.get("steps") or 0), scalars=evaluation_scalars(report.score_rows(metrics)),
            verdicts=verdicts, tensorboard_dir=os.path.join(tmp, "tensorboard"), wandb_dir=os.path.join(tmp, "wandb"),
            run_name=f"evaluate-{r.fingerprint[:8]}",
        )
        for folder, _, names in os.walk(tmp):
            for name in sorted(names):
                relative = os.path.relpath(os.path.join(folder, name), tmp).replace(os.sep, "/")
                shards.append(r.dir.publish_copy(relative, os.path.join(folder, name), rows=0))
    return shards


def _unigram(metrics: dict) -> float | None:
    """The unigram baseline's MLM accuracy of the last intrinsic phase (the plot's floor line)."""
    for by_model in reversed(list((metrics.get("intrinsic") or {}).values())):
        unigram = ((by_model.get(metrics.get("subject", "pretrained")) or {}).get("baselines") or {}).get("unigram") or {}
        if unigram.get("mlm_accuracy") is not None:
            return unigram["mlm_accuracy"]
    return None


def _write_outputs(stage: StageDir, metrics: dict, records: list[dict], validations: list[dict]) -> list[ShardInfo]:
    """metrics.json, plots/*.png and report.md; returns them as the manifest's shards."""
    storage = stage.storage
    stage.remove("plots", recursive=True)  # a plot an earlier run drew may not apply now
    written = []
    plots: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bertpipe-eval-") as tmp:
        drawn = {
            "pretraining": plot_pretraining(
                records, validations, (metrics.get("pretraining_log") or {}).get("log_every", 1), _unigram(metrics), os.path.join(tmp, "pretraining.png")
            ),
            "tasks": plot_tasks(metrics["tasks"], os.path.join(tmp, "tasks.png")),
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
