"""`bertpipe serve` in-process (its default) as a user runs it: a subprocess serving a tiny
run's ONNX exports (the model and its fine-tuned task model, fp32) at 127.0.0.1 on a free
port, with two API keys. One server for the module: the clients people already have
(the `openai` package, huggingface_hub's InferenceClient) get what the PyTorch model
computes; keys, bad input, oversize bodies and a full queue get their status at once;
nothing listens beyond loopback; SIGTERM under load answers every request it accepted.

The run root is written directly (tests/support/tiny_run.py) and exported in this process."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from processes import LOOPBACK
from serving import KEYS, call, get, post, served_run, serving

TASK = "sentiment"
SCORES = {"cls": {"anisotropy": 0.5, "sts_spearman": 0.61}, "mean": {"anisotropy": 0.3, "sts_spearman": 0.42}}
"""The evaluation's embedding scores in the run: [CLS] scored better, so it is the default."""
RECIPE = {
    "evaluate": {"embeddings": {"max_seq_length": 16, "long_inputs": "windows", "max_windows": 16}},
    "serve": {
        "max_texts": 4,
        "max_text_bytes": 200,
        "batch_wait_ms": 20.0,
        "max_batch_tokens": 256,
        "threads": 1,
        "max_queued_texts": 16,
        "accept_token_ids": True,  # the ids the tests send are this model's own, from /tokenize
        "batching": "on",  # the tests of batches and the queue need batches from the first request
    },
    "ray": {"num_cpus": 2},
}
TEXTS = ["The council met on Tuesday.", "Fire crews worked through the night to save the houses " * 3, "Rain."]


@pytest.fixture(scope="module")
def run(tmp_path_factory, gensim_data):
    return served_run(tmp_path_factory, gensim_data, {**RECIPE, "embedding_scores": SCORES}, task=TASK)


@pytest.fixture(scope="module")
def server(run):
    """The in-process server (ONNX fp32, with the task model), the sockets its process tree
    listened on, its output; stopped by pid."""
    with serving(run[1], "--format", "onnx", "--task", TASK) as served:
        yield served


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--stage", "distill"],
            "bertpipe serve reads the model in the distill stage's output, and there is none under",
        ),
        (
            ["--quantize", "int8"],
            "has no model.int8.onnx: run `bertpipe export --format onnx --quantize int8 --stage pretrain`",
        ),
        (["--format", "torch", "--quantize", "int8"], "--quantize int8 needs --format onnx"),
        (["--stage", "evaluate"], "--stage evaluate serves a fine-tuned task model: name it with --task NAME"),
        (["--task", "ner"], "--task ner: the evaluate stage under"),
        (["--replicas", "3"], "need 3 CPUs"),
        (["--port", "{taken}"], "cannot listen there"),
        (["--api-key", "short"], "an API key of 5 characters is too easy to guess"),
    ],
)
def test_serve_refuses_in_one_line_before_it_serves(run, args, expected):
    """Each refusal is one `bertpipe: error:` line, before anything listens."""
    import socket

    from typer.testing import CliRunner

    from flows.cli import app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        argv = [a.format(taken=taken.getsockname()[1]) for a in args]
        extra = ["--set", "serve.threads=1"] if "--replicas" in args else []
        result = CliRunner().invoke(app, ["serve", "-c", run[1], *argv, *extra])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("bertpipe: error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_the_start_line_names_the_model_the_mode_and_warns_of_an_open_port_without_a_key(server, run):
    from pipelines.serve.launch import IN_PROCESS, start_line

    url, _, _, lines = server
    line = next(line for line in lines if line.startswith("bertpipe serve:"))
    assert f"of run {run[0]} at {url}; in-process, 1 thread(s); API key required; batching on; POST" in line
    assert "pretrained (pretrain stage, onnx)" in line and "reachable from other machines" not in line
    identity = {"model_name": "student", "stage": "distill", "format": "onnx", "quantize": "int8", "run": "r"}
    open_line = start_line(identity, "http://0.0.0.0:80", "0.0.0.0", IN_PROCESS, 1, 2, keyed=False)
    assert (
        "reachable from other machines" in open_line
        and "WARNING: no API key, so anyone who reaches it can use it" in open_line
    )
    assert "WARNING" not in start_line(identity, "http://0.0.0.0:80", "0.0.0.0", IN_PROCESS, 1, 2, keyed=True)


def test_every_route_but_health_needs_one_of_the_keys(server):
    url, *_ = server
    assert get(url + "/health", key=None) == (200, {"status": "ok"})
    for path in ("/info", "/metrics", "/embed"):
        status, headers, body = call(url + path, b'{"inputs": "a"}' if path == "/embed" else None, key=None)
        assert (
            status == 401
            and headers.get("www-authenticate") == "Bearer"
            and "needs an API key" in json.loads(body)["error"]
        )
    status, body = post(url + "/v1/embeddings", {"input": "a", "model": "m"}, key="not-" + KEYS[0])
    assert status == 401 and body["error"]["type"] == "authentication_error"  # OpenAI's error shape on its route
    for key in KEYS:
        assert post(url + "/embed", {"inputs": "a"}, key=key)[0] == 200


def test_info_has_teis_fields_and_bertpipes(server, run):
    url, *_ = server
    _, _, exports = run
    status, info = get(url + "/info")
    assert (
        status == 200
        and info["model_id"] == "pretrained"
        and info["max_input_length"] == 16
        and info["max_client_batch_size"] == 4
    )
    assert info["model_type"] == {
        "classifier": {"id2label": {"0": "neg", "1": "pos"}, "label2id": {"neg": 0, "pos": 1}}
    }
    assert (
        info["run"] == run[0]
        and info["stage"] == "pretrain"
        and info["format"] == "onnx"
        and info["mode"] == "in-process"
    )
    assert info["fingerprint"] == exports[None].fingerprint and info["model"].endswith("onnx/pretrain/model.onnx")
    assert (
        info["task"]["name"] == TASK
        and info["task"]["fingerprint"] == exports[TASK].fingerprint
        and info["pairs"] is False
    )
    assert info["max_tokens"] == {"embed": 16, "classify": 48, "fill_mask": 64}
    assert info["accept_token_ids"] is True and info["unreadable"] == "flag" and info["model_aliases"] == []
    assert info["batching"]["setting"] == "on" and info["batching"]["now"] == "batched"
    assert info["pooling"]["default"] == "cls" and "STS Spearman" in info["pooling"]["why"]
    assert set(info["endpoints"]) == {
        "POST /embed",
        "POST /",
        "POST /predict",
        "POST /tokenize",
        "POST /v1/embeddings",
        "GET /v1/models",
        "POST /fill-mask",
        "GET /health",
        "GET /metrics",
        "GET /info",
    }


def test_embed_predict_and_fill_mask_answer_what_the_pytorch_model_computes(server, run):
    from transformers import BertForMaskedLM

    from bertcore.eval.embeddings import embed
    from bertcore.eval.encoder import load_encoder, load_tokenizer
    from bertcore.eval.heads import load_task_model
    from bertcore.eval.windows import Windowing

    url, *_ = server
    model_dir = os.path.join(run[0], "pretrain", "model")
    encoder, tokenizer = load_encoder(model_dir), load_tokenizer(model_dir)
    for pooling in ("cls", "mean"):
        status, answer = post(
            url + "/embed?details=true", {"inputs": TEXTS, **({"pooling": pooling} if pooling == "mean" else {})}
        )
        assert status == 200 and answer["pooling"] == pooling and answer["truncated"] == [False, False, False], answer
        want = embed(
            encoder, tokenizer, TEXTS, pooling=pooling, max_seq_length=16, windowing=Windowing(16, None, "mean", 16)
        )
        got = np.array(answer["embeddings"])
        assert ((got * want).sum(1) / np.linalg.norm(want, axis=1)).min() >= 0.999  # served vectors are unit length
        assert np.linalg.norm(got, axis=1) == pytest.approx(1.0, abs=1e-5)
        status, bare = post(url + "/embed", {"inputs": TEXTS, **({"pooling": pooling} if pooling == "mean" else {})})
        assert status == 200 and bare == answer["embeddings"]  # TEI's shape: the vectors alone

    status, answer = post(url + "/predict", {"inputs": TEXTS[:2]})
    assert status == 200, answer
    task, _ = load_task_model(os.path.join(run[0], "eval", "heads", "pretrained", f"{TASK}.safetensors"), model_dir)
    batch = tokenizer(
        TEXTS[:2], truncation=True, max_length=48, padding=True, return_tensors="pt", return_token_type_ids=True
    )
    with torch.no_grad():
        want = torch.softmax(task(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]), -1).numpy()
    for predicted, probabilities in zip(answer, want):
        assert [p["label"] for p in predicted] == [["neg", "pos"][i] for i in np.argsort(-probabilities)]
        assert {p["label"]: p["score"] for p in predicted} == pytest.approx(
            dict(zip(["neg", "pos"], probabilities.tolist())), abs=1e-4
        )

    text = "The [MASK] met on Tuesday."
    status, top = post(url + "/fill-mask", {"inputs": text, "parameters": {"top_k": 3}})
    assert status == 200, top
    mlm = BertForMaskedLM.from_pretrained(model_dir).eval()
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probabilities = torch.softmax(
            mlm(input_ids=ids).logits[0, (ids[0] == tokenizer.mask_token_id).nonzero()[0, 0]], -1
        )
    assert [t["token"] for t in top] == probabilities.topk(3).indices.tolist()
    assert [t["score"] for t in top] == pytest.approx(probabilities.topk(3).values.tolist(), abs=1e-4)
    assert top[0]["sequence"] == text.replace("[MASK]", top[0]["token_str"])


def test_the_openai_client_gets_the_same_vectors_in_both_encodings(server):
    from openai import OpenAI

    url, *_ = server
    want = np.array(post(url + "/embed", {"inputs": TEXTS})[1])
    client = OpenAI(base_url=url + "/v1", api_key=KEYS[1], max_retries=0)
    for encoding in ("float", "base64"):
        answer = client.embeddings.create(input=TEXTS, model="pretrained", encoding_format=encoding)
        got = np.array(
            [
                d.embedding if encoding == "float" else np.frombuffer(base64.b64decode(d.embedding), "<f4")
                for d in answer.data
            ]
        )
        assert [d.index for d in answer.data] == [0, 1, 2] and answer.model == "pretrained"
        assert np.abs(got - want).max() < 1e-6, encoding
        assert answer.usage.prompt_tokens > len(TEXTS) * 2
    default = client.embeddings.create(input=TEXTS[0], model="pretrained")  # the package asks for base64 and decodes it
    assert np.abs(np.array(default.data[0].embedding) - want[0]).max() < 1e-6
    assert [m.id for m in client.models.list()] == ["pretrained"]
    from openai import UnprocessableEntityError

    with pytest.raises(UnprocessableEntityError, match="cannot be shortened"):
        client.embeddings.create(input="a", model="pretrained", dimensions=8)


def test_huggingface_hubs_inference_client_embeds_classifies_and_fills(server, monkeypatch):
    import huggingface_hub
    from huggingface_hub import InferenceClient

    # HF_HUB_OFFLINE=1 (no hub downloads in tests) blocks every URL the client calls; it calls 127.0.0.1 only here
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    url, *_ = server
    client = InferenceClient(base_url=url, api_key=KEYS[0])
    vectors = client.feature_extraction(TEXTS, normalize=True, truncate=True)  # POST /, TEI's shape
    assert np.abs(vectors - np.array(post(url + "/embed", {"inputs": TEXTS})[1])).max() < 1e-6
    assert client.feature_extraction(TEXTS[1], truncate=True, truncation_direction="left").shape == (1, 32)
    labels = client.text_classification(TEXTS[0])  # POST / with "parameters": the served task head
    want = post(url + "/predict", {"inputs": TEXTS[0]})[1]
    assert [p.label for p in labels] == [p["label"] for p in want] and [p.score for p in labels] == pytest.approx(
        [p["score"] for p in want]
    )
    filled = InferenceClient(base_url=url + "/fill-mask", api_key=KEYS[0]).fill_mask(
        "The [MASK] met on Tuesday.", top_k=2
    )
    assert len(filled) == 2 and filled[0].sequence == f"The {filled[0].token_str} met on Tuesday."


def test_tokenize_gives_the_models_own_tokens(server, run):
    from bertcore.eval.encoder import load_tokenizer

    url, *_ = server
    status, tokens = post(url + "/tokenize", {"inputs": [TEXTS[0]]})
    assert (
        status == 200
        and [t["id"] for t in tokens[0]]
        == load_tokenizer(os.path.join(run[0], "pretrain", "model"))(TEXTS[0])["input_ids"]
    )
    assert "".join(t["text"] for t in tokens[0] if not t["special"]).lower() == TEXTS[0].replace(" ", "").lower()
    want = np.array(post(url + "/embed", {"inputs": TEXTS[2]})[1][0])
    for special in (False, True):  # ids from /tokenize, with [CLS] and [SEP] or without: read as the text
        _, tokens = post(url + "/tokenize", {"inputs": TEXTS[2], "add_special_tokens": special})
        _, answer = post(url + "/v1/embeddings", {"input": [t["id"] for t in tokens[0]]})  # no model: the served one
        assert np.abs(np.array(answer["data"][0]["embedding"]) - want).max() < 1e-6, special
        assert answer["usage"]["prompt_tokens"] == len(tokens[0]) + (0 if special else 2)


BAD = [
    ("/embed", b'{"inputs": [""]}', 422, "inputs[0] is empty"),
    ("/embed", '{"inputs": ["caf\u00e9"]}'.encode("latin-1"), 400, "not UTF-8"),
    (
        "/embed",
        json.dumps({"inputs": ["!" * 190], "truncate": False}).encode(),
        413,
        "needs more than the 16 windows of 16 tokens",
    ),
    ("/embed", json.dumps({"inputs": ["word " * 60]}).encode(), 413, "over the limit of 200 (serve.max_text_bytes)"),
    (
        "/embed",
        json.dumps({"inputs": ["a", "b", "c", "d", "e"]}).encode(),
        413,
        "over the limit of 4 (serve.max_texts)",
    ),
    ("/embed", b'{"inputs": 42}', 422, "inputs must be a string or a list of strings"),
    ("/embed", b'{"inputs": ["unclosed"', 400, "not valid JSON"),
    ("/predict", b'{"inputs": [["a", "b"]]}', 422, "fine-tuned on single texts"),
    ("/fill-mask", b'{"inputs": ["no mask"]}', 422, "holds no [MASK]"),
    ("/classify", b'{"inputs": ["a"]}', 404, "no endpoint /classify: it is /predict now"),
    ("/nowhere", b"{}", 404, "no endpoint /nowhere"),
    ("/health", b"{}", 405, "/health takes GET, not POST"),
]


def test_each_bad_input_gets_its_4xx_and_the_server_answers_on(server):
    url, proc, *_ = server
    for path, body, status, reason in BAD:
        got, _, answer = call(url + path, body)
        error = json.loads(answer)["error"]
        assert got == status and reason in error and "\n" not in error, (path, got, error)
    status, answer = post(url + "/embed", {"inputs": "still here"})
    assert status == 200 and len(answer) == 1 and proc.poll() is None


def test_a_50_mb_body_gets_a_413_that_names_the_limit(server):
    url, proc, *_ = server
    started = time.monotonic()
    status, _, answer = call(url + "/embed", b'{"inputs": ["' + b"x" * (50 << 20) + b'"]}')
    limit = 4 * (200 + 16) + 4096
    assert (
        status == 413
        and f"over the limit of {limit} bytes (serve.max_texts x serve.max_text_bytes)" in json.loads(answer)["error"]
    )
    assert time.monotonic() - started < 30 and post(url + "/embed", {"inputs": "still here"})[0] == 200


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
    ok, batches, batched = (
        ("bertpipe_requests_total", (("code", "200"), ("endpoint", "/embed"))),
        ("bertpipe_batch_requests_count", ()),
        ("bertpipe_batch_requests_sum", ()),
    )
    start = _samples(call(url + "/metrics")[2].decode())
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: post(url + "/embed", {"inputs": [f"{TEXTS[i % 3]} {i}"]}), range(32)))
    assert all(status == 200 for status, _ in answers)
    status, _, page = call(url + "/metrics")
    assert status == 200 and "# TYPE bertpipe_request_seconds histogram" in page.decode()
    end = _samples(page.decode())
    assert end[ok] - start.get(ok, 0.0) == 32 and end[batched] - start[batched] == 32
    assert end[batches] - start[batches] < 32  # some requests shared a batch


def test_a_full_queue_answers_429_at_once_and_what_it_accepts_keeps_a_bounded_latency(server):
    """serve.max_queued_texts is 16: 48 clients sending 4 long texts each overfill it."""
    url, *_ = server
    body = json.dumps({"inputs": [TEXTS[1]] * 4}).encode()

    def one(_):
        started = time.perf_counter()
        status, headers, _ = call(url + "/embed", body)
        return status, headers.get("retry-after"), time.perf_counter() - started

    with ThreadPoolExecutor(48) as pool:
        results = list(pool.map(one, range(96)))
    accepted = [seconds for status, _, seconds in results if status == 200]
    refused = [(after, seconds) for status, after, seconds in results if status == 429]
    assert len(accepted) + len(refused) == len(results) and accepted and refused, results
    assert all(after is not None and int(after) >= 1 for after, _ in refused)
    assert max(seconds for _, seconds in refused) < 2.0  # at once, not after waiting in the queue
    assert max(accepted) < 20.0  # at most 16 texts ahead of any accepted request


def test_nothing_listens_beyond_loopback(server):
    url, _, seen, _ = server
    assert call(url + "/health")[0] == 200
    assert seen, "no listening socket seen"
    exposed = {name: sorted(addresses - LOOPBACK) for name, addresses in seen.items() if addresses - LOOPBACK}
    assert not exposed, exposed
    listening = {name: sorted(addresses) for name, addresses in seen.items()}
    print(f"listening sockets of the in-process server's process tree: {listening}")


def test_sigterm_under_load_answers_every_request_it_accepted(server):
    """The last test of the module: it stops the server."""
    url, proc, _, lines = server
    before = sum(
        v
        for (name, labels), v in _samples(call(url + "/metrics")[2].decode()).items()
        if name == "bertpipe_requests_total"
        and dict(labels)["endpoint"] not in ("/health", "/metrics", "/info", "other")
    )
    outcomes: list[tuple[float, object]] = []
    stopping = threading.Event()
    body = json.dumps({"inputs": [TEXTS[1]] * 2}).encode()

    def client() -> None:
        while True:
            try:
                status, _, _ = call(url + "/embed", body, timeout=30)
                outcomes.append((time.monotonic(), status))
            except OSError as exc:  # refused or reset: the server had stopped taking requests
                outcomes.append((time.monotonic(), type(exc).__name__))
                if stopping.is_set():
                    return

    clients = [threading.Thread(target=client) for _ in range(6)]
    for thread in clients:
        thread.start()
    time.sleep(1.5)
    signalled = time.monotonic()
    stopping.set()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    for thread in clients:
        thread.join(timeout=60)
    answered = [status for _, status in outcomes if isinstance(status, int)]
    assert proc.returncode == 0 and not any("Traceback" in line for line in lines), "".join(lines)[-3000:]
    assert set(answered) == {200}, outcomes
    assert any(at > signalled and isinstance(status, int) for at, status in outcomes), (
        "no request was in flight at SIGTERM"
    )
    stopped = next(line for line in lines if "bertpipe serve: stopped;" in line)
    assert f"stopped; {int(before) + len(answered)} requests answered" in stopped and "cut off" not in stopped, (
        before,
        len(answered),
        stopped,
    )
