"""Checkpoint files of the pretrain stage directory, as the training loop sees them:

    checkpoints/step-0000100/
        mp_rank_00_model_states.pt, *zero_pp_rank_R_*.pt   DeepSpeed (model, optimizer, schedule)
        trainer-rank-0000R.pt      per rank: loader position, torch RNG, counters
        _complete.json             written last by rank 0: the checkpoint is usable

`StageFiles` hides where the stage directory lives (a local folder, or a local mirror of
an object-store prefix); the helpers here list, prune and clear complete checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Protocol

from bertcore.metrics_log import METRICS, TENSORBOARD, TRACKING_STATE, VALIDATION

CHECKPOINTS = "checkpoints"
COMPLETE = "_complete.json"
_TAG = re.compile(r"step-(\d{7,})")

class StageFiles(Protocol):
    """The pretrain stage directory as the training loop sees it. Paths are relative to
    the stage directory ('checkpoints/step-0000100/_complete.json'). Files are written
    under `local_path` and become visible to others with `upload`; `download` brings a
    file or folder to `local_path`. For a local stage directory both are no-ops."""

    def local_path(self, relative: str) -> str: ...

    def upload(self, relative: str) -> None: ...

    def download(self, relative: str) -> None: ...

    def drop_local(self, relative: str) -> None: ...

    def exists(self, relative: str) -> bool: ...

    def listdir(self, relative: str) -> list[str]: ...

    def read_text(self, relative: str) -> str: ...

    def write_text(self, relative: str, text: str) -> None: ...

    def remove(self, relative: str) -> None: ...


class LocalStageFiles:
    """StageFiles of a directory every worker can read and write (local disk, or a shared
    filesystem on a cluster): the working copy is the stage directory itself."""

    def __init__(self, directory: str):
        self.directory = directory

    def local_path(self, relative: str) -> str:
        return os.path.join(self.directory, relative)

    def upload(self, relative: str) -> None:
        pass

    def download(self, relative: str) -> None:
        pass

    def drop_local(self, relative: str) -> None:
        pass

    def exists(self, relative: str) -> bool:
        return os.path.exists(self.local_path(relative))

    def listdir(self, relative: str) -> list[str]:
        path = self.local_path(relative)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def read_text(self, relative: str) -> str:
        with open(self.local_path(relative), encoding="utf-8") as handle:
            return handle.read()

    def write_text(self, relative: str, text: str) -> None:
        path = self.local_path(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)

    def remove(self, relative: str) -> None:
        path = self.local_path(relative)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)


def checkpoint_tag(step: int) -> str:
    return f"step-{step:07d}"


def complete_checkpoints(files: StageFiles) -> list[dict]:
    """The markers of complete checkpoints (their `_complete.json`), oldest first."""
    found = []
    for name in files.listdir(CHECKPOINTS):
        if _TAG.fullmatch(name) and files.exists(f"{CHECKPOINTS}/{name}/{COMPLETE}"):
            found.append(json.loads(files.read_text(f"{CHECKPOINTS}/{name}/{COMPLETE}")))
    return sorted(found, key=lambda marker: marker["step"])


def latest_checkpoint(files: StageFiles) -> dict | None:
    markers = complete_checkpoints(files)
    return markers[-1] if markers else None


def clear_checkpoints(files: StageFiles) -> None:
    """Delete every checkpoint and the training logs, TensorBoard's included, and forget
    the tracker runs (a fresh start): markers first, so no half-deleted checkpoint ever
    looks complete."""
    for name in files.listdir(CHECKPOINTS):
        files.remove(f"{CHECKPOINTS}/{name}/{COMPLETE}")
    files.remove(CHECKPOINTS)
    for name in (METRICS, VALIDATION, TENSORBOARD, TRACKING_STATE):
        files.remove(name)


def prune(files: StageFiles, keep: int) -> None:
    markers = complete_checkpoints(files)
    for marker in markers[:-keep]:
        tag = checkpoint_tag(marker["step"])
        files.remove(f"{CHECKPOINTS}/{tag}/{COMPLETE}")
        files.remove(f"{CHECKPOINTS}/{tag}")
    # leftovers of an attempt that died while writing, older than the newest complete one
    newest = markers[-1]["step"] if markers else None
    for name in files.listdir(CHECKPOINTS):
        match = _TAG.fullmatch(name)
        if match and newest is not None and int(match.group(1)) < newest and not files.exists(f"{CHECKPOINTS}/{name}/{COMPLETE}"):
            files.remove(f"{CHECKPOINTS}/{name}")
