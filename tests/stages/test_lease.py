"""One writer per run root: a second run on the same root is refused at once with one line
naming the holder (local disk and a real S3 endpoint), a lease whose holder died is taken
over, and a holder that was taken over notices instead of writing on."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertcore.config import StorageConfig
from pipelines.lease import LEASE, LeaseHeld, LeaseLost, RootLease
from pipelines.storage import Storage

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    """(storage, run root) on local disk, or on the moto S3 server."""
    if request.param == "local":
        return Storage(StorageConfig()), str(tmp_path / "run")
    endpoint, bucket = request.getfixturevalue("s3_bucket")
    return Storage(StorageConfig(endpoint_url=endpoint)), f"s3://{bucket}/run"


def test_a_second_writer_is_refused_naming_the_holder(root):
    storage, uri = root
    with RootLease(storage, uri, "flow run first-run (abc)"):
        assert storage.exists(f"{uri}/{LEASE}")
        with pytest.raises(LeaseHeld) as refused:
            RootLease(storage, uri, "flow run second-run (def)").acquire()
        message = str(refused.value)
        assert f"run.root {uri} is in use by flow run first-run (abc) (host " in message and "\n" not in message
    assert not storage.exists(f"{uri}/{LEASE}")  # released
    with RootLease(storage, uri, "flow run third-run"):  # free again
        pass


def test_a_run_is_refused_before_it_starts_when_the_root_is_held_or_an_upstream_is_missing(root, tmp_path):
    """`Pipeline.preflight` (what `bertpipe run` calls before Prefect and Ray start) refuses
    a held root and a stage whose upstream is neither selected nor complete, and passes a
    selection that builds its own upstream; it takes no lease of its own."""
    from pipelines.registry import load_config
    from pipelines.runner import Pipeline
    from pipelines.stage import UpstreamMissing

    storage, uri = root
    cfg = load_config(ROOT / "configs" / "demo.yaml", [f"run.root={uri}"])
    pipeline = Pipeline(cfg, storage)
    with pytest.raises(
        UpstreamMissing,
        match=rf"^vocab: the corpus stage has no output under {uri}/corpus: run `bertpipe run --only corpus`",
    ):
        pipeline.preflight(["vocab", "examples"])
    pipeline.preflight(["corpus", "vocab", "examples"])
    assert not storage.exists(f"{uri}/{LEASE}")
    with (
        RootLease(storage, uri, "flow run nightly-refresh (1234)"),
        pytest.raises(LeaseHeld, match="is in use by flow run nightly-refresh"),
    ):
        pipeline.preflight(["corpus"])
    pipeline.preflight(["corpus"])


def test_a_stale_lease_is_taken_over_and_its_holder_notices(root, caplog):
    storage, uri = root
    first = RootLease(storage, uri, "the first run", ttl_s=0.6).acquire()
    first._stop.set()  # its heartbeat stops, as if the process hung or died
    first._thread.join()
    with pytest.raises(LeaseHeld):
        RootLease(storage, uri, "too early", ttl_s=0.6).acquire()
    time.sleep(1.0)  # past its expiry
    with caplog.at_level(logging.WARNING, logger="pipelines.lease"):
        second = RootLease(storage, uri, "the second run", ttl_s=30).acquire()
    assert any("took over the stale lease of the first run" in r.getMessage() for r in caplog.records)
    first.renew()
    assert first.lost
    with pytest.raises(LeaseLost, match="the second run .* took over this run's lease"):
        first.check()
    with pytest.raises(LeaseLost):  # and this process writes nothing more under the root
        storage.write_bytes(f"{uri}/corpus/part-00000.arrow", b"late")
    assert not storage.exists(f"{uri}/corpus/part-00000.arrow")
    first.release()  # must not remove the new holder's lease
    assert json.loads(storage.read_text(f"{uri}/{LEASE}"))["holder"] == "the second run"
    second.release()


def test_the_heartbeat_keeps_a_long_run_its_lease(root):
    storage, uri = root
    with RootLease(storage, uri, "a long run", ttl_s=0.8) as lease:
        time.sleep(2.0)  # more than twice the ttl
        with pytest.raises(LeaseHeld):
            RootLease(storage, uri, "an intruder", ttl_s=0.8).acquire()
        lease.check()


def test_an_unreadable_lease_file_does_not_lock_the_root_forever(tmp_path):
    storage, uri = Storage(StorageConfig()), str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LEASE).write_text("{truncated", encoding="utf-8")
    with RootLease(storage, uri, "next run"):
        pass


@pytest.mark.parametrize(
    "content, damage",
    [
        (
            (
                '{"holder": "x", "host": "h", "pid": 1, "token": "t", "acquired_at": 0, "heartbeat_at": 0, '
                '"expires_at": "later"}'
            ),
            "expires_at is 'later', not a number",
        ),
        (
            (
                '{"holder": "x", "host": "h", "pid": "1", "token": "t", "acquired_at": 0, "heartbeat_at": 0, '
                '"expires_at": 9e99}'
            ),
            "pid is '1', not a number",
        ),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"holder": "x"}', "host is None, not a string"),
    ],
)
def test_a_lease_file_with_wrong_types_is_a_damaged_lease_taken_over_with_one_line(tmp_path, caplog, content, damage):
    """The probe's `"expires_at": "later"` made every writer fail with a TypeError."""
    storage, uri = Storage(StorageConfig()), str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LEASE).write_text(content, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="pipelines.lease"), RootLease(storage, uri, "next run") as lease:
        assert json.loads(storage.read_text(f"{uri}/{LEASE}"))["token"] == lease.record.token
    warnings = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert (
        len(warnings) == 1 and damage in warnings[0] and f"{uri}/{LEASE}" in warnings[0] and "\n" not in warnings[0]
    ), warnings


CLI_RUN = [sys.executable, "-m", "flows.cli", "run", "--only", "corpus"]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
def test_bertpipe_run_on_a_held_root_exits_at_once_with_one_line(where, tmp_path, gensim_data, request):
    """A real second `bertpipe run` (its own process) while a writer holds the root: exit 2
    at once (before Prefect and Ray start), one line naming the holder, nothing written."""
    import os

    env = dict(os.environ)
    if where == "local":
        storage, uri = Storage(StorageConfig()), str(tmp_path / "run")
    else:
        endpoint, bucket = request.getfixturevalue("s3_bucket")
        storage, uri = Storage(StorageConfig(endpoint_url=endpoint)), f"s3://{bucket}/run"
        env["AWS_ENDPOINT_URL"] = endpoint
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        (
            f"run: {{root: '{uri}'}}\nray: {{num_cpus: 1}}\ncorpus: {{inputs: [{{uri: "
            f"'{gensim_data}/lee_background.cor', format: lines}}]}}\n"
        ),
        encoding="utf-8",
    )
    with RootLease(storage, uri, "flow run nightly-refresh (1234)"):
        done = subprocess.run(
            [*CLI_RUN, "-c", str(recipe)], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
        )
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        errors = [line for line in done.stderr.splitlines() if line.startswith("bertpipe: error:")]
        assert len(errors) == 1 and "is in use by flow run nightly-refresh (1234)" in errors[0], done.stderr[-2000:]
        assert not storage.exists(f"{uri}/corpus")
    if where == "local":
        return  # what follows is the same on either store; the object store's lease is the one worth the run
    # the same command once the root is free
    done = subprocess.run([*CLI_RUN, "-c", str(recipe)], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert storage.exists(f"{uri}/corpus/_manifest.json") and not storage.exists(f"{uri}/{LEASE}")


def test_a_dead_holder_on_this_host_is_taken_over_at_once(root, caplog):
    """A SIGKILLed run leaves a lease that has not expired; its pid is gone, so the rerun
    takes the root at once instead of waiting for the ttl."""
    storage, uri = root
    holder = subprocess.Popen([sys.executable, "-c", "pass"])
    holder.wait()
    now = time.time()
    record = {
        "holder": "flow run killed-run (1)",
        "host": __import__("socket").gethostname(),
        "pid": holder.pid,
        "token": "dead",
        "acquired_at": now - 5,
        "heartbeat_at": now - 1,
        "expires_at": now + 119,
    }
    storage.write_bytes(f"{uri}/{LEASE}", json.dumps(record).encode())
    with caplog.at_level(logging.WARNING, logger="pipelines.lease"), RootLease(storage, uri, "the rerun") as lease:
        assert json.loads(storage.read_text(f"{uri}/{LEASE}"))["token"] == lease.record.token
    assert any("killed-run" in r.getMessage() and "its process is gone" in r.getMessage() for r in caplog.records)


def test_a_live_holder_is_refused_with_the_time_left(root):
    storage, uri = root
    with RootLease(storage, uri, "flow run busy (2)"), pytest.raises(LeaseHeld, match=r"its lease expires in \d+ s"):
        RootLease(storage, uri, "a second run").acquire()


def test_a_lease_file_gone_with_no_other_writer_is_taken_again(root, caplog):
    """A store that lost the lease file (an outage, a restore) while no one else took the
    root: the holder takes it again and goes on, instead of calling itself taken over."""
    storage, uri = root
    with RootLease(storage, uri, "a long run", ttl_s=60) as lease:
        storage.remove(f"{uri}/{LEASE}")
        with caplog.at_level(logging.WARNING, logger="pipelines.lease"):
            lease.renew()
        assert not lease.lost
        lease.check()
        assert json.loads(storage.read_text(f"{uri}/{LEASE}"))["token"] == lease.record.token
        storage.write_bytes(f"{uri}/corpus/part-00000.arrow", b"goes on")
    assert any("took it again" in r.getMessage() for r in caplog.records)
