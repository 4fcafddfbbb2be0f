"""No password inside a URI reaches disk (issue 18, case 2): planted each way a user can pass
one (`--set storage.endpoint_url`, a URI in the recipe file, a `--set corpus.inputs` URI, the
AWS_ENDPOINT_URL environment variable), it is found in no file under the run root and in
no file of Prefect's home (its database and WAL included), while the run itself uses the
real value: the recipe's input is read from an HTTP server that demands that password."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from processes import migrated_prefect_home

ROOT = Path(__file__).resolve().parents[2]


def serve_with_password(folder: Path, user: str, password: str) -> ThreadingHTTPServer:
    """Files of `folder` over HTTP on 127.0.0.1, to a client that sends this Basic password."""
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _answer(self) -> bytes | None:
            path = folder / self.path.lstrip("/")
            if self.headers.get("Authorization") != expected or not path.is_file():
                self.send_response(401 if self.headers.get("Authorization") != expected else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            data = path.read_bytes()
            wanted = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if wanted:
                start = int(wanted.group(1))
                data = data[start : int(wanted.group(2) or len(data) - 1) + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{start + len(data) - 1}/{path.stat().st_size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            return data

        def do_HEAD(self) -> None:
            self._answer()

        def do_GET(self) -> None:
            if data := self._answer():
                self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def files_holding(folder: Path, secret: bytes) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and secret in p.read_bytes())


@pytest.mark.slow
def test_a_password_inside_a_uri_reaches_no_file_of_the_run_or_of_prefect(tmp_path, gensim_data):
    secrets = {
        "set": "PW-FROM-SET-7f3a",  # --set storage.endpoint_url (the probe's case)
        "recipe": "PW-FROM-RECIPE-91c2",  # a URI in the recipe file, used for real
        "input": "PW-FROM-INPUT-44d0",  # --set corpus.inputs: a URI that fails, skipped
        "env": "PW-FROM-ENV-b8e5",  # AWS_ENDPOINT_URL
    }
    www = tmp_path / "www"
    www.mkdir()
    shutil.copy(gensim_data / "lee_background.cor", www / "news.txt")
    server = serve_with_password(www, "bob", secrets["recipe"])
    port = server.server_address[1]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        json.dumps(
            {
                "ray": {"num_cpus": 2},
                "corpus": {
                    "inputs": [
                        {
                            "uri": f"http://bob:{secrets['recipe']}@127.0.0.1:{port}/news.txt",
                            "format": "lines",
                            "name": "news",
                        }
                    ],
                    "on_error": "skip",
                    "shard_chars": 100_000,
                },
            }
        )
    )
    prefect_home = tmp_path / "prefect"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "AWS_ENDPOINT"))}
    env.update(
        PREFECT_HOME=str(migrated_prefect_home(prefect_home)),
        BERTPIPE_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=str(ROOT),
    )
    inputs = json.dumps(
        [
            {"uri": f"http://bob:{secrets['recipe']}@127.0.0.1:{port}/news.txt", "format": "lines", "name": "news"},
            f"http://carol:{secrets['input']}@127.0.0.1:{port}/missing.jsonl",
        ]
    )
    runs = [
        (
            tmp_path / "run-a",
            [
                "--set",
                f"storage.endpoint_url=http://alice:{secrets['set']}@127.0.0.1:9",
                "--set",
                f"corpus.inputs={inputs}",
            ],
            env,
        ),
        (tmp_path / "run-b", [], {**env, "AWS_ENDPOINT_URL": f"http://dave:{secrets['env']}@127.0.0.1:9"}),
    ]
    try:
        for root, args, run_env in runs:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "flows.cli",
                    "run",
                    "-c",
                    str(recipe),
                    "--only",
                    "corpus",
                    "--set",
                    f"run.root={root}",
                    *args,
                ],
                capture_output=True,
                text=True,
                timeout=900,
                cwd=ROOT,
                env=run_env,
            )
            assert out.returncode == 0, out.stderr[-3000:]
            manifest = json.loads((root / "corpus" / "_manifest.json").read_text())
            assert manifest["stats"]["documents_read"] > 100, "the input behind the password was read"
            for value in secrets.values():
                assert value not in out.stdout + out.stderr
    finally:
        server.shutdown()
    skipped = json.loads((tmp_path / "run-a" / "corpus" / "_manifest.json").read_text())["skipped"]
    assert [s["file"] for s in skipped] == [f"http://carol:****@127.0.0.1:{port}/missing.jsonl"]
    config = (tmp_path / "run-a" / "corpus" / "_config.yaml").read_text()
    assert "endpoint_url: http://alice:****@127.0.0.1:9" in config
    assert "endpoint_url: http://dave:****@127.0.0.1:9" in (tmp_path / "run-b" / "corpus" / "_config.yaml").read_text()
    database = [p.name for p in prefect_home.rglob("prefect.db*")]
    assert "prefect.db" in database, sorted(p.name for p in prefect_home.rglob("*"))
    for name, value in secrets.items():
        found = files_holding(tmp_path / "run-a", value.encode()) + files_holding(tmp_path / "run-b", value.encode())
        found += files_holding(prefect_home, value.encode())
        assert found == [], f"the {name} password is written in {found}"
