"""Checkpoint files of the pretrain stage directory, as the training loop sees them:

    checkpoints/step-0000100/
        mp_rank_00_model_states.pt, *zero_pp_rank_R_*.pt   DeepSpeed (model, optimizer, schedule)
        trainer-rank-0000R.json    per rank: loader position and counters (JSON)
        trainer-rank-0000R.safetensors  per rank: torch (and CUDA) RNG states
        _complete.json             written last by rank 0: the checkpoint is usable

`StageFiles` hides where the stage directory lives (a local folder, or a local mirror of
an object-store prefix); the helpers here list, prune and clear complete checkpoints.

No code from data: the trainer's own state is JSON and safetensors, and DeepSpeed's files
(pickles, which DeepSpeed loads with `weights_only=False`) are scanned first with torch's
pickle scanner, which reads the opcodes without running them: a file that names any global
outside `SAFE_GLOBALS` (the DeepSpeed classes its checkpoints hold) is refused.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from typing import TYPE_CHECKING, Protocol

from bertcore.errors import InputDataError
from bertcore.paths import inside, remove_within
from bertcore.train.metrics_log import METRICS, TENSORBOARD, TRACKING_STATE, VALIDATION

CHECKPOINTS = "checkpoints"
COMPLETE = "_complete.json"
_TAG = re.compile(r"step-(\d{7,})")

if TYPE_CHECKING:  # the functions that need torch import it: `bertpipe inspect pretrain` reads checkpoints without it
    import torch

SAFE_GLOBALS = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
"""Globals (beyond tensors and plain containers) that DeepSpeed's checkpoint pickles name,
found by scanning checkpoints of every ZeRO stage, fp32 and bf16, AdamW and LAMB."""


class UnsafeCheckpoint(InputDataError):
    """A checkpoint file that would run code, or that cannot be scanned, when loaded."""


def check_pickles(folder: str) -> None:
    """Refuse a checkpoint folder any of whose pickle files names a global outside
    SAFE_GLOBALS (scanned, never unpickled). Call before DeepSpeed or torch loads it."""
    import torch

    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.endswith((".pt", ".pth", ".bin", ".pkl")) or not os.path.isfile(path):
            continue
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception as exc:  # noqa: BLE001 - not a torch zip file (a legacy or hand-made pickle)
            raise UnsafeCheckpoint(
                f"{path}: not a checkpoint file that can be checked without running it ({exc}); refusing to load it"
            ) from None
        unknown = sorted(set(found) - set(SAFE_GLOBALS))
        if unknown:
            raise UnsafeCheckpoint(
                f"{path}: refusing to load: it would call {', '.join(unknown[:3])} (not part of a DeepSpeed "
                "checkpoint); the run root may have been tampered with, see docs/security.md"
            )


def load_elastic_checkpoint(engine, load_dir: str, tag: str) -> str | None:
    """Load a ZeRO-1/2 checkpoint written in DeepSpeed's elastic layout (bertcore/train/optim.py
    asks for it) by any number of workers: this one's, or another (a run that lost a node).
    DeepSpeed's engine refuses optimizer states of another data-parallel size outright, and
    its own elastic load needs a per-group step that torch's AdamW does not keep, while its
    ZeRO-1/2 optimizer can merge the partitions of any size and cut out this rank's: so the
    engine loads the module, fp32 master weights (merged), schedule and counters without
    the optimizer states, then the optimizer merges those. Returns the load path (None when
    DeepSpeed found nothing)."""
    load_path, _ = engine.load_checkpoint(load_dir, tag=tag, load_optimizer_states=False)
    if load_path is None:
        return None
    states = engine._get_all_zero_checkpoints(load_dir, tag)  # every writer's partition (elastic layout)
    if not states or not all(states):
        raise InputDataError(
            f"{load_dir}/{tag}: its optimizer partitions are not all there; the checkpoint cannot resume on "
            "another world size"
        )
    from deepspeed.checkpoint.constants import BASE_OPTIMIZER_STATE_STEP

    groups = engine.optimizer.optimizer.param_groups
    had_step = "step" in groups[0]
    for state in states:  # torch's AdamW counts steps per parameter (restored with the moments), not per group
        state.setdefault(BASE_OPTIMIZER_STATE_STEP, None)
    engine.optimizer._restore_elastic_base_optimizer_state(states)
    if not had_step:
        for group in groups:
            group.pop("step", None)
    # the groups' learning rates come with the optimizer states DeepSpeed skipped: the
    # restored schedule knows the last one
    if engine.lr_scheduler is not None:
        for group, lr in zip(groups, engine.lr_scheduler.get_last_lr()):
            group["lr"] = lr
    engine.optimizer._link_all_hp_params()
    return load_path


def rank_state_files(folder: str, rank: int) -> tuple[str, str]:
    """The JSON and safetensors files of one rank's trainer state in a checkpoint folder."""
    stem = os.path.join(folder, f"trainer-rank-{rank:05d}")
    return f"{stem}.json", f"{stem}.safetensors"


def save_rank_state(folder: str, rank: int, state: dict, tensors: dict[str, torch.Tensor]) -> None:
    """One rank's trainer state: counters and loader position as JSON, RNG states as tensors."""
    import safetensors.torch

    json_path, tensor_path = rank_state_files(folder, rank)
    os.makedirs(folder, exist_ok=True)
    with open(json_path, "w", encoding="utf-8") as handle:
        json.dump(state, handle)
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, tensor_path)


def load_rank_state(folder: str, rank: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """What `save_rank_state` wrote (no pickle involved)."""
    import safetensors.torch

    json_path, tensor_path = rank_state_files(folder, rank)
    if not os.path.exists(json_path):
        raise InputDataError(
            f"{folder}: no trainer state for rank {rank} ({os.path.basename(json_path)}); the checkpoint was written "
            "by an older bertpipe or by another number of workers; set pretrain.resume=never to start over"
        )
    with open(json_path, encoding="utf-8") as handle:
        return json.load(handle), safetensors.torch.load_file(tensor_path)


def safe_load(path: str) -> dict:
    """torch.load of a checked DeepSpeed file with `weights_only=True` (SAFE_GLOBALS allowed)."""
    import torch

    check_pickles(os.path.dirname(path) or ".")
    allowed = []
    for qualified in SAFE_GLOBALS:
        module, _, attribute = qualified.rpartition(".")
        try:
            allowed.append(getattr(importlib.import_module(module), attribute))
        except (ImportError, AttributeError):  # another DeepSpeed version: that class is not needed
            continue
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)


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
        """The path of `relative`; PathEscape when a symbolic link would lead it out of the folder."""
        return inside(os.path.join(self.directory, relative), self.directory)

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
        """Delete a file or folder; a symbolic link on the way is removed itself, never followed."""
        remove_within(os.path.join(self.directory, relative), self.directory, recursive=True)


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


PRE_DECAY = "pre-decay"
"""The name of the checkpoint at the end of a wsd schedule's stable phase (kept, never pruned)."""


def named_checkpoint(files: StageFiles, name: str) -> dict | None:
    """The marker of the complete checkpoint kept under `name` (e.g. pre-decay), or None."""
    return next((m for m in reversed(complete_checkpoints(files)) if m.get("name") == name), None)


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
    """Delete all but the `keep` newest complete checkpoints, except named ones (a wsd
    schedule's pre-decay checkpoint), and the leftovers of dead attempts."""
    markers = complete_checkpoints(files)
    unnamed = [m for m in markers if not m.get("name")]
    for marker in unnamed[:-keep]:
        tag = checkpoint_tag(marker["step"])
        files.remove(f"{CHECKPOINTS}/{tag}/{COMPLETE}")
        files.remove(f"{CHECKPOINTS}/{tag}")
    # leftovers of an attempt that died while writing, older than the newest complete one
    newest = markers[-1]["step"] if markers else None
    for name in files.listdir(CHECKPOINTS):
        match = _TAG.fullmatch(name)
        if (
            match
            and newest is not None
            and int(match.group(1)) < newest
            and not files.exists(f"{CHECKPOINTS}/{name}/{COMPLETE}")
        ):
            files.remove(f"{CHECKPOINTS}/{name}")


def rng_state(use_gpu: bool) -> dict:
    """This rank's random state, as a checkpoint keeps it (dropout draws continue after a resume)."""
    import torch

    return {"torch_rng": torch.get_rng_state(), **({"cuda_rng": torch.cuda.get_rng_state()} if use_gpu else {})}


def restore_rng(rng: dict, use_gpu: bool) -> None:
    import torch

    torch.set_rng_state(rng["torch_rng"])
    if use_gpu and "cuda_rng" in rng:
        torch.cuda.set_rng_state(rng["cuda_rng"])
