"""The parts of `bertpipe serve` that need no Ray (bertcore/inference): token-budget
batching, request checks, the Prometheus page, the pooling choice, and the Engine on a tiny
model, whose answers must be what the model itself (and the evaluate stage) computes."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from bertcore.inference import batching  # noqa: E402
from bertcore.inference.prometheus import Metrics, render  # noqa: E402
from bertcore.inference.validate import Job, Limits, Offer, RequestError, parse, read_json  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from tiny_bert import save_tiny_bert  # noqa: E402

torch.set_num_threads(1)

# -- batching -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_plan_keeps_every_call_within_the_token_budget_and_runs_every_row_once(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 200, size=rng.integers(1, 120)).tolist()
    budget = 1024
    calls = batching.plan(lengths, budget, max_rows=32)
    assert sorted(i for call in calls for i in call) == list(range(len(lengths)))
    for call in calls:
        cost = len(call) * max(lengths[i] for i in call)
        assert cost <= budget or len(call) == 1, (call, cost)
        assert len(call) <= 32
    # sorting by length wastes less than taking the rows as they came, within the same budget
    arrival = []
    for i in range(len(lengths)):
        if arrival and (len(arrival[-1]) + 1) * max(lengths[j] for j in arrival[-1] + [i]) <= budget:
            arrival[-1].append(i)
        else:
            arrival.append([i])
    assert batching.padded_tokens(lengths, calls) <= batching.padded_tokens(lengths, arrival)


def test_a_row_longer_than_the_budget_runs_alone_and_the_plan_depends_on_lengths_only():
    assert batching.plan([300, 10, 10, 10], 100) == [[0], [1, 2, 3]]
    assert batching.plan([5, 9, 5, 9], 18) == [[1, 3], [0, 2]]  # ties keep arrival order
    assert batching.plan([4] * 10, 16) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batching.plan([4] * 10, 1000, max_rows=4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batching.plan([], 10) == []


def test_pad_gives_the_three_inputs_padded_at_the_end():
    feed = batching.pad([[2, 7, 3], [2, 3]], 0, [[0, 0, 0], [0, 1]])
    assert feed["input_ids"].tolist() == [[2, 7, 3], [2, 3, 0]]
    assert feed["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert feed["token_type_ids"].tolist() == [[0, 0, 0], [0, 1, 0]]
    assert all(v.dtype == np.int64 for v in feed.values())


# -- request checks -------------------------------------------------------------------------------

LIMITS = Limits(max_texts=4, max_text_bytes=64)
OFFER = Offer(task="sentiment", head_type="classification", mask_token="[MASK]", pooling="mean", top_k=5)


def _body(data) -> bytes:
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "kind, body, status, reason",
    [
        ("embed", b"", 400, "the request body is empty"),
        ("embed", b'{"inputs": ["caf\xe9"]}', 400, "not UTF-8: byte 0xe9 at offset 16"),
        ("embed", b'{"inputs": ["a",]}', 400, "not valid JSON: Expecting value at line 1 column 17"),
        ("embed", _body(["a"]), 422, "the request body is a JSON list"),
        ("embed", _body({"texts": ["a"]}), 422, "unknown field 'texts'; /embed takes: inputs, pooling, normalize"),
        ("embed", _body({}), 422, 'missing field "inputs"'),
        ("embed", _body({"inputs": 3}), 422, "inputs must be a string or a list of strings, got a number"),
        ("embed", _body({"inputs": ["a", None]}), 422, "inputs[1] is a null, not a string"),
        ("embed", _body({"inputs": []}), 422, "inputs is an empty list"),
        ("embed", _body({"inputs": ["a", "  "]}), 422, "inputs[1] is empty (only whitespace)"),
        ("embed", _body({"inputs": ""}), 422, "inputs is empty;"),
        ("embed", _body({"inputs": ["a"] * 5}), 413, "inputs holds 5 texts, over the limit of 4 (serve.max_texts)"),
        ("embed", _body({"inputs": ["é" * 33]}), 413, "inputs[0] is 66 bytes of UTF-8, over the limit of 64 (serve.max_text_bytes)"),
        ("embed", b'{"inputs": ["\\ud800"]}', 422, "unpaired surrogate"),
        ("embed", _body({"inputs": "a", "pooling": "max"}), 422, "pooling must be one of 'cls', 'mean', got \"max\""),
        ("embed", _body({"inputs": "a", "normalize": 1}), 422, "normalize must be true or false, got 1"),
        ("embed", b"x" * (LIMITS.max_body_bytes + 1), 413, f"over the limit of {LIMITS.max_body_bytes}"),
        ("classify", _body({"inputs": "a", "task": "ner"}), 404, "the served model has no task 'ner'; it serves 'sentiment'"),
        ("fill_mask", _body({"inputs": "no mask here"}), 422, "inputs holds no [MASK]"),
        ("fill_mask", _body({"inputs": "a [MASK]", "top_k": True}), 422, "top_k must be a whole number from 1 to 100, got true"),
        ("fill_mask", _body({"inputs": "a [MASK]", "top_k": 0}), 422, "top_k must be a whole number"),
    ],
)
def test_each_bad_request_gets_its_status_and_one_line(kind, body, status, reason):
    with pytest.raises(RequestError) as caught:
        parse(kind, body, LIMITS, OFFER)
    assert caught.value.status == status and reason in caught.value.reason, caught.value.reason
    assert "\n" not in caught.value.reason


def test_endpoints_the_model_cannot_serve_are_404_before_the_body_is_read():
    bare = Offer(task=None, head_type=None, mask_token=None, pooling="cls", top_k=5)
    for kind, reason in (("classify", "it has no task head"), ("fill_mask", "no masked-LM head")):
        with pytest.raises(RequestError) as caught:
            parse(kind, b"not even json", LIMITS, bare)
        assert caught.value.status == 404 and reason in caught.value.reason
    tagger = Offer(task="ner", head_type="token_classification", mask_token=None, pooling="cls", top_k=5)
    with pytest.raises(RequestError, match="its head is for ner, a token_classification task"):
        parse("classify", _body({"inputs": "a"}), LIMITS, tagger)


def test_good_requests_become_jobs_with_the_defaults_filled_in():
    assert parse("embed", _body({"inputs": "one text"}), LIMITS, OFFER) == Job("embed", ("one text",), pooling="mean", normalize=True)
    assert parse("embed", _body({"inputs": ["a", "b"], "pooling": "cls", "normalize": False}), LIMITS, OFFER) == Job("embed", ("a", "b"), "cls", False)
    assert parse("classify", _body({"inputs": ["a"], "task": "sentiment"}), LIMITS, OFFER) == Job("classify", ("a",))
    assert parse("fill_mask", _body({"inputs": ["a [MASK] b"], "top_k": 3}), LIMITS, OFFER) == Job("fill_mask", ("a [MASK] b",), top_k=3)
    assert read_json("  {\"inputs\": \"ü\"} ".encode(), LIMITS) == {"inputs": "ü"}


# -- metrics --------------------------------------------------------------------------------------


def test_the_metrics_page_is_prometheus_text_that_its_own_parser_reads():
    from prometheus_client.parser import text_string_to_metric_families

    one, two = Metrics(), Metrics()
    for value in (0.003, 0.02, 0.02, 7.0, 30.0):
        one.observe("bertpipe_request_seconds", value, endpoint="/embed")
    one.count("bertpipe_requests_total", endpoint="/embed", code="200")
    one.count("bertpipe_requests_total", endpoint="/embed", code="200")
    one.count("bertpipe_requests_total", endpoint="/classify", code="422")
    two.count("bertpipe_requests_total", endpoint='/we"ird\\path', code="404")
    two.observe("bertpipe_call_tokens", 4096)
    page = render({"r1": json.loads(json.dumps(one.snapshot())), "r2": two.snapshot()})  # snapshots survive JSON, as between processes

    families = {f.name: f for f in text_string_to_metric_families(page)}
    requests = {(s.labels["replica"], s.labels["endpoint"], s.labels["code"]): s.value for s in families["bertpipe_requests"].samples}
    assert requests == {("r1", "/embed", "200"): 2, ("r1", "/classify", "422"): 1, ("r2", '/we"ird\\path', "404"): 1}
    latency = {(s.name, s.labels.get("le")): s.value for s in families["bertpipe_request_seconds"].samples}
    assert latency[("bertpipe_request_seconds_bucket", "0.005")] == 1
    assert latency[("bertpipe_request_seconds_bucket", "0.025")] == 3  # cumulative
    assert latency[("bertpipe_request_seconds_bucket", "10")] == 4
    assert latency[("bertpipe_request_seconds_bucket", "+Inf")] == 5 == latency[("bertpipe_request_seconds_count", None)]
    assert latency[("bertpipe_request_seconds_sum", None)] == pytest.approx(37.043)
    tokens = {(s.name, s.labels.get("le")): s.value for s in families["bertpipe_call_tokens"].samples}
    assert tokens[("bertpipe_call_tokens_bucket", "2048")] == 0 and tokens[("bertpipe_call_tokens_bucket", "4096")] == 1
    assert "# TYPE bertpipe_batch_requests histogram" in page and page.endswith("\n")


def test_the_pooling_default_is_the_one_the_evaluation_scored_better():
    from bertcore.inference.pooling import best_pooling

    scores = {"cls": {"anisotropy": 0.9, "sts_spearman": 0.41}, "mean": {"anisotropy": 0.6, "sts_spearman": 0.38}}
    assert best_pooling(scores)[0] == "cls"  # STS decides when both have it
    assert best_pooling({"cls": {"anisotropy": 0.9}, "mean": {"anisotropy": 0.6}})[0] == "mean"
    assert best_pooling({"cls": {"anisotropy": 0.2}, "mean": {"anisotropy": 0.6}})[0] == "cls"
    assert best_pooling(None) == ("mean", "the evaluation has no embedding scores for this model")


# -- the engine on a tiny model -------------------------------------------------------------------

LINES = [
    "the cat sat on the mat", "a dog ran in the park", "birds fly over the sea and the land",
    "rain fell on the old town all night", "she read the letter twice and smiled",
] * 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT folder, a classification task model on it (saved as the evaluate stage
    saves one), and both exported to fp32 ONNX."""
    from bertcore.eval.encoder import Features, TaskModel, load_encoder
    from bertcore.eval.heads import TaskHead, save_task_model
    from bertcore.inference.export import export_folder

    folder = save_tiny_bert(tmp_path_factory.mktemp("tiny"), LINES, vocab_size=150, max_positions=64)
    torch.manual_seed(3)
    task = TaskModel(load_encoder(folder), "classification", 3, features=Features(pooling="mean"))
    head = TaskHead(
        task="topic", type="classification", labels=["animals", "weather", "people"], num_outputs=3, layers=[-1], combine="concat",
        pooling="mean", seed=1, trained_on="test", encoder_sha256="-", max_seq_length=24,
        long_inputs={"window_stride": None, "window_pool": "mean", "max_windows": 8},
    )
    head_file = os.path.join(tmp_path_factory.mktemp("head"), "topic.safetensors")
    save_task_model(head_file, task, head)
    base_onnx, task_onnx = str(tmp_path_factory.mktemp("onnx")), str(tmp_path_factory.mktemp("onnx-task"))
    export_folder(folder, base_onnx, LINES[:8], max_length=32)
    export_folder(folder, task_onnx, LINES[:8], head_file=head_file, max_length=24)
    from dataclasses import asdict

    return {"folder": folder, "head_file": head_file, "head": asdict(head), "base_onnx": base_onnx, "task_onnx": task_onnx}


def _engine(tiny, runtime: str, *, windows: bool = False):
    from bertcore.eval.windows import Windowing
    from bertcore.inference.engine import Engine, EngineSpec, Reading

    embed = Reading(16, Windowing(16, None, "mean", 8) if windows else None)
    classify = Reading(24, Windowing(24, None, "mean", 8))
    common = dict(folder=tiny["folder"], embed=embed, classify=classify, fill_mask_tokens=64, head=tiny["head"], mlm_dir=tiny["folder"], budget=48)
    if runtime == "onnx":
        return Engine(EngineSpec(**common, onnx_file=os.path.join(tiny["base_onnx"], "model.onnx"), task_onnx_file=os.path.join(tiny["task_onnx"], "model.onnx")))
    return Engine(EngineSpec(**common, torch_dir=tiny["folder"], head_file=tiny["head_file"]))


TEXTS = ("the cat sat on the mat", "birds fly over the sea and the land " * 4, "rain")


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_embeddings_are_the_models_own_vectors_however_the_batch_is_cut(tiny, runtime):
    from bertcore.eval.embeddings import embed
    from bertcore.eval.encoder import load_encoder, load_tokenizer
    from bertcore.eval.windows import Windowing

    encoder, tokenizer = load_encoder(tiny["folder"]), load_tokenizer(tiny["folder"])
    for windows in (False, True):
        engine = _engine(tiny, runtime, windows=windows)
        jobs = [Job("embed", TEXTS, pooling="mean", normalize=False), Job("embed", TEXTS[:2], pooling="cls", normalize=False)]
        answers, calls = engine.run(jobs)
        assert len(calls) > 1 and all(c.tokens <= 48 or c.rows == 1 for c in calls)  # the budget cut the batch
        windowing = Windowing(16, None, "mean", 8) if windows else None
        for job, answer in zip(jobs, answers):
            want = embed(encoder, tokenizer, list(job.texts), pooling=job.pooling, max_seq_length=16, windowing=windowing)
            got = np.array(answer["embeddings"])
            cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            assert cosine.min() >= 0.9999 and np.abs(got - want).max() < 1e-4, (windows, job.pooling, cosine)
        assert answers[0]["truncated"] == [False, not windows, False] and answers[0]["tokens"][2] == 3
    answer, _ = engine.run([Job("embed", ("the cat",), normalize=True)])
    assert np.linalg.norm(answer[0]["embeddings"][0]) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_classify_and_fill_mask_give_the_models_own_predictions(tiny, runtime):
    from transformers import BertForMaskedLM

    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.heads import load_task_model
    from bertcore.eval.windows import Windowing, split_windows

    engine, tokenizer = _engine(tiny, runtime), load_tokenizer(tiny["folder"])
    texts = ("the cat sat on the [MASK]", "a [MASK] ran in the [MASK] " * 6)
    answers, _ = engine.run([Job("classify", texts), Job("fill_mask", texts, top_k=3)])
    classified, filled = answers

    task, _ = load_task_model(tiny["head_file"], tiny["folder"])
    for text, predicted in zip(texts, classified["predictions"]):
        windows = split_windows(tokenizer, text, None, Windowing(24, None, "mean", 8))
        feed = batching.pad(windows.input_ids, tokenizer.pad_token_id, windows.token_type_ids)
        owner = torch.zeros(len(windows.input_ids), dtype=torch.long)
        with torch.no_grad():
            logits = task(*(torch.from_numpy(feed[k]) for k in ("input_ids", "attention_mask", "token_type_ids")), window_owner=owner)[0]
        want = torch.softmax(logits, -1).numpy()
        assert [p["label"] for p in predicted] == [["animals", "weather", "people"][i] for i in np.argsort(-want)]
        assert sorted(p["score"] for p in predicted) == pytest.approx(sorted(want), abs=1e-4)
    assert classified["truncated"] == [False, False]  # two windows read the long text whole

    mlm = BertForMaskedLM.from_pretrained(tiny["folder"]).eval()
    for text, per_mask in zip(texts, filled["predictions"]):
        ids = tokenizer(text, truncation=True, max_length=64, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = mlm(input_ids=ids).logits[0]
        positions = (ids[0] == tokenizer.mask_token_id).nonzero().flatten().tolist()
        assert len(per_mask) == len(positions) >= 1
        for position, top in zip(positions, per_mask):
            assert [t["token"] for t in top] == logits[position].topk(3).indices.tolist()
            assert top[0]["token_str"] == tokenizer.decode([top[0]["token"]]).strip()
