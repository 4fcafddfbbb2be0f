"""Outputs stay trustworthy when bytes rot: a shard with one flipped byte is `damaged` in
`bertpipe status`, found by `bertpipe verify`, recomputed by `bertpipe run` to the original
bytes; a damaged manifest is reported, not a crash, and recomputed; pretraining re-hashes
its inputs before it reads them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipelines.runner import Pipeline
from pipelines.stage_dir import MANIFEST, DamagedManifest, StageDir
from pipelines.storage import sha256_file

DATA_STAGES = ("corpus", "vocab", "examples")


@pytest.fixture
def run(demo_pipeline, tmp_path):
    """A private copy of the session's corpus, vocab and examples (mtimes kept, as copy2 does)."""
    cfg, manifests = demo_pipeline
    for stage in DATA_STAGES:
        shutil.copytree(Path(cfg.run.root) / stage, tmp_path / stage)
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"root": str(tmp_path)})}), manifests


def flip_byte(path: Path, keep_mtime: bool) -> None:
    """Change one byte in the middle of the file; its size stays the same."""
    before = os.stat(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    if keep_mtime:  # a careful forger, or a disk that corrupts silently
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def states(cfg, verify: bool = False) -> dict[str, str]:
    return {row["stage"]: row["state"] for row in Pipeline(cfg, verify=verify).status()}


@pytest.mark.parametrize("stage", DATA_STAGES)
def test_a_flipped_byte_is_damaged_and_recomputed_to_the_original_bytes(run, stage):
    cfg, manifests = run
    manifest = manifests[stage]
    shard = max(manifest.shards, key=lambda s: s.bytes)
    path = Path(cfg.run.root) / stage / shard.path
    flip_byte(path, keep_mtime=False)

    assert states(cfg)[stage] == "damaged"
    rows = {r["stage"]: r for r in Pipeline(cfg).verify_outputs([stage])}
    assert rows[stage]["state"] == "damaged" and rows[stage]["problems"] == {shard.path: "damaged"}

    rebuilt, computed = Pipeline(cfg).run(stage)
    assert computed and sha256_file(str(path)) == shard.sha256
    assert [(s.path, s.sha256) for s in rebuilt.shards] == [(s.path, s.sha256) for s in manifest.shards]
    assert states(cfg)[stage] == "complete"


def test_a_flip_that_keeps_the_mtime_is_found_with_verify(run):
    cfg, manifests = run
    shard = manifests["examples"].shards[0]
    path = Path(cfg.run.root) / "examples" / shard.path
    flip_byte(path, keep_mtime=True)
    assert states(cfg)["examples"] == "complete"  # the fast path trusts size + mtime
    assert states(cfg, verify=True)["examples"] == "damaged"
    manifest, computed = Pipeline(cfg, verify=True).run("examples")
    assert computed and sha256_file(str(path)) == shard.sha256
    assert states(cfg, verify=True)["examples"] == "complete"


def test_verify_command_exits_nonzero_on_damage(run):
    from typer.testing import CliRunner

    from flows.cli import app

    cfg, manifests = run
    recipe = Path(cfg.run.root) / "recipe.yaml"
    recipe.write_text(json.dumps(json.loads(cfg.model_dump_json())), encoding="utf-8")
    runner = CliRunner()
    clean = runner.invoke(app, ["verify", "corpus", "vocab", "-c", str(recipe)])
    assert clean.exit_code == 0, clean.output
    assert "corpus     complete" in clean.output
    shard = manifests["vocab"].shards[0]
    flip_byte(Path(cfg.run.root) / "vocab" / shard.path, keep_mtime=True)
    damaged = runner.invoke(app, ["verify", "-c", str(recipe), "--json"])
    assert damaged.exit_code == 1
    rows = {r["stage"]: r for r in json.loads(damaged.output)}
    assert rows["vocab"]["problems"] == {shard.path: "damaged"} and rows["corpus"]["state"] == "complete"
    assert rows["pretrain"]["state"] == "missing"


@pytest.mark.parametrize("damage", ["truncated", "not json", "wrong shape"])
def test_a_damaged_manifest_is_reported_and_recomputed(run, damage):
    cfg, manifests = run
    path = Path(cfg.run.root) / "vocab" / MANIFEST
    text = path.read_text(encoding="utf-8")
    path.write_text(
        {"truncated": text[: len(text) // 2], "not json": "\x00\x01garbage", "wrong shape": "[1, 2]"}[damage],
        encoding="utf-8",
    )

    rows = {r["stage"]: r for r in Pipeline(cfg).status()}
    assert rows["vocab"]["state"] == "damaged" and "_manifest.json is damaged" in rows["vocab"]["note"]
    with pytest.raises(DamagedManifest, match=r"vocab/_manifest.json is damaged .*run `bertpipe run --only vocab`"):
        Pipeline(cfg).run("examples", force=True)
    rebuilt, computed = Pipeline(cfg).run("vocab")
    assert computed and rebuilt.fingerprint == manifests["vocab"].fingerprint
    assert StageDir(Pipeline(cfg).storage, cfg.run.root, "vocab").state(rebuilt.fingerprint) == "complete"


def test_a_damaged_unit_marker_makes_its_unit_run_again(run):
    cfg, manifests = run
    examples = Path(cfg.run.root) / "examples"
    (examples / MANIFEST).unlink()
    markers = sorted((examples / "_progress").glob("build__*.json"))
    markers[0].write_text("{not json", encoding="utf-8")
    untouched = {p: p.stat().st_mtime_ns for p in (examples / "seq128" / "train").iterdir()}
    manifest, computed = Pipeline(cfg).run("examples")
    assert computed and [(s.path, s.sha256) for s in manifest.shards] == [
        (s.path, s.sha256) for s in manifests["examples"].shards
    ]
    rewritten = [p for p, t in untouched.items() if p.stat().st_mtime_ns != t]
    assert rewritten and len(rewritten) < len(untouched)  # that unit only


@pytest.mark.slow
def test_a_damaged_shard_training_reads_is_found_by_the_worker_and_recomputed(run, ray_cluster):
    """The driver checks stamps only; the worker hashes the shards of its window as it opens
    them (one window holds them all here), names the damaged one, and `bertpipe run`
    recomputes it and trains again."""
    cfg, manifests = run
    pretrain = cfg.pretrain.model_copy(
        update={
            "model_size": "tiny",
            "num_workers": 1,
            "phases": [cfg.pretrain.phases[0].model_copy(update={"steps": 4, "batch_size": 8})],
            "validation_batches": 0,
            "checkpoint_every": 4,
            "shuffle_window_shards": 1000,
        }
    )
    cfg = cfg.model_copy(update={"pretrain": pretrain})
    shard = next(s for s in manifests["examples"].shards if s.path.startswith("seq128/train/"))
    path = Path(cfg.run.root) / "examples" / shard.path
    flip_byte(path, keep_mtime=True)  # invisible to the fast check: only the full hash sees it
    assert states(cfg)["examples"] == "complete"
    manifest, computed = Pipeline(cfg).run("pretrain")
    assert computed and manifest.stats["steps"] == 4
    assert sha256_file(str(path)) == shard.sha256  # recomputed before training read it
