"""Helpers for the tests of `bertpipe serve` (test_serve*.py): a served tiny run, the
command as a user runs it (a subprocess, stopped by pid), and plain HTTP calls."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from processes import free_port, listening_sockets, stop
from tiny_run import news_sentences, write_run_root

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("first-key-0123456789", "second-key-9876543210")
"""The API keys the test servers accept (BERTPIPE_API_KEY, comma-separated)."""


def served_run(
    tmp_path_factory, gensim_data, recipe: dict, *, task: str | None, export: bool = True
) -> tuple[str, str, dict]:
    """(run root, recipe file, {task or None: the ONNX export's manifest}) of a tiny run:
    the pretrain stage's model and, with `task`, a task model, both exported to ONNX fp32
    (export=False: not exported, for `--format torch`; no manifests)."""
    from bertcore.config import StorageConfig
    from pipelines.export.onnx import export_onnx
    from pipelines.registry import parse_config
    from pipelines.storage import Storage

    root = str(tmp_path_factory.mktemp("serve-run"))
    write_run_root(root, news_sentences(gensim_data), task=task, embedding_scores=recipe.pop("embedding_scores", None))
    data = {"run": {"root": root, "seed": 7}, "corpus": {"inputs": ["unused.txt"]}, **recipe}
    cfg = parse_config(data)
    exports = {
        t: export_onnx(cfg, Storage(StorageConfig()), task=t, sentences=16)[1]
        for t in ({None, task} if task else {None})
        if export
    }
    path = tmp_path_factory.mktemp("recipe") / "serve.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return root, str(path), exports


@contextlib.contextmanager
def serving(recipe: str, *args: str, keys: tuple[str, ...] = KEYS, timeout: float = 300):
    """`bertpipe serve -c recipe ARGS --port P` until the block ends: yields (url, process,
    the listening sockets its process tree opened, its output lines, so far)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", BERTPIPE_API_KEY=",".join(keys))
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "flows.cli", "serve", "-c", recipe, *args, "--port", str(port)]
    lines: list[str] = []
    roots: list[int] = []
    with listening_sockets(roots=roots) as seen:  # the server's process tree only, not a Ray of the test session
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        roots.append(proc.pid)
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + timeout
            while not any(line.startswith("bertpipe serve:") for line in lines):
                assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-5000:]
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}", proc, seen, lines
        finally:
            stop(proc)
            reader.join(timeout=10)


def call(
    url: str, body: bytes | None = None, *, method: str | None = None, key: str | None = KEYS[0], timeout: float = 60
) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request (POST when there is a body)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(
        url, data=body, method=method or ("POST" if body is not None else "GET"), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def post(url: str, data, **options) -> tuple[int, object]:
    status, _, body = call(url, json.dumps(data).encode(), **options)
    return status, json.loads(body)


def get(url: str, **options) -> tuple[int, object]:
    status, _, body = call(url, **options)
    return status, json.loads(body)
