"""Files outside the run root that a stage reads: an existing Hugging Face model folder
(`pretrain.init_from`), or a vocabulary (`vocab.pretrained`: one file or a model folder).
They are named by URI (local or s3://...); what identifies them in fingerprints is the
content signature of each file read (Storage.signature), never the path alone, and local
copies are kept per content.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass

from bertcore.errors import ConfigError, InputDataError
from bertcore.model.folder import bin_refusal
from bertcore.model.hf_files import CONFIG_FILE, PYTORCH_BIN, SAFETENSORS_INDEX, WEIGHT_FILES, shard_names, weight_files
from bertcore.model.sentence_files import MAX_BYTES, MODULES_FILE, listed_files, parse_modules
from bertcore.vocab.config import CONFIG_FILE as TOKENIZER_CONFIG
from bertcore.vocab.config import MERGES_FILE, TOKENIZER_FILE, VOCAB_FILE, VOCAB_JSON
from pipelines.shards import local_copy, local_folder
from pipelines.storage import Storage, join


@dataclass
class ExternalFolder:
    """Files of a folder outside the run root, with their content identity."""

    uri: str
    files: list[str]
    """The files read, relative to uri."""
    identity: dict[str, str]
    """URI -> content signature of each file."""

    @property
    def cache_key(self) -> str:
        return "external-" + hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()[:16]

    def local(self, storage: Storage) -> str:
        """A local folder holding the files (the folder itself when local)."""
        return local_folder(storage, self.uri, self.files, self.cache_key)


def external_folder(storage: Storage, uri: str, files: list[str]) -> ExternalFolder:
    uri = uri.rstrip("/")
    return ExternalFolder(uri, files, {join(uri, name): storage.signature(join(uri, name)) for name in files})


def model_folder(storage: Storage, uri: str, key: str, *, sentence_files: bool = False) -> ExternalFolder:
    """A Hugging Face model folder: config.json and its safetensors weights (shards
    included), and with `sentence_files` the sentence-transformers files it has (a
    teacher's: its student is exported with the same pooling). A folder without config.json
    and weights, or with only a pytorch_model.bin, is a ConfigError naming `key`."""
    uri = uri.rstrip("/")
    names = storage.listdir(uri)
    weights = weight_files(names)
    if CONFIG_FILE not in names or not weights:
        raise ConfigError(
            f"{key}: {uri} holds no Hugging Face model (it needs {CONFIG_FILE} and one of {', '.join(WEIGHT_FILES)}); "
            "point it at a folder written by save_pretrained"
        )
    if weights[0] == PYTORCH_BIN:
        raise ConfigError(bin_refusal(uri, key))
    files = [CONFIG_FILE, *weights]
    if weights[0] == SAFETENSORS_INDEX:
        index = join(uri, SAFETENSORS_INDEX)
        files += shard_names(local_copy(storage, index, f"external-index-{storage.signature(index)}"))
    if sentence_files and MODULES_FILE in names:
        modules = join(uri, MODULES_FILE)
        local = local_copy(storage, modules, f"external-modules-{storage.signature(modules)}")
        with open(local, "rb") as handle:
            text = handle.read(MAX_BYTES + 1)
        try:
            listed = listed_files(parse_modules(json.loads(text), modules))
        except (ValueError, InputDataError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ConfigError(
                f"{key}: {modules} is not a sentence-transformers modules.json "
                f"({' '.join(str(exc).split())[:160]}); fix or remove it"
            ) from None
        files += [name for name in listed if name in names or ("/" in name and storage.exists(join(uri, name)))]
    return external_folder(storage, uri, files)


def vocabulary_files(storage: Storage, uri: str, key: str, *, byte_level: bool = False) -> ExternalFolder:
    """A vocabulary: one file (a vocab.txt, or a tokenizer.json when it ends in .json), or
    a folder's vocab.txt and/or tokenizer.json with its tokenizer_config.json when there.
    A byte-level BPE: a folder's vocab.json + merges.txt and/or tokenizer.json, a vocab.json
    (with merges.txt beside it) or a tokenizer.json. Anything else is a ConfigError naming `key`."""
    uri = uri.rstrip("/")
    fs, path = storage.fs(uri)
    if fs.isfile(path):
        folder, name = posixpath.dirname(uri), posixpath.basename(uri)
        if byte_level and name == VOCAB_JSON:
            if MERGES_FILE not in storage.listdir(folder):
                raise ConfigError(
                    f"{key}: {uri} is a vocab.json without the merges.txt a byte-level BPE needs beside it; "
                    "put them in one folder"
                )
            return external_folder(storage, folder, [VOCAB_JSON, MERGES_FILE])
        return external_folder(storage, folder, [name])
    names = storage.listdir(uri)
    bpe_pair = VOCAB_JSON in names and MERGES_FILE in names
    if byte_level:
        if not bpe_pair and TOKENIZER_FILE not in names:
            raise ConfigError(
                f"{key}: {uri} holds neither vocab.json + merges.txt nor a tokenizer.json; point it at a RoBERTa "
                "model's folder (vocab.model is byte_level_bpe)"
            )
        return external_folder(storage, uri, [n for n in (VOCAB_JSON, MERGES_FILE, TOKENIZER_FILE) if n in names])
    if VOCAB_FILE not in names and TOKENIZER_FILE not in names:
        hint = (
            "; it holds a byte-level BPE (vocab.json + merges.txt): set vocab.model: byte_level_bpe" if bpe_pair else ""
        )
        raise ConfigError(
            f"{key}: {uri} is neither a vocab.txt, a tokenizer.json nor a folder holding one; point it at a "
            f"BERT model's folder or file{hint}"
        )
    return external_folder(storage, uri, [n for n in (VOCAB_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG) if n in names])
