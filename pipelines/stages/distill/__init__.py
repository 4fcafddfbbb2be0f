"""The distill stage's declaration; its work is pipelines/stages/distill/work.py."""

from __future__ import annotations

import posixpath
from typing import Any

from bertcore.distill.config import DistillConfig
from pipelines.stage import External, Stage
from pipelines.storage import Storage


def off(sections: dict[str, Any]) -> str | None:
    """The stage runs only when distill.enabled."""
    return None if sections["distill"].enabled else "distill.enabled is false"


def _same_folder(vocabulary: str | None, teacher: str) -> bool:
    """Whether a vocab.pretrained URI is the teacher's folder or a file in it."""
    if vocabulary is None:
        return False
    vocabulary, teacher = vocabulary.rstrip("/"), teacher.rstrip("/")
    return vocabulary == teacher or posixpath.dirname(vocabulary) == teacher


def check(cfg: DistillConfig, reads: dict[str, Any]) -> None:
    """Run when the recipe loads (and against what the upstream stages recorded): the
    phases name examples phases; the teacher is the pretrain stage's model or a folder
    whose vocabulary the examples are built with (one line naming both when not)."""
    lengths = cfg.check_phases(reads["examples"])
    vocab = reads["vocab"]
    if cfg.teacher is None:
        if "pretrain" not in reads:
            raise ValueError(
                "distill.teacher is unset, so the teacher would be the pretrain stage's model, but the "
                "recipe leaves pretrain out; name a teacher folder"
            )
        pretrain = reads["pretrain"]
        if pretrain.max_position_embeddings is not None:  # None with pretrain.init_from: checked when the stage runs
            cfg.check_positions(
                lengths,
                pretrain.max_position_embeddings,
                "shorten the phase or give the pretrained model more positions",
            )
        return
    if vocab.source != "pretrained" or not _same_folder(vocab.pretrained, cfg.teacher):
        built_with = (
            f"vocab.pretrained {vocab.pretrained}"
            if vocab.source == "pretrained"
            else "a vocabulary trained on the corpus (vocab.source: train)"
        )
        raise ValueError(
            f"distill.teacher {cfg.teacher} and the examples' vocabulary ({built_with}) differ: the student "
            "uses the teacher's "
            "vocabulary, so set vocab.source: pretrained and leave vocab.pretrained unset (it defaults to "
            "distill.teacher)"
        )


def identify(cfg: DistillConfig, storage: Storage) -> External | None:
    """The content identity of distill.teacher's config.json, weights and sentence-transformers
    files (None: the pretrain stage's model)."""
    if cfg.teacher is None:
        return None
    from pipelines.external import model_folder

    teacher = model_folder(storage, cfg.teacher, "distill.teacher", sentence_files=True)
    return External(identity={"teacher": teacher.identity}, value=teacher, summary=f"teacher {teacher.uri}")


# Not resumable unit by unit: checkpoints are its units, and a rerun resumes from the latest complete one.
STAGE = Stage(
    "distill",
    DistillConfig,
    "pipelines.stages.distill.work:run",
    reads=("pretrain", "examples", "vocab"),
    check=check,
    identify=identify,
    off=off,
    resumable=False,
    verify_inputs=True,
    # 2: keeps the student's start (student-start/); the student of an embedding teacher is an embedding model
    code_version="2",
    writes=(
        "(when distill.enabled) DeepSpeed checkpoints/step-NNNNNNN/, model/ (Hugging Face layout: the student; "
        "with a teacher without an MLM head an embedding model with sentence-transformers files), student-start/ "
        "(the student before its first step), metrics.jsonl"
    ),
)
