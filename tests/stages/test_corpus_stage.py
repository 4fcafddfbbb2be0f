"""The corpus stage on a real local Ray (2 CPUs), on local disk and on a moto S3 server."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from pipelines.registry import load_config
from pipelines.runner import Pipeline
from pipelines.stage_dir import MANIFEST, RESOLVED_CONFIG, StageDir
from pipelines.storage import Storage, sha256_file
from store_use import scratch_left

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


def demo_config(root, *extra):
    return load_config(DEMO, [f"run.root={root}", *extra])


def read_shard(path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return ipc.open_file(source).read_all()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, ray_cluster):
    root = tmp_path_factory.mktemp("demo")
    cfg = demo_config(root)
    manifest, computed = Pipeline(cfg).run("corpus")
    assert computed
    return cfg, manifest, Path(cfg.run.root) / "corpus"


def test_demo_corpus_manifest_and_shards(demo_run):
    cfg, manifest, stage_dir = demo_run
    assert (stage_dir / MANIFEST).exists() and (stage_dir / RESOLVED_CONFIG).exists()
    stats = manifest.stats
    # nothing silently dropped: read = kept + dropped by reason, per source and in total
    assert stats["documents_read"] == stats["documents_kept"] + sum(stats["dropped"].values())
    for source, entry in stats["per_source"].items():
        assert entry["read"] == entry["kept"] + sum(entry["dropped"].values()), source
    assert set(stats["per_source"]) == {"enwiki", "lee-news"}
    # the Wikipedia sample has redirects and non-article pages; they are counted, not lost
    assert stats["per_source"]["enwiki"]["dropped"].get("redirect", 0) > 0
    assert stats["splits"]["train"]["documents"] > 200 and stats["splits"]["validation"]["documents"] > 0
    kept = stats["splits"]["train"]["documents"] + stats["splits"]["validation"]["documents"]
    assert kept == stats["documents_kept"] == manifest.rows

    for shard in manifest.shards:
        path = stage_dir / shard.path
        assert path.stat().st_size == shard.bytes and sha256_file(str(path)) == shard.sha256
        table = read_shard(path)
        assert table.schema.names == [
            "doc_id",
            "source",
            "title",
            "sentences",
            "url",
            "crawl_date",
            "content_type",
            "language",
            "language_score",
        ]
        assert table.schema.field("sentences").type == pa.list_(pa.string())
        assert table.num_rows == shard.rows
        assert all(len(doc) >= cfg.corpus.min_sentences for doc in table.column("sentences").to_pylist())
    ids = [i for s in manifest.shards for i in read_shard(stage_dir / s.path).column("doc_id").to_pylist()]
    assert len(ids) == len(set(ids)), "a document id appears twice"


def test_train_shards_balanced_by_characters(demo_run):
    _, manifest, _ = demo_run
    train = [s for s in manifest.shards if s.path.startswith("train/")]
    assert len(train) >= 3
    chars = [s.extra["chars"] for s in train]
    mean = sum(chars) / len(chars)
    assert all(abs(c - mean) <= 0.10 * mean for c in chars[:-1]), chars


def test_wikipedia_text_is_clean(demo_run):
    _, manifest, stage_dir = demo_run
    text = "\n".join(
        sentence
        for shard in manifest.shards
        for doc in read_shard(stage_dir / shard.path).column("sentences").to_pylist()
        for sentence in doc
    )
    for markup in ("{{", "}}", "[[", "]]", "<ref", "{|", "|}", "[[Category:", "'''"):
        assert markup not in text, markup


def test_rerun_is_skipped_and_deleted_shard_is_recomputed_alone(demo_run):
    cfg, manifest, stage_dir = demo_run
    storage = Storage(cfg.storage)
    again, computed = Pipeline(cfg, storage).run("corpus")
    assert not computed and again.fingerprint == manifest.fingerprint

    victim = stage_dir / manifest.shards[1].path
    others = {
        s.path: (stage_dir / s.path).stat().st_mtime_ns for s in manifest.shards if s.path != manifest.shards[1].path
    }
    victim.unlink()
    assert StageDir(storage, cfg.run.root, "corpus").state(manifest.fingerprint) == "incomplete"
    rebuilt, computed = Pipeline(cfg, storage).run("corpus")
    assert computed
    assert sha256_file(str(victim)) == manifest.shards[1].sha256
    assert {s.path: (stage_dir / s.path).stat().st_mtime_ns for s in rebuilt.shards if s.path in others} == others
    assert [s.sha256 for s in rebuilt.shards] == [s.sha256 for s in manifest.shards]


def test_one_and_two_workers_give_identical_bytes(demo_run, tmp_path):
    cfg, manifest, _ = demo_run
    single = demo_config(tmp_path / "one", "ray.parallelism=1")
    other, _ = Pipeline(single).run("corpus", parallelism=1)
    assert [(s.path, s.sha256) for s in other.shards] == [(s.path, s.sha256) for s in manifest.shards]


def test_changed_setting_changes_fingerprint(demo_run, tmp_path):
    cfg, manifest, _ = demo_run
    changed = demo_config(cfg.run.root, "corpus.min_chars=300")
    assert Pipeline(changed).expected_fingerprint("corpus") != manifest.fingerprint


def test_stage_on_s3(demo_run, s3_bucket, monkeypatch):
    """Input and output on s3:// (moto server on 127.0.0.1): same bytes as on local disk,
    no credentials in what the stage writes, and no scratch left beside the shards (at
    most 5% of them: the output shards' unit markers)."""
    import boto3

    endpoint, bucket = s3_bucket
    _, local_manifest, _ = demo_run
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    local_cfg = demo_run[0]
    for spec in local_cfg.corpus.inputs:
        client.upload_file(spec.uri, bucket, f"raw/{os.path.basename(spec.uri)}")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    cfg = demo_config(
        f"s3://{bucket}/run",
        f"corpus.inputs=[{{uri: 's3://{bucket}/raw/*.bz2', format: wikipedia, name: enwiki}}, "
        f"{{uri: 's3://{bucket}/raw/lee_background.cor', format: lines, name: lee-news}}]",
    )
    manifest, computed = Pipeline(cfg).run("corpus")
    assert computed
    assert [(s.path, s.sha256) for s in manifest.shards] == [(s.path, s.sha256) for s in local_manifest.shards]
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="run/corpus/")["Contents"]}
    assert "run/corpus/_manifest.json" in keys and "run/corpus/train/part-00000.arrow" in keys
    written = client.get_object(Bucket=bucket, Key="run/corpus/_manifest.json")["Body"].read().decode()
    written += client.get_object(Bucket=bucket, Key="run/corpus/_config.yaml")["Body"].read().decode()
    assert "testing" not in written and "secret" not in written.lower()
    output, other = scratch_left(Storage(cfg.storage), f"{cfg.run.root}/corpus", manifest)
    assert set(other) <= {"_progress"} and sum(other.values()) <= 0.05 * output, (output, other)
    again, computed = Pipeline(cfg).run("corpus")
    assert not computed


def test_jsonl_and_parquet_inputs(tmp_path, ray_cluster):
    import json

    import pyarrow.parquet as pq

    from pipelines.registry import parse_config

    body = "The committee met on Tuesday. It approved the budget for the new library. Work starts next week."
    rows = [{"key": f"doc-{i}", "body": f"{body} Item {i} was noted."} for i in range(30)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:15]), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows[15:]), tmp_path / "b.parquet", row_group_size=4)
    cfg = parse_config(
        {
            "run": {"root": str(tmp_path / "run")},
            "corpus": {
                "inputs": [
                    {"uri": str(tmp_path / "*.jsonl"), "text_column": "body", "title_column": "key", "name": "json"},
                    {"uri": str(tmp_path / "*.parquet"), "text_column": "body", "title_column": "key", "name": "pq"},
                ],
                "min_chars": 50,
                "validation_fraction": 0.0,
                "split_bytes": 600,  # several tasks share each file
            },
        }
    )
    manifest, _ = Pipeline(cfg).run("corpus")
    assert manifest.stats["work_units"] > 2
    titles = [
        t
        for s in manifest.shards
        for t in read_shard(Path(cfg.run.root) / "corpus" / s.path).column("title").to_pylist()
    ]
    assert titles == [r["key"] for r in rows]  # every record once, in input order
    first = read_shard(Path(cfg.run.root) / "corpus" / manifest.shards[0].path).column("sentences")[0].as_py()
    assert first == [
        "The committee met on Tuesday.",
        "It approved the budget for the new library.",
        "Work starts next week.",
        "Item 0 was noted.",
    ]


def test_near_duplicates_removed_when_enabled(gensim_data, tmp_path, ray_cluster):
    from pipelines.registry import parse_config

    inputs = [{"uri": str(gensim_data / "lee_background.cor"), "format": "lines", "name": "news"}]
    plain = parse_config({"run": {"root": str(tmp_path / "a")}, "corpus": {"inputs": inputs}})
    near = parse_config({"run": {"root": str(tmp_path / "b")}, "corpus": {"inputs": inputs, "near_dedup": True}})
    without, _ = Pipeline(plain).run("corpus")
    with_near, _ = Pipeline(near).run("corpus")
    removed = with_near.stats["dropped"].get("near_duplicate", 0)
    assert removed >= 1 and "near_duplicate" not in without.stats["dropped"]
    assert with_near.stats["documents_kept"] == without.stats["documents_kept"] - removed
