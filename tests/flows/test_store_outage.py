"""A run on an s3:// root rides out an object-store outage by itself: the store (a moto
server behind a forwarder, tests/support/outage.py) goes down for 12 s once the corpus stage has
written its first output shard (its Ray tasks are writing the others, and the driver writes
the manifest next), and comes back. The flow finishes without a rerun, its log says in one
line what happened (no traceback), and every shard equals an undisturbed run's.

A store whose answers are cut off mid-body for a while (the status line and headers
arrive, then part of the body, then a reset) is waited out the same way, whichever way
bertpipe reads the body."""

from __future__ import annotations

import http.client
import logging
import re
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from bertcore.config import StorageConfig
from flows.pipeline import bert_pretraining
from outage import Forwarder, outage_when
from pipelines.registry import load_config
from pipelines.runner import Pipeline
from pipelines.storage import Storage

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
DATA_STAGES = ["corpus", "vocab", "examples"]
SAME_AS_DEMO_PIPELINE = ["vocab.vocab_size=4000", "examples.dupe_factor=1"]  # tests/conftest.py: the reference


def has_shard(client, bucket: str, stage_dir: str) -> bool:
    """Whether the stage under `stage_dir` has published an output shard (`<split>/part-*`)."""
    listing = client.list_objects_v2(Bucket=bucket, Prefix=stage_dir)
    return any(re.search(r"/(train|validation)/part-", o["Key"]) for o in listing.get("Contents", []))


def shards(pipeline: Pipeline) -> dict[str, dict[str, str]]:
    return {name: {s.path: s.sha256 for s in pipeline.dir(name).manifest().shards} for name in DATA_STAGES}


@pytest.mark.slow
def test_a_store_outage_while_corpus_writes_is_ridden_out(
    s3_bucket, demo_pipeline, prefect_harness, ray_cluster, capfd
):
    import boto3

    endpoint, bucket = s3_bucket
    direct = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")  # never through the forwarder
    with Forwarder(urlparse(endpoint).port) as store:
        cfg = load_config(
            DEMO, [f"run.root=s3://{bucket}/run", f"storage.endpoint_url={store.url}", *SAME_AS_DEMO_PIPELINE]
        )
        started = time.monotonic()
        with outage_when(store, lambda: has_shard(direct, bucket, "run/corpus/"), seconds=12, wait_s=120) as outage:
            summaries = bert_pretraining(cfg, only=DATA_STAGES)
        took = time.monotonic() - started
    assert outage.get("up_at"), "the store was never taken down: corpus wrote no shard within 120 s"
    assert [s["state"] for s in summaries] == ["computed"] * 3, summaries

    reference_cfg, reference = demo_pipeline
    on_s3 = Pipeline(
        load_config(DEMO, [f"run.root=s3://{bucket}/run", f"storage.endpoint_url={endpoint}", *SAME_AS_DEMO_PIPELINE])
    )
    assert shards(on_s3) == {name: {s.path: s.sha256 for s in manifest.shards} for name, manifest in reference.items()}
    assert [on_s3.dir(n).manifest().fingerprint for n in DATA_STAGES] == [reference[n].fingerprint for n in DATA_STAGES]

    # the run's log (the driver's records) and its console (where Ray relays its tasks' lines here;
    # `bertpipe run` puts them in the log too, flows/logs.py): what happened, in plain words
    logs = [o["Key"] for o in direct.list_objects_v2(Bucket=bucket, Prefix="run/_logs/flow-run-")["Contents"]]
    assert len(logs) == 1, logs
    text = direct.get_object(Bucket=bucket, Key=logs[0])["Body"].read().decode()
    assert "Traceback" not in text and "Retry 1/2" not in text and "run ended: Completed" in text, text[-3000:]
    console, deadline = "", time.monotonic() + 15  # Ray relays its workers' lines a moment later
    while not re.search(r"object store unreachable for \d+ s", console) and time.monotonic() < deadline:
        time.sleep(0.5)
        console += "".join(capfd.readouterr())
    said = [line for line in (text + console).splitlines() if re.search(r"object store unreachable for \d+ s", line)]
    assert said, console[-3000:]
    assert "Traceback" not in console, console[-3000:]
    with capfd.disabled():
        print(f"\nstore down {outage['up_at'] - outage['down_at']:.0f} s; data stages {took:.0f} s; said: {said[0]}")


CUT_S = 4
"""How long every answer is cut: longer than s3fs's own retries of a cut body (5 tries within
about 2 s), far shorter than the window of a refused connection (about 75 s)."""

READS = {
    "open": lambda storage, uri, folder: storage.open(
        uri
    ).read(),  # s3fs's file: read_json, read_table, take_rows, sha256
    "get": lambda storage, uri, folder: (storage.get(uri, str(folder)), (folder / "shard.bin").read_bytes())[
        1
    ],  # s3fs's get_file: local copies
}


@pytest.mark.parametrize("read", sorted(READS))
def test_answers_cut_mid_body_are_retried_like_a_refused_connection(s3_bucket, read, tmp_path, caplog):
    import boto3

    endpoint, bucket = s3_bucket
    body = bytes(range(256)) * 1200  # 300 KB, of which the forwarder lets 1 KB (headers included) through
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").put_object(
        Bucket=bucket, Key="shard.bin", Body=body
    )
    with Forwarder(urlparse(endpoint).port) as store:
        storage = Storage(StorageConfig(endpoint_url=store.url))
        store.cut_answers(1024)
        whole_again = threading.Timer(CUT_S, store.cut_answers, [None])
        whole_again.start()
        try:
            with caplog.at_level(logging.WARNING, logger="pipelines.storage"):
                got = READS[read](storage, f"s3://{bucket}/shard.bin", tmp_path)
        finally:
            whole_again.cancel()
    assert got == body
    assert store.cuts >= 2, store.cuts
    said = [r.getMessage() for r in caplog.records]
    assert any(re.match(r"object store unreachable at \S+ \(Connection was closed", line) for line in said), said
    assert any(
        re.match(r"object store unreachable for \d+ s at \S+; retried \d+ times until it answered again", line)
        for line in said
    ), said


def test_the_forwarder_passes_an_answer_whole_to_a_client_slow_to_read_it(s3_bucket):
    """With the store up, an answer reaches a client that reads it late whole. moto closes
    each connection after its answer; the forwarder used to reset the client's side at
    that close, dropping the part of a large answer still queued for it, so on a busy
    machine a store that was up cut bodies short."""
    import boto3

    endpoint, bucket = s3_bucket
    body = bytes(range(256)) * 12000  # 3 MB: more than a socket's buffers hold
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").put_object(
        Bucket=bucket, Key="shard.bin", Body=body
    )
    with Forwarder(urlparse(endpoint).port) as store:
        url = boto3.client("s3", endpoint_url=store.url, region_name="us-east-1").generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "shard.bin"}
        )
        connection = http.client.HTTPConnection("127.0.0.1", store.port, timeout=30)
        connection.request("GET", url.removeprefix(store.url))
        time.sleep(1)  # moto has sent it all and closed by now
        answer = connection.getresponse()
        got = answer.read()
        connection.close()
    assert answer.status == 200 and got == body, (answer.status, len(got))
