"""The Prefect flow `bert_pretraining`: one task per stage, in the registry's order.

The flow only sequences stages, retries and reports; each stage decides from its manifest
whether it is already complete (and is then shown as cached). The flow's parameter is the
pydantic run config, so the Prefect UI shows a typed form. What Prefect stores of it (its
JSON form) has every password inside a URI masked (bertcore/redact.py), while a run started
in this process uses the object itself, real values included; so are the failure messages,
log records and artifacts it stores.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import StateDetails
from prefect.states import Completed, Failed

from bertcore.errors import BertpipeError
from bertcore.model.hf_files import MLM_SUFFIX, MODEL_DIR
from bertcore.model.sentence_files import MODULES_FILE
from bertcore.redact import mask_text, masked
from bertcore.vocab.morphemes import PRE_TOKENIZER_KEY
from flows import logs, run_log, supervise
from flows.artifacts import publish_stage
from flows.failures import describe, is_transient, write_traceback
from pipelines.lease import RootLease
from pipelines.ray_runtime import ensure_ray
from pipelines.registry import PipelineConfig, select
from pipelines.runner import Pipeline

USER_ERROR = "UserError"
PERMANENT_ERROR = "PermanentError"
CACHED = "Cached"
"""Name of the state of a stage whose complete output has its fingerprint (Prefect shows it as cached)."""


class TransientStageError(RuntimeError):
    """A stage failed for a cause that may pass (a lost Ray worker, a network error); its
    message is `describe`'s line, so what Prefect stores holds no password (the original
    exception, masked, is in the log)."""


def _retry_transient_only(task, task_run, state) -> bool:
    # a user's mistake (bad config, missing input) or a permanent failure (disk full, no
    # permission, a missing bucket, a damaged manifest) fails the same way every time; a
    # lost Ray node or a flaky object store does not, and a retried stage redoes only the
    # units that are not finished
    return state.name not in (USER_ERROR, PERMANENT_ERROR)


@task(
    name="stage",
    cache_policy=NO_CACHE,
    task_run_name="{name}",
    retries=2,
    retry_delay_seconds=[30, 120],
    retry_condition_fn=_retry_transient_only,
)
def run_stage(name: str, pipeline: Pipeline, force: bool) -> dict[str, Any]:
    from prefect.runtime import task_run

    logger = get_run_logger()
    started = time.perf_counter()
    # --force recomputes on the first attempt only: a retry (a lost node) resumes what the
    # forced attempt already did instead of starting over again
    force = force and (task_run.run_count or 1) <= 1
    try:
        manifest, computed = pipeline.run(name, force=force)
    except BertpipeError as exc:
        # A user's mistake: fail with one clear line instead of a traceback.
        return Failed(name=USER_ERROR, message=mask_text(f"{name}: {exc}"))
    except Exception as exc:  # noqa: BLE001 - a bug or an outage: retried when transient, else the stage fails
        # the traceback goes to a file under run.root, not to the console: its last line is the error
        logger.error(
            "%s failed; full traceback in %s", name, write_traceback(name, exc, pipeline.cfg.run.root, pipeline.storage)
        )
        if is_transient(exc):  # Prefect tries the stage again; finished units are kept
            raise TransientStageError(describe(name, exc, pipeline.cfg.run.root)) from None
        return Failed(name=PERMANENT_ERROR, message=describe(name, exc, pipeline.cfg.run.root))
    directory = pipeline.dir(name)
    summary = {
        "stage": name,
        "state": "computed" if computed else "cached",
        "fingerprint": manifest.fingerprint,
        "rows": manifest.rows,
        "bytes": manifest.bytes,
        "seconds": manifest.timings.get("total_s"),
        "skipped_inputs": len(manifest.skipped),
        "uri": mask_text(directory.uri),
        "elapsed_s": round(time.perf_counter() - started, 3),
        "headline": manifest.headline,
    }
    if manifest.report:
        summary["report"] = mask_text(directory.path(manifest.report))
    for folder in (MODEL_DIR + MLM_SUFFIX, MODEL_DIR):  # the folder AutoModelForMaskedLM loads without unexpected keys
        if manifest.shards_under(f"{folder}/"):
            summary["model"] = mask_text(directory.path(folder))
            summary["model_kind"] = (
                "sentence-transformers" if manifest.shards_under(f"{folder}/{MODULES_FILE}") else "masked-lm"
            )
            break
    if manifest.stats.get(PRE_TOKENIZER_KEY):
        summary["morphemes"] = manifest.stats[PRE_TOKENIZER_KEY]  # the vocabulary splits Korean morphemes (vocab)
    if manifest.stats.get("verdicts"):
        summary["verdicts"] = list(manifest.stats["verdicts"])  # what the run's last lines say (evaluate)
    for skipped in masked(manifest.skipped):
        logger.warning("%s: skipped input %s: %s", name, skipped["file"], skipped["reason"])
    publish_stage(name, manifest, directory, computed)
    if computed:
        return summary
    # skipped on a matching fingerprint: a Completed state named Cached, keyed by the fingerprint
    return Completed(
        name=CACHED,
        data=summary,
        message=f"{name}: output complete with fingerprint {manifest.fingerprint}",
        state_details=StateDetails(cache_key=f"bertpipe-{name}-{manifest.fingerprint}"),
    )


@flow(name="bert_pretraining", log_prints=True)
def bert_pretraining(
    config: PipelineConfig,
    only: list[str] | None = None,
    from_stage: str | None = None,
    force: bool = False,
    verify: bool = False,
) -> list[dict[str, Any]]:
    """Raw text to a pretrained, evaluated BERT encoder: corpus -> vocab -> examples ->
    pretrain -> evaluate. Stages already complete with the same fingerprint are cached;
    `verify` re-hashes every shard before trusting it."""
    logs.default_levels()
    pipeline = Pipeline(config, verify=verify)
    with run_log.recorded(config.run.root, pipeline.storage) as record, supervise.Watch() as watch:
        return record.ended(watch.refusal() or _run(pipeline, select(only, from_stage, pipeline.off), force, watch))


def _run(pipeline: Pipeline, stages: list[str], force: bool, watch: supervise.Watch) -> list[dict[str, Any]] | Any:
    """The stages in order under the root's writer lease; a failed stage ends the run with its line."""
    config = pipeline.cfg
    summaries = []
    try:
        with one_writer(pipeline) as lease:
            ensure_ray(config.ray)
            logs.route_ray_output()
            for name in stages:
                lease.check()
                if watch.worker_lost:  # its worker died: hand over to a live one before the next stage
                    return watch.handover(name)
                for line in pipeline.stale_reads(name, stages):  # --only: what it reads is as it was, said once
                    get_run_logger().warning("%s", line)
                state = run_stage(name, pipeline, force, return_state=True)
                if state.is_failed():
                    return Failed(message=_one_line(name, state, pipeline))
                summaries.append(state.result())
    except BertpipeError as exc:  # the root is held by another writer, or was taken over
        return Failed(message=mask_text(str(exc)))
    except Exception as exc:  # noqa: BLE001 - e.g. the lease cannot be written: a read-only root, a missing bucket
        get_run_logger().error(
            "the run failed; full traceback in %s", write_traceback("run", exc, config.run.root, pipeline.storage)
        )
        return Failed(message=describe("run", exc, config.run.root))
    return summaries


def _one_line(name: str, state, pipeline: Pipeline) -> str:
    """The failed stage's message: ours already is one line; an error that Prefect retried
    until it gave up is described from the exception itself."""
    if state.name in (USER_ERROR, PERMANENT_ERROR):
        return state.message
    error = state.result(raise_on_failure=False)
    if isinstance(error, TransientStageError):
        return f"{error} (after retries)"
    if isinstance(error, BaseException):
        return describe(name, error, pipeline.cfg.run.root) + " (after retries)"
    return mask_text(f"{name}: {' '.join(str(state.message).split())}")


def root_limit(root: str) -> str:
    """The Prefect global concurrency limit that deployments of one run root share."""
    return "bertpipe-root-" + hashlib.sha256(root.encode()).hexdigest()[:16]


@contextlib.contextmanager
def one_writer(pipeline: Pipeline) -> Iterator[RootLease]:
    """Hold the run root for this flow run: in a deployment, first a slot of the root's
    concurrency limit (other deployments of the root wait their turn), then the lease file
    (any other writer, a CLI run included, is refused at once)."""
    from prefect.runtime import deployment, flow_run

    holder = f"flow run {flow_run.name or '?'} ({flow_run.id or 'no id'})"
    with contextlib.ExitStack() as stack:
        if deployment.id:
            from prefect.concurrency.sync import concurrency

            # a dead holder's slot frees within the crash window, when its run is rescheduled
            stack.enter_context(
                concurrency(
                    root_limit(pipeline.cfg.run.root), occupy=1, strict=False, lease_duration=supervise.slot_lease_s()
                )
            )
        yield stack.enter_context(RootLease(pipeline.storage, pipeline.cfg.run.root, holder))
