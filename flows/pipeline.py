"""The Prefect flow `bert_pretraining`: one task per stage, in order.

The flow only sequences stages and reports; each stage decides from its manifest whether
it is already complete (and is then shown as cached). The flow's parameter is the
pydantic run config, so the Prefect UI shows a typed form.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from bertcore.config import PipelineConfig
from bertcore.errors import BertpipeError
from flows.stages import REGISTRY, select
from pipelines.ray_runtime import ensure_ray
from pipelines.storage import Storage


def _summary(name: str, manifest, computed: bool, stage_uri: str) -> dict[str, Any]:
    return {
        "stage": name,
        "state": "computed" if computed else "cached",
        "fingerprint": manifest.fingerprint,
        "rows": manifest.rows,
        "bytes": manifest.bytes,
        "seconds": manifest.timings.get("total_s"),
        "skipped_inputs": len(manifest.skipped),
        "uri": stage_uri,
    }


USER_ERROR = "UserError"


def _retry_unless_user_error(task, task_run, state) -> bool:
    # a user's mistake (bad config, missing input) fails the same way every time; a lost
    # Ray node or a flaky object store does not, and a retried stage redoes only the
    # shards that are not finished
    return state.name != USER_ERROR


@task(
    name="stage",
    cache_policy=NO_CACHE,
    task_run_name="{name}",
    retries=2,
    retry_delay_seconds=[30, 120],
    retry_condition_fn=_retry_unless_user_error,
)
def run_stage(name: str, config: PipelineConfig, force: bool) -> dict[str, Any]:
    logger = get_run_logger()
    storage = Storage(config.storage)
    spec = REGISTRY[name]
    try:
        manifest, computed = spec.run(config, storage, force=force, parallelism=config.ray.parallelism)
    except BertpipeError as exc:
        # A user's mistake: fail with one clear line instead of a traceback.
        return Failed(name=USER_ERROR, message=f"{name}: {exc}")
    stage_uri = f"{config.run.root}/{spec.directory}"
    summary = _summary(name, manifest, computed, stage_uri)
    logger.info("%s: %s (%s rows, fingerprint %s) -> %s", name, summary["state"], summary["rows"], manifest.fingerprint, stage_uri)
    for skipped in manifest.skipped:
        logger.warning("%s: skipped input %s: %s", name, skipped["file"], skipped["reason"])
    if name == "evaluate":
        from pipelines import evaluate

        evaluate.publish_artifacts(*evaluate.load_report(config.run.root, storage))
        summary["report"] = f"{stage_uri}/report.md"
    create_table_artifact(
        key=f"{name}-stats",
        table=[{"statistic": k, "value": str(v)} for k, v in _flatten(manifest.stats).items()],
        description=f"{name} stage statistics ({summary['state']})",
    )
    return summary


def _flatten(stats: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and len(out) < 200:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


@flow(name="bert_pretraining", log_prints=True)
def bert_pretraining(
    config: PipelineConfig,
    only: list[str] | None = None,
    from_stage: str | None = None,
    force: bool = False,
) -> list[dict[str, Any]]:
    """Raw text to a pretrained, evaluated BERT encoder: corpus -> vocab -> examples ->
    pretrain -> evaluate. Stages already complete with the same fingerprint are cached."""
    stages = select(only, from_stage)
    ensure_ray(config.ray)
    summaries = []
    for name in stages:
        state = run_stage(name, config, force, return_state=True)
        if state.is_failed():
            return Failed(message=state.message)
        summaries.append(state.result())
    return summaries
