"""A training stage's inputs: the examples and vocab stages' outputs as the workers need them
(the shards as the examples manifest lists them, stamps and row counts, never their bytes),
each phase checked against its examples, the machine's bounded shard cache folder and its
bound, and a damaged shard a worker meets named as the examples stage's."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bertcore.errors import BertpipeError, ConfigError
from bertcore.train.config import TrainingConfig
from bertcore.train.shard_cache import DamagedShard, ShardRef
from pipelines.stage import Upstream, UpstreamMissing
from pipelines.storage import Storage

if TYPE_CHECKING:
    from bertcore.examples.config import ExamplesConfig
    from bertcore.examples.masking import VocabTables


@dataclass
class Inputs:
    """What the examples and vocab stages produced, as a training stage needs it."""

    examples_fingerprint: str
    vocab_fingerprint: str
    examples: ExamplesConfig
    vocab: VocabTables
    train_shards: dict[str, list[ShardRef]]
    """Phase name -> the examples/<phase>/train/ shards as the manifest lists them."""
    validation_shards: dict[str, list[ShardRef]]
    examples_uri: str = ""
    """The examples stage's directory (a damaged shard a worker finds is named relative to it)."""


def read_inputs(cfg: TrainingConfig, examples: Upstream, vocab: Upstream, storage: Storage) -> tuple[Any, Inputs]:
    """The section with each phase's max_seq_length resolved from the examples phase, and
    the inputs; a phase with fewer sequences than one micro-batch is a ConfigError."""
    from bertcore.examples.config import ExamplesConfig
    from bertcore.examples.masking import VocabTables
    from bertcore.vocab.config import entries_file
    from bertcore.vocab.tokenizer import read_entries

    examples_cfg = ExamplesConfig.model_validate(examples.manifest.config)
    phases = []
    train, validation = {}, {}
    for i, phase in enumerate(cfg.phases):
        phases.append(
            phase.model_copy(
                update={"max_seq_length": phase.max_seq_length or examples_cfg.phase(phase.name).max_seq_length}
            )
        )
        train_shards = examples.manifest.shards_under(f"{phase.name}/train/")
        train[phase.name] = [examples.ref(s) for s in train_shards]
        validation[phase.name] = [examples.ref(s) for s in examples.manifest.shards_under(f"{phase.name}/validation/")]
        if not train_shards:
            raise UpstreamMissing(
                f"{examples.path(phase.name + '/train')}: the examples manifest lists no shards; rerun the "
                "examples stage"
            )
        rows = sum(s.rows for s in train_shards)
        if rows < cfg.micro_batch_size(phase):
            raise ConfigError(
                f"{cfg.SECTION}.phases[{i}].batch_size ({phase.batch_size}) needs "
                f"{cfg.micro_batch_size(phase)} sequences per worker "
                f"and micro-batch, but phase {phase.name} has {rows} training sequences; lower it or make more examples"
            )
    listed = entries_file(s.path for s in vocab.manifest.shards)  # vocab.txt, or a byte-level BPE's vocab.json
    with tempfile.TemporaryDirectory(prefix="bertpipe-vocab-") as tmp:  # read, then gone: nothing left in TMPDIR
        local = os.path.join(tmp, listed)
        with storage.open(vocab.path(listed), "rb") as source, open(local, "wb") as out:
            shutil.copyfileobj(source, out)
        tokens = read_entries(local)
    inputs = Inputs(
        examples.fingerprint,
        vocab.fingerprint,
        examples_cfg,
        VocabTables.from_tokens(tokens),
        train,
        validation,
        examples_uri=examples.dir.uri,
    )
    if storage.local_path(examples.dir.uri) is None:
        check_cache_bound(cfg, inputs)
    return cfg.model_copy(update={"phases": phases}), inputs


def cache_folder(section: str, stage_uri: str, examples_fingerprint: str) -> str:
    """The shard cache folder of a training stage on this machine: one per stage, run root and
    examples (the same path on every machine, under its temporary folder)."""
    name = hashlib.sha256(f"{stage_uri}\n{examples_fingerprint}".encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "bertpipe-cache", f"{section}-{name}")


def check_cache_bound(cfg: TrainingConfig, inputs: Inputs) -> None:
    """A ConfigError when the machine's cache (`data_cache_gb`) cannot hold what one reader
    needs at once: two windows of the largest training shards (the current one and the
    next, fetched ahead) and the validation window it keeps."""
    key, window = cfg.SECTION, cfg.shuffle_window_shards
    for phase in cfg.phases:
        train = sorted((s.bytes for s in inputs.train_shards[phase.name]), reverse=True)
        validation = sorted((s.bytes for s in inputs.validation_shards[phase.name]), reverse=True)
        need = 2 * sum(train[:window]) + (sum(validation[:window]) if cfg.validation_batches else 0)
        if need > cfg.data_cache_bytes:
            raise ConfigError(
                f"{key}.data_cache_gb ({cfg.data_cache_gb:g}) holds less than phase {phase.name} reads at once: two "
                f"windows of {key}.shuffle_window_shards={window} examples shards and the validation window, "
                f"{need / 1e9:.2f} GB; raise {key}.data_cache_gb or lower {key}.shuffle_window_shards"
            )


def damaged_examples(error: DamagedShard, examples_uri: str) -> BertpipeError:
    """A damaged examples shard a worker found, as the runner's DamagedShards (the examples
    stage and the shard's path in it), which `bertpipe run` recomputes before training again."""
    from pipelines.stage_dir import DamagedShards

    prefix = examples_uri.rstrip("/") + "/"
    if not error.uri.startswith(prefix):
        return error
    return DamagedShards(str(error), stage="examples", paths=[error.uri[len(prefix) :]])
