"""A model folder from outside the run (`pretrain.init_from`, `distill.teacher`, export's
model/) is judged on the driver from its config.json and the safetensors header alone
(bertcore/model/folder.py): absurd sizes are refused with the memory they would need, a
config that disagrees with its weights, a truncated or header-bombed file and a pickle are
one line naming the file, and the heads are read from the tensor names."""

from __future__ import annotations

import json
import os
import struct
import time
from types import SimpleNamespace

import pytest
import torch
import transformers

from bertcore.config import StorageConfig
from bertcore.errors import BertpipeError, InputDataError
from bertcore.model.config import ModelConfig
from bertcore.model.folder import check_model_folder, read_header
from pipelines.storage import Storage

torch.set_num_threads(1)


def _config(**overrides) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        **overrides,
    )


def _save(model, folder) -> str:
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory) -> str:
    torch.manual_seed(0)
    return _save(transformers.BertForMaskedLM(_config()), tmp_path_factory.mktemp("mlm"))


def _edit_config(folder, **changes) -> None:
    path = os.path.join(folder, "config.json")
    data = json.load(open(path))
    json.dump({**data, **changes}, open(path, "w"))


def _copy(folder, to) -> str:
    os.makedirs(to)
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as src, open(os.path.join(to, name), "wb") as dst:
            dst.write(src.read())
    return str(to)


@pytest.mark.parametrize(
    "key, value, figure",
    [
        ("num_hidden_layers", 100_000, r"7\.09e\+11 parameters"),
        ("hidden_size", 10_000_008, "GB of fp32"),
        ("vocab_size", 10**9, "GB of fp32"),
        ("max_position_embeddings", 10**7, "GB of fp32"),
        ("num_attention_heads", 1024, "GB of fp32"),
        ("intermediate_size", 10**6, "GB of fp32"),
    ],
)
def test_model_configs_have_upper_bounds_that_name_the_memory_needed(key, value, figure):
    fields = {"vocab_size": 30522, "hidden_size": 1024 * 16 if key == "num_attention_heads" else 768, key: value}
    with pytest.raises(
        ValueError, match=rf"{key} {value:,} is above the [\d,]+ bertcore builds \(such a model holds .*{figure}"
    ):
        ModelConfig(**fields)
    ModelConfig.named("large", 30522)  # the published shapes stay well inside


def test_an_absurd_config_json_is_refused_on_the_driver_in_one_line_without_allocating(mlm_folder, tmp_path):
    folder = _copy(mlm_folder, tmp_path / "bomb")
    _edit_config(folder, num_hidden_layers=100_000)
    started = time.perf_counter()
    with pytest.raises(InputDataError) as refused:
        check_model_folder(folder, "distill.teacher")
    message = str(refused.value)
    assert (
        message.startswith(f"{folder}/config.json: num_hidden_layers 100,000 is above the 256")
        and "GB of fp32" in message
    )
    assert "\n" not in message and time.perf_counter() - started < 1.0


def test_a_config_that_disagrees_with_its_weights_is_refused_naming_both(mlm_folder, tmp_path):
    folder = _copy(mlm_folder, tmp_path / "layers")
    _edit_config(folder, num_hidden_layers=4)
    with pytest.raises(
        InputDataError,
        match=r"model\.safetensors: holds encoder layers 0-1 but .*config\.json gives num_hidden_layers 4",
    ):
        check_model_folder(folder)
    folder = _copy(mlm_folder, tmp_path / "wide")
    _edit_config(folder, intermediate_size=128)
    with pytest.raises(InputDataError, match=r"intermediate\.dense\.weight has shape \[64, 32\] but .* = \[128, 32\]"):
        check_model_folder(folder)


def test_truncated_and_header_bombed_safetensors_are_one_line_naming_the_file(mlm_folder, tmp_path):
    weights = os.path.join(mlm_folder, "model.safetensors")
    data = open(weights, "rb").read()
    cases = {
        "cut": (data[: len(data) // 2], "truncated: tensor"),
        "cut-header": (data[:100], "truncated: the header claims"),
        "bomb": (struct.pack("<Q", 1 << 60) + data[8:], "more than the 104,857,600 allowed"),
        "tiny": (b"\x01\x02", "shorter than the 8-byte header length"),
        "junk": (struct.pack("<Q", 4) + b"nope" + data[8:], "its header is not JSON"),
    }
    for name, (content, why) in cases.items():
        folder = _copy(mlm_folder, tmp_path / name)
        path = os.path.join(folder, "model.safetensors")
        open(path, "wb").write(content)
        with pytest.raises(InputDataError) as refused:
            check_model_folder(folder)
        message = str(refused.value)
        assert (
            message.startswith(f"{path}: not a readable safetensors file (") and why in message and "\n" not in message
        ), message


def test_the_header_gives_shapes_without_loading_tensors(mlm_folder):
    header = read_header(os.path.join(mlm_folder, "model.safetensors"))
    assert header["bert.embeddings.word_embeddings.weight"] == ("F32", (120, 32))


def test_heads_are_found_by_tensor_names_whatever_the_model_class(mlm_folder, tmp_path):
    assert check_model_folder(mlm_folder).has_mlm_head
    bare = _save(transformers.BertModel(_config()), tmp_path / "bare")
    checked = check_model_folder(bare)
    assert (
        not checked.has_mlm_head and "bert.embeddings.word_embeddings.weight" in checked.shapes
    )  # unprefixed names mapped


def _bin_folder(tmp_path, model) -> str:
    folder = _save(model, tmp_path / "bin")
    os.remove(os.path.join(folder, "model.safetensors"))
    torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
    return folder


def test_a_pytorch_model_bin_is_refused_with_the_conversion_command(tmp_path):
    """all-MiniLM-L6-v2 saved as .bin was taken to have an MLM head; now any .bin teacher or
    init_from is refused, when the recipe's folders are identified, in one line."""
    from pipelines.external import model_folder

    folder = _bin_folder(tmp_path, transformers.BertModel(_config()))
    for refuse in (
        lambda: model_folder(Storage(StorageConfig()), folder, "distill.teacher"),
        lambda: check_model_folder(folder, "distill.teacher"),
    ):
        with pytest.raises(BertpipeError) as refused:
            refuse()
        message = str(refused.value)
        assert message.startswith(
            f"distill.teacher: {folder}/pytorch_model.bin is a pickle; bertpipe reads safetensors only"
        )
        assert (
            "save_pretrained(p, safe_serialization=True)" in message
            and "weights_only" not in message
            and "\n" not in message
        )


def test_the_conversion_command_gives_a_folder_that_is_accepted(tmp_path):
    folder = _bin_folder(tmp_path, transformers.BertForMaskedLM(_config()))
    with pytest.raises(BertpipeError) as refused:
        check_model_folder(folder)
    command = str(refused.value).split('python -c "', 1)[1].rstrip('"')
    exec(command, {})  # what the user is told to run
    assert check_model_folder(folder).has_mlm_head


def test_distillation_checks_the_teacher_on_the_driver(mlm_folder, tmp_path):
    from pipelines.external import model_folder
    from pipelines.stages.distill.work import _teacher

    storage = Storage(StorageConfig())
    folder = _copy(mlm_folder, tmp_path / "teacher")
    _edit_config(folder, hidden_size=10_000_008, num_attention_heads=1)
    run = SimpleNamespace(external=model_folder(storage, folder, "distill.teacher"), storage=storage, inputs={})
    with pytest.raises(
        InputDataError, match=r"config\.json: hidden_size 10,000,008 is above the 16,384 bertcore builds"
    ):
        _teacher(run, 120)
    bare = _save(transformers.BertModel(_config()), tmp_path / "bare")
    run = SimpleNamespace(external=model_folder(storage, bare, "distill.teacher"), storage=storage, inputs={})
    assert _teacher(run, 120).has_mlm_head is False
