"""The parts of `bertpipe serve` that need no server (bertcore/inference): token-budget
batching, the Prometheus page, the pooling choice, and the Engine on a tiny model, whose
answers must be what the model itself (and the evaluate stage) computes. The request side
(routes, the batcher) is tests/stages/test_serve_routes.py."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from bertcore.inference import batching
from bertcore.inference.prometheus import Metrics, render
from bertcore.inference.validate import Job, RequestError
from tiny_bert import save_tiny_bert

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
    page = render(
        {"r1": json.loads(json.dumps(one.snapshot())), "r2": two.snapshot()}
    )  # snapshots survive JSON, as between processes

    families = {f.name: f for f in text_string_to_metric_families(page)}
    requests = {
        (s.labels["replica"], s.labels["endpoint"], s.labels["code"]): s.value
        for s in families["bertpipe_requests"].samples
    }
    assert requests == {("r1", "/embed", "200"): 2, ("r1", "/classify", "422"): 1, ("r2", '/we"ird\\path', "404"): 1}
    latency = {(s.name, s.labels.get("le")): s.value for s in families["bertpipe_request_seconds"].samples}
    assert latency[("bertpipe_request_seconds_bucket", "0.005")] == 1
    assert latency[("bertpipe_request_seconds_bucket", "0.025")] == 3  # cumulative
    assert latency[("bertpipe_request_seconds_bucket", "10")] == 4
    assert (
        latency[("bertpipe_request_seconds_bucket", "+Inf")] == 5 == latency[("bertpipe_request_seconds_count", None)]
    )
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
    "the cat sat on the mat",
    "a dog ran in the park",
    "birds fly over the sea and the land",
    "rain fell on the old town all night",
    "she read the letter twice and smiled",
] * 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT folder, a classification task model on it (saved as the evaluate stage
    saves one), and both exported to fp32 ONNX."""
    from bertcore.eval import kinds
    from bertcore.eval.encoder import Features, TaskModel, load_encoder
    from bertcore.eval.heads import TaskHead, save_task_model
    from bertcore.inference.export import export_folder

    folder = save_tiny_bert(tmp_path_factory.mktemp("tiny"), LINES, vocab_size=150, max_positions=64)
    torch.manual_seed(3)
    task = TaskModel(load_encoder(folder), kinds.get("classification"), 3, features=Features(pooling="mean"))
    head = TaskHead(
        task="topic",
        type="classification",
        labels=["animals", "weather", "people"],
        num_outputs=3,
        layers=[-1],
        combine="concat",
        pooling="mean",
        seed=1,
        trained_on="test",
        encoder_sha256="-",
        max_seq_length=24,
        long_inputs={"window_stride": None, "window_pool": "mean", "max_windows": 8},
    )
    head_file = os.path.join(tmp_path_factory.mktemp("head"), "topic.safetensors")
    save_task_model(head_file, task, head)
    base_onnx, task_onnx = str(tmp_path_factory.mktemp("onnx")), str(tmp_path_factory.mktemp("onnx-task"))
    export_folder(folder, base_onnx, LINES[:8], max_length=32)
    export_folder(folder, task_onnx, LINES[:8], head_file=head_file, max_length=24)
    from dataclasses import asdict

    return {
        "folder": folder,
        "head_file": head_file,
        "head": asdict(head),
        "base_onnx": base_onnx,
        "task_onnx": task_onnx,
    }


def _engine(tiny, runtime: str, *, windows: bool = False):
    from bertcore.eval.windows import Windowing
    from bertcore.inference.engine import Engine, EngineSpec, Reading

    embed = Reading(16, Windowing(16, None, "mean", 8) if windows else None)
    classify = Reading(24, Windowing(24, None, "mean", 8))
    common = dict(
        folder=tiny["folder"],
        embed=embed,
        classify=classify,
        fill_mask_tokens=64,
        head=tiny["head"],
        mlm_dir=tiny["folder"],
        budget=48,
    )
    if runtime == "onnx":
        return Engine(
            EngineSpec(
                **common,
                onnx_file=os.path.join(tiny["base_onnx"], "model.onnx"),
                task_onnx_file=os.path.join(tiny["task_onnx"], "model.onnx"),
            )
        )
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
        jobs = [
            Job("embed", TEXTS, pooling="mean", normalize=False),
            Job("embed", TEXTS[:2], pooling="cls", normalize=False),
        ]
        answers, calls = engine.run(jobs)
        assert len(calls) > 1 and all(c.tokens <= 48 or c.rows == 1 for c in calls)  # the budget cut the batch
        windowing = Windowing(16, None, "mean", 8) if windows else None
        for job, answer in zip(jobs, answers):
            want = embed(
                encoder, tokenizer, list(job.texts), pooling=job.pooling, max_seq_length=16, windowing=windowing
            )
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
    for text, got in zip(texts, classified["logits"]):
        windows = split_windows(tokenizer, text, None, Windowing(24, None, "mean", 8))
        feed = batching.pad(windows.input_ids, tokenizer.pad_token_id, windows.token_type_ids)
        owner = torch.zeros(len(windows.input_ids), dtype=torch.long)
        with torch.no_grad():
            logits = task(
                *(torch.from_numpy(feed[k]) for k in ("input_ids", "attention_mask", "token_type_ids")),
                window_owner=owner,
            )[0]
        assert got == pytest.approx(logits.numpy(), abs=1e-4)
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


def test_truncation_token_ids_pairs_tokens_and_targets_read_as_the_model_reads(tiny):
    from transformers import BertForMaskedLM

    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.heads import load_task_model

    engine, tokenizer = _engine(tiny, "onnx"), load_tokenizer(tiny["folder"])
    long = "birds fly over the sea and the land " * 4
    answers, _ = engine.run(
        [
            Job("embed", (long,), truncate=False),
            Job("embed", ("rain", long), left=True, normalize=False),
            Job(
                "embed",
                token_ids=(tuple(tokenizer(long, add_special_tokens=False)["input_ids"][-14:]),),
                normalize=False,
            ),
            Job("tokenize", ("the cat sat",)),
            Job("classify", ("the cat sat", "rain fell"), second=("a dog ran", "on the old town")),
            Job("fill_mask", ("the cat sat on the [MASK]",), top_k=2, targets=("mat", "sea", "dog")),
        ]
    )
    refused, left, ids, tokens, pairs, targets = answers
    # truncate false: refused with the length, and the rest of the batch answered
    length = len(tokenizer(long)["input_ids"])
    assert (
        isinstance(refused, RequestError)
        and refused.status == 413
        and f"is {length} tokens, over the 16 the model reads" in refused.reason
    )
    # left truncation keeps the end: the same vector as the text's last 14 tokens sent as ids
    assert left["truncated"] == [False, True] and left["tokens"] == [3, 16]
    assert np.abs(left["embeddings"][1] - ids["embeddings"][0]).max() < 1e-5
    assert [t["id"] for t in tokens["tokens"][0]] == tokenizer("the cat sat")["input_ids"]
    assert [t["text"] for t in tokens["tokens"][0]][1:-1] == [
        "the cat sat"[t["start"] : t["stop"]] for t in tokens["tokens"][0][1:-1]
    ] and tokens["tokens"][0][0]["special"]
    # pairs: [CLS] a [SEP] b [SEP] with token types 0 then 1, as fine-tuning reads them
    task, _ = load_task_model(tiny["head_file"], tiny["folder"])
    batch = tokenizer(
        ["the cat sat", "rain fell"],
        ["a dog ran", "on the old town"],
        padding=True,
        return_tensors="pt",
        return_token_type_ids=True,
    )
    assert batch["token_type_ids"].max() == 1
    with torch.no_grad():
        want = task(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).numpy()
    assert pairs["logits"] == pytest.approx(want, abs=1e-4)
    # targets: only those words, scored as the masked-LM head scores them
    mlm = BertForMaskedLM.from_pretrained(tiny["folder"]).eval()
    encoded = tokenizer("the cat sat on the [MASK]", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probabilities = torch.softmax(mlm(input_ids=encoded).logits[0, -2], -1)
    wanted = sorted(
        ((probabilities[engine.target_ids([w])[0]].item(), w) for w in ("mat", "sea", "dog")), reverse=True
    )[:2]
    got = targets["predictions"][0][0]
    assert [c["token"] for c in got] == [engine.target_ids([w])[0] for _, w in wanted]
    assert [c["score"] for c in got] == pytest.approx([s for s, _ in wanted], abs=1e-5)


def test_ids_from_tokenize_read_as_the_text_and_unknown_tokens_are_counted_flagged_or_refused(tiny):
    from dataclasses import replace

    from bertcore.inference.engine import Engine

    engine = _engine(tiny, "onnx")
    tokens = engine.run([Job("tokenize", ("the cat sat",))])[0][0]["tokens"][0]
    ids = tuple(t["id"] for t in tokens)  # [CLS] ... [SEP], as /tokenize gives them
    text, wrapped, bare = engine.run(
        [
            Job("embed", ("the cat sat",), normalize=False),
            Job("embed", token_ids=(ids,), normalize=False),
            Job("embed", token_ids=(ids[1:-1],), normalize=False),
        ]
    )[0]
    assert wrapped["tokens"] == bare["tokens"] == text["tokens"] == [len(ids)]  # not wrapped a second time
    assert np.abs(wrapped["embeddings"] - text["embeddings"]).max() < 1e-5
    assert np.abs(bare["embeddings"] - text["embeddings"]).max() < 1e-5

    texts = ("the cat sat", "😀🎉🚀", "the 🍕 cat", "안녕하세요")
    for windows in (False, True):
        answer = _engine(tiny, "onnx", windows=windows).run([Job("embed", texts)])[0][0]
        assert answer["unknown"][0] == 0 and answer["unknown"][2] >= 1 and answer["unknown"][1] >= 1
        assert answer["unreadable"] == [False, True, False, True], (windows, answer)
    pairs, classified = engine.run([Job("classify", ("the cat", "😀"), second=("🍕", "🎉")), Job("classify", texts)])[0]
    assert pairs["unreadable"] == [False, True] and pairs["unknown"][0] == 1
    assert classified["unreadable"] == [False, True, False, True]

    refusing = Engine(replace(engine.spec, unreadable="refuse"))
    refused, fine = refusing.run([Job("embed", texts[:2]), Job("embed", texts[2:3])])[0]
    assert isinstance(refused, RequestError) and refused.status == 422 and refused.code == "unreadable"
    assert "inputs[1] ('😀🎉🚀') is all unknown tokens" in refused.reason and "\n" not in refused.reason
    assert fine["unreadable"] == [False] and fine["unknown"][0] >= 1  # partly unknown: answered, counted
