"""Where `bertpipe export --out` may write (pipelines/export/target.py), from the probe's
reproductions: never into a stage directory or run root (this run's or another's, however
the path reaches it), never over a folder no export made, never onto a file; refused in
one line before the lease, torch or Ray, with nothing touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from bertcore.config import StorageConfig
from bertcore.errors import ConfigError
from pipelines.export.target import check_target
from pipelines.storage import Storage

STAGE_MANIFEST = {
    "stage": "pretrain",
    "code_version": "1",
    "fingerprint": "abc",
    "inputs": {},
    "config": {},
    "shards": [],
    "stats": {},
    "timings": {},
}


def _run_root(path) -> str:
    """A run root as a run leaves it: pretrain/ and corpus/ complete, pretrain/model-mlm/ inside."""
    for stage in ("corpus", "pretrain"):
        (path / stage).mkdir(parents=True)
        (path / stage / "_manifest.json").write_text(json.dumps({**STAGE_MANIFEST, "stage": stage}))
        (path / stage / "_config.yaml").write_text("x: 1\n")
    (path / "pretrain" / "model-mlm").mkdir()
    (path / "pretrain" / "model-mlm" / "config.json").write_text("{}")
    return str(path)


@pytest.fixture
def root(tmp_path):
    return _run_root(tmp_path / "R")


@pytest.fixture
def storage():
    return Storage(StorageConfig())


@pytest.mark.parametrize(
    "out, why",
    [
        ("{R}/pretrain", "is the pretrain stage's directory"),
        ("{R}/pretrain/model-mlm", "is inside the pretrain stage's directory"),
        ("{R}", "the run root itself"),
        ("{R}/exports/../corpus", "the corpus stage's directory"),
        ("{R}/.hidden", "cannot name a file or folder"),
        ("{R}/../other-root/corpus", "a run root or stage directory (its _manifest.json (the corpus stage's))"),
        ("{R}/../other-root/new-folder", "is inside"),
        ("{R}/../other-root", "corpus/_manifest.json, a stage's output"),
    ],
)
def test_stage_directories_and_run_roots_are_refused(tmp_path, root, storage, out, why):
    _run_root(tmp_path / "other-root")
    before = {p: open(p, "rb").read() for p in _files(tmp_path)}
    with pytest.raises(ConfigError, match="--out") as raised:
        check_target(storage, root, out.format(R=root))
    message = str(raised.value)
    assert why in message and "\n" not in message and "new folder" in message, message
    assert {p: open(p, "rb").read() for p in _files(tmp_path)} == before


def test_a_folder_reached_through_a_link_is_judged_where_it_leads(tmp_path, root, storage):
    os.symlink(os.path.join(root, "pretrain"), tmp_path / "innocent")
    with pytest.raises(ConfigError, match="pretrain stage's directory"):
        check_target(storage, root, str(tmp_path / "innocent"))


def test_a_folder_with_its_own_manifest_or_files_is_not_an_exports(tmp_path, root, storage):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for name in ("config.json", "model.int8.onnx"):
        (theirs / name).write_text("mine")
    with pytest.raises(ConfigError, match="already holds files that no export made"):
        check_target(storage, root, str(theirs))
    (theirs / "_manifest.json").write_text(json.dumps({"what": "my own bookkeeping"}))
    with pytest.raises(ConfigError, match="a run root or stage directory"):
        check_target(storage, root, str(theirs))
    # the probe's forged manifest (`stage: export-onnx` and nothing else) made a re-export
    # fail on 'Manifest.__init__() missing 6 required positional arguments ... `bertpipe run`'
    (theirs / "_manifest.json").write_text(json.dumps({"stage": "export-onnx"}))
    with pytest.raises(ConfigError, match="its _manifest.json, which no run or export wrote whole"):
        check_target(storage, root, str(theirs))
    assert sorted(os.listdir(theirs)) == ["_manifest.json", "config.json", "model.int8.onnx"]


def test_an_existing_file_is_refused(tmp_path, root, storage):
    (tmp_path / "model.onnx").write_text("x")
    with pytest.raises(ConfigError, match="is an existing file"):
        check_target(storage, root, str(tmp_path / "model.onnx"))


def test_new_empty_and_earlier_export_folders_are_accepted(tmp_path, root, storage):
    assert check_target(storage, root, str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")
    assert check_target(storage, root, f"{root}/onnx/pretrain") == f"{root}/onnx/pretrain"
    assert check_target(storage, root, f"{root}/exports/step-100") == f"{root}/exports/step-100"
    (tmp_path / "empty").mkdir()
    assert check_target(storage, root, str(tmp_path / "empty")) == str(tmp_path / "empty")
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "_manifest.json").write_text(json.dumps({**STAGE_MANIFEST, "stage": "export-onnx"}))
    (earlier / "_config.yaml").write_text("run: {}\n")
    (earlier / "model.onnx").write_text("x")
    assert check_target(storage, root, str(earlier)) == str(earlier)
    (tmp_path / "exports" / "pretrain").mkdir(parents=True)  # default-style export folders named like stages
    (tmp_path / "exports" / "pretrain" / "_manifest.json").write_text(
        json.dumps({**STAGE_MANIFEST, "stage": "export-onnx"})
    )
    assert check_target(storage, root, str(tmp_path / "exports" / "pretrain-ner")) == str(
        tmp_path / "exports" / "pretrain-ner"
    )


def test_the_hf_exports_twin_folder_is_checked_too(tmp_path, root, storage):
    (tmp_path / "out-mlm").mkdir()
    (tmp_path / "out-mlm" / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match=r"out-mlm\) already holds files"):
        check_target(storage, root, str(tmp_path / "out"), twins=("-mlm",))


@pytest.mark.parametrize("fmt", ["onnx", "hf"])
def test_the_cli_refuses_in_one_line_before_the_lease_torch_or_ray(tmp_path, root, fmt):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"run": {"root": root}, "corpus": {"inputs": ["unused.txt"]}}))
    manifest = os.path.join(root, "pretrain", "_manifest.json")
    before = open(manifest, "rb").read()
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from flows.cli import app\n"
        f"r = CliRunner().invoke(app, ['export', '-c', {str(recipe)!r}, '--format', {fmt!r}, '--out', "
        f"{root + '/pretrain'!r}])\n"
        "sys.stderr.write(r.stderr)\n"
        "print(sorted(m for m in ('torch', 'ray', 'onnx') if m in sys.modules), r.exit_code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert done.stdout.strip() == "[] 2", done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("bertpipe: error: --out") and "pretrain stage's directory" in lines[-1], done.stderr
    assert "Traceback" not in done.stderr
    assert open(manifest, "rb").read() == before and not os.path.exists(os.path.join(root, "_lease.json"))


def _files(top) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(top) for f in files)
