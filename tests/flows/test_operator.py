"""The operator test (issue 25): a scheduled cluster run set up the way an operator sets it
up, and a node lost under it while nobody watches.

All of it real, in one loopback-only network namespace (test_ray_cluster.py `loopback_only`;
the namespace has nothing but `lo`): a Prefect server and a process worker, a two-node Ray
cluster (head and worker node, one CPU each, token auth) and a moto S3 server. `bertpipe
deploy` deploys a tiny recipe whose run.root is in that bucket and whose ray.address is the
head, and one run of its `full` deployment is triggered (the data stages and pretrain;
evaluate is left out, it is not what a lost node tests).

Once pretraining's first checkpoint is complete the worker node is lost: its `ray start`
process, raylet, agents and workers are frozen and SIGKILLed by pid (descendants of the node's
`ray start --block`; never by name, other Rays run on this machine), and a new worker node
is started. The run must complete by itself: the flow run Completed at its first attempt,
no stage retried by Prefect; pretrain restarted its workers from the checkpoint in the same
run (pipelines/training/launch.py `fit`) and its manifest says so; and its outputs equal those of
an uninterrupted run of the same recipe, which a driver with an embedded Ray of its own (2
CPUs, in the namespace too) runs on a local root alongside, from the start: every stage's
shards, the model's bytes, the loss at every step. Every listening socket of what the test
started is a loopback one.

The issue's second case, the Prefect worker killed (SIGKILL, then SIGTERM) under a running
flow run, is tests/flows/test_prefect_supervision.py's.

The pytest process stays outside the namespace: it reaches the server and the bucket
through short scripts it runs inside (nsenter).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from bertcore.train.checkpoint import CHECKPOINTS, COMPLETE, checkpoint_tag
from pipelines.registry import load_config
from processes import free_port, stop
from test_deploy import DEMO, _prefect_env, running_prefect_server
from test_prefect_supervision import Workers, gone
from test_ray_cluster import DRIVER, beyond_loopback, listening, loopback_only, two_nodes

BERTPIPE = str(Path(sys.executable).with_name("bertpipe"))
POOL = "bertpipe-operator"
BUCKET = "bertpipe-operator"
PREFIX = "runs/operator"
STAGES = ["corpus", "vocab", "examples", "pretrain"]
STEPS, CHECKPOINT_EVERY = 40, 10


def recipe(root: str, ray_address: str | None = None, endpoint: str | None = None) -> list[str]:
    """The demo made tiny, as `--set` overrides: the news file only, a small vocabulary, one
    pass of 64-token examples, and 40 pretraining steps of 8 sequences on two workers with a
    checkpoint every 10 (the node comes back within pretrain.rejoin_timeout_s, 120 s by default).
    Without `ray_address`, the demo's embedded Ray with 2 CPUs."""
    return [
        f"run.root={root}",
        *([f"ray.address={ray_address}"] if ray_address else []),
        *([f"storage.endpoint_url={endpoint}"] if endpoint else []),
        "corpus.inputs=[{uri: '{demo_data}/lee_background.cor', format: lines, name: lee-news}]",
        "vocab.vocab_size=2000",
        "examples.dupe_factor=1",
        "examples.phases=[{name: seq64, max_seq_length: 64, max_predictions_per_seq: 10}]",
        f"pretrain.phases=[{{name: seq64, steps: {STEPS}, batch_size: 8}}]",
        f"pretrain.checkpoint_every={CHECKPOINT_EVERY}",
        "pretrain.log_every=10",
        "pretrain.validation_batches=2",
        "pretrain.torch_threads=1",
    ]


# Run in the namespace: triggers one run of the deployment argv[1] with the stages argv[2]
# and prints RUN {id, name}; prints CHECKPOINT once the object argv[5] of the bucket argv[4]
# (at endpoint argv[3]) exists, and FINAL {state, ...} when the run is final or argv[6]
# seconds have passed.
OPERATE = r"""
import json, sys, time
import boto3
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment

deployment, only, endpoint, bucket, key, timeout_s = sys.argv[1:7]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
deadline = time.monotonic() + float(timeout_s)
run = run_deployment(deployment, parameters={"only": only.split(",")}, timeout=0)
print("RUN " + json.dumps({"id": str(run.id), "name": run.name}), flush=True)
with get_client(sync_client=True) as client:
    seen, asked = False, 0.0
    while time.monotonic() < deadline:
        if not seen and s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount"):
            seen = True
            print("CHECKPOINT", flush=True)
        if time.monotonic() - asked > 3:
            asked = time.monotonic()
            state = client.read_flow_run(run.id).state
            if state is not None and state.is_final():
                break
        time.sleep(0.2)
    flow_run = client.read_flow_run(run.id)
    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    state = flow_run.state
    print("FINAL " + json.dumps({
        "state": state.name if state else None, "final": bool(state and state.is_final()),
        "completed": bool(state and state.is_completed()), "message": state.message if state else None,
        "run_count": flow_run.run_count, "task_runs": {t.name: t.run_count for t in tasks},
    }), flush=True)
"""

# Run in the namespace: creates the bucket argv[2] at endpoint argv[1].
MAKE_BUCKET = r"""
import sys, boto3
boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1").create_bucket(Bucket=sys.argv[2])
"""

# Run in the namespace: copies everything under s3://argv[2]/argv[3]/ at endpoint argv[1]
# into the folder argv[4], the checkpoints left out.
FETCH = r"""
import os, sys, boto3
endpoint, bucket, prefix, out = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
    for item in page.get("Contents", []):
        relative = item["Key"][len(prefix) + 1:]
        if "/checkpoints/" in relative:
            continue
        path = os.path.join(out, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s3.download_file(bucket, item["Key"], path)
"""


@contextlib.contextmanager
def moto_server(enter: list[str], home: Path):
    """A moto S3 server on 127.0.0.1, started with the command prefix `enter`; yields its URL
    and process."""
    port = free_port()
    log_path = home / "moto.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [*enter, sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not any(p == port for *_, p in listening([server.pid], enter)):
            assert server.poll() is None and time.monotonic() < deadline, (
                f"moto did not start:\n{log_path.read_text()[-3000:]}"
            )
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", server
    finally:
        stop(server)


def freeze_node(node: subprocess.Popen) -> list[psutil.Process]:
    """SIGSTOP a node's `ray start --block` process and everything under it (raylet, agents,
    log monitor, workers), found by pid: the machine stops, and training cannot go past the
    step it is in. Returns the processes."""
    root = psutil.Process(node.pid)
    tree = [root, *root.children(recursive=True)]
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.suspend()
    return tree


def kill_node(node: subprocess.Popen, tree: list[psutil.Process]) -> list[str]:
    """SIGKILL the frozen processes of a node (a lost machine); their names, once all are gone."""
    names = []
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            names.append(process.name())
            process.kill()
    node.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not all(gone(process) for process in tree):
        assert time.monotonic() < deadline, [p.pid for p in tree if not gone(p)]
        time.sleep(0.2)
    return names


class Lines:
    """The stdout lines of a process, read on a thread, so that every wait has a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, prefix: str, timeout: float, what: str, tail) -> str:
        """The rest of the next line that starts with `prefix`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"waited {timeout:.0f} s for {what}\n{tail()}") from None
            assert line is not None, f"the operator script ended before {what}\n{tail()}"
            if line.startswith(prefix + " ") or line.strip() == prefix:
                return line[len(prefix) :].strip()


def _manifest(root: Path, stage: str) -> dict:
    return json.loads((root / stage / "_manifest.json").read_text())


def _steps(root: Path) -> list[tuple]:
    """(step, tokens, data hash, loss) of every line of the pretrain stage's metrics.jsonl."""
    records = [
        json.loads(line) for line in (root / "pretrain" / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    return [(r["step"], r["tokens"], r["data_hash"], r["loss"]) for r in records]


@pytest.mark.slow
def test_a_deployed_run_outlives_a_lost_ray_node(tmp_path):
    started = last = time.monotonic()
    timings: dict[str, float] = {}

    def lap(what: str) -> None:
        nonlocal last
        timings[what], last = time.monotonic() - last, time.monotonic()

    home = tmp_path / "operator"
    home.mkdir()
    with contextlib.ExitStack() as stack:
        enter = stack.enter_context(loopback_only())
        # the uninterrupted run, alongside: the same recipe on a local root, by a driver with an
        # embedded Ray of its own (2 CPUs) in the namespace
        reference_root = tmp_path / "reference"
        (tmp_path / "reference.json").write_text(load_config(DEMO, recipe(str(reference_root))).model_dump_json())
        reference_log = home / "reference.log"
        with open(reference_log, "wb") as log:
            reference_driver = subprocess.Popen(
                [*enter, sys.executable, "-c", DRIVER, str(tmp_path / "reference.json"), ",".join(STAGES), "1"],
                env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        stack.callback(stop, reference_driver)
        cluster = stack.enter_context(two_nodes(enter))  # the worker node joins while the servers start
        endpoint, moto = stack.enter_context(moto_server(enter, home))
        api, server = stack.enter_context(running_prefect_server(home, enter))
        lap("servers and nodes started")

        # what the operator does: a worker, a bucket, `bertpipe deploy`, a triggered run
        ray_auth = {k: cluster.env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED")}
        workers = Workers(api, home / "workers", pool=POOL, enter=enter, env=ray_auth)
        stack.callback(workers.stop_all)
        worker = workers.start()  # it waits for the pool's runs while the recipe is deployed
        made = subprocess.run(
            [*enter, sys.executable, "-c", MAKE_BUCKET, endpoint, BUCKET], capture_output=True, text=True, timeout=60
        )
        assert made.returncode == 0, made.stderr[-2000:]
        sets = [
            arg
            for override in recipe(f"s3://{BUCKET}/{PREFIX}", cluster.address, endpoint)
            for arg in ("--set", override)
        ]
        deployed = subprocess.run(
            [
                *enter,
                BERTPIPE,
                "deploy",
                "--config",
                str(DEMO),
                *sets,
                "--pool",
                POOL,
                "--kind",
                "full",
                "--cron",
                "full=none",
                "--name",
                "operator",
            ],
            env=_prefect_env(home, PREFECT_API_URL=api),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-3000:]
        first_checkpoint = f"{PREFIX}/pretrain/{CHECKPOINTS}/{checkpoint_tag(CHECKPOINT_EVERY)}/{COMPLETE}"
        operate_log = home / "operate.log"
        with open(operate_log, "wb") as log:
            operate = subprocess.Popen(
                [
                    *enter,
                    sys.executable,
                    "-c",
                    OPERATE,
                    "bert_pretraining/operator-full",
                    ",".join(STAGES),
                    endpoint,
                    BUCKET,
                    first_checkpoint,
                    "900",
                ],
                env=_prefect_env(home, PREFECT_API_URL=api),
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        stack.callback(stop, operate)
        lines = Lines(operate)

        def tail() -> str:
            return f"{workers.tail()}\n--- {operate_log}\n{operate_log.read_text(errors='replace')[-2500:]}"

        run = json.loads(lines.next("RUN", 300, "the run to be triggered", tail))

        # pretraining's first checkpoint is complete: the worker node is lost, and comes back
        lines.next("CHECKPOINT", 600, f"checkpoint {checkpoint_tag(CHECKPOINT_EVERY)} of pretrain", tail)
        lap("deployed, triggered, first checkpoint")
        frozen = freeze_node(cluster.procs[1])
        # every socket of what the test started, the flow run and the training workers on both nodes included
        sockets = listening(
            [server.pid, moto.pid, worker.pid, reference_driver.pid, *(node.pid for node in cluster.procs)], enter
        )
        lost = kill_node(cluster.procs[1], frozen)
        cluster.join_node()
        final = json.loads(lines.next("FINAL", 900, "the run to end", tail))
        lap("node lost -> run ended")
        # the run completed by itself: its first attempt, no stage retried
        assert final["completed"], f"{final}\n{tail()}"
        assert final["run_count"] == 1 and all(count == 1 for count in final["task_runs"].values()), final
        assert sorted(final["task_runs"]) == sorted(STAGES), final
        sockets += listening([server.pid, moto.pid, worker.pid, cluster.procs[0].pid, cluster.procs[-1].pid], enter)

        copy = tmp_path / "copy"
        fetched = subprocess.run(
            [*enter, sys.executable, "-c", FETCH, endpoint, BUCKET, PREFIX, str(copy)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert fetched.returncode == 0, fetched.stderr[-2000:]

        try:
            reference_driver.wait(timeout=600)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the uninterrupted run did not end:\n{reference_log.read_text(errors='replace')[-3000:]}"
            ) from None
        results = [
            line for line in reference_log.read_text(errors="replace").splitlines() if line.startswith("RESULT ")
        ]
        assert reference_driver.returncode == 0 and results, reference_log.read_text(errors="replace")[-4000:]
        reference = json.loads(results[-1].removeprefix("RESULT "))["stages"]
        lap("then the uninterrupted run")
    timings["total"] = time.monotonic() - started
    print("timings:", json.dumps({k: round(v, 1) for k, v in timings.items()}), file=sys.stderr)

    assert "raylet" in lost and any(name.startswith("ray::") for name in lost), (
        lost
    )  # a node with training workers was lost

    # pretrain restarted its workers from a checkpoint, on two workers again, and says so
    stats = _manifest(copy, "pretrain")["stats"]
    assert len(stats["restarts"]) == 1, f"restarts: {stats['restarts']} (none: the run outran the node's loss)"
    (restart,) = stats["restarts"]
    assert (
        restart["workers"] == 2 and CHECKPOINT_EVERY <= restart["step"] < STEPS and "worker rank" in restart["lost"]
    ), restart
    assert stats["steps"] == STEPS and stats["world_size"] == 2 and stats["resizes"] == [], stats
    (log,) = (copy / "_logs").glob(f"flow-run-*-{run['name']}.log")
    text = log.read_text()
    assert f"restarting the workers from checkpoint {checkpoint_tag(restart['step'])} (restart 1 of 3)" in text, text[
        -3000:
    ]

    # ... and its outputs are those of the uninterrupted run: every stage's shards, the
    # pretrained model's bytes, every step's loss (the logs themselves carry timings)
    for stage in STAGES:
        manifest, want = _manifest(copy, stage), reference[stage]
        assert manifest["fingerprint"] == want["fingerprint"] and want["computed"], stage
        shards = {s["path"]: s["sha256"] for s in manifest["shards"]}
        if stage == "pretrain":
            shards = {path: digest for path, digest in shards.items() if not path.endswith(".jsonl")}
            want = {"shards": {path: digest for path, digest in want["shards"].items() if not path.endswith(".jsonl")}}
            assert any(path.endswith("model.safetensors") for path in shards), shards
        assert shards == want["shards"], stage
    assert _steps(copy) == _steps(reference_root)
    assert [step for step, *_ in _steps(copy)] == list(range(1, STEPS + 1))

    exposed = beyond_loopback(sockets)
    assert not exposed, "listening beyond loopback: " + "; ".join(exposed)
    names = {name for _, name, *_ in sockets}
    assert {"gcs_server", "raylet"} <= names, names
