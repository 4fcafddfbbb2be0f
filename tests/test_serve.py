"""`bertpipe serve` as a user runs it: a subprocess with its own embedded Ray and Ray Serve,
serving a tiny run's ONNX exports (the model and its fine-tuned task model, fp32) at
127.0.0.1 on a free port. Every endpoint answers what the PyTorch model itself computes;
every bad input gets its 4xx with a one-line JSON reason and the same replica answers on;
nothing listens beyond loopback; SIGTERM stops it all.

The run root is written directly (tests/tiny_run.py) and exported in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from processes import LOOPBACK, free_port, listening_sockets, stop  # noqa: E402
from tiny_run import news_sentences, write_run_root  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASK = "sentiment"
SCORES = {"cls": {"anisotropy": 0.5, "sts_spearman": 0.61}, "mean": {"anisotropy": 0.3, "sts_spearman": 0.42}}
"""The evaluation's embedding scores in the run: [CLS] scored better, so it is the default."""
RECIPE = {
    "evaluate": {"embeddings": {"max_seq_length": 16, "long_inputs": "windows", "max_windows": 16}},
    "serve": {"max_texts": 4, "max_text_bytes": 200, "batch_wait_ms": 20.0, "max_batch_tokens": 256, "threads": 1},
    "ray": {"num_cpus": 2},
}
TEXTS = ["The council met on Tuesday.", "Fire crews worked through the night to save the houses " * 3, "Rain."]


@pytest.fixture(scope="module")
def served_run(tmp_path_factory, gensim_data):
    """A run root with the pretrain stage's model and an evaluate stage's task model, both
    exported to ONNX (fp32), and its recipe."""
    from bertcore.config import StorageConfig
    from pipelines.export.onnx import export_onnx
    from pipelines.registry import parse_config
    from pipelines.storage import Storage

    root = str(tmp_path_factory.mktemp("serve-run"))
    write_run_root(root, news_sentences(gensim_data), task=TASK, embedding_scores=SCORES)
    data = {"run": {"root": root, "seed": 7}, "corpus": {"inputs": ["unused.txt"]}, **RECIPE}
    cfg = parse_config(data)
    exports = {task: export_onnx(cfg, Storage(StorageConfig()), task=task, sentences=16)[1] for task in (None, TASK)}
    recipe = tmp_path_factory.mktemp("recipe") / "serve.yaml"
    recipe.write_text(yaml.safe_dump(data), encoding="utf-8")
    return root, str(recipe), exports


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--stage", "distill"], "reads the distill stage's model, and there is none under"),
        (["--quantize", "int8"], "has no model.int8.onnx: run `bertpipe export --format onnx --quantize int8 --stage pretrain`"),
        (["--format", "torch", "--quantize", "int8"], "--quantize int8 needs --format onnx"),
        (["--stage", "evaluate"], "--stage evaluate serves a fine-tuned task model: name it with --task NAME"),
        (["--task", "ner"], "--task ner: the evaluate stage under"),
        (["--replicas", "3"], "need 3 CPUs"),
        (["--port", "{taken}"], "cannot listen there"),
    ],
)
def test_serve_refuses_in_one_line_before_it_serves(served_run, args, expected):
    """Each refusal is one `bertpipe: error:` line, before any replica starts (the CPU check
    after the embedded Ray is up; the others before it)."""
    import socket

    from typer.testing import CliRunner

    from flows.cli import app

    _, recipe, _ = served_run
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        argv = [a.format(taken=taken.getsockname()[1]) for a in args]
        extra = ["--set", "serve.threads=1"] if "--replicas" in args else []
        result = CliRunner().invoke(app, ["serve", "-c", recipe, *argv, *extra])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("bertpipe: error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def _request(url: str, body: bytes | None = None, method: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method or ("POST" if body is not None else "GET"), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, data) -> tuple[int, dict]:
    status, body = _request(url, json.dumps(data).encode())
    return status, json.loads(body)


@pytest.fixture(scope="module")
def server(served_run):
    """`bertpipe serve` on the run (ONNX fp32, with the task model), the sockets its process
    tree listened on while it ran, and its output; stopped by pid."""
    root, recipe, _ = served_run
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "flows.cli", "serve", "-c", recipe, "--format", "onnx", "--task", TASK, "--port", str(port)]
    lines: list[str] = []
    with listening_sockets() as seen:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 300
            while not any(line.startswith("bertpipe serve:") for line in lines):
                assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-5000:]
                time.sleep(0.5)
            yield f"http://127.0.0.1:{port}", proc, seen, lines
        finally:
            stop(proc)
    reader.join(timeout=10)


def test_the_start_line_names_the_model_the_run_and_the_loopback_address(server, served_run):
    url, _, _, lines = server
    line = next(line for line in lines if line.startswith("bertpipe serve:"))
    assert f"of run {served_run[0]} at {url};" in line and "pretrained (pretrain stage, onnx)" in line, line
    assert "reachable from other machines" not in line


def test_health_and_info_name_the_model_its_run_and_fingerprints(server, served_run):
    url, *_ = server
    _, _, exports = served_run
    status, body = _request(url + "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    status, body = _request(url + "/info")
    info = json.loads(body)
    assert status == 200 and info["run"] == served_run[0] and info["stage"] == "pretrain" and info["format"] == "onnx"
    assert info["fingerprint"] == exports[None].fingerprint and info["model"].endswith("onnx/pretrain/model.onnx")
    assert info["task"]["name"] == TASK and info["task"]["fingerprint"] == exports[TASK].fingerprint and info["task"]["labels"] == ["neg", "pos"]
    assert info["max_tokens"] == {"embed": 16, "classify": 48, "fill_mask": 64}
    assert info["pooling"]["default"] == "cls" and "STS Spearman" in info["pooling"]["why"]
    assert info["long_inputs"]["embed"].startswith("windows")
    assert set(info["endpoints"]) == {"POST /embed", "POST /classify", "POST /fill-mask", "GET /health", "GET /metrics", "GET /info"}


def test_embed_classify_and_fill_mask_answer_what_the_pytorch_model_computes(server, served_run):
    from transformers import BertForMaskedLM

    from bertcore.eval.embeddings import embed
    from bertcore.eval.encoder import load_encoder, load_tokenizer
    from bertcore.eval.heads import load_task_model
    from bertcore.eval.windows import Windowing

    url, *_ = server
    root = served_run[0]
    model_dir = os.path.join(root, "pretrain", "model")
    encoder, tokenizer = load_encoder(model_dir), load_tokenizer(model_dir)
    for pooling in ("cls", "mean"):
        status, answer = _post(url + "/embed", {"inputs": TEXTS, **({"pooling": pooling} if pooling == "mean" else {})})
        assert status == 200 and answer["pooling"] == pooling and answer["truncated"] == [False, False, False], answer
        want = embed(encoder, tokenizer, TEXTS, pooling=pooling, max_seq_length=16, windowing=Windowing(16, None, "mean", 16))
        got = np.array(answer["embeddings"])
        cosine = (got * want).sum(1) / np.linalg.norm(want, axis=1)  # served vectors are unit length
        assert cosine.min() >= 0.999, cosine
        assert np.linalg.norm(got, axis=1) == pytest.approx(1.0, abs=1e-5)

    status, answer = _post(url + "/classify", {"inputs": TEXTS[:2]})
    assert status == 200, answer
    task, _ = load_task_model(os.path.join(root, "eval", "heads", "pretrained", f"{TASK}.safetensors"), model_dir)
    batch = tokenizer(TEXTS[:2], truncation=True, max_length=48, padding=True, return_tensors="pt", return_token_type_ids=True)
    with torch.no_grad():
        want = torch.softmax(task(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]), -1).numpy()
    for predicted, probabilities in zip(answer["predictions"], want):
        assert [p["label"] for p in predicted] == [["neg", "pos"][i] for i in np.argsort(-probabilities)]
        assert {p["label"]: p["score"] for p in predicted} == pytest.approx(dict(zip(["neg", "pos"], probabilities.tolist())), abs=1e-4)

    text = "The [MASK] met on Tuesday."
    status, answer = _post(url + "/fill-mask", {"inputs": [text], "top_k": 3})
    assert status == 200, answer
    mlm = BertForMaskedLM.from_pretrained(model_dir).eval()
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probabilities = torch.softmax(mlm(input_ids=ids).logits[0, (ids[0] == tokenizer.mask_token_id).nonzero()[0, 0]], -1)
    top = answer["predictions"][0][0]
    assert [t["token"] for t in top] == probabilities.topk(3).indices.tolist()
    assert [t["score"] for t in top] == pytest.approx(probabilities.topk(3).values.tolist(), abs=1e-4)


BAD = [
    ("/embed", b'{"inputs": [""]}', 422, "inputs[0] is empty"),
    ("/embed", '{"inputs": ["caf\u00e9"]}'.encode("latin-1"), 400, "not UTF-8"),
    ("/embed", json.dumps({"inputs": ["word " * 60]}).encode(), 413, "over the limit of 200 (serve.max_text_bytes)"),
    ("/embed", json.dumps({"inputs": ["a", "b", "c", "d", "e"]}).encode(), 413, "over the limit of 4 (serve.max_texts)"),
    ("/embed", b'{"inputs": 42}', 422, "inputs must be a string or a list of strings"),
    ("/embed", b'{"inputs": ["unclosed"', 400, "not valid JSON"),
    ("/classify", b'{"inputs": ["a"], "task": "ner"}', 404, "no task 'ner'"),
    ("/fill-mask", b'{"inputs": ["no mask"]}', 422, "holds no [MASK]"),
    ("/nowhere", b"{}", 404, "no endpoint /nowhere"),
    ("/health", b"{}", 405, "/health takes GET, not POST"),
]


def test_each_bad_input_gets_its_4xx_and_the_same_replica_answers_on(server):
    url, proc, *_ = server
    pid = json.loads(_request(url + "/info")[1])["replica"]["pid"]
    for path, body, status, reason in BAD:
        got, answer = _request(url + path, body)
        error = json.loads(answer)["error"]
        assert got == status and reason in error and "\n" not in error, (path, got, error)
        assert _request(url + "/health")[0] == 200
    status, answer = _post(url + "/embed", {"inputs": "still here"})
    assert status == 200 and len(answer["embeddings"]) == 1
    assert json.loads(_request(url + "/info")[1])["replica"]["pid"] == pid  # no replica died on the way
    assert proc.poll() is None


def _samples(page: str) -> dict[tuple, float]:
    """{(sample name, labels but the replica): value summed over replicas}, read by
    Prometheus's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            key = (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "replica")))
            out[key] = out.get(key, 0.0) + sample.value
    return out


def test_concurrent_requests_are_batched_and_counted_in_the_metrics(server):
    url, *_ = server
    ok, batches, batched = ("bertpipe_requests_total", (("code", "200"), ("endpoint", "/embed"))), ("bertpipe_batch_requests_count", ()), ("bertpipe_batch_requests_sum", ())
    start = _samples(_request(url + "/metrics")[1].decode())
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: _post(url + "/embed", {"inputs": [f"{TEXTS[i % 3]} {i}"]}), range(32)))
    assert all(status == 200 for status, _ in answers)
    status, page = _request(url + "/metrics")
    assert status == 200 and "# TYPE bertpipe_request_seconds histogram" in page.decode()
    end = _samples(page.decode())
    assert end[ok] - start.get(ok, 0.0) == 32 and end[batched] - start[batched] == 32
    assert end[batches] - start[batches] < 32  # some requests shared a batch


def test_nothing_listens_beyond_loopback_and_sigterm_stops_it(server):
    url, proc, seen, lines = server
    assert _request(url + "/health")[0] == 200
    assert seen, "no listening socket seen"
    exposed = {name: sorted(addresses - LOOPBACK) for name, addresses in seen.items() if addresses - LOOPBACK}
    assert not exposed, exposed
    stop(proc)
    assert proc.returncode == 0, "".join(lines)[-3000:]
    assert not any("Traceback" in line for line in lines), "".join(lines)[-3000:]
