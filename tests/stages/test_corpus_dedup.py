"""The corpus stage's partitioned duplicate removal on a real local Ray: real news stories
with planted near duplicates (tests/support/planted.py), many work files, near dedup on.

- the output is byte-identical for 1 and 2 workers;
- it removes what the rule says, computed in one process from the same signatures, and
  agrees with the serial in-memory index the stage used before on at least 99% of removals;
- a dedup task killed mid-run is retried by Ray and the shards do not change;
- once finished, the stage leaves no scratch beside its shards (the module's run keeps it,
  `run.keep_scratch`, for the comparison above, and a rerun with the default removes it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from bertcore.text.dedup import near_duplicates
from dedup_reference import serial_near_duplicates
from pipelines.registry import parse_config
from pipelines.runner import Pipeline
from pipelines.stage_dir import Manifest
from pipelines.stages.corpus.shuffle import fixed_width
from pipelines.storage import Storage
from planted import planted
from processes import kill_one_task, start_stage
from store_use import scratch_left

DEDUP_TASKS = ("index_work", "exact_group", "near_group")


def read(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return ipc.open_file(source).read_all()


@pytest.fixture(scope="module")
def planted_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("planted") / "planted.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for title, text in planted(seed=0, copies=2):
            out.write(json.dumps({"key": title, "body": text}) + "\n")
    return path


def config(root: Path, source: Path, keep_scratch: bool = False, **corpus):
    return parse_config(
        {
            "run": {"root": str(root), "keep_scratch": keep_scratch},
            "corpus": {
                "inputs": [{"uri": str(source), "text_column": "body", "title_column": "key", "name": "planted"}],
                "near_dedup": True,
                "min_chars": 50,
                "min_sentences": 1,
                "validation_fraction": 0.1,
                "split_bytes": 32_000,  # about 30 work files
                "shard_chars": 100_000,
                **corpus,
            },
        }
    )


@pytest.fixture(scope="module")
def two_workers(planted_jsonl, tmp_path_factory, ray_cluster):
    cfg = config(tmp_path_factory.mktemp("two"), planted_jsonl, keep_scratch=True)  # _work_documents reads it
    manifest, computed = Pipeline(cfg).run("corpus", parallelism=2)
    assert computed
    return cfg, manifest


def shard_hashes(manifest: Manifest) -> dict[str, str]:
    return {s.path: s.sha256 for s in manifest.shards}


def test_near_dedup_gives_identical_shards_for_one_and_two_workers(two_workers, planted_jsonl, tmp_path):
    cfg, manifest = two_workers
    assert manifest.stats["work_units"] >= 20 and len(manifest.shards) >= 4
    assert manifest.stats["dropped"]["duplicate"] > 50 and manifest.stats["dropped"]["near_duplicate"] > 100
    single, _ = Pipeline(config(tmp_path, planted_jsonl)).run("corpus", parallelism=1)
    assert shard_hashes(single) == shard_hashes(manifest)
    assert single.stats == manifest.stats


def _work_documents(root: Path):
    """Every cleaned document in input order: doc id, content hash, signature."""
    tables = [
        read(p).select(["doc_id", "content_hash", "signature"])
        for p in sorted((root / "corpus" / "_work").glob("*.arrow"))
    ]
    table = pa.concat_tables(tables)
    ids = table.column("doc_id").to_pylist()
    hashes = table.column("content_hash").to_pylist()
    return ids, hashes, fixed_width(table.column("signature"), 128 * 4, "<u4")


def _kept_ids(root: Path, manifest: Manifest) -> set[str]:
    return {d for s in manifest.shards for d in read(root / "corpus" / s.path).column("doc_id").to_pylist()}


def test_near_dedup_removes_what_the_rule_says_and_agrees_with_the_serial_index(two_workers):
    cfg, manifest = two_workers
    root = Path(cfg.run.root)
    ids, hashes, signatures = _work_documents(root)
    seen, first = set(), []
    for i, digest in enumerate(hashes):  # exact: the first of each content hash
        if digest not in seen:
            seen.add(digest)
            first.append(i)
    assert len(ids) - len(first) == manifest.stats["dropped"]["duplicate"]
    # the same steps in one process, over every document (exact copies pair as their first
    # copy does) less the exact copies, give exactly the stage's removals
    in_memory = set(near_duplicates(np.arange(len(ids)), signatures, 0.8).tolist()) - (
        set(range(len(ids))) - set(first)
    )
    kept = _kept_ids(root, manifest)
    assert {i for i in first if ids[i] not in kept} == in_memory
    # against the index the stage walked before (one MinHashLSH, in input order)
    serial = serial_near_duplicates(first, [signatures[i] for i in first], 0.8, 128)
    assert len(serial & in_memory) / len(serial | in_memory) >= 0.99, (
        len(serial),
        len(in_memory),
        len(serial ^ in_memory),
    )


def test_a_killed_dedup_task_is_retried_and_the_shards_are_unchanged(two_workers, planted_jsonl, tmp_path):
    _, reference = two_workers
    cfg = config(tmp_path / "run", planted_jsonl)
    driver = start_stage(cfg, tmp_path, "corpus")
    killed, out, err = kill_one_task(driver, DEDUP_TASKS)
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert driver.returncode == 0 and results, err[-4000:]
    assert killed, "no dedup task was caught running; nothing was disturbed"
    # Ray's account of the retry (raylet messages reach the driver's output)
    assert any(f"Task {task} failed" in out + err for task in DEDUP_TASKS) and "will be retried" in out + err
    manifest = Manifest.from_json(json.loads(results[-1].removeprefix("RESULT ")))
    assert shard_hashes(manifest) == shard_hashes(reference)
    assert manifest.stats == reference.stats


def test_a_finished_corpus_leaves_no_scratch(two_workers, tmp_path):
    """The module's run kept its scratch (run.keep_scratch); a rerun with the default finds
    the stage complete and removes it, as it does after a crash between the manifest and
    the removal. What stays beside the shards is then at most 5% of them."""
    cfg, manifest = two_workers
    root = tmp_path / "copy"
    shutil.copytree(Path(cfg.run.root) / "corpus", root / "corpus")
    storage = Storage(cfg.storage)
    output, kept = scratch_left(storage, str(root / "corpus"), manifest)
    assert {"_work", "_dedup"} <= set(kept) and sum(kept.values()) > 0.5 * output
    default = cfg.model_copy(update={"run": cfg.run.model_copy(update={"root": str(root), "keep_scratch": False})})
    again, computed = Pipeline(default).run("corpus")
    assert not computed and again.fingerprint == manifest.fingerprint
    output, other = scratch_left(storage, str(root / "corpus"), manifest)
    assert set(other) <= {"_progress"} and sum(other.values()) <= 0.05 * output, (output, other)
