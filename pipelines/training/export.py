"""The export of a training stage's model as a Hugging Face folder: the final (or a chosen)
DeepSpeed checkpoint, consolidated (`export_model`), or the model as it was before its
first step (`export_start`, the distill stage's student-start/), each written by one Ray
task through bertcore/train/export.py and published in the stage's directory; with NSP
also the BertForMaskedLM twin, and for an embedding model its sentence-transformers files.

Light at import: torch and Ray are imported by the functions that use them.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import uuid
from typing import TYPE_CHECKING, Protocol

from bertcore.errors import BertpipeError, ConfigError
from bertcore.model.hf_files import MLM_SUFFIX, MODEL_DIR
from bertcore.train.config import TrainingConfig
from pipelines.stage import Upstream
from pipelines.stage_dir import ShardInfo, StageDir
from pipelines.storage import Storage, join

if TYPE_CHECKING:
    from bertcore.model.sentence_files import SentenceLayout
    from bertcore.train.objectives import Objective


class ObjectiveSpec(Protocol):
    """What a training stage trains, in a form that travels to the Ray workers (pickled):
    it builds the objective inside each worker and the exportable weights in the export task."""

    nsp: bool
    """Whether the exported model keeps the NSP head and pooler (BertForPreTraining) or not (BertForMaskedLM)."""
    sentence: SentenceLayout | None
    """When set, the export is an embedding model in this sentence-transformers layout (bertcore/train/export.py)."""

    def objective(self, storage: Storage) -> Objective:
        """The objective, built in a worker (teacher and starting weights read there)."""
        ...

    def exportable(self, checkpoint_dir: str, marker: dict) -> dict:
        """The state dict (bertcore.model.bert names of BertForPreTraining) of a local checkpoint folder."""
        ...


def _write_folder(
    storage: Storage, state: dict, model_cfg, spec: ObjectiveSpec, vocab_dir: str, out_uri: str, tmp: str
) -> list[dict]:
    """Publish the Hugging Face folder of `state` at `out_uri` (a BertForMaskedLM when not
    `spec.nsp`; with NSP a BertForPreTraining, and its BertForMaskedLM twin at `out_uri`-mlm,
    which AutoModelForMaskedLM loads without unexpected keys; a roberta model: one
    RobertaForMaskedLM; an embedding model with its sentence-transformers files when
    `spec.sentence`); returns [{uri, folder, name, bytes,
    sha256, stamp}] of the files written."""
    from bertcore.train.export import export_checkpoint

    # BERT with NSP: BertForPreTraining and its masked-LM twin; other families (RoBERTa, the modern encoder) one folder
    twin = spec.nsp and model_cfg.family.nsp_head
    folders = [(out_uri.rstrip("/"), spec.nsp)] + ([(out_uri.rstrip("/") + MLM_SUFFIX, False)] if twin else [])
    written = []
    for uri, with_nsp in folders:
        out_local = os.path.join(tmp, posixpath.basename(uri))
        for name in export_checkpoint(state, model_cfg, vocab_dir, out_local, nsp=with_nsp, sentence=spec.sentence):
            local = os.path.join(out_local, name)
            info = storage.write_file(join(uri, name), lambda path, local=local: shutil.copyfile(local, path))
            written.append(
                {
                    "uri": join(uri, name),
                    "folder": posixpath.basename(uri),
                    "name": name,
                    "bytes": info.bytes,
                    "sha256": info.sha256,
                    "stamp": info.stamp,
                }
            )
    return written


def _export_task(
    stage: StageDir,
    spec: ObjectiveSpec,
    vocab_uri: str,
    vocab_files: list[str],
    vocab_key: str,
    marker: dict,
    out_uri: str,
) -> list[dict]:
    """Consolidate the checkpoint of `marker` and publish its folder at `out_uri` (see `_write_folder`)."""
    from bertcore.model.bert import ModelConfig
    from bertcore.train.checkpoint import CHECKPOINTS, checkpoint_tag
    from pipelines.shards import local_folder
    from pipelines.stage_files import stage_files

    storage = stage.storage
    tag = checkpoint_tag(marker["step"])
    with tempfile.TemporaryDirectory(prefix="bertpipe-export-") as tmp:
        files = stage_files(storage, stage.uri, f"export-{uuid.uuid4().hex[:8]}")
        files.download(f"{CHECKPOINTS}/{tag}")
        state = spec.exportable(files.local_path(f"{CHECKPOINTS}/{tag}"), marker)
        files.drop_local(f"{CHECKPOINTS}/{tag}")
        vocab_dir = local_folder(storage, vocab_uri, vocab_files, vocab_key)
        return _write_folder(
            storage, state, ModelConfig.model_validate(marker["model_config"]), spec, vocab_dir, out_uri, tmp
        )


def _start_task(
    stage: StageDir,
    spec: ObjectiveSpec,
    vocab_uri: str,
    vocab_files: list[str],
    vocab_key: str,
    seed: int,
    section: str,
    out_uri: str,
) -> list[dict]:
    """Build the model training starts from (what step 1 updates: the same seeded
    initialisation as the workers') and publish its folder at `out_uri` (see `_write_folder`).
    `spec` also says what of the module is exported (`start_state`, the distill stage's)."""
    import torch

    from bertcore.model.bert import ModelConfig
    from bertcore.train.objectives import init_generator
    from pipelines.shards import local_folder

    storage = stage.storage
    objective = spec.objective(storage)
    state = spec.start_state(objective.build(init_generator(seed, section), torch.device("cpu")).state_dict())
    model_cfg = ModelConfig.model_validate(objective.describe()["model_config"])  # what a checkpoint marker records
    with tempfile.TemporaryDirectory(prefix="bertpipe-export-") as tmp:
        vocab_dir = local_folder(storage, vocab_uri, vocab_files, vocab_key)
        return _write_folder(storage, state, model_cfg, spec, vocab_dir, out_uri, tmp)


def _remote(task, *args) -> list[dict]:
    """`task(*args)` as one Ray task; a user error raised in it surfaces as itself."""
    import ray

    from pipelines.ray_runtime import unwrap

    ref = ray.remote(num_cpus=1, max_retries=1)(task).remote(*args)
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        error = unwrap(exc)
        if isinstance(error, BertpipeError):
            raise error from None
        raise


def export_model(
    stage: StageDir, spec: ObjectiveSpec, vocab: Upstream, *, step: int | None = None, out: str | None = None
) -> list[dict]:
    """Write the Hugging Face folder of checkpoint `step` (default: the latest complete
    one) to `out` (default: <stage>/model/), and with NSP its BertForMaskedLM twin beside it
    (`out`-mlm); returns the files written. `vocab`: the vocabulary it was trained with.
    Needs Ray (ensure_ray) for the one task that does the work."""
    from bertcore.train.checkpoint import CHECKPOINTS, checkpoint_tag, complete_checkpoints
    from pipelines.stage_files import stage_files

    files = stage_files(stage.storage, stage.uri, "driver")
    markers = complete_checkpoints(files)
    if step is not None:
        markers = [m for m in markers if m["step"] == step]
    if not markers:
        what = f"checkpoint {checkpoint_tag(step)}" if step is not None else "checkpoint"
        raise ConfigError(f"{stage.path(CHECKPOINTS)}: no complete {what}; run the {stage.directory} stage first")
    return _remote(
        _export_task,
        stage,
        spec,
        vocab.dir.uri,
        _vocab_files(vocab),
        f"{stage.directory}-{vocab.fingerprint}",
        markers[-1],
        out or stage.path(MODEL_DIR),
    )


def export_start(
    cfg: TrainingConfig, stage: StageDir, spec: ObjectiveSpec, vocab: Upstream, seed: int, out: str
) -> list[dict]:
    """Write the folder of the model before its first training step (`spec.start_state`
    of the module the workers build from the run seed) to `out`, laid out as the trained
    one; returns the files written. Needs Ray."""
    return _remote(
        _start_task,
        stage,
        spec,
        vocab.dir.uri,
        _vocab_files(vocab),
        f"{stage.directory}-{vocab.fingerprint}",
        seed,
        cfg.SECTION,
        out,
    )


def _vocab_files(vocab: Upstream) -> list[str]:
    """The tokenizer files the vocab stage wrote: WordPiece's or byte-level BPE's."""
    from bertcore.vocab.config import tokenizer_files

    return tokenizer_files(s.path for s in vocab.manifest.shards)


def model_shards(exported: list[dict]) -> list[ShardInfo]:
    """The files `export_model` or `export_start` wrote, as the stage's shards."""
    return [
        ShardInfo(f"{f['folder']}/{f['name']}", rows=1, bytes=f["bytes"], sha256=f["sha256"], stamp=f["stamp"])
        for f in exported
    ]
