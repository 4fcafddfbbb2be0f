"""Faults during the examples stage (dupe_factor 3, both phases, so it runs long enough to
be hit): a Ray worker killed mid-task, and the whole driver killed mid-stage; and the corpus
stage's single-stream reader killed mid-file. Either way the finished stage is
byte-identical to an undisturbed run.

The disturbed runs are subprocesses with their own embedded Ray, so the processes killed
are found among that subprocess's descendants and nothing else on the machine is touched.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from pipelines.runner import Pipeline
from pipelines.stage_dir import MANIFEST, Manifest
from processes import kill_one_task, kill_tree, start_stage, tasks_running


def _config(demo_pipeline, root: Path):
    """The session's demo config on a fresh root holding copies of its corpus and vocab."""
    cfg, _ = demo_pipeline
    for stage in ("corpus", "vocab"):
        shutil.copytree(Path(cfg.run.root) / stage, root / stage)
    return cfg.model_copy(
        update={
            "run": cfg.run.model_copy(update={"root": str(root)}),
            "ray": cfg.ray.model_copy(update={"address": "", "num_cpus": 2}),
            "examples": cfg.examples.model_copy(update={"dupe_factor": 3}),
        }
    )


@pytest.fixture(scope="module")
def undisturbed(demo_pipeline, tmp_path_factory):
    """The manifest of the examples stage (dupe_factor 3, both phases) run without faults."""
    cfg = _config(demo_pipeline, tmp_path_factory.mktemp("undisturbed"))
    assert {p.name for p in cfg.examples.phases} >= {"seq128", "seq512"}
    manifest, computed = Pipeline(cfg).run("examples")
    assert computed
    return manifest


def _shards(manifest: Manifest) -> dict[str, str]:
    return {s.path: s.sha256 for s in manifest.shards}


def _files_in_shard_dirs(root: Path) -> set[str]:
    """Every file under examples/<phase>/<split>/, as paths relative to examples/."""
    stage = root / "examples"
    return {
        str(p.relative_to(stage))
        for p in stage.glob("*/*/*")
        if p.is_file() and not p.relative_to(stage).parts[0].startswith("_")
    }


@pytest.mark.slow
def test_a_killed_worker_is_retried_and_the_output_is_unchanged(undisturbed, demo_pipeline, tmp_path):
    reference = undisturbed
    cfg = _config(demo_pipeline, tmp_path / "run")
    driver = start_stage(cfg, tmp_path)
    killed, out, err = kill_one_task(driver, "build_shard")
    assert killed, "no build_shard task was caught running; nothing was disturbed"
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert driver.returncode == 0 and results, err[-4000:]
    # Ray's account of the retry (raylet messages reach the driver's stdout)
    assert "Task build_shard failed" in out + err and "will be retried" in out + err

    manifest = Manifest.from_json(json.loads(results[-1].removeprefix("RESULT ")))
    assert manifest.fingerprint == reference.fingerprint
    assert _shards(manifest) == _shards(reference)
    assert manifest.stats == reference.stats
    # no half-written file from the killed task is left beside the shards
    assert _files_in_shard_dirs(tmp_path / "run") == set(_shards(reference))


@pytest.mark.slow
def test_a_killed_driver_resumes_keeping_finished_shards(undisturbed, demo_pipeline, tmp_path):
    reference = undisturbed
    root = tmp_path / "run"
    cfg = _config(demo_pipeline, root)
    driver = start_stage(cfg, tmp_path)
    progress = root / "examples" / "_progress"
    try:
        deadline = time.monotonic() + 300
        # wait until a few build_shard tasks have finished (each leaves a unit marker), then crash
        while len(list(progress.glob("build__*.json"))) < 3:
            assert driver.poll() is None, "the examples stage ended before it could be interrupted"
            assert time.monotonic() < deadline, "no build_shard task finished in time"
            time.sleep(0.05)
    finally:
        kill_tree(driver)
    assert not (root / "examples" / MANIFEST).exists()

    finished = {}
    for marker in progress.glob("build__*.json"):
        for shard in json.loads(marker.read_text())["shards"]:
            finished[shard["path"]] = (root / "examples" / shard["path"]).stat().st_mtime_ns
    assert finished and len(finished) < len(reference.shards)

    manifest, computed = Pipeline(cfg).run("examples")
    assert computed
    assert _shards(manifest) == _shards(reference)
    # the shards finished before the crash were kept, not written again
    assert {path: (root / "examples" / path).stat().st_mtime_ns for path in finished} == finished
    assert _files_in_shard_dirs(root) == set(_shards(reference))


@pytest.mark.slow
def test_a_killed_stream_reader_is_retried_and_the_corpus_is_unchanged(demo_pipeline, enwiki_dump, tmp_path):
    """A single-stream .gz (the demo's dump, recompressed here) is decompressed by one
    read_stream task feeding cleaning tasks (a .bz2 is read in block ranges instead);
    killing the reader mid-file makes Ray run it again, and the batches it had already
    handed out are neither lost nor counted twice."""
    import bz2
    import gzip

    cfg, _ = demo_pipeline
    dump = tmp_path / "enwiki-sample.xml.gz"
    with bz2.open(enwiki_dump) as source, gzip.open(dump, "wb", compresslevel=6) as target:
        shutil.copyfileobj(source, target)
    assert dump.stat().st_size > cfg.corpus.split_bytes  # large enough to be streamed, not read whole
    inputs = [cfg.corpus.inputs[0].model_copy(update={"uri": str(dump)}), *cfg.corpus.inputs[1:]]
    corpus = cfg.corpus.model_copy(update={"inputs": inputs})
    reference, computed = Pipeline(
        cfg.model_copy(
            update={"corpus": corpus, "run": cfg.run.model_copy(update={"root": str(tmp_path / "reference")})}
        )
    ).run("corpus")
    assert computed and reference.stats["streamed_units"] == 1
    cfg = cfg.model_copy(
        update={
            "corpus": corpus,
            "run": cfg.run.model_copy(update={"root": str(tmp_path / "run")}),
            "ray": cfg.ray.model_copy(update={"address": "", "num_cpus": 2}),
        }
    )
    driver = start_stage(cfg, tmp_path, "corpus")
    # once a batch is being cleaned, the reader has handed it out
    killed, out, err = kill_one_task(driver, "read_stream", when=lambda: bool(tasks_running(driver, "clean_batch")))
    assert killed, "the reader was not caught running after it handed out a batch; nothing was disturbed"
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert driver.returncode == 0 and results, err[-4000:]
    manifest = Manifest.from_json(json.loads(results[-1].removeprefix("RESULT ")))
    assert manifest.stats["streamed_units"] == 1
    assert _shards(manifest) == _shards(reference)
    assert manifest.stats == reference.stats  # no batch lost or counted twice
