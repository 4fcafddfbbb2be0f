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
- tasks: one per (task, train fraction, seed, model); cross-validation folds run inside
  the job, each on its fraction of the fold's training part (bertcore/eval/fractions.py);
  the job of a task's first seed on the subject at its largest fraction (the whole file
  by default) also keeps the model it fine-tuned on everything, `heads/<subject>/<task>.safetensors`
  (bertcore/eval/heads.py), which `bertpipe export --task` puts on the exported encoder;
- embeddings: one per model; fill-mask: one, the subject; speed (after distillation): one,
  after the others, alone (the student's start is not timed: it has the student's shape).
Each finished job leaves `_progress/<job>.json` with its result, so an evaluation that
crashed, re-run with the same fingerprint, computes only the jobs still missing. A job's
result does not depend on which worker ran it or when: every random choice, the training
subsets of a fraction included, is keyed by the run seed, the task and the fit. Remote
files (model, task files) are copied to a per-content local cache in the worker that reads
them, because transformers and the task readers read local folders.

fingerprint = hash(code version + evaluate section without its file paths + pretrain (or
distill), examples and corpus fingerprints + run seed + the content signature of every task file),
so editing a task file in place re-runs the evaluation and moving it does not.

This module runs the plan (pipelines/stages/evaluate/plan.py: the models and the jobs on
them) on Ray and folds the results into metrics; the jobs themselves are in
pipelines/stages/evaluate/jobs.py, and the scoring, floors, verdicts, distillation
comparisons and report in bertcore/eval.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections import Counter
from typing import Any

import ray

from bertcore.errors import ConfigError
from bertcore.eval import distillation, report, summary
from bertcore.eval.distillation import START
from bertcore.eval.learning_curve import learning_curve
from bertcore.eval.plots import plot_learning_curves, plot_pretraining, plot_tasks
from bertcore.eval.scores import json_dumps, score_rows
from bertcore.model.hf_files import START_DIR
from bertcore.train import metrics_log
from bertcore.train.export import MODEL_DIR
from bertcore.train.metrics_log import METRICS, VALIDATION
from pipelines.ray_runtime import concurrent_tasks, run_tasks
from pipelines.shards import local_copy
from pipelines.stage import Output, StageRun, Upstream
from pipelines.stage_dir import ShardInfo, StageDir
from pipelines.stages.evaluate import check_lengths, diagnoses
from pipelines.stages.evaluate.jobs import (
    Model,
    embeddings_job,
    fill_mask_job,
    finetune_job,
    has_mlm_head,
    intrinsic_job,
    speed_job,
)
from pipelines.stages.evaluate.plan import Job, Plan, finetune_key, models_of, plan_jobs
from pipelines.storage import Storage

log = logging.getLogger(__name__)


def _training_log(storage: Storage, pretrain: Upstream) -> tuple[list[dict], list[dict], dict | None]:
    """The pretraining log's records, its validations, and what the report says of them:
    where the log is (relative to run.root), its final figures (the means over the last
    logging interval, bertcore.train.metrics_log), the last validation and the loss jumps."""
    uri = pretrain.path(METRICS)
    if not storage.exists(uri):
        return [], [], None
    records, bad = metrics_log.read_training_log(storage.read_text(uri).splitlines())
    validations: list[dict] = []
    if storage.exists(pretrain.path(VALIDATION)):
        validations, _ = metrics_log.read_training_log(storage.read_text(pretrain.path(VALIDATION)).splitlines())
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


def run(r: StageRun) -> Output:
    """Evaluate pretrain/model/ (after distillation: the teacher, distill/model/ and a
    student-sized random init) and write eval/. Needs a running Ray (pipelines.ray_runtime.ensure_ray)."""
    resolved, signatures = r.external
    models, subject, trained = models_of(r, resolved.baseline)
    from bertcore.eval.intrinsic import model_config_of

    folders = {m.name: os.path.dirname(local_copy(r.storage, f"{m.uri}/config.json", m.cache_key)) for m in models}
    configs = {name: model_config_of(folder) for name, folder in folders.items()}
    check_lengths(resolved, configs[subject.name].max_sequence_length, f"{subject.uri}/config.json", ConfigError)
    plan = Plan(resolved, signatures, models, subject, trained, masked_lm=has_mlm_head(folders[subject.name]))
    plan.sizes = {name: c.num_hidden_layers * c.hidden_size**2 for name, c in configs.items()}
    plan_jobs(plan, r, configs[subject.name].max_sequence_length)

    t0 = time.perf_counter()
    results, reused = _run_jobs(plan, r)
    jobs_s = time.perf_counter() - t0

    for note in plan.notes:
        log.info("evaluate: %s", note)
    records, validations, log_summary = _training_log(r.storage, trained)
    metrics = _metrics(plan, results, configs, log_summary, r.seed, r.fingerprint)
    for model in metrics["models"].values():  # relative to run.root when a stage wrote it: the report survives a move
        model["uri"] = next(
            (
                f"{up.dir.directory}/{folder}"
                for up in r.inputs.values()
                for folder in (MODEL_DIR, START_DIR)
                if model["uri"] == up.path(folder)
            ),
            model["uri"],
        )
    metrics["timings"] = {"jobs_s": round(jobs_s, 3), "jobs": len(plan.jobs), "jobs_reused": reused}
    skipped = [
        {"file": uri, "reason": f"{n} malformed row(s) skipped (on_error: skip)"}
        for uri, n in metrics["skipped_rows"]["files"].items()
    ]
    stats = summary.stats(metrics)
    return Output(
        shards=_write_outputs(r.dir, metrics, records, validations, [t.name for t in resolved.tasks])
        + _track(r, trained, metrics)
        + _saved_models(results),
        stats=stats,
        timings={"jobs_s": round(jobs_s, 3)},
        skipped=skipped,
        report="report.md",
        tables={"evaluation-scores": score_rows(metrics)},
        headline=summary.headline(stats),
    )


def _saved_models(results: dict[str, Any]) -> list[ShardInfo]:
    """The fine-tuned models the jobs saved (heads/), as shard records."""
    return [
        ShardInfo(**result["saved"]) for result in results.values() if isinstance(result, dict) and result.get("saved")
    ]


def _run_jobs(plan: Plan, r: StageRun) -> tuple[dict[str, Any], int]:
    """Every job's result, and how many were read back from an interrupted attempt. The
    speed job runs last, alone, so no other job shares the machine while it times."""
    cfg, storage, seed = plan.cfg, r.storage, r.seed

    def submit(job: Job) -> ray.ObjectRef:
        options = {"num_cpus": cfg.num_threads} | ({"num_gpus": cfg.num_gpus} if cfg.num_gpus else {})
        if job.kind == "intrinsic":
            return intrinsic_job.options(**options).remote(
                job.model,
                job.shards,
                job.train_shards,
                plan.examples_cfg.phase(job.phase),
                plan.examples_cfg,
                cfg.intrinsic,
                seed,
                storage,
                cfg.num_threads,
            )
        if job.kind == "fill_mask":
            return fill_mask_job.options(**options).remote(
                job.model, plan.sentences, cfg.intrinsic.fill_mask, seed, storage, cfg.num_threads
            )
        if job.kind == "finetune":
            return finetune_job.options(**options).remote(
                job.task,
                job.model,
                plan.subject,
                job.task_seed,
                storage,
                plan.signatures,
                cfg.num_threads,
                r.dir if job.keep_model else None,
                job.fraction,
                seed,
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
        len(todo),
        ", ".join(f"{n} {kind}" for kind, n in kinds.items()) or "none",
        f", {len(results)} kept from an interrupted attempt" if results else "",
        cfg.num_threads,
    )
    batches = (
        ([j for j in todo if j.kind != "speed"], r.parallelism, "evaluate"),
        ([j for j in todo if j.kind == "speed"], 1, "evaluate: speed"),
    )
    for batch, parallelism, desc in batches:
        if not batch:
            continue

        def finished(index: int, result: Any, batch=batch) -> None:
            r.dir.complete(batch[index].key, r.fingerprint, _saved_models({batch[index].key: result}), result)

        ran = run_tasks(
            submit,
            batch,
            parallelism=parallelism,
            desc=desc,
            on_result=finished,
            unit="jobs",
            costs=[job.cost for job in batch],
            slots=concurrent_tasks(cfg.num_threads, cfg.num_gpus or 0.0),
        )
        for job, result in zip(batch, ran):
            results[job.key] = result
    return results, len(plan.jobs) - len(todo)


def _model_entry(model: Model, cfg, parameters: int) -> dict:
    return {
        "uri": model.uri,
        "parameters": parameters,
        "config": cfg.model_dump(mode="json"),
        "random_init": model.random_init,
    }


def _metrics(plan: Plan, results: dict[str, Any], configs: dict, log_summary, seed: int, fp: str) -> dict:
    """The metrics dictionary (eval/metrics.json): `models` names every model scored, and
    `subject` the one judged against random init (see bertcore/eval/report.py)."""
    eval_cfg, jobs, subject = plan.cfg, plan.jobs, plan.subject.name
    models = {
        m.name: _model_entry(m, configs[m.name], configs[m.name].family.parameter_count(configs[m.name]))
        for m in plan.models
    }
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
        by_fraction = {
            f: {
                m.name: [results[finetune_key(task.name, m.name, f, s)] for s in summary.seeds_of(task, m.random_init)]
                for m in plan.models
            }
            for f in task.train_fractions
        }
        entries = {f: summary.task_entry(task, runs, subject) for f, runs in by_fraction.items()}
        runs, entry = (
            by_fraction[task.train_fractions[-1]],
            entries[task.train_fractions[-1]],
        )  # the headline: the largest fraction
        if len(entries) > 1:
            entry["learning_curve"] = learning_curve(entries)
        entry["saved_model"] = next((run["saved"]["path"] for run in runs[subject] if run.get("saved")), None)
        for split, n in entry["skipped"].items():
            if n:
                files[getattr(task, split)] += n
        metrics["tasks"][task.name] = entry

    embedding_jobs = [job for job in jobs if job.kind == "embeddings"]
    if embedding_jobs:
        first = results[embedding_jobs[0].key]
        metrics["embeddings"] = {
            "sentences": len(plan.sentences),
            "sts_pairs": first["sts_pairs"],
            "long_inputs": first.get("long_inputs"),
        }
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
        lines = (
            ("MLM", summary.mlm_verdict(phase, scores, subject)),
            ("NSP", summary.nsp_verdict(phase, scores, subject)),
        )
        verdicts.update({f"{phase} {what}": line for what, line in lines if line})
    verdicts.update({name: task["verdict"]["text"] for name, task in metrics["tasks"].items()})
    verdicts.update(
        {
            f"{label} distilled": line
            for label, line in zip(metrics.get("distillation") or {}, distillation.lines(metrics))
        }
    )
    shards = []
    for folder in ("tensorboard", "wandb"):
        storage.remove(r.dir.path(folder), recursive=True)  # the tracker files of this evaluation only
    with tempfile.TemporaryDirectory(prefix="bertpipe-eval-tracking-") as tmp:
        log_evaluation(
            cfg,
            state,
            step=int(pretrain.manifest.stats.get("steps") or 0),
            scalars=evaluation_scalars(score_rows(metrics)),
            verdicts=verdicts,
            tensorboard_dir=os.path.join(tmp, "tensorboard"),
            wandb_dir=os.path.join(tmp, "wandb"),
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
        unigram = ((by_model.get(metrics.get("subject", "pretrained")) or {}).get("baselines") or {}).get(
            "unigram"
        ) or {}
        if unigram.get("mlm_accuracy") is not None:
            return unigram["mlm_accuracy"]
    return None


def _write_outputs(
    stage: StageDir, metrics: dict, records: list[dict], validations: list[dict], tasks: list[str]
) -> list[ShardInfo]:
    """metrics.json, plots/*.png and report.md (linking the diagnoses of `tasks` that
    `bertpipe diagnose` left beside the stage); returns them as the manifest's shards."""
    storage = stage.storage
    stage.remove("plots", recursive=True)  # a plot an earlier run drew may not apply now
    written = []
    plots: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bertpipe-eval-") as tmp:
        drawn = {
            "pretraining": plot_pretraining(
                records,
                validations,
                (metrics.get("pretraining_log") or {}).get("log_every", 1),
                _unigram(metrics),
                os.path.join(tmp, "pretraining.png"),
            ),
            "tasks": plot_tasks(metrics["tasks"], os.path.join(tmp, "tasks.png")),
            "label_fractions": plot_learning_curves(metrics["tasks"], os.path.join(tmp, "label_fractions.png")),
        }
        for name, ok in drawn.items():
            if ok:
                relative = f"plots/{name}.png"
                with open(os.path.join(tmp, f"{name}.png"), "rb") as handle:
                    written.append((relative, storage.write_bytes(stage.path(relative), handle.read())))
                plots[name] = relative
    metrics_bytes = json_dumps(metrics).encode()
    written.append(("metrics.json", storage.write_bytes(stage.path("metrics.json"), metrics_bytes)))
    written.append(
        (
            "report.md",
            storage.write_bytes(
                stage.path("report.md"),
                report.render_markdown(
                    metrics, plots, diagnoses.found(storage, stage.root, tasks, stage.directory)
                ).encode(),
            ),
        )
    )
    return [ShardInfo(path=relative, rows=0, bytes=w.bytes, sha256=w.sha256, stamp=w.stamp) for relative, w in written]
