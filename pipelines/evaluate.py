"""Evaluate stage: the pretrained model's held-out MLM/NSP scores, fine-tuning tasks
against a randomly initialised model of the same size, and sentence embeddings, written
as `eval/metrics.json`, `eval/report.md` and `eval/plots/*.png` under the run root.

Ray shape: one task per job, all submitted together (at most `parallelism` in flight):
- intrinsic: one per (examples phase, pretrained | random init), over the phase's
  validation shards;
- fine-tuning: one per (task, seed, pretrained | random init); cross-validation folds run
  inside the job;
- embeddings: one per (pretrained | random init).
Each finished job leaves `_progress/<job>.json` with its result, so an evaluation that
crashed, re-run with the same fingerprint, computes only the jobs still missing. Remote
files (model, task files) are copied to a per-content local cache in the worker that reads
them, because transformers and the task readers read local folders.

fingerprint = hash(code version + evaluate section + pretrain and examples fingerprints +
run seed + the content signature of every task file), so editing a task file in place
also re-runs the evaluation. The core is `evaluate(eval_cfg, root, storage, seed)`;
`run(cfg, storage)` is the stage interface on a whole run config.
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

from bertcore.config import PipelineConfig
from bertcore.errors import BertpipeError, ConfigError
from bertcore.eval import finetune, report
from bertcore.eval.config import EmbeddingsConfig, EvaluateConfig, IntrinsicConfig
from bertcore.eval.tasks import TASK_FILES, TaskConfig
from bertcore.examples import ExamplesConfig, PhaseConfig
from bertcore.export import HF_FILES
from bertcore.rng import keyed_numpy, keyed_seed
from bertcore.train import METRICS
from pipelines import pretrain
from pipelines.examples import local_copy
from pipelines.pretrain import UpstreamMissing
from pipelines.ray_runtime import run_tasks
from pipelines.stage import MANIFEST, PROGRESS, RESOLVED_CONFIG, Manifest, ShardInfo, StageDir, fingerprint
from pipelines.storage import Storage, is_local, join
from pipelines.vocab import read_batches

log = logging.getLogger(__name__)

STAGE = "evaluate"
DIRECTORY = "eval"
"""The stage's directory under run.root: eval/, while the stage is named `evaluate`."""
CODE_VERSION = "1"
MODEL_DIR = f"{pretrain.STAGE}/{pretrain.MODEL_DIR}"
TRAINING_LOG = f"{pretrain.STAGE}/{METRICS}"
SENTENCE_POOL = 50
"""Embedding sentences are sampled from at most this many times `embeddings.sentences` corpus sentences."""


# -- local copies -------------------------------------------------------------------------------


def _model_dir(storage: Storage, model_uri: str, cache_key: str) -> str:
    """A local folder with the exported model (the folder itself when the root is local)."""
    paths = [local_copy(storage, join(model_uri, name), cache_key) for name in HF_FILES]
    return os.path.dirname(paths[0])


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


@ray.remote(max_retries=1)
def _intrinsic_job(
    model_uri: str,
    shard_uris: list[str],
    phase: PhaseConfig,
    examples_cfg: ExamplesConfig,
    cfg: IntrinsicConfig,
    random_init: bool,
    seed: int,
    storage: Storage,
    cache_key: str,
    num_threads: int,
) -> dict:
    """MLM/NSP scores of one phase's validation shards."""
    from bertcore.data import ExamplesLoader
    from bertcore.eval.intrinsic import held_out_scores, load_pretraining_model
    from bertcore.masking import VocabTables
    from bertcore.tokenizer import VOCAB_FILE, read_vocab

    _threads(num_threads)
    model_dir = _model_dir(storage, model_uri, cache_key)
    model = load_pretraining_model(model_dir, random_init=random_init, seed=seed)
    mask_config = None
    if examples_cfg.masking == "dynamic":
        tokens = read_vocab(os.path.join(model_dir, VOCAB_FILE))
        mask_config = examples_cfg.mask_config(phase, VocabTables.from_tokens(tokens))
    paths = [local_copy(storage, uri, cache_key) for uri in shard_uris]
    loader = ExamplesLoader(
        paths,
        cfg.batch_size,
        seed=keyed_seed(seed, STAGE, "intrinsic", phase.name) >> 1,  # the dynamic masks: fixed, the same for both models
        masking=examples_cfg.masking,
        mask_config=mask_config,
        pad_id=model.cfg.pad_token_id,
        shuffle=False,
        even_batches=False,
    )
    return held_out_scores(model, loader, max_batches=cfg.max_batches)


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
    from bertcore.eval.embeddings import embedding_report
    from bertcore.eval.tasks import read_rows

    model_dir = _model_dir(storage, model_uri, cache_key)
    pairs, skipped, problems = None, 0, []
    if cfg.sts is not None:
        sts = cfg.sts
        path = _local_file(storage, sts.file, file_keys)
        try:
            read = read_rows(
                path,
                format=sts.format,
                text_a=sts.text_a,
                text_b=sts.text_b,
                label_column=sts.score_column,
                task_type="regression",
                header=sts.header,
                encoding=sts.encoding,
                on_error=sts.on_error,
            )
        except BertpipeError as exc:
            raise type(exc)(_original_paths(str(exc), {path: sts.file})) from None
        pairs, skipped = read.examples, read.skipped
        problems = [_original_paths(p, {path: sts.file}) for p in read.problems]
    scores = embedding_report(
        model_dir,
        model_dir,
        sentences,
        seed=seed,
        sts_pairs=pairs,
        num_pairs=cfg.num_pairs,
        max_seq_length=cfg.max_seq_length,
        random_init=random_init,
        num_threads=num_threads,
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


def _model_name(random_init: bool) -> str:
    return "random_init" if random_init else "pretrained"


def _absolute(uri: str) -> str:
    return os.path.abspath(os.path.expanduser(uri)) if is_local(uri) and "://" not in uri else uri


def _file_signature(storage: Storage, uri: str) -> str:
    """What identifies a file's content: its sha256 when local, the object store's ETag
    (or size and modification time) when remote."""
    if is_local(uri):
        return storage.sha256(uri)[:20]
    info = storage.info(uri)
    tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("crc32c")
    return str(tag or f"{info.get('size')}-{info.get('LastModified') or info.get('mtime') or info.get('updated')}").strip('"')


def _resolve_files(eval_cfg: EvaluateConfig, storage: Storage) -> tuple[EvaluateConfig, dict[str, str]]:
    """The section with absolute local paths, and {file URI: content signature}. A file
    that does not exist is a ConfigError naming its key."""
    signatures: dict[str, str] = {}

    def check(uri: str, key: str) -> str:
        uri = _absolute(uri)
        try:
            found = storage.exists(uri) and not storage.fs(uri)[0].isdir(storage.fs(uri)[1])
        except OSError as exc:
            raise ConfigError(f"{key}: cannot reach {uri} ({exc})") from None
        if not found:
            raise ConfigError(f"{key}: {uri} does not exist (or is a folder); fix the path in the evaluate section")
        signatures[uri] = _file_signature(storage, uri)
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
    return resolved, signatures


def _fingerprint(eval_cfg: EvaluateConfig, seed: int, pretrain_fp: str, examples_fp: str | None, signatures: dict[str, str]) -> str:
    inputs = {"pretrain": pretrain_fp, "examples": examples_fp, "seed": seed, "files": signatures}
    return fingerprint(STAGE, CODE_VERSION, eval_cfg.model_dump(mode="json"), inputs)


def _intrinsic_phases(eval_cfg: EvaluateConfig, examples_manifest: Manifest, pretrain_manifest: Manifest, max_positions: int, notes: list[str]) -> tuple[ExamplesConfig, list[PhaseConfig]]:
    examples_cfg = ExamplesConfig.model_validate(examples_manifest.config)
    available = [p.name for p in examples_cfg.phases]
    wanted = eval_cfg.intrinsic.phases
    if wanted is not None:
        unknown = [p for p in wanted if p not in available]
        if unknown:
            raise ConfigError(f"evaluate.intrinsic.phases: {unknown} are not examples phases (have {available})")
    else:
        trained = [p.get("name") for p in (pretrain_manifest.config or {}).get("phases", []) if isinstance(p, dict)]
        wanted = [p for p in available if p in trained] or available
    phases = []
    for name in wanted:
        phase = examples_cfg.phase(name)
        if phase.max_seq_length > max_positions:
            notes.append(f"intrinsic: phase {name} ({phase.max_seq_length} tokens) is longer than the model's {max_positions} positions; left out")
        else:
            phases.append(phase)
    return examples_cfg, phases


def _sentences(storage: Storage, root: str, cfg: EmbeddingsConfig, seed: int, notes: list[str]) -> list[str]:
    """Up to cfg.sentences held-out corpus sentences, sampled with a keyed RNG from the first
    SENTENCE_POOL x that many of the validation split (in shard order)."""
    corpus_dir = StageDir(storage, root, "corpus")
    corpus = corpus_dir.manifest()
    if corpus is None:
        notes.append("embeddings: no corpus stage output to draw held-out sentences from; skipped")
        return []
    pool: list[str] = []
    limit = SENTENCE_POOL * cfg.sentences
    for shard in (s for s in corpus.shards if s.path.startswith("validation/")):
        for batch in read_batches(storage, corpus_dir.path(shard.path)):
            pool.extend(s for doc in batch.column("sentences").to_pylist() for s in doc if s.strip())
            if len(pool) >= limit:
                break
        if len(pool) >= limit:
            break
    pool = pool[:limit]
    if len(pool) < 2:
        notes.append("embeddings: the corpus validation split has fewer than 2 sentences; skipped")
        return []
    rng = keyed_numpy(seed, STAGE, "embedding-sentences")
    chosen = sorted(rng.choice(len(pool), size=min(cfg.sentences, len(pool)), replace=False))
    return [pool[i] for i in chosen]


def _training_log(storage: Storage, root: str) -> tuple[list[dict], dict | None]:
    uri = join(root, TRAINING_LOG)
    if not storage.exists(uri):
        return [], None
    records, bad = report.read_training_log(storage.read_text(uri).splitlines())
    summary = {"uri": uri, "records": len(records), "unreadable_lines": bad}
    if records:
        summary["first"], summary["last"] = records[0], records[-1]
    return records, summary


# -- the stage ----------------------------------------------------------------------------------


def evaluate(
    eval_cfg: EvaluateConfig,
    root: str,
    storage: Storage,
    seed: int,
    *,
    force: bool = False,
    parallelism: int | None = None,
    pipeline_config: PipelineConfig | None = None,
) -> tuple[Manifest, bool]:
    """Evaluate `<root>/pretrain/model/` and write `<root>/eval/`. Returns (manifest,
    computed); a complete output with the same fingerprint is kept unless `force`.
    `pipeline_config` is written next to the output as the resolved config when given
    (else the evaluate section alone). Needs a running Ray (pipelines.ray_runtime.ensure_ray)."""
    started = time.perf_counter()
    pretrain_manifest = pretrain._manifest(storage, root, pretrain.STAGE)
    examples_dir = StageDir(storage, root, "examples")
    examples_manifest = examples_dir.manifest()
    if examples_manifest is None and eval_cfg.intrinsic.enabled:
        raise UpstreamMissing(
            f"the examples stage has no output under {root}/examples (the held-out MLM scores read it): run it first, "
            "or set evaluate.intrinsic.enabled: false"
        )
    resolved, signatures = _resolve_files(eval_cfg, storage)
    fp = _fingerprint(eval_cfg, seed, pretrain_manifest.fingerprint, examples_manifest.fingerprint if examples_manifest else None, signatures)
    stage = StageDir(storage, root, DIRECTORY)
    if (done := stage.reuse_or_reset(fp, force=force)) is not None:
        return done, False

    model_uri = join(root, MODEL_DIR)
    cache_key = f"eval-{pretrain_manifest.fingerprint}"
    if not storage.exists(join(model_uri, "config.json")):
        raise UpstreamMissing(f"{model_uri}: no exported model (config.json missing); re-run the pretrain stage")
    from bertcore.eval.intrinsic import model_config_of

    model_cfg = model_config_of(os.path.dirname(local_copy(storage, join(model_uri, "config.json"), cache_key)))
    notes: list[str] = []
    models = [False, True] if resolved.baseline else [False]

    jobs: list[_Job] = []
    examples_cfg = None
    if resolved.intrinsic.enabled:
        examples_cfg, phases = _intrinsic_phases(resolved, examples_manifest, pretrain_manifest, model_cfg.max_position_embeddings, notes)
        for phase in phases:
            shards = [examples_dir.path(s.path) for s in examples_manifest.shards if s.path.startswith(f"{phase.name}/validation/") and s.rows]
            if not shards:
                notes.append(f"intrinsic: phase {phase.name} has no validation sequences")
                continue
            for random_init in models:
                jobs.append(_Job(f"intrinsic__{phase.name}__{_model_name(random_init)}", "intrinsic", random_init, phase=phase.name, shards=shards))
    for task in resolved.tasks:
        for task_seed in task.seeds:
            for random_init in models:
                jobs.append(_Job(f"finetune__{task.name}__{_model_name(random_init)}__seed{task_seed}", "finetune", random_init, task=task, task_seed=task_seed))
    sentences = _sentences(storage, root, resolved.embeddings, seed, notes) if resolved.embeddings.enabled else []
    if sentences:
        for random_init in models:
            jobs.append(_Job(f"embeddings__{_model_name(random_init)}", "embeddings", random_init))

    def submit(job: _Job) -> ray.ObjectRef:
        options = {"num_cpus": resolved.num_threads}
        if job.kind == "intrinsic":
            return _intrinsic_job.options(**options).remote(
                model_uri, job.shards, examples_cfg.phase(job.phase), examples_cfg, resolved.intrinsic, job.random_init,
                seed, storage, cache_key, resolved.num_threads,
            )
        if job.kind == "finetune":
            return _finetune_job.options(**options).remote(
                job.task, model_uri, job.random_init, job.task_seed, storage, cache_key, signatures, resolved.num_threads
            )
        return _embeddings_job.options(**options).remote(
            model_uri, sentences, resolved.embeddings, job.random_init, seed, storage, cache_key, signatures, resolved.num_threads
        )

    # Jobs an interrupted attempt with this fingerprint finished are read back, not rerun.
    results: dict[str, Any] = {}
    for job in jobs:
        marker = stage.path(f"{PROGRESS}/{job.key}.json")
        if storage.exists(marker):
            data = storage.read_json(marker)
            if data.get("fingerprint") == fp:
                results[job.key] = data["result"]
    todo = [job for job in jobs if job.key not in results]

    def finished(index: int, result: Any) -> None:
        storage.write_json(stage.path(f"{PROGRESS}/{todo[index].key}.json"), {"fingerprint": fp, "result": result})

    t0 = time.perf_counter()
    for job, result in zip(todo, run_tasks(submit, todo, parallelism=parallelism, desc="evaluate", on_result=finished)):
        results[job.key] = result
    jobs_s = time.perf_counter() - t0

    for note in notes:
        log.info("evaluate: %s", note)
    records, log_summary = _training_log(storage, root)
    metrics = _metrics(resolved, jobs, results, models, model_uri, model_cfg, log_summary, seed, fp, notes, len(sentences))
    metrics["timings"] = {"jobs_s": round(jobs_s, 3), "jobs": len(jobs), "jobs_reused": len(jobs) - len(todo)}
    shards = _write_outputs(stage, metrics, records)
    skipped = [
        {"file": uri, "reason": f"{n} malformed row(s) skipped (on_error: skip)"}
        for uri, n in metrics["skipped_rows"]["files"].items()
    ]
    manifest = Manifest(
        stage=STAGE,
        code_version=CODE_VERSION,
        fingerprint=fp,
        inputs={"pretrain": pretrain_manifest.fingerprint, "examples": examples_manifest.fingerprint if examples_manifest else None},
        config=eval_cfg.model_dump(mode="json"),
        shards=shards,
        stats=_stats(metrics),
        timings={"jobs_s": round(jobs_s, 3), "total_s": round(time.perf_counter() - started, 3)},
        skipped=skipped,
    )
    if pipeline_config is not None:
        stage.write_manifest(manifest, pipeline_config)
    else:
        storage.write_bytes(stage.path(RESOLVED_CONFIG), resolved_yaml_of_section(eval_cfg).encode())
        manifest.created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        storage.write_json(stage.path(MANIFEST), manifest.to_json())
    return manifest, True


def resolved_yaml_of_section(eval_cfg: EvaluateConfig) -> str:
    import yaml

    return yaml.safe_dump({"evaluate": eval_cfg.model_dump(mode="json")}, sort_keys=False, allow_unicode=True)


def _slim_run(run: dict) -> dict:
    keep = ("seed", "validation", "test", "final_train_loss", "seconds")
    return {k: run[k] for k in keep if k in run}


def _metrics(eval_cfg, jobs, results, models, model_uri, model_cfg, log_summary, seed, fp, notes, n_sentences) -> dict:
    import torch

    from bertcore.model import BertForPreTraining

    with torch.device("meta"):  # counts parameters without allocating or initialising them
        parameters = BertForPreTraining(model_cfg).num_parameters()
    metrics: dict[str, Any] = {
        "stage": STAGE,
        "fingerprint": fp,
        "seed": seed,
        "baseline": eval_cfg.baseline,
        "model": {"uri": model_uri, "parameters": parameters, "config": model_cfg.model_dump(mode="json")},
        "pretraining_log": log_summary,
        "intrinsic": {},
        "tasks": {},
        "embeddings": None,
    }
    for job in jobs:
        if job.kind == "intrinsic":
            metrics["intrinsic"].setdefault(job.phase, {})[_model_name(job.random_init)] = results[job.key]

    files: Counter[str] = Counter()
    for task in eval_cfg.tasks:
        by_model = {m: [results[f"finetune__{task.name}__{_model_name(m)}__seed{s}"] for s in task.seeds] for m in models}
        summaries = {m: finetune.summarize_seeds(runs) for m, runs in by_model.items()}
        first = by_model[False][0]
        entry: dict[str, Any] = {
            "type": task.type,
            "primary_metric": report.PRIMARY_METRIC[task.type],
            "seeds": len(task.seeds),
            "folds": task.cross_validation_folds,
            "freeze_encoder": task.freeze_encoder,
            "labels": first["labels"],
            "train_examples": first["train_examples"],
        }
        for m, summary in summaries.items():
            entry[_model_name(m)] = {k: v for k, v in summary.items() if k != "runs"} | {"runs": [_slim_run(r) for r in summary["runs"]]}
        if True in summaries:
            entry["gain"] = finetune.baseline_gain(summaries[False], summaries[True])
        entry["skipped"] = first["skipped"]
        entry["skipped_problems"] = first["skipped_problems"]
        for split, n in first["skipped"].items():
            if n:
                files[getattr(task, split)] += n
        metrics["tasks"][task.name] = entry

    embedding_jobs = [job for job in jobs if job.kind == "embeddings"]
    if embedding_jobs:
        first = results[embedding_jobs[0].key]
        metrics["embeddings"] = {"sentences": n_sentences, "sts_pairs": first["sts_pairs"]}
        for job in embedding_jobs:
            metrics["embeddings"][_model_name(job.random_init)] = results[job.key]["scores"]
        if first["skipped"]:
            files[eval_cfg.embeddings.sts.file] += first["skipped"]
            metrics["embeddings"]["skipped_problems"] = first["skipped_problems"]
    metrics["skipped_rows"] = {"total": files.total(), "files": dict(files)}
    metrics["notes"] = notes
    return metrics


def _stats(metrics: dict) -> dict:
    """What the manifest (and the flow's statistics table) shows: the headline numbers."""
    stats: dict[str, Any] = {"skipped_rows": metrics["skipped_rows"]["total"], "tasks": {}, "intrinsic": {}}
    for phase, by_model in metrics["intrinsic"].items():
        stats["intrinsic"][phase] = {m: {k: s.get(k) for k in ("mlm_accuracy", "mlm_perplexity", "nsp_accuracy")} for m, s in by_model.items()}
    for name, task in metrics["tasks"].items():
        metric = task["primary_metric"]
        stats["tasks"][name] = {"metric": metric} | {
            m: task[m]["validation"][metric]["median"] for m in ("pretrained", "random_init") if m in task and metric in task[m].get("validation", {})
        }
    return report.json_safe(stats)


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
    return [ShardInfo(path=relative, rows=0, bytes=w.bytes, sha256=w.sha256) for relative, w in written]


def run(cfg: PipelineConfig, storage: Storage, *, force: bool = False, parallelism: int | None = None) -> tuple[Manifest, bool]:
    """The stage interface: `evaluate` on the run config's `evaluate` section."""
    return evaluate(cfg.evaluate, cfg.run.root, storage, cfg.run.seed, force=force, parallelism=parallelism, pipeline_config=cfg)


def expected_fingerprint(cfg: PipelineConfig, storage: Storage) -> str:
    from pipelines import examples, vocab

    _, signatures = _resolve_files(cfg.evaluate, storage)
    # pretrain's fingerprint is built on this same examples fingerprint, and each one lists the corpus inputs again.
    examples_fp = examples.expected_fingerprint(cfg, storage)
    pretrain_fp = pretrain._fingerprint(cfg, examples_fp, vocab.expected_fingerprint(cfg, storage))
    return _fingerprint(cfg.evaluate, cfg.run.seed, pretrain_fp, examples_fp, signatures)


# -- report and Prefect artifacts -----------------------------------------------------------------


def load_report(root: str, storage: Storage) -> tuple[str, list[dict]]:
    """(report.md text, score rows) of a finished evaluation, for `publish_artifacts`."""
    stage = StageDir(storage, root, DIRECTORY)
    metrics = storage.read_json(stage.path("metrics.json"))
    return storage.read_text(stage.path("report.md")), report.score_rows(metrics)


def publish_artifacts(report_md: str, rows: list[dict]) -> bool:
    """Publish the report (markdown) and the scores (table) as Prefect artifacts of the
    current flow or task run. Outside a run there is nowhere to attach them: returns False
    and does nothing."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.context import get_run_context
    from prefect.exceptions import MissingContextError

    try:
        get_run_context()
    except MissingContextError:
        return False
    create_markdown_artifact(markdown=report_md, key="evaluation-report", description="Evaluation report (eval/report.md)")
    if rows:
        create_table_artifact(table=rows, key="evaluation-scores", description="Evaluation scores: pretrained vs random init")
    return True
