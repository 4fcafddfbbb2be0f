"""The pretrain stage's declaration; its work is pipelines/pretrain.py."""

from __future__ import annotations

from typing import Any

from bertcore.examples_config import ExamplesConfig
from bertcore.pretrain_config import PretrainConfig
from pipelines.external import model_folder
from pipelines.stage import External, Stage
from pipelines.storage import Storage


def check(cfg: PretrainConfig, reads: dict[str, Any]) -> None:
    """pretrain.phases against the examples section: every phase names an examples phase,
    is at least as long as its sequences, and fits the model's positions; init_from needs
    an adopted vocabulary. Run when the config loads, and again against what the examples
    and vocab stages recorded before training."""
    examples: ExamplesConfig = reads["examples"]
    produced = {p.name: p for p in examples.phases}
    for i, phase in enumerate(cfg.phases):
        source = produced.get(phase.name)
        if source is None:
            raise ValueError(
                f"pretrain.phases[{i}].name: the examples stage has no phase {phase.name!r} (it made {sorted(produced)}); "
                "use one of those names or add the phase to examples.phases"
            )
        if phase.max_seq_length is not None and phase.max_seq_length < source.max_seq_length:
            raise ValueError(
                f"pretrain.phases[{i}].max_seq_length ({phase.max_seq_length}) is shorter than the examples of phase "
                f"{phase.name} (examples.phases max_seq_length {source.max_seq_length}); make it at least that, or leave it out"
            )
    if cfg.init_from is not None and reads["vocab"].source != "pretrained":
        raise ValueError(
            "pretrain.init_from: a model continues pretraining on its own vocabulary; set vocab.source: pretrained "
            "(vocab.pretrained then defaults to pretrain.init_from)"
        )
    if cfg.init_from is None:  # else the positions are config.json's, checked when the stage runs
        lengths = [phase.max_seq_length or produced[phase.name].max_seq_length for phase in cfg.phases]
        check_positions(cfg, lengths, cfg.max_position_embeddings,
                        "raise pretrain.model_overrides.max_position_embeddings or shorten the phase")


def check_positions(cfg: PretrainConfig, lengths: list[int], positions: int, remedy: str) -> None:
    """Every phase's sequences (`lengths`, phase by phase) fit the model's positions."""
    for i, (phase, length) in enumerate(zip(cfg.phases, lengths)):
        if length > positions:
            raise ValueError(
                f"pretrain.phases[{i}]: phase {phase.name} has sequences of {length} tokens but the model has {positions} positions; {remedy}"
            )


def identify(cfg: PretrainConfig, storage: Storage) -> External | None:
    """The content identity of pretrain.init_from's config.json and weights (None without it)."""
    if cfg.init_from is None:
        return None
    init = model_folder(storage, cfg.init_from, "pretrain.init_from")
    return External(identity={"init_from": init.identity}, value=init)


# Not resumable unit by unit: checkpoints are its units, and a rerun resumes from the latest complete one.
STAGE = Stage(
    "pretrain", PretrainConfig, "pipelines.pretrain:run", reads=("examples", "vocab"), check=check, identify=identify,
    resumable=False, verify_inputs=True,
    writes="DeepSpeed checkpoints/step-NNNNNNN/, model/ (Hugging Face layout), metrics.jsonl",
)
