"""The Prefect flow `bert_pretraining`: one task per stage, in the registry's order.

The flow only sequences stages, retries and reports; each stage decides from its manifest
whether it is already complete (and is then shown as cached). The flow's parameter is the
pydantic run config, so the Prefect UI shows a typed form.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import StateDetails
from prefect.states import Completed, Failed

from bertcore.errors import BertpipeError
from flows import logs
from flows.artifacts import publish_stage
from pipelines.ray_runtime import ensure_ray
from pipelines.registry import PipelineConfig, select
from pipelines.runner import Pipeline

USER_ERROR = "UserError"
CACHED = "Cached"
"""Name of the state of a stage whose complete output has its fingerprint (Prefect shows it as cached)."""


def _retry_unless_user_error(task, task_run, state) -> bool:
    # a user's mistake (bad config, missing input) fails the same way every time; a lost
    # Ray node or a flaky object store does not, and a retried stage redoes only the
    # units that are not finished
    return state.name != USER_ERROR


@task(
    name="stage",
    cache_policy=NO_CACHE,
    task_run_name="{name}",
    retries=2,
    retry_delay_seconds=[30, 120],
    retry_condition_fn=_retry_unless_user_error,
)
def run_stage(name: str, pipeline: Pipeline, force: bool) -> dict[str, Any]:
    logger = get_run_logger()
    started = time.perf_counter()
    try:
        manifest, computed = pipeline.run(name, force=force)
    except BertpipeError as exc:
        # A user's mistake: fail with one clear line instead of a traceback.
        return Failed(name=USER_ERROR, message=f"{name}: {exc}")
    directory = pipeline.dir(name)
    summary = {
        "stage": name,
        "state": "computed" if computed else "cached",
        "fingerprint": manifest.fingerprint,
        "rows": manifest.rows,
        "bytes": manifest.bytes,
        "seconds": manifest.timings.get("total_s"),
        "skipped_inputs": len(manifest.skipped),
        "uri": directory.uri,
        "elapsed_s": round(time.perf_counter() - started, 3),
        "headline": manifest.headline,
    }
    if manifest.report:
        summary["report"] = directory.path(manifest.report)
    for skipped in manifest.skipped:
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
) -> list[dict[str, Any]]:
    """Raw text to a pretrained, evaluated BERT encoder: corpus -> vocab -> examples ->
    pretrain -> evaluate. Stages already complete with the same fingerprint are cached."""
    logs.default_levels()
    stages = select(only, from_stage)
    ensure_ray(config.ray)
    logs.route_ray_output()
    pipeline = Pipeline(config)
    summaries = []
    for name in stages:
        state = run_stage(name, pipeline, force, return_state=True)
        if state.is_failed():
            return Failed(message=state.message)
        summaries.append(state.result())
    return summaries
