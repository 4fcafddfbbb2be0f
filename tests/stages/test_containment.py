"""Nothing outside the root, nothing that hangs (issue 18, cases 1, 4 and 5 on paths, and 7):
a symbolic link inside a stage directory is `damaged`, is never hashed, and removing it
never touches what it points to; input folder walks never follow a link out of the folder,
never loop and never open a FIFO; `--verify` hashes the inputs again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bertcore.config import StorageConfig
from bertcore.paths import PathEscape
from pipelines.registry import parse_config
from pipelines.runner import Pipeline
from pipelines.stage_dir import MANIFEST, StageDir
from pipelines.stages.corpus.inputs import list_inputs
from pipelines.storage import Storage

ROOT = Path(__file__).resolve().parents[2]


def recipe(root: Path, inputs: list, **corpus) -> dict:
    return {
        "run": {"root": str(root)},
        "ray": {"num_cpus": 2},
        "corpus": {"inputs": inputs, "shard_chars": 100_000, "validation_fraction": 0.05, **corpus},
    }


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory, gensim_data, ray_cluster):
    """A complete corpus stage on a copy of the news text (300 lines); the hash cache is
    private to the module."""
    base = tmp_path_factory.mktemp("containment")
    os.environ["BERTPIPE_CACHE_DIR"] = str(base / "cache")
    (base / "in").mkdir()
    shutil.copy(gensim_data / "lee_background.cor", base / "in" / "news.txt")
    data = recipe(base / "run", [{"uri": str(base / "in" / "news.txt"), "format": "lines", "name": "news"}])
    Pipeline(parse_config(data)).run("corpus")
    yield base, data
    os.environ.pop("BERTPIPE_CACHE_DIR", None)


def private_copy(corpus_run, tmp_path) -> tuple:
    base, data = corpus_run
    shutil.copytree(base / "in", tmp_path / "in")
    shutil.copytree(base / "run", tmp_path / "run")
    data = recipe(tmp_path / "run", [{"uri": str(tmp_path / "in" / "news.txt"), "format": "lines", "name": "news"}])
    return parse_config(data), tmp_path / "run" / "corpus"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- case 1: a symbolic link inside a stage directory ------------------------------------------


def test_a_link_in_a_stage_directory_is_damaged_never_hashed_and_deleting_it_spares_its_target(corpus_run, tmp_path):
    """The probe: `corpus/evil -> /outside` and a manifest entry `evil/victim.txt` with a
    wrong sha256; `verify` hashed the outside file, `run` deleted it. Here a second entry
    carries the outside file's true sha256: the old code hashed it and called it `ok`."""
    cfg, stage = private_copy(corpus_run, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("not bertpipe's to delete\n")
    (outside / "same.txt").write_text("bytes whose hash the manifest knows\n")
    os.symlink(outside, stage / "evil")
    manifest = json.loads((stage / MANIFEST).read_text())
    manifest["shards"] += [
        {
            "path": "evil/victim.txt",
            "rows": 1,
            "bytes": (outside / "victim.txt").stat().st_size,
            "sha256": "0" * 64,
            "extra": {},
            "stamp": "",
        },
        {
            "path": "evil/same.txt",
            "rows": 1,
            "bytes": (outside / "same.txt").stat().st_size,
            "sha256": sha256(outside / "same.txt"),
            "extra": {},
            "stamp": "",
        },
    ]
    (stage / MANIFEST).write_text(json.dumps(manifest))

    rows = {r["stage"]: r for r in Pipeline(cfg).verify_outputs(["corpus"])}
    assert rows["corpus"]["state"] == "damaged"
    assert rows["corpus"]["problems"] == {"evil/victim.txt": "damaged", "evil/same.txt": "damaged"}
    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()}["corpus"] == "damaged"

    manifest_after, _ = Pipeline(cfg).run("corpus")
    assert (outside / "victim.txt").read_text() == "not bertpipe's to delete\n"
    assert (outside / "same.txt").exists()
    assert not os.path.lexists(stage / "evil"), "the link itself is what goes"
    assert not [s for s in manifest_after.shards if s.path.startswith("evil/")]
    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()}["corpus"] == "complete"


def test_no_read_or_write_of_a_stage_directory_goes_through_a_link_out_of_it(tmp_path):
    storage = Storage(StorageConfig())
    stage = StageDir(storage, str(tmp_path / "run"), "eval")
    (tmp_path / "run" / "eval").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "run" / "eval" / "plots")
    with pytest.raises(PathEscape, match="outside"):
        stage.path("plots/tasks.png")
    with pytest.raises(PathEscape):
        stage.publish("plots/tasks.png", lambda p: Path(p).write_bytes(b"png"), rows=1)
    stage.remove("plots", recursive=True)  # the evaluate stage's first step: the link goes, the folder stays
    assert (tmp_path / "outside").is_dir() and not os.path.lexists(tmp_path / "run" / "eval" / "plots")
    # a link to a file inside the directory is no better: such a shard is damaged
    (tmp_path / "run" / "eval" / "real.json").write_text("{}")
    os.symlink("real.json", tmp_path / "run" / "eval" / "metrics.json")
    from pipelines.stage_dir import ShardInfo

    real = tmp_path / "run" / "eval" / "real.json"
    assert stage.check(ShardInfo("metrics.json", 1, real.stat().st_size, sha256(real))) == "damaged"
    assert stage.check(ShardInfo("real.json", 1, real.stat().st_size, sha256(real))) == "ok"


def test_deleting_a_checkpoint_folder_never_follows_a_link(tmp_path):
    from bertcore.train.checkpoint import LocalStageFiles, clear_checkpoints

    (tmp_path / "pretrain").mkdir()
    (tmp_path / "outside" / "step-0000001").mkdir(parents=True)
    (tmp_path / "outside" / "step-0000001" / "_complete.json").write_text("{}")
    os.symlink(tmp_path / "outside", tmp_path / "pretrain" / "checkpoints")
    files = LocalStageFiles(str(tmp_path / "pretrain"))
    with pytest.raises(PathEscape, match="checkpoints leads to .*outside"):
        clear_checkpoints(files)  # the old code unlinked outside/step-0000001/_complete.json
    assert (tmp_path / "outside" / "step-0000001" / "_complete.json").exists()
    files.remove("checkpoints")
    assert (
        not os.path.lexists(tmp_path / "pretrain" / "checkpoints") and (tmp_path / "outside" / "step-0000001").is_dir()
    )


# -- cases 4 and 5: input folders with loops, links out and FIFOs ---------------------------------


@pytest.fixture
def hostile_folder(tmp_path, gensim_data):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(gensim_data / "lee_background.cor", folder / "sub" / "news.txt")
    os.symlink("news.txt", folder / "sub" / "again.txt")  # a link to a file inside: read
    os.symlink(folder, folder / "self")  # a link to the folder itself: the probe's IsADirectoryError
    os.symlink("loop", folder / "loop")  # a link to itself
    (tmp_path / "outside.txt").write_text("a file outside the input folder\n")
    os.symlink(tmp_path / "outside.txt", folder / "out.txt")
    os.symlink("missing.txt", folder / "broken.txt")  # broken, inside the folder
    os.mkfifo(folder / "pipe.txt")  # the probe's hang: `status` opened it and waited forever
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(folder / "sock.txt"))
    yield folder
    server.close()


def test_an_input_folder_walk_lists_what_it_leaves_out_and_opens_no_fifo(hostile_folder, tmp_path):
    cfg = parse_config(recipe(tmp_path / "run", [{"uri": str(hostile_folder), "format": "lines"}], on_error="skip"))
    listing = list_inputs(cfg.corpus, Storage(cfg.storage))
    assert [f.name for f in listing.files] == ["sub/again.txt", "sub/news.txt"]
    reasons = {Path(s["file"]).name: s["reason"] for s in listing.skipped}
    assert reasons == {
        "broken.txt": "a broken symbolic link",
        "loop": "cannot be read (Too many levels of symbolic links)",
        "out.txt": f"a symbolic link to {tmp_path / 'outside.txt'}, outside the input folder (not followed)",
        "pipe.txt": "a FIFO (named pipe), not a regular file",
        "self": "a symbolic link to a folder (not followed)",
        "sock.txt": "a socket, not a regular file",
    }, reasons


def test_status_on_an_input_folder_with_a_fifo_and_a_self_link_answers_in_one_table(hostile_folder, tmp_path):
    """In a child process: the old code hung on the FIFO (the timeout only guards)."""
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe(tmp_path / "run", [{"uri": str(hostile_folder), "format": "lines"}])))
    env = {**os.environ, "BERTPIPE_CACHE_DIR": str(tmp_path / "cache")}
    try:
        out = subprocess.run(
            [sys.executable, "-m", "flows.cli", "status", "-c", str(path), "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("bertpipe status still hangs on a FIFO in an input folder")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["stage"]: r for r in json.loads(out.stdout)}
    assert rows["corpus"]["state"] == "missing" and rows["corpus"]["expected_fingerprint"], rows["corpus"]
    assert "Traceback" not in out.stderr


def test_a_fifo_named_as_an_input_is_skipped_or_refused_in_one_line(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    storage = Storage(StorageConfig())
    skipping = parse_config(recipe(tmp_path / "run", [str(tmp_path / "pipe.jsonl")], on_error="skip"))
    listing = list_inputs(skipping.corpus, storage)
    assert listing.files == [] and listing.skipped[0]["reason"] == "a FIFO (named pipe), not a regular file"
    from bertcore.errors import InputDataError

    raising = parse_config(recipe(tmp_path / "run", [str(tmp_path / "pipe.jsonl")]))
    with pytest.raises(InputDataError, match=r"corpus\.inputs\[0\]: no regular file matches .*pipe\.jsonl \(.*a FIFO"):
        list_inputs(raising.corpus, storage)


# -- case 7: an input edited in place with the same size, mtime and inode ---------------------------


def test_verify_hashes_inputs_again_and_finds_an_edit_in_place_that_the_cache_misses(corpus_run, tmp_path):
    cfg, _ = private_copy(corpus_run, tmp_path)
    news = tmp_path / "in" / "news.txt"
    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()}["corpus"] == "complete"  # hashed and cached now
    before = os.stat(news)
    with open(news, "r+b") as handle:  # same inode, same size
        data = bytearray(handle.read())
        data[100:105] = b"XXXXX" if data[100:105] != b"XXXXX" else b"YYYYY"
        handle.seek(0)
        handle.write(data)
    os.utime(news, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(news)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)

    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()}["corpus"] == "complete"  # the cache's trade-off
    row = {r["stage"]: r for r in Pipeline(cfg, verify=True).status()}["corpus"]
    assert row["state"] == "stale"
    assert any(reason.startswith("input inputs[0].files.news.txt.content: ") for reason in row["changed"]), row[
        "changed"
    ]
    # the cache now holds the new hash, so a plain status agrees
    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()}["corpus"] == "stale"


def test_a_glob_that_meets_a_folder_lists_it_as_skipped_unless_it_reads_its_files(tmp_path):
    """`*.jsonl` meeting a folder `x.jsonl/` dropped it without a word."""
    (tmp_path / "x.jsonl").mkdir()
    (tmp_path / "x.jsonl" / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "g.jsonl").write_text('{"text": "g"}\n')
    storage = Storage(StorageConfig())
    flat = storage.list_files(f"{tmp_path}/*.jsonl")
    assert flat.files == [f"{tmp_path}/g.jsonl"]
    assert flat.skipped == [
        (f"{tmp_path}/x.jsonl", "a folder (a glob matches files; name the folder itself to read what it holds)")
    ]
    deep = storage.list_files(f"{tmp_path}/**/*.jsonl")
    assert deep.files == [f"{tmp_path}/g.jsonl", f"{tmp_path}/x.jsonl/a.jsonl"] and deep.skipped == []
