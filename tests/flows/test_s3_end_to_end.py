"""The whole flow with every URI on S3 (a moto server on 127.0.0.1): inputs, every stage's
output, checkpoints, the model and the report. A second run is cached throughout; one
changed examples setting re-runs exactly examples, pretrain and evaluate. Data moves only
where it is needed: the server's request log shows each training shard fetched once by the
two training workers of this one machine, and no shard cache is left on local disk."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import pytest

from flows.pipeline import bert_pretraining
from pipelines.registry import load_config
from pipelines.training.inputs import cache_folder

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


@pytest.mark.slow
def test_demo_flow_on_s3(s3_bucket, gensim_data, monkeypatch, prefect_harness, ray_cluster):
    import boto3

    endpoint, bucket = s3_bucket
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for name in (
        "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
        "lee_background.cor",
        "pang_lee_polarity.cor",
    ):
        client.upload_file(str(gensim_data / name), bucket, f"raw/{name}")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    raw = f"s3://{bucket}/raw"
    overrides = [
        f"run.root=s3://{bucket}/runs/demo",
        (
            f"corpus.inputs=[{{uri: '{raw}/*.bz2', format: wikipedia, name: enwiki}}, {{uri: "
            f"'{raw}/lee_background.cor', format: lines, name: lee-news}}]"
        ),
        "vocab.vocab_size=3000",
        "examples.dupe_factor=1",
        "examples.phases=[{name: seq128, max_seq_length: 128, max_predictions_per_seq: 20}]",
        "pretrain.phases=[{name: seq128, steps: 20, batch_size: 16, max_seq_length: 128}]",
        "pretrain.checkpoint_every=10",
        (
            f"evaluate.tasks=[{{name: polarity, type: classification, format: fasttext, train: "
            f"'{raw}/pang_lee_polarity.cor', "
            "encoding: cp1252, cross_validation_folds: 2, seeds: [1], epochs: 1, batch_size: 16, max_seq_length: 32}]"
        ),
        "evaluate.embeddings.sentences=50",
    ]
    cfg = load_config(DEMO, overrides)

    def states(config):
        return {s["stage"]: s["state"] for s in bert_pretraining(config)}

    events: list[tuple[float, str, logging.LogRecord]] = []

    class Events(logging.Handler):  # moto's server logs each request it answers (werkzeug); stages their start and end
        def emit(self, record: logging.LogRecord) -> None:
            events.append((record.created, record.name, record))

    handler = Events()
    watched = {name: logging.getLogger(name) for name in ("werkzeug", "pipelines.stage_log")}
    levels = {name: logger.level for name, logger in watched.items()}
    for logger in watched.values():
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    stages = ["corpus", "vocab", "examples", "pretrain", "evaluate"]
    try:
        assert states(cfg) == dict.fromkeys(stages, "computed")
    finally:
        for name, logger in watched.items():
            logger.removeHandler(handler)
            logger.setLevel(levels[name])
    pretraining = [
        t for t, name, r in events if name == "pipelines.stage_log" and getattr(r, "stage", None) == "pretrain"
    ]
    train = re.compile(rf"GET /{bucket}/runs/demo/examples/seq128/train/(part-\S+\.arrow)")
    fetched = Counter(
        m.group(1)
        for t, name, r in events
        if name == "werkzeug" and min(pretraining) <= t <= max(pretraining) and (m := train.search(r.getMessage()))
    )
    assert fetched and set(fetched.values()) == {1}, fetched  # two workers, one download each
    examples = json.loads(client.get_object(Bucket=bucket, Key="runs/demo/examples/_manifest.json")["Body"].read())
    cache = cache_folder("pretrain", f"s3://{bucket}/runs/demo/pretrain", examples["fingerprint"])
    assert not Path(cache).exists(), "the shard cache is removed when training ends"
    keys = {
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="runs/demo/")
        for o in page.get("Contents", [])
    }
    for key in (
        "runs/demo/corpus/_manifest.json",
        "runs/demo/vocab/vocab.txt",
        "runs/demo/examples/_manifest.json",
        "runs/demo/pretrain/metrics.jsonl",
        "runs/demo/pretrain/model/model.safetensors",
        "runs/demo/eval/report.md",
        "runs/demo/eval/metrics.json",
    ):
        assert key in keys, key
    assert any(k.startswith("runs/demo/pretrain/checkpoints/step-0000020/") for k in keys)
    metrics = json.loads(client.get_object(Bucket=bucket, Key="runs/demo/eval/metrics.json")["Body"].read())
    assert "polarity" in json.dumps(metrics)

    assert states(cfg) == dict.fromkeys(stages, "cached")
    changed = load_config(DEMO, [*overrides, "examples.masked_lm_prob=0.2"])
    assert states(changed) == {
        "corpus": "cached",
        "vocab": "cached",
        "examples": "computed",
        "pretrain": "computed",
        "evaluate": "computed",
    }
    # pretraining started over on the new examples instead of continuing the old checkpoints
    log = client.get_object(Bucket=bucket, Key="runs/demo/pretrain/metrics.jsonl")["Body"].read().decode().splitlines()
    assert [json.loads(line)["step"] for line in log] == list(range(1, 21))
