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
    assert states(bert_pretraining(cfg, only=DATA_STAGES)) == {"corpus": "cached", "vocab": "cached", "examples": "cached"}
    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()} == {
        "corpus": "complete",
        "vocab": "complete",
        "examples": "complete",
        "pretrain": "missing",
        "evaluate": "missing",
    }

    changed = cfg.model_copy(update={"examples": cfg.examples.model_copy(update={"masked_lm_prob": 0.2})})
    assert {r["stage"]: r["state"] for r in Pipeline(changed).status()}["examples"] == "stale"
    assert states(bert_pretraining(changed, only=DATA_STAGES)) == {"corpus": "cached", "vocab": "cached", "examples": "computed"}
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

    assert select(None, None) == ["corpus", "vocab", "examples", "pretrain", "evaluate"]
    assert select(None, "examples") == ["examples", "pretrain", "evaluate"]
    assert select(["evaluate", "corpus"], None) == ["corpus", "evaluate"]
    with pytest.raises(ConfigError, match="unknown stage 'trainer'"):
        select(["trainer"], None)
    with pytest.raises(ConfigError, match="either --only or --from"):
        select(["corpus"], "vocab")


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
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert [run.run_count for run in runs] == [1]
