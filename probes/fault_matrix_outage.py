"""Fault matrix, object-store outage: the store goes down for 30 s once in each data stage.

Each case runs the flow's data stages (corpus, vocab, examples; the demo recipe with
vocab.vocab_size=4000 and examples.dupe_factor=1) on an s3:// root: a moto server behind
tests/support/outage.py's forwarder, taken down for `--seconds` once the stage has written its
first file (`BEGUN`), then up again. A run that fails is run again once with the store up.
One line per case says whether the run recovered by itself, needed a rerun or failed (with
its one line), whether its shards equal those of the same stages run undisturbed on local
disk, how often Prefect retried a stage, and what the run's log said about the store.

    .venv/bin/python probes/fault_matrix_outage.py [--seconds 30]

Not a test (pytest collects test_*.py only): it takes several minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests" / "support")]  # outage, processes
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")

DEMO = HERE.parent / "configs" / "demo.yaml"
DATA_STAGES = ["corpus", "vocab", "examples"]
OVERRIDES = ["vocab.vocab_size=4000", "examples.dupe_factor=1"]
BEGUN = {"corpus": r"^run/corpus/_work/.", "vocab": r"^run/vocab/(?!_logs/).", "examples": r"^run/examples/(?!_logs/)."}
"""When the store goes down: once an object matching this exists. corpus: its first work file
(its Ray tasks are cleaning and writing the others); vocab: its first output file (the task
publishing the tokenizer files has the rest to write, then the driver the manifest); examples:
its first file (its tokenize tasks are writing the others)."""


def shards(pipeline) -> dict[str, dict[str, str]]:
    return {name: {s.path: s.sha256 for s in pipeline.dir(name).manifest().shards} for name in DATA_STAGES}


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def case(stage: str, seconds: float, endpoint: str, client, reference) -> str:
    from flows.pipeline import bert_pretraining
    from outage import Forwarder, outage_when
    from pipelines.registry import load_config
    from pipelines.runner import Pipeline

    bucket = f"outage-{stage}"
    client.create_bucket(Bucket=bucket)

    def begun() -> bool:
        listing = client.list_objects_v2(Bucket=bucket, Prefix="run/")
        return any(re.search(BEGUN[stage], o["Key"]) for o in listing.get("Contents", []))

    started = time.monotonic()
    with Forwarder(int(endpoint.rsplit(":", 1)[1])) as store:
        cfg = load_config(DEMO, [f"run.root=s3://{bucket}/run", f"storage.endpoint_url={store.url}", *OVERRIDES])
        failures = []
        with outage_when(store, begun, seconds=seconds, wait_s=600) as outage:
            try:
                bert_pretraining(cfg, only=DATA_STAGES)
            except Exception as exc:  # noqa: BLE001 - the matrix reports any failure as its verdict
                failures.append(one_line(exc))
        if failures:  # by hand, as an operator would: the store is up again
            try:
                bert_pretraining(cfg, only=DATA_STAGES)
            except Exception as exc:  # noqa: BLE001 - the matrix reports any failure as its verdict
                failures.append(one_line(exc))
    took = time.monotonic() - started
    if not outage.get("up_at"):
        return (
            f"outage {seconds:.0f} s in {stage}: not applied (the stage wrote nothing); run "
            f"{'failed' if failures else 'completed'} in {took:.0f} s"
        )
    verdict = "recovered by itself" if not failures else "needed a rerun" if len(failures) == 1 else "failed"
    try:
        same = (
            shards(
                Pipeline(
                    load_config(DEMO, [f"run.root=s3://{bucket}/run", f"storage.endpoint_url={endpoint}", *OVERRIDES])
                )
            )
            == reference
        )
        outputs = "outputs equal" if same else "outputs differ"
    except Exception as exc:  # noqa: BLE001 - the matrix reports any failure as its verdict
        outputs = f"no outputs to compare ({one_line(exc)})"
    logs = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="run/_logs/flow-run-").get("Contents", [])]
    text = "".join(client.get_object(Bucket=bucket, Key=key)["Body"].read().decode() for key in logs)
    said = sorted({m.group(0) for m in re.finditer(r"object store unreachable for \d+ s[^\n]*", text)})
    tracebacks = text.count("Traceback (most recent call last)")
    retries = len(re.findall(r"Retry \d+/\d+ will start", text))
    first = f"; first run: {failures[0]}" if failures else ""
    return (
        f"outage {seconds:.0f} s in {stage}: {verdict}; {outputs}; run {took:.0f} s{first}; "
        f"stage retries {retries}; log: {len(said)} 'unreachable for' lines ({said[0] if said else 'none'}), "
        f"{tracebacks} tracebacks"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the store is down in each case")
    parser.add_argument("--stages", nargs="+", default=DATA_STAGES, choices=DATA_STAGES)
    args = parser.parse_args()

    from flows import logs

    logs.setup(0)  # as `bertpipe run` does: Ray's worker output reaches the run log

    import boto3
    from moto.server import ThreadedMotoServer
    from prefect.testing.utilities import prefect_test_harness

    from bertcore.config import RayConfig
    from pipelines.ray_runtime import ensure_ray
    from pipelines.registry import load_config
    from pipelines.runner import Pipeline
    from processes import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    lines = []
    try:
        ensure_ray(RayConfig(num_cpus=2))
        with prefect_test_harness(server_startup_timeout=120), tempfile.TemporaryDirectory() as tmp:
            reference_run = Pipeline(load_config(DEMO, [f"run.root={tmp}/reference", *OVERRIDES]))
            for name in DATA_STAGES:
                reference_run.run(name)
            reference = shards(reference_run)
            for stage in args.stages:
                lines.append(case(stage, args.seconds, endpoint, client, reference))
                print(lines[-1], flush=True)
    finally:
        import ray

        ray.shutdown()
        server.stop()
    print("\n".join(["", "fault matrix: object-store outage", *lines]))


if __name__ == "__main__":
    main()
