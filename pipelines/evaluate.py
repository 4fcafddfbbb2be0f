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


def _model_dir(storage: Storage, model_uri: str, cache_key: str) -> str:
    """A local folder with the exported model (the folder itself when the root is local)."""
    return local_folder(storage, model_uri, HF_FILES, cache_key)


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
    model_uri: str,
    shard_uris: list[str],
    train_uris: list[str],
    phase: PhaseConfig,
    examples_cfg: ExamplesConfig,
    cfg: IntrinsicConfig,
    random_init: bool,
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
    model_dir = _model_dir(storage, model_uri, cache_key)
    model = load_pretraining_model(model_dir, random_init=random_init, seed=seed).to(device())
    tokens = read_vocab(os.path.join(model_dir, VOCAB_FILE))
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
    unigram = scores["baselines"]["unigram"]
    if unigram:
        unigram["token"] = tokens[unigram["token_id"]]
    return scores


@ray.remote(max_retries=1)
def _fill_mask_job(model_uri: str, sentences: list[str], count: int, seed: int, storage: Storage, cache_key: str, num_threads: int) -> list[dict]:
    """The pretrained model's top guesses for one masked word in each of a few held-out sentences."""
    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.intrinsic import fill_mask, load_pretraining_model

    _threads(num_threads)
    model_dir = _model_dir(storage, model_uri, cache_key)
    return fill_mask(load_pretraining_model(model_dir), load_tokenizer(model_dir), sentences, seed=seed, count=count)


@ray.remote(max_retries=1)
def _finetune_job(
    task: TaskConfig, model_uri: str, random_init: bool, task_seed: int, storage: Storage, cache_key: str, file_keys: dict[str, str], num_threads: int
) -> dict:
    """One fine-tuning run (all folds of one seed); file names in messages are the task's URIs."""
    model_dir = _model_dir(storage, model_uri, cache_key)
    local, back = _local_task(task, storage, file_keys)
    try:
        result = finetune.run_task(local, model_dir, model_dir, task_seed, random_init=random_init, num_threads=num_threads)
    except BertpipeError as exc:
        raise type(exc)(_original_paths(str(exc), back)) from None
    result["skipped_problems"] = [_original_paths(p, back) for p in result["skipped_problems"]]
    return result


@ray.remote(max_retries=1)
def _embeddings_job(
    model_uri: str, sentences: list[str], cfg: EmbeddingsConfig, random_init: bool, seed: int, storage: Storage, cache_key: str, file_keys: dict[str, str], num_threads: int
) -> dict:
    """Anisotropy (and STS Spearman) for [CLS] and mean pooling."""
    from bertcore.eval.embeddings import embedding_report, read_sts

    model_dir = _model_dir(storage, model_uri, cache_key)
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
        model_dir, model_dir, sentences, seed=seed, sts_pairs=pairs, num_pairs=cfg.num_pairs,
        max_seq_length=cfg.max_seq_length, random_init=random_init, num_threads=num_threads,
    )
    return {"scores": scores, "sts_pairs": len(pairs or []), "skipped": skipped, "skipped_problems": problems}


# -- planning -----------------------------------------------------------------------------------


@dataclass
class _Job:
    key: str
    """Name of the job's progress marker, e.g. finetune__sst2__pretrained__seed1."""
    kind: str
    random_init: bool
    phase: str | None = None
    task: TaskConfig | None = None
    task_seed: int = 0
    shards: list[str] = field(default_factory=list)
    train_shards: list[str] = field(default_factory=list)


def _model_name(random_init: bool) -> str:
    return "random_init" if random_init else "pretrained"


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
    model_uri: str
    cache_key: str
    models: list[bool]
    jobs: list[_Job] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    examples_cfg: ExamplesConfig | None = None
    sentences: list[str] = field(default_factory=list)


def run(r: StageRun) -> Output:
    """Evaluate pretrain/model/ and write eval/. Needs a running Ray (pipelines.ray_runtime.ensure_ray)."""
    resolved, signatures = r.external
    pretrain = r.inputs["pretrain"]
    model_uri = pretrain.path(MODEL_DIR)
    cache_key = f"eval-{pretrain.fingerprint}"
    if not r.storage.exists(f"{model_uri}/config.json"):
        raise ConfigError(f"{model_uri}: no exported model (config.json missing); re-run the pretrain stage (`bertpipe run --only pretrain --force`)")
    from bertcore.eval.intrinsic import model_config_of

    model_cfg = model_config_of(os.path.dirname(local_copy(r.storage, f"{model_uri}/config.json", cache_key)))
    _check_lengths(resolved, model_cfg.max_position_embeddings, f"{model_uri}/config.json", ConfigError)
    plan = _Plan(resolved, signatures, model_uri, cache_key, [False, True] if resolved.baseline else [False])
    _plan_jobs(plan, r, model_cfg.max_position_embeddings)

    t0 = time.perf_counter()
    results, reused = _run_jobs(plan, r)
    jobs_s = time.perf_counter() - t0

    for note in plan.notes:
        log.info("evaluate: %s", note)
    records, log_summary = _training_log(r.storage, pretrain)
    metrics = _metrics(plan, results, model_cfg, log_summary, r.seed, r.fingerprint)
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
    """One job per (intrinsic phase | task and seed | embeddings) and model."""
    cfg = plan.cfg
    if cfg.intrinsic.enabled:
        examples = r.inputs["examples"]
        from bertcore.eval.intrinsic import phases_to_score

        plan.examples_cfg = ExamplesConfig.model_validate(examples.manifest.config)
        trained = [p.get("name") for p in (r.inputs["pretrain"].manifest.config or {}).get("phases", []) if isinstance(p, dict)]
        phases = phases_to_score(cfg.intrinsic, plan.examples_cfg, trained, max_positions, plan.notes)
        for phase in phases:
            shards = [examples.path(s.path) for s in examples.manifest.shards_under(f"{phase.name}/validation/") if s.rows]
            if not shards:
                plan.notes.append(f"intrinsic: phase {phase.name} has no validation sequences")
                continue
            train = [examples.path(s.path) for s in examples.manifest.shards_under(f"{phase.name}/train/") if s.rows]
            for random_init in plan.models:
                key = f"intrinsic__{phase.name}__{_model_name(random_init)}"
                plan.jobs.append(_Job(key, "intrinsic", random_init, phase=phase.name, shards=shards, train_shards=train))
    for task in cfg.tasks:
        for random_init in plan.models:
            for task_seed in summary.seeds_of(task, random_init):
                key = f"finetune__{task.name}__{_model_name(random_init)}__seed{task_seed}"
                plan.jobs.append(_Job(key, "finetune", random_init, task=task, task_seed=task_seed))
    fill_mask = cfg.intrinsic.enabled and cfg.intrinsic.fill_mask > 0
    if cfg.embeddings.enabled or fill_mask:
        plan.sentences = _sentences(r.storage, r.inputs["corpus"], cfg.embeddings, r.seed, plan.notes)
    if plan.sentences and cfg.embeddings.enabled:
        for random_init in plan.models:
            plan.jobs.append(_Job(f"embeddings__{_model_name(random_init)}", "embeddings", random_init))
    if plan.sentences and fill_mask:
        plan.jobs.append(_Job("fill_mask__pretrained", "fill_mask", False))


def _run_jobs(plan: _Plan, r: StageRun) -> tuple[dict[str, Any], int]:
    """Every job's result, and how many were read back from an interrupted attempt."""
    cfg, storage, seed = plan.cfg, r.storage, r.seed

    def submit(job: _Job) -> ray.ObjectRef:
        options = {"num_cpus": cfg.num_threads} | ({"num_gpus": cfg.num_gpus} if cfg.num_gpus else {})
        if job.kind == "intrinsic":
            return _intrinsic_job.options(**options).remote(
                plan.model_uri, job.shards, job.train_shards, plan.examples_cfg.phase(job.phase), plan.examples_cfg, cfg.intrinsic,
                job.random_init, seed, storage, plan.cache_key, cfg.num_threads,
            )
        if job.kind == "fill_mask":
            return _fill_mask_job.options(**options).remote(
                plan.model_uri, plan.sentences, cfg.intrinsic.fill_mask, seed, storage, plan.cache_key, cfg.num_threads
            )
        if job.kind == "finetune":
            return _finetune_job.options(**options).remote(
                job.task, plan.model_uri, job.random_init, job.task_seed, storage, plan.cache_key, plan.signatures, cfg.num_threads
            )
        return _embeddings_job.options(**options).remote(
            plan.model_uri, plan.sentences, cfg.embeddings, job.random_init, seed, storage, plan.cache_key, plan.signatures, cfg.num_threads
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

    def finished(index: int, result: Any) -> None:
        r.dir.complete(todo[index].key, r.fingerprint, [], result)

    for job, result in zip(todo, run_tasks(submit, todo, parallelism=r.parallelism, desc="evaluate", on_result=finished, unit="jobs")):
        results[job.key] = result
    return results, len(plan.jobs) - len(todo)


def _metrics(plan: _Plan, results: dict[str, Any], model_cfg, log_summary, seed: int, fp: str) -> dict:
    import torch

    from bertcore.model import BertForPreTraining

    eval_cfg, jobs, models = plan.cfg, plan.jobs, plan.models
    with torch.device("meta"):  # counts parameters without allocating or initialising them
        parameters = BertForPreTraining(model_cfg).num_parameters()
    metrics: dict[str, Any] = {
        "stage": "evaluate",
        "fingerprint": fp,
        "seed": seed,
        "baseline": eval_cfg.baseline,
        "model": {"uri": plan.model_uri, "parameters": parameters, "config": model_cfg.model_dump(mode="json")},
        "pretraining_log": log_summary,
        "intrinsic": {},
        "fill_mask": results.get("fill_mask__pretrained", []),
        "tasks": {},
        "embeddings": None,
    }
    for job in jobs:
        if job.kind == "intrinsic":
            metrics["intrinsic"].setdefault(job.phase, {})[_model_name(job.random_init)] = results[job.key]

    files: Counter[str] = Counter()
    for task in eval_cfg.tasks:
        runs = {_model_name(m): [results[f"finetune__{task.name}__{_model_name(m)}__seed{s}"] for s in summary.seeds_of(task, m)] for m in models}
        entry = summary.task_entry(task, runs)
        for split, n in entry["skipped"].items():
            if n:
                files[getattr(task, split)] += n
        metrics["tasks"][task.name] = entry

    embedding_jobs = [job for job in jobs if job.kind == "embeddings"]
    if embedding_jobs:
        first = results[embedding_jobs[0].key]
        metrics["embeddings"] = {"sentences": len(plan.sentences), "sts_pairs": first["sts_pairs"]}
        for job in embedding_jobs:
            metrics["embeddings"][_model_name(job.random_init)] = results[job.key]["scores"]
        if first["skipped"]:
            files[eval_cfg.embeddings.sts.file] += first["skipped"]
            metrics["embeddings"]["skipped_problems"] = first["skipped_problems"]
    metrics["skipped_rows"] = {"total": files.total(), "files": dict(files)}
    metrics["verdicts"] = summary.verdicts(metrics)
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
    "evaluate", EvaluateConfig, run, reads=("pretrain", "examples", "corpus"), directory="eval", identify=identify, check=check,
    fingerprint_config=task_location_free,
    writes="metrics.json, report.md, plots/*.png",
)
