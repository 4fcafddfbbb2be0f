"""The pretrain stage's declaration; its work is pipelines/stages/pretrain/work.py."""

from __future__ import annotations

from typing import Any

from bertcore.train.config import PretrainConfig
from pipelines.external import model_folder
from pipelines.stage import External, Stage
from pipelines.storage import Storage


def check(cfg: PretrainConfig, reads: dict[str, Any]) -> None:
    """pretrain.phases against the examples section: every phase names an examples phase,
    is at least as long as its sequences, and fits the model's positions; init_from needs
    an adopted vocabulary. Run when the config loads, and again against what the examples
    and vocab stages recorded before training."""
    lengths = cfg.check_phases(reads["examples"])
    if cfg.init_from is not None and reads["vocab"].source != "pretrained":
        raise ValueError(
            "pretrain.init_from: a model continues pretraining on its own vocabulary; set vocab.source: pretrained "
            "(vocab.pretrained then defaults to pretrain.init_from)"
        )
    if cfg.init_from is None:  # else the family and the positions are config.json's, checked when the stage runs
        layout = "roberta" if reads["vocab"].byte_level else "bert"
        family = cfg.family_for(layout)  # pretrain.family against the vocabulary
        if reads["examples"].has_nsp and "next_sentence_label" not in family.batch_keys:
            raise ValueError(
                f"examples.objective {reads['examples'].objective} makes sentence pairs for next-sentence prediction, "
                f"which the {family.name} family does not train; use examples.objective: roberta (packed sentences, "
                "masked LM only)"
            )
        model = cfg.build_model_config(30522, 1 if layout == "roberta" else 0, layout=layout)
        cfg.check_positions(
            lengths,
            model.max_sequence_length,
            "raise pretrain.model_overrides.max_position_embeddings or shorten the phase",
        )


def identify(cfg: PretrainConfig, storage: Storage) -> External | None:
    """The content identity of pretrain.init_from's config.json and weights (None without it)."""
    if cfg.init_from is None:
        return None
    init = model_folder(storage, cfg.init_from, "pretrain.init_from")
    return External(identity={"init_from": init.identity}, value=init)


def off(sections: dict[str, Any]) -> str | None:
    """Nothing is pretrained when the recipe distils an external teacher."""
    distill = sections["distill"]
    if distill.enabled and distill.teacher is not None:
        return f"distill.teacher ({distill.teacher}) is the teacher, so nothing is pretrained"
    return None


# Not resumable unit by unit: checkpoints are its units, and a rerun resumes from the latest complete one.
STAGE = Stage(
    "pretrain",
    PretrainConfig,
    "pipelines.stages.pretrain.work:run",
    reads=("examples", "vocab"),
    check=check,
    identify=identify,
    off=off,
    resumable=False,
    verify_inputs=True,
    writes="DeepSpeed checkpoints/step-NNNNNNN/, model/ (Hugging Face layout), metrics.jsonl",
)
