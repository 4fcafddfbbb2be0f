"""Experiment tracking of a pretraining run, on rank 0: TensorBoard event files always,
MLflow and Weights & Biases when `pretrain.tracking` enables them and the package is
installed. What they get: the training figures every `pretrain.log_every` steps and at the
last (`train/...`, the means over the interval, bertcore.train.metrics_log), each validation
(`validation/...`), and the config once. The evaluate stage then adds its scores
(`eval/<phase or task>/<metric>`, with `_random_init` and `_gain`) at the last training
step, and its verdicts (`log_evaluation`): into the same MLflow and W&B runs, and into
TensorBoard event files under eval/tensorboard/.

    pretrain/tensorboard/   event files (torch's SummaryWriter); uploaded with every
                            checkpoint when run.root is remote
    pretrain/tracking.json  the MLflow and W&B run ids, so a resumed run logs into the
                            same runs
    pretrain/wandb/         W&B's local files (with WANDB_MODE=offline, for `wandb sync`)

A run resumed from the checkpoint at step S redoes the steps after S. TensorBoard drops
the first attempt's points after S (purge_step); MLflow keeps both attempts' points for
those steps; W&B keeps the first attempt's (it ignores steps below the last one it saw).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from bertcore.errors import ConfigError
from bertcore.section import Section
from bertcore.train.metrics_log import TENSORBOARD, TRACKING_STATE

if TYPE_CHECKING:  # torch comes with it; the section above is read by recipes, which must load fast
    from bertcore.train.checkpoint import StageFiles

log = logging.getLogger(__name__)

WANDB_DIR = "wandb"
TRACKING_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY")
"""Environment variables the trackers read, passed on from the driver to the workers."""


class TrackingConfig(Section):
    """Where pretraining curves go besides metrics.jsonl (`pretrain.tracking`). TensorBoard
    event files are always written under pretrain/tensorboard/."""

    mlflow: bool = False
    """Log to MLflow (needs the mlflow or mlflow-skinny package) at mlflow_tracking_uri or $MLFLOW_TRACKING_URI;
    sqlite:////abs/path/mlflow.db works offline."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI, e.g. http://mlflow:5000 or sqlite:////data/mlflow.db (MLflow 3 takes file:/path only with
    MLFLOW_ALLOW_FILE_STORE=true); default: $MLFLOW_TRACKING_URI, else MLflow's own default."""
    wandb: bool = False
    """Log to Weights & Biases (needs the wandb package and a login, or WANDB_MODE=offline to write the run under
    pretrain/wandb/ for a later `wandb sync`)."""
    project: str = Field("bertpipe", min_length=1)
    """MLflow experiment and W&B project that the run goes to."""
    run_name: str | None = None
    """Name of the MLflow/W&B run; default: pretrain-<first 8 hex digits of the resume key>."""


class Trackers:
    """The trackers of one training run. Rank 0 opens them with `open_trackers`; the other
    ranks hold `Trackers.disabled()`, whose methods do nothing."""

    def __init__(self, writer=None, mlflow=None, wandb=None):
        self.writer, self.mlflow, self.wandb = writer, mlflow, wandb

    @classmethod
    def disabled(cls) -> Trackers:
        return cls()

    def log(self, step: int, values: dict[str, Any], prefix: str) -> None:
        """Numbers of `values` (None and strings left out) as `prefix/key` at `step`."""
        scalars = {
            f"{prefix}/{k}": float(v)
            for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if not scalars:
            return
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)
        if self.mlflow is not None:
            self.mlflow.log(step, scalars)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self, failed: bool = False) -> None:
        """End the runs (as failed when training raised)."""
        if self.writer is not None:
            self.writer.close()
        if self.mlflow is not None:
            self.mlflow.close(failed)
        if self.wandb is not None:
            self.wandb.finish(exit_code=1 if failed else 0)


class _MlflowRun:
    """One MLflow run through MlflowClient (no global "active run" state)."""

    def __init__(self, cfg: TrackingConfig, run_id: str | None, run_name: str, params: dict[str, str]):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=cfg.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        if run_id is None:
            experiment = self.client.get_experiment_by_name(cfg.project)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(cfg.project)
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            for key, value in params.items():
                self.client.log_param(run_id, key, value[:6000])
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        try:
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])
        except Exception as exc:  # noqa: BLE001 - an unreachable server must not stop training
            log.warning("pretrain: MLflow did not take the metrics of step %d: %s", step, exc)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _installed(package: str, key: str) -> bool:
    if importlib.util.find_spec(package) is not None:
        return True
    log.warning(
        "pretrain.tracking.%s is on but the %s package is not installed (pip install %s); not logging to it",
        key,
        package,
        package,
    )
    return False


def open_trackers(
    cfg: TrackingConfig, files: StageFiles, *, step: int, run_name: str, params: dict[str, Any]
) -> Trackers:
    """Rank 0's trackers for a run that has completed `step` optimizer steps (0: a fresh
    start). The MLflow/W&B run ids are kept in tracking.json, so a resumed run continues
    the same runs. An enabled tracker that cannot start is a ConfigError naming its key."""
    from torch.utils.tensorboard import SummaryWriter

    flat = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in _flatten(params).items()}
    state = json.loads(files.read_text(TRACKING_STATE)) if step > 0 and files.exists(TRACKING_STATE) else {}
    name = cfg.run_name or run_name
    mlflow = wandb = None
    if cfg.mlflow and _installed("mlflow", "mlflow"):
        try:
            mlflow = _MlflowRun(cfg, state.get("mlflow_run_id"), name, flat)
        except Exception as exc:  # noqa: BLE001 - the client's errors vary by store; each ends in this one line
            raise ConfigError(
                f"pretrain.tracking.mlflow: no MLflow run could be started ({_one_line(exc)}); check "
                "$MLFLOW_TRACKING_URI or set pretrain.tracking.mlflow=false"
            ) from None
        state["mlflow_run_id"] = mlflow.run_id
    if cfg.wandb and _installed("wandb", "wandb"):
        import wandb as wandb_module

        os.makedirs(files.local_path(WANDB_DIR), exist_ok=True)
        try:
            wandb = wandb_module.init(
                project=cfg.project,
                name=name,
                id=state.get("wandb_run_id"),
                resume="allow",
                config=params,
                dir=files.local_path(WANDB_DIR),
            )
        except Exception as exc:  # noqa: BLE001 - wandb's errors vary by mode; each ends in this one line
            raise ConfigError(
                f"pretrain.tracking.wandb: no W&B run could be started ({_one_line(exc)}); log in, set "
                "WANDB_MODE=offline, or set pretrain.tracking.wandb=false"
            ) from None
        state["wandb_run_id"] = wandb.id
    if state:
        files.write_text(TRACKING_STATE, json.dumps(state, indent=2) + "\n")
    writer = SummaryWriter(files.local_path(TENSORBOARD), purge_step=step + 1 if step > 0 else None)
    if step == 0:
        writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in flat.items()), 0)
    return Trackers(writer, mlflow, wandb)


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def log_evaluation(
    cfg: TrackingConfig,
    state: dict,
    *,
    step: int,
    scalars: dict[str, float],
    verdicts: dict[str, str],
    tensorboard_dir: str,
    wandb_dir: str,
    run_name: str,
) -> None:
    """The evaluate stage's scores and verdicts, at optimizer step `step`: TensorBoard event
    files under `tensorboard_dir` always; the MLflow and W&B runs pretraining logged into
    (their ids in `state`, pretrain/tracking.json), or new runs named `run_name`, when
    `cfg` (pretraining's tracking section) enables them and they are installed. Verdicts
    go to TensorBoard as text, to MLflow as tags `verdict.<name>`, to W&B's run summary.
    A tracker that cannot be reached is a warning: the evaluation is written regardless."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tensorboard_dir)
    for key, value in scalars.items():
        writer.add_scalar(key, value, step)
    writer.add_text("verdicts", "\n".join(f"- {name}: {text}" for name, text in verdicts.items()), step)
    writer.close()
    if cfg.mlflow and _installed("mlflow", "mlflow"):
        try:
            run = _MlflowRun(cfg, state.get("mlflow_run_id"), cfg.run_name or run_name, {})
            run.log(step, scalars)
            for name, text in verdicts.items():
                run.client.set_tag(run.run_id, f"verdict.{name}", text[:5000])
            run.close(False)
        except Exception as exc:  # noqa: BLE001 - the client's errors vary by store; the evaluation stands without it
            log.warning("evaluate: MLflow did not take the evaluation (%s); it is in eval/metrics.json", _one_line(exc))
    if cfg.wandb and _installed("wandb", "wandb"):
        import wandb as wandb_module

        os.makedirs(wandb_dir, exist_ok=True)
        try:
            run = wandb_module.init(
                project=cfg.project,
                name=cfg.run_name or run_name,
                id=state.get("wandb_run_id"),
                resume="allow",
                dir=wandb_dir,
            )
            run.summary.update({**scalars, **{f"verdict/{name}": text for name, text in verdicts.items()}})
            run.finish()
        except Exception as exc:  # noqa: BLE001 - wandb's errors vary by mode; the evaluation stands without it
            log.warning("evaluate: W&B did not take the evaluation (%s); it is in eval/metrics.json", _one_line(exc))


def evaluation_scalars(rows: list[dict]) -> dict[str, float]:
    """eval/<name>/<metric> (pretrained), ..._random_init and ..._gain of the validation
    score rows (bertcore.eval.scores.score_rows), as fractions like train/ and validation/."""
    out: dict[str, float] = {}
    for row in rows:
        if row["name"].endswith("(test)"):
            continue
        key = f"eval/{row['name']}/{row['metric']}"
        for suffix, field in (("", "pretrained"), ("_random_init", "random_init"), ("_gain", "gain")):
            value = row.get(field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key + suffix] = float(value)
    return out
