"""The Prefect flow `bert_pretraining` (real Prefect API from the test harness, real local
Ray): stages in order, cached re-runs, exactly the downstream stages re-run after a change,
and `bertpipe status`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flows.pipeline import bert_pretraining
from pipelines.runner import Pipeline


@pytest.fixture
def upstream_copy(demo_pipeline, tmp_path):
    """A run root holding the session's finished stages, so flow tests start warm."""
    cfg, _ = demo_pipeline
    for stage in ("corpus", "vocab", "examples"):
        shutil.copytree(Path(cfg.run.root) / stage, tmp_path / stage)
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"root": str(tmp_path)})})


DATA_STAGES = ["corpus", "vocab", "examples"]


def states(summaries):
    return {s["stage"]: s["state"] for s in summaries}


def test_flow_caches_and_reruns_downstream_only(upstream_copy, prefect_harness):
    cfg = upstream_copy
    assert states(bert_pretraining(cfg, only=DATA_STAGES)) == {
        "corpus": "cached",
        "vocab": "cached",
        "examples": "cached",
    }
    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()} == {
        "corpus": "complete",
        "vocab": "complete",
        "examples": "complete",
        "pretrain": "missing",
        "distill": "off",  # distill.enabled is false: status says so rather than "missing"
        "evaluate": "missing",
    }

    changed = cfg.model_copy(update={"examples": cfg.examples.model_copy(update={"masked_lm_prob": 0.2})})
    assert {r["stage"]: r["state"] for r in Pipeline(changed).status()}["examples"] == "stale"
    assert states(bert_pretraining(changed, only=DATA_STAGES)) == {
        "corpus": "cached",
        "vocab": "cached",
        "examples": "computed",
    }
    assert states(bert_pretraining(changed, only=["vocab"], force=True)) == {"vocab": "computed"}
    assert states(bert_pretraining(changed, only=["examples"])) == {"examples": "cached"}


def test_flow_reports_a_user_error_as_one_line(tmp_path, prefect_harness, ray_cluster):
    from pipelines.registry import parse_config

    cfg = parse_config({"run": {"root": str(tmp_path)}, "corpus": {"inputs": [str(tmp_path / "none.txt")]}})
    state = bert_pretraining(cfg, only=["vocab"], return_state=True)
    assert state.is_failed()
    assert "corpus stage has no output" in state.message and "\n" not in state.message
    state = bert_pretraining(cfg, return_state=True)
    assert state.is_failed() and "corpus.inputs[0]" in state.message


def test_stage_selection():
    from bertcore.errors import ConfigError
    from pipelines.registry import select

    assert select(None, None) == ["corpus", "vocab", "examples", "pretrain", "distill", "evaluate"]
    off = {"distill": "distill.enabled is false"}  # what a recipe without distillation leaves out
    assert select(None, None, off) == ["corpus", "vocab", "examples", "pretrain", "evaluate"]
    assert select(None, "examples", off) == ["examples", "pretrain", "evaluate"]
    assert select(["evaluate", "corpus"], None) == ["corpus", "evaluate"]
    with pytest.raises(ConfigError, match="unknown stage 'trainer'"):
        select(["trainer"], None)
    with pytest.raises(ConfigError, match="either --only or --from"):
        select(["corpus"], "vocab")


def _task_runs(flow_run_id) -> dict:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))

    return {run.name: run.state for run in asyncio.run(read())}


def test_skipped_stages_show_as_cached_in_prefect_and_in_the_summary(upstream_copy, prefect_harness):
    from prefect.client.schemas.objects import StateType

    from flows import summary

    cfg = upstream_copy
    state = bert_pretraining(cfg, only=DATA_STAGES, return_state=True)
    summaries = state.result()
    fingerprints = {s["stage"]: s["fingerprint"] for s in summaries}
    runs = _task_runs(state.state_details.flow_run_id)
    assert {name: (s.type, s.name) for name, s in runs.items()} == dict.fromkeys(
        DATA_STAGES, (StateType.COMPLETED, "Cached")
    )
    assert {name: s.state_details.cache_key for name, s in runs.items()} == {
        n: f"bertpipe-{n}-{fingerprints[n]}" for n in DATA_STAGES
    }

    table = summary.table(summaries)
    assert table[0].split() == ["stage", "state", "time", "key", "figures"]
    rows = {line.split()[0]: line for line in table[1:] if not line.startswith(" ")}  # not the wrapped figures
    assert list(rows) == DATA_STAGES and all(line.split()[1] == "cached" for line in rows.values())
    corpus = next(s for s in summaries if s["stage"] == "corpus")
    assert f"documents {corpus['headline']['documents']}" in rows["corpus"]
    assert "[UNK] rate" in rows["vocab"] and "examples " in rows["examples"]
    commands = "\n".join(
        summary.next_commands(summaries, cfg.run.root, "configs/demo.yaml", [f"run.root={cfg.run.root}"])
    )
    assert f"bertpipe inspect examples --root {cfg.run.root} --n 2" in commands
    assert "bertpipe status -c configs/demo.yaml  (with this run's --set options)" in commands
    assert "from_pretrained" not in commands  # no model in this run
    assert "bertpipe inspect examples -c configs/demo.yaml --n 2" in "\n".join(
        summary.next_commands(summaries, cfg.run.root, "configs/demo.yaml", [])
    )

    state = bert_pretraining(cfg, only=["vocab"], force=True, return_state=True)
    runs = _task_runs(state.state_details.flow_run_id)
    assert (runs["vocab"].type, runs["vocab"].name) == (StateType.COMPLETED, "Completed")
    assert state.result()[0]["state"] == "computed"


def test_stage_lines_reach_the_flow_runs_log_in_prefect(upstream_copy, prefect_harness):
    """The start, progress and end lines of a stage are in Prefect's log of its task run
    (the CLI and deployments attach Prefect's API handler to the project's loggers through
    PREFECT_LOGGING_EXTRA_LOGGERS; here the same handler is attached by hand, and the flow
    itself puts the loggers at INFO, as in a deployment's flow run)."""
    import asyncio
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("pipelines")
    handler, level = APILogHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.NOTSET)
    try:
        state = bert_pretraining(upstream_copy, only=["vocab"], force=True, return_state=True)
        handler.flush()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)

    async def read():
        async with get_client() as client:
            flow_run = state.state_details.flow_run_id
            return await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run])))

    logs = asyncio.run(read())
    vocab_run = _task_runs(state.state_details.flow_run_id)
    mine = [log for log in logs if log.name.startswith("pipelines")]
    messages = [log.message for log in mine]
    assert any(m.startswith("vocab: start · reads corpus") for m in messages), messages
    assert any(m.startswith("vocab: train 1/1 units") for m in messages), messages
    assert any(m.startswith("vocab: done in") and "[UNK] rate" in m for m in messages), messages
    assert {log.task_run_id for log in mine} == {vocab_run["vocab"].state_details.task_run_id}


def test_a_bad_input_fails_the_flow_once_with_one_line(tmp_path, prefect_harness, ray_cluster):
    """A damaged input fails the same way every time: one line naming the file and byte,
    and the stage is not retried."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from pipelines.registry import parse_config

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "A fine first record."}\n{"text": \n', encoding="utf-8")
    cfg = parse_config({"run": {"root": str(tmp_path / "run")}, "corpus": {"inputs": [str(bad)]}})
    state = bert_pretraining(cfg, only=["corpus"], return_state=True)
    assert state.is_failed() and "\n" not in state.message
    assert str(bad) in state.message and "byte 33" in state.message
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    assert [run.run_count for run in runs] == [1]
