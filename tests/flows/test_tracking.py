"""Experiment tracking of the training loop (one process, gloo): TensorBoard event files
always, MLflow and Weights & Biases in their offline modes when installed (these tests
skip without them). Each follows a crash and resume into the same run."""

from __future__ import annotations

import json
import os

import pytest

from bertcore.train.metrics_log import METRICS, TENSORBOARD, TRACKING_STATE, VALIDATION, MetricsLog, final, intervals
from test_train import Crash, crash_at, make_run_root, make_trainer, tiny_pretrain


@pytest.fixture(scope="module")
def news_root(tmp_path_factory, gensim_data):
    root = tmp_path_factory.mktemp("tracked")
    return root, make_run_root(root, gensim_data, max_documents=120)


def tracked(**tracking) -> object:
    return tiny_pretrain(log_every=5, eval_every=10, tracking=tracking)


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_gets_the_interval_means_and_validations_and_a_resume_replaces_the_redone_points(
    world_of_one, news_root, tmp_path
):
    root, info = news_root
    stage = tmp_path / "stage"
    cfg = tiny_pretrain(log_every=4, eval_every=10)  # intervals 9-12 and 13-16 straddle the step-10 checkpoint
    with pytest.raises(Crash):  # after the step-16 point and before the step-20 checkpoint: resumes from 10
        make_trainer(cfg, root, info, stage, on_step=crash_at(17)).run()
    make_trainer(cfg, root, info, stage).run()

    scalars = tensorboard_scalars(stage / TENSORBOARD)
    records = MetricsLog(str(stage / METRICS)).records()
    metrics = {r["step"]: r for r in records}
    validations = {r["step"]: r for r in MetricsLog(str(stage / VALIDATION)).records()}
    means = intervals(records, 4)  # what the console printed, the report plots and inspect shows
    assert (
        [step for step, _ in scalars["train/loss"]] == [s["step"] for s in means] == [4, 8, 12, 16, 20]
    )  # no point twice
    # the means over each interval, the one the resume cut through (9-12: steps 9-10 logged before the crash) included
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([s["loss"] for s in means], rel=1e-6)
    assert [v for _, v in scalars["train/mlm_accuracy"]] == pytest.approx([s["mlm_accuracy"] for s in means], rel=1e-6)
    assert [v for _, v in scalars["train/lr"]] == pytest.approx(
        [metrics[s]["lr"] for s in (4, 8, 12, 16, 20)], rel=1e-6
    )
    assert [step for step, _ in scalars["validation/mlm_loss"]] == [10, 20]
    assert [v for _, v in scalars["validation/mlm_loss"]] == pytest.approx(
        [validations[s]["mlm_loss"] for s in (10, 20)], rel=1e-6
    )
    assert "train/mfu" not in scalars  # no peak FLOP/s on a CPU: nothing rather than a made-up number


def test_mlflow_run_in_a_local_store_continues_after_a_resume(world_of_one, news_root, tmp_path, monkeypatch):
    import mlflow  # noqa: F401 - the dev extra installs it: missing, the test fails
    from mlflow.tracking import MlflowClient

    root, info = news_root
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow 3's offline store (its file store needs an opt-in)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    stage = tmp_path / "stage"
    with pytest.raises(Crash):
        make_trainer(tracked(mlflow=True, project="news"), root, info, stage, on_step=crash_at(12)).run()
    run_id = json.loads((stage / TRACKING_STATE).read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).info.status == "FAILED"
    make_trainer(tracked(mlflow=True, project="news"), root, info, stage).run()

    experiment = client.get_experiment_by_name("news")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # the resumed attempt logged into the same run
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name.startswith("pretrain-")
    assert run.data.params["pretrain.learning_rate"] == "0.001" and run.data.params["model.num_hidden_layers"] == "2"
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted({m.step for m in history}) == [5, 10, 15, 20]
    last = final(MetricsLog(str(stage / METRICS)).records(), 5)  # the mean of steps 16-20
    assert [m.value for m in history if m.step == 20] == pytest.approx([last["loss"]])
    assert [m.step for m in client.get_metric_history(run_id, "validation/mlm_accuracy")] == [10, 20]


def test_wandb_offline_run_is_written_under_the_stage_and_resumed_by_id(world_of_one, news_root, tmp_path, monkeypatch):
    import wandb  # noqa: F401 - the dev extra installs it: missing, the test fails

    root, info = news_root
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    stage = tmp_path / "stage"
    with pytest.raises(Crash):
        make_trainer(tracked(wandb=True), root, info, stage, on_step=crash_at(12)).run()
    run_id = json.loads((stage / TRACKING_STATE).read_text())["wandb_run_id"]
    make_trainer(tracked(wandb=True), root, info, stage).run()
    assert json.loads((stage / TRACKING_STATE).read_text())["wandb_run_id"] == run_id
    runs = sorted(name for name in os.listdir(stage / "wandb" / "wandb") if name.startswith("offline-run-"))
    assert len(runs) == 2 and all(name.endswith(f"-{run_id}") for name in runs)  # two attempts, one run id
    for name in runs:
        assert (stage / "wandb" / "wandb" / name / f"run-{run_id}.wandb").stat().st_size > 0


def test_an_enabled_tracker_that_is_not_installed_is_skipped_with_a_warning(
    world_of_one, news_root, tmp_path, monkeypatch, caplog
):
    import importlib.util

    root, info = news_root
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    marker = make_trainer(tiny_pretrain(tracking={"wandb": True}), root, info, tmp_path).run()
    assert marker["step"] == 20
    assert "pretrain.tracking.wandb is on but the wandb package is not installed" in caplog.text
    assert not (tmp_path / TRACKING_STATE).exists()


@pytest.mark.slow
def test_training_curves_artifact_in_a_flow(prefect_harness, world_of_one, news_root, tmp_path):
    import asyncio

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    from bertcore.config import StorageConfig
    from flows.artifacts import publish_stage
    from pipelines.stage_dir import Manifest, ShardInfo, StageDir
    from pipelines.storage import Storage

    root, info = news_root
    directory = StageDir(Storage(StorageConfig()), str(tmp_path), "pretrain")
    make_trainer(tiny_pretrain(eval_every=10), root, info, tmp_path / "pretrain").run()
    shards = [ShardInfo(name, 1, (tmp_path / "pretrain" / name).stat().st_size, "-") for name in (METRICS, VALIDATION)]
    manifest = Manifest("pretrain", "1", "fp", {}, {"log_every": 5}, shards, {"steps": 20}, {})

    @flow
    def publish() -> bool:
        return publish_stage("pretrain", manifest, directory, computed=True)

    state = publish(return_state=True)
    assert state.result() is True

    async def read(key: str):  # this flow run's artifact (other tests of the session publish the same key)
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=[key]),
                    flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]),
                )
            )

    found = asyncio.run(read("pretrain-curves"))
    assert len(found) == 1
    curves = found[0].data
    steps = MetricsLog(str(tmp_path / "pretrain" / METRICS)).records()
    validations = MetricsLog(str(tmp_path / "pretrain" / VALIDATION)).records()
    assert "Training loss (means of 5 steps), steps 1-20" in curves
    last = final(steps, 5)  # the last interval is always a row, as the console printed it
    assert (
        f"| 16-20 | seq64 | {last['loss']:.3f} | {last['mlm_loss']:.3f} | {100 * last['mlm_accuracy']:.1f}% |" in curves
    )
    for v in validations:  # both validations, with their held-out MLM loss and accuracy in percent
        assert (
            f"| {v['step']} | seq64 | {v['sequences']:,} | {v['loss']:.3f} | {v['mlm_loss']:.3f} | "
            f"{100 * v['mlm_accuracy']:.1f}% |"
        ) in curves


def test_sparkline_scales_from_the_lowest_to_the_highest_value():
    from flows.artifacts import sparkline

    assert sparkline([4.0, 3.0, 2.0, 1.0]) == "█▆▃▁"
    assert sparkline([2.0, 2.0]) == "▁▁" and sparkline([None, None]) == ""
    assert len(sparkline([float(i) for i in range(1000)], width=50)) == 50


def test_an_enabled_tracker_that_cannot_start_stops_the_run_naming_its_key(
    world_of_one, news_root, tmp_path, monkeypatch
):
    import mlflow  # noqa: F401 - the dev extra installs it: missing, the test fails

    from bertcore.errors import ConfigError

    root, info = news_root
    monkeypatch.setenv(
        "MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}"
    )  # MLflow 3 refuses file stores unless opted in
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(
        ConfigError, match=r"pretrain\.tracking\.mlflow: no MLflow run could be started \(.*filesystem tracking backend"
    ):
        make_trainer(tiny_pretrain(tracking={"mlflow": True}), root, info, tmp_path / "stage").run()
    assert not (tmp_path / "stage" / TENSORBOARD).exists()  # nothing was opened before the error


def test_evaluation_scores_and_verdicts_go_to_the_runs_pretraining_used(tmp_path, monkeypatch):
    """The evaluate stage's part (bertcore.train.tracking.log_evaluation): TensorBoard always, and
    into the MLflow run whose id pretraining kept, and the W&B run (offline)."""
    import wandb  # noqa: F401 - the dev extra installs MLflow and W&B: a missing one fails here
    from mlflow.tracking import MlflowClient

    from bertcore.train.tracking import TrackingConfig, evaluation_scalars, log_evaluation

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(
        client.create_experiment("news"), run_name="pretrain-x"
    ).info.run_id  # what pretraining left
    rows = [
        {
            "section": "pretraining",
            "name": "seq128",
            "metric": "mlm_accuracy",
            "pretrained": 0.088,
            "random_init": 0.0002,
            "gain": 0.0878,
        },
        {
            "section": "fine-tuning",
            "name": "polarity",
            "metric": "accuracy",
            "pretrained": 0.465,
            "random_init": 0.5,
            "gain": -0.035,
        },
        {
            "section": "fine-tuning",
            "name": "polarity (test)",
            "metric": "accuracy",
            "pretrained": 0.4,
            "random_init": 0.5,
            "gain": -0.1,
        },
    ]
    scalars = evaluation_scalars(rows)
    assert scalars == {
        "eval/seq128/mlm_accuracy": 0.088,
        "eval/seq128/mlm_accuracy_random_init": 0.0002,
        "eval/seq128/mlm_accuracy_gain": 0.0878,
        "eval/polarity/accuracy": 0.465,
        "eval/polarity/accuracy_random_init": 0.5,
        "eval/polarity/accuracy_gain": -0.035,
    }
    verdicts = {"polarity": "no measurable gain (-3.5 points, within the seed spread of 4.5)"}
    cfg = TrackingConfig(mlflow=True, mlflow_tracking_uri=uri, wandb=True, project="news")
    log_evaluation(
        cfg,
        {"mlflow_run_id": run_id},
        step=600,
        scalars=scalars,
        verdicts=verdicts,
        tensorboard_dir=str(tmp_path / "tb"),
        wandb_dir=str(tmp_path / "wandb"),
        run_name="evaluate-x",
    )

    run = client.get_run(run_id)
    assert (
        run.data.metrics["eval/polarity/accuracy"] == pytest.approx(0.465)
        and run.data.tags["verdict.polarity"] == verdicts["polarity"]
    )
    assert [m.step for m in client.get_metric_history(run_id, "eval/seq128/mlm_accuracy")] == [600]
    assert run.info.status == "FINISHED"
    board = tensorboard_scalars(tmp_path / "tb")
    assert board["eval/polarity/accuracy_gain"] == [(600, pytest.approx(-0.035))]
    assert any(name.startswith("offline-run-") for name in os.listdir(tmp_path / "wandb" / "wandb"))
