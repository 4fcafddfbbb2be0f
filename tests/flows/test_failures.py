"""Failures that are not the user's end a run with one line naming the stage, the place and
the cause, and are not retried when trying again cannot help: a full disk, a read-only
file system, a bucket that does not exist. Lost Ray workers and network errors are retried."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import uuid

import pytest
import ray.exceptions

from flows.failures import describe, is_transient
from pipelines.registry import parse_config


def _tmpfs(path, size: str, read_only: bool = False) -> bool:
    """Mount a small tmpfs at `path` (root in a container can); False where it cannot."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0
    )


def _unmount(path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


async def _task_runs(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _run_corpus(cfg):
    """The flow on the corpus stage; returns (message, the stage's task run count)."""
    from flows.pipeline import bert_pretraining

    state = bert_pretraining(cfg, only=["corpus"], return_state=True)
    assert state.is_failed()
    runs = asyncio.run(_task_runs(state.state_details.flow_run_id))
    return state.message, [r.run_count for r in runs if r.name == "corpus"]


def _demo_inputs(gensim_data):
    return [{"uri": str(gensim_data / "lee_background.cor"), "format": "lines"}]


@pytest.mark.parametrize("read_only", [False, True], ids=["disk-full", "read-only"])
def test_a_full_or_read_only_disk_ends_the_run_with_one_line_and_no_retry(
    read_only, tmp_path, gensim_data, prefect_harness, ray_cluster, monkeypatch
):
    root = tmp_path / "small"
    mounted = _tmpfs(root, "300k", read_only)
    try:
        if not mounted:  # no privilege to mount here: the same error, raised where the stage writes its manifest
            from pipelines.stage_dir import StageDir

            code = errno.EROFS if read_only else errno.ENOSPC

            def fail(self, manifest, resolved):
                raise OSError(code, os.strerror(code), self.path("_config.yaml"))

            monkeypatch.setattr(StageDir, "write_manifest", fail)
            root.mkdir(exist_ok=True)
        cfg = parse_config({"run": {"root": str(root / "run")}, "corpus": {"inputs": _demo_inputs(gensim_data)}})
        if read_only and mounted:
            cfg = parse_config({"run": {"root": str(root)}, "corpus": {"inputs": _demo_inputs(gensim_data)}})
        message, runs = _run_corpus(cfg)
    finally:
        if mounted:
            _unmount(root)
    what = "read-only file system" if read_only else "disk full"
    assert "\n" not in message and message.startswith((f"corpus: {what}", f"run: {what}")), message
    assert str(root) in message and "run.root" in message, message
    assert runs in ([1], []), runs  # never retried ([] when the lease could not even be written)


def test_a_bucket_that_does_not_exist_ends_the_run_with_one_line(
    s3_server, tmp_path, gensim_data, prefect_harness, ray_cluster, monkeypatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    cfg = parse_config({"run": {"root": f"s3://{bucket}/run"}, "corpus": {"inputs": _demo_inputs(gensim_data)}})
    message, runs = _run_corpus(cfg)
    assert "\n" not in message and "bucket does not exist" in message and bucket in message, message
    assert runs in ([1], []), runs


def test_what_is_worth_retrying():
    node_lost = ray.exceptions.NodeDiedError("node 1 died")
    assert is_transient(node_lost) and is_transient(ConnectionResetError(errno.ECONNRESET, "reset by peer"))
    try:
        from botocore.exceptions import EndpointConnectionError

        assert is_transient(EndpointConnectionError(endpoint_url="http://s3"))
    except ImportError:  # botocore comes with s3fs; keep the check honest if it ever does not
        pytest.fail("botocore is a dependency of s3fs")
    wrapped = ray.exceptions.RayTaskError(
        "clean_unit", "traceback", OSError(errno.ENOSPC, "No space left on device", "/data/run/corpus/x")
    )
    assert not is_transient(wrapped) and not is_transient(PermissionError(errno.EACCES, "denied", "/x"))
    assert describe("corpus", wrapped, "/data/run") == (
        "corpus: disk full at /data/run/corpus/x ([Errno 28] No space left on device: '/data/run/corpus/x'); "
        "free space for run.root /data/run (or point run.root elsewhere) and run again"
    )


def test_a_training_failure_is_one_line_per_rank_and_a_long_message_is_cut_at_a_word():
    """Ray Train's WorkerGroupError text is a page of tracebacks; the last line was cut off
    mid-word at 300 characters (`node_ip='127.0.0.`)."""
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    inner = RuntimeError("Read error [127.0.0.1]:28586: Connection reset by peer.\nmore lines\n" + "x " * 400)
    failed = WorkerGroupError(
        "A page of text\n" * 50,
        {0: UserExceptionWithTraceback(inner, "Traceback ...\n" * 40), 1: ValueError("bad shape")},
    )
    line = describe("pretrain", failed, "/data/run")
    assert "\n" not in line and len(line) < 500
    assert line == (
        "pretrain: the training workers failed (rank 0: RuntimeError: Read error [127.0.0.1]:28586: Connection reset "
        "by peer.; rank 1: ValueError: bad shape)"
    )
    long = describe("corpus", RuntimeError("word " * 100 + "node_ip='127.0.0.1'"), "/data/run")
    assert long.endswith("…") and len(long) <= 330 and "node_ip='127.0.0." not in long


def test_the_traceback_goes_under_the_run_root_and_elsewhere_when_the_root_cannot_take_it(tmp_path):
    from bertcore.config import StorageConfig
    from flows.failures import write_traceback
    from pipelines.storage import Storage

    try:
        raise ValueError("the cause")
    except ValueError as exc:
        error = exc
    where = write_traceback("pretrain", error, str(tmp_path / "run"), Storage(StorageConfig()))
    assert (
        where.startswith(str(tmp_path / "run" / "pretrain" / "_logs") + "/")
        and "ValueError: the cause" in open(where).read()
    )
    where = write_traceback("run", error, str(tmp_path / "run"), Storage(StorageConfig()))
    assert os.path.dirname(where) == str(tmp_path / "run" / "_logs")
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("x")
    fallback = write_traceback("corpus", error, str(blocked), Storage(StorageConfig()))
    try:
        assert not fallback.startswith(str(blocked)) and "ValueError: the cause" in open(fallback).read()
    finally:
        os.unlink(fallback)


def test_no_object_store_credentials_is_one_line_naming_what_to_give(s3_server, monkeypatch, tmp_path, request):
    """An s3:// URI read with no credentials anywhere (botocore's NoCredentialsError, from a
    real s3fs call against the moto endpoint): one line, no retry, saying what to set."""
    from bertcore.config import StorageConfig
    from pipelines.storage import Storage

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()  # fsspec would hand back a filesystem that found credentials before
    request.addfinalizer(S3FileSystem.clear_instance_cache)  # and later tests one that found none
    storage = Storage(StorageConfig(endpoint_url=s3_server))
    with pytest.raises(Exception) as caught:
        storage.exists("s3://teachers/minilm/config.json")
    assert not is_transient(caught.value)
    line = describe("distill", caught.value, "s3://runs/a")
    assert "\n" not in line
    assert line.startswith("distill: no object-store credentials (Unable to locate credentials)")
    assert "run.root s3://runs/a" in line and "distill.teacher" in line and "AWS_ACCESS_KEY_ID" in line
