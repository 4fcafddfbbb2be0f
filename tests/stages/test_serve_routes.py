"""The request side of `bertpipe serve` without a server or a model: each route family's
shapes and refusals (bertcore/inference/routes/), pair inputs, and the adaptive batcher
(bertcore/inference/batcher.py) on a stand-in model that sleeps."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from bertcore.inference.routes import ROUTES
from bertcore.inference.validate import Job, Limits, Offer, RequestError, read_json

# -- request checks: each route family's shapes ---------------------------------------------------

LIMITS = Limits(max_texts=4, max_text_bytes=64)
OFFER = Offer(
    task="sentiment",
    head_type="classification",
    mask_token="[MASK]",
    pooling="mean",
    top_k=5,
    labels=("neg", "pos"),
    model_id="student",
    dimensions=32,
    vocab_size=100,
)
PAIRS = Offer(
    task="mrpc", head_type="classification", mask_token=None, pooling="mean", top_k=5, pairs=True, labels=("no", "yes")
)


def _body(data) -> bytes:
    return json.dumps(data).encode()


def _parse(path: str, body: bytes, offer: Offer = OFFER, query: dict | None = None):
    route = next(r for r in ROUTES if r.path == path)
    return route.parse(read_json(body, LIMITS) if route.method == "POST" else None, query or {}, offer, LIMITS)


@pytest.mark.parametrize(
    "path, body, status, reason",
    [
        ("/embed", b"", 400, "the request body is empty"),
        ("/embed", b'{"inputs": ["caf\xe9"]}', 400, "not UTF-8: byte 0xe9 at offset 16"),
        ("/embed", b'{"inputs": ["a",]}', 400, "not valid JSON: Expecting value at line 1 column 17"),
        ("/embed", _body(["a"]), 422, "the request body is a JSON list"),
        (
            "/embed",
            _body({"texts": ["a"]}),
            422,
            "unknown field 'texts'; /embed takes: inputs, normalize, truncate, truncation_direction",
        ),
        ("/embed", _body({}), 422, 'missing field "inputs"'),
        ("/embed", _body({"inputs": 3}), 422, "inputs must be a string or a list of strings, got a number"),
        ("/embed", _body({"inputs": ["a", None]}), 422, "inputs[1] is a null, not a string"),
        ("/embed", _body({"inputs": []}), 422, "inputs is an empty list"),
        ("/embed", _body({"inputs": ["a", "  "]}), 422, "inputs[1] is empty (only whitespace)"),
        ("/embed", _body({"inputs": ""}), 422, "inputs is empty;"),
        ("/embed", _body({"inputs": ["a"] * 5}), 413, "inputs holds 5 inputs, over the limit of 4 (serve.max_texts)"),
        (
            "/embed",
            _body({"inputs": ["é" * 33]}),
            413,
            "inputs[0] is 66 bytes of UTF-8, over the limit of 64 (serve.max_text_bytes)",
        ),
        ("/embed", b'{"inputs": ["\\ud800"]}', 422, "unpaired surrogate"),
        ("/embed", _body({"inputs": "a", "pooling": "max"}), 422, "pooling must be one of 'cls', 'mean', got \"max\""),
        ("/embed", _body({"inputs": "a", "normalize": 1}), 422, "normalize must be true or false, got 1"),
        (
            "/embed",
            _body({"inputs": "a", "truncation_direction": "up"}),
            422,
            'truncation_direction must be "left" or "right", got "up"',
        ),
        (
            "/embed",
            _body({"inputs": "a", "dimensions": 8}),
            422,
            "this model's embeddings have 32 dimensions and cannot be shortened",
        ),
        ("/embed", _body({"inputs": "a", "prompt_name": "query"}), 422, "the served model has no prompts"),
        ("/embed", b"x" * (LIMITS.max_body_bytes + 1), 413, f"over the limit of {LIMITS.max_body_bytes}"),
        ("/predict", _body({"inputs": "a", "task": "ner"}), 422, "unknown field 'task'"),
        (
            "/predict",
            _body({"inputs": [["a", "b"]]}),
            422,
            "inputs[0] is a pair, and the served head (sentiment) was fine-tuned on single texts",
        ),
        (
            "/predict",
            _body({"inputs": "a", "parameters": {"function_to_apply": "tanh"}}),
            422,
            "function_to_apply must be one of softmax, sigmoid, none",
        ),
        (
            "/predict",
            _body({"inputs": [["a", "b", "c"]]}),
            422,
            "inputs[0] must be a text or a pair [a, b], got a list of 3",
        ),
        ("/fill-mask", _body({"inputs": "no mask here"}), 422, "inputs holds no [MASK]"),
        (
            "/fill-mask",
            _body({"inputs": "a [MASK]", "parameters": {"top_k": True}}),
            422,
            "top_k must be a whole number from 1 to 100, got true",
        ),
        ("/fill-mask", _body({"inputs": "a [MASK]", "top_k": 0}), 422, "top_k must be a whole number"),
        (
            "/fill-mask",
            _body({"inputs": "a [MASK]", "parameters": {"targets": []}}),
            422,
            "targets must be a word or a list of 1 to 100 words",
        ),
        (
            "/v1/embeddings",
            _body({"input": "a", "encoding_format": "hex"}),
            422,
            'encoding_format must be "float" or "base64", got "hex"',
        ),
        (
            "/v1/embeddings",
            _body({"input": [[3923, 374, 279, 892, 30]], "model": "student"}),  # LangChain's default: tiktoken ids
            422,
            (
                "input holds token ids, and this server reads text: ids from another tokenizer (tiktoken's, which "
                "LangChain's OpenAIEmbeddings sends unless check_embedding_ctx_length=False)"
            ),
        ),
        ("/v1/embeddings", _body({"input": [1, 2, 3]}), 422, "input holds token ids"),
        (
            "/v1/embeddings",
            _body({"input": "a", "model": "text-embedding-3-small"}),
            404,
            "the model \"text-embedding-3-small\" does not exist here: this server serves 'student'",
        ),
        ("/v1/embeddings", _body({"input": "a", "model": 3}), 422, "model must be a string, got a number"),
        ("/v1/embeddings", _body({"input": "a", "dimensions": 16}), 422, "cannot be shortened"),
        ("/v1/embeddings", _body({"inputs": "a"}), 422, "unknown field 'inputs'; /v1/embeddings takes: input, model"),
    ],
)
def test_each_bad_request_gets_its_status_and_one_line(path, body, status, reason):
    with pytest.raises(RequestError) as caught:
        _parse(path, body)
    assert caught.value.status == status and reason in caught.value.reason, caught.value.reason
    assert "\n" not in caught.value.reason


def test_a_pair_head_takes_pairs_only_and_reads_two_texts_as_one_pair():
    job = _parse("/predict", _body({"inputs": ["the first", "the second"]}), PAIRS).job
    assert (job.texts, job.second) == (("the first",), ("the second",))
    job = _parse("/predict", _body({"inputs": [["a", "b"], {"text": "c", "text_pair": "d"}]}), PAIRS).job
    assert (job.texts, job.second) == (("a", "c"), ("b", "d"))
    for inputs, where in (("one text", "inputs"), (["a", "b", "c"], "inputs[0]"), ([["a"]], "inputs[0]")):
        with pytest.raises(RequestError) as caught:
            _parse("/predict", _body({"inputs": inputs}), PAIRS)
        assert (
            caught.value.status == 422
            and f"{where} is a single text, and the served head (mrpc) was fine-tuned on text pairs"
            in caught.value.reason
        )
    # a single-text head reads a list of two texts as two inputs
    job = _parse("/predict", _body({"inputs": ["the first", "the second"]})).job
    assert (job.texts, job.second) == (("the first", "the second"), None)


def test_token_ids_are_read_only_where_the_server_was_told_they_are_its_own_and_model_names_a_served_model():
    from dataclasses import replace

    from bertcore.inference.routes.openai import error

    own = replace(OFFER, token_ids=True, aliases=("text-embedding-3-small",))
    assert _parse("/v1/embeddings", _body({"input": [7, 8, 9]}), own).job.token_ids == ((7, 8, 9),)
    assert _parse("/v1/embeddings", _body({"input": [[7], [8, 9]]}), own).job.token_ids == ((7,), (8, 9))
    with pytest.raises(
        RequestError, match=r"input\[1\]\[1\] is 400, not a token id of this model's vocabulary \(0 to 99\)"
    ):
        _parse("/v1/embeddings", _body({"input": [[1, 2], [3, 400]]}), own)
    for name in ("student", "text-embedding-3-small"):
        assert _parse("/v1/embeddings", _body({"input": "a", "model": name}), own).job.texts == ("a",)
    with pytest.raises(RequestError) as caught:
        _parse("/v1/embeddings", _body({"input": "a", "model": "other-model"}), own)
    refusal = caught.value
    assert refusal.status == 404 and "(or 'text-embedding-3-small')" in refusal.reason
    assert error(refusal.status, refusal.reason, refusal.param, refusal.code) == {
        "error": {
            "message": refusal.reason,
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }  # OpenAI's shape for an unknown model


def test_routes_the_model_cannot_serve_are_404_before_the_body_is_read():
    bare = Offer(task=None, head_type=None, mask_token=None, pooling="cls", top_k=5)
    for path, reason in (("/predict", "it has no task head"), ("/fill-mask", "no masked-LM head")):
        with pytest.raises(RequestError) as caught:
            next(r for r in ROUTES if r.path == path).parse("not even json", {}, bare, LIMITS)
        assert caught.value.status == 404 and reason in caught.value.reason
    tagger = Offer(task="ner", head_type="token_classification", mask_token=None, pooling="cls", top_k=5)
    with pytest.raises(RequestError, match="its head is for ner, a token_classification task"):
        _parse("/predict", _body({"inputs": "a"}), tagger)
    with pytest.raises(RequestError, match='POST / with "parameters" is a task pipeline'):
        _parse("/", _body({"inputs": "a", "parameters": {}}), bare)


def test_good_requests_become_jobs_and_answers_take_each_familys_shape():
    vectors = np.array([[0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    answer = {
        "embeddings": vectors,
        "pooling": "mean",
        "normalized": True,
        "tokens": [5, 3],
        "truncated": [False, True],
        "unknown": [0, 3],
        "unreadable": [False, True],
    }
    work = _parse("/embed", _body({"inputs": ["a", "b"], "truncate": False, "truncation_direction": "Left"}))
    assert work.job == Job("embed", ("a", "b"), pooling="mean", normalize=True, truncate=False, left=True)
    assert work.reply(answer) is vectors  # TEI: a bare list of vectors
    details = _parse("/embed", _body({"inputs": "a"}), query={"details": "true"}).reply(answer)
    assert details["truncated"] == [False, True]
    assert details["unknown_tokens"] == [0, 3] and details["unreadable"] == [False, True]
    assert _parse("/", _body({"inputs": "a", "normalize": False})).job == Job("embed", ("a",), normalize=False)

    work = _parse("/v1/embeddings", _body({"input": ["a", "b"], "model": "student", "encoding_format": "base64"}))
    body = work.reply(answer)
    assert body["model"] == "student" and body["usage"] == {"prompt_tokens": 8, "total_tokens": 8, "unknown_tokens": 3}
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1] and np.array_equal(np.stack(decoded), vectors)
    assert [(d["unknown_tokens"], d["unreadable"]) for d in body["data"]] == [(0, False), (3, True)]
    assert _parse("/v1/embeddings", _body({"input": "a"})).job.texts == ("a",)  # no model: the served one answers

    logits = {"logits": np.array([[0.0, 2.0], [1.0, -1.0]], dtype=np.float32)}
    single = _parse("/predict", _body({"inputs": "a"})).reply({"logits": logits["logits"][:1]})
    assert [p["label"] for p in single] == ["pos", "neg"] and sum(p["score"] for p in single) == pytest.approx(1.0)
    batch = _parse("/predict", _body({"inputs": ["a", "b"], "raw_scores": True})).reply(logits)
    assert batch == [
        [{"label": "pos", "score": 2.0}, {"label": "neg", "score": 0.0}],
        [{"label": "neg", "score": 1.0}, {"label": "pos", "score": -1.0}],
    ]
    assert _parse("/", _body({"inputs": "a", "parameters": {"top_k": 1}})).reply({"logits": logits["logits"][:1]}) == [
        single[:1]
    ]

    work = _parse("/fill-mask", _body({"inputs": "a [MASK] b [MASK]", "parameters": {"top_k": 1, "targets": ["x"]}}))
    assert work.job == Job("fill_mask", ("a [MASK] b [MASK]",), top_k=1, targets=("x",))
    shaped = work.reply(
        {
            "predictions": [
                [[{"token": 7, "token_str": "x", "score": 0.5}], [{"token": 8, "token_str": "y", "score": 0.25}]]
            ]
        }
    )
    assert [c["sequence"] for per_mask in shaped for c in per_mask] == ["a x b [MASK]", "a [MASK] b y"]
    assert read_json('  {"inputs": "ü"} '.encode(), LIMITS) == {"inputs": "ü"}


# -- the batcher ------------------------------------------------------------------------------------


class _SlowModel:
    """Engine.run's shape: each job's texts back, after `seconds`; records the batches."""

    def __init__(self, seconds: float):
        self.seconds, self.batches = seconds, []

    def __call__(self, jobs):
        import time

        self.batches.append([job.texts[0] for job in jobs])
        time.sleep(self.seconds)
        return [{"texts": job.texts} for job in jobs], None


def _batcher(model, **settings):
    from bertcore.inference.batcher import Batcher

    return Batcher(model, **{"max_batch_requests": 64, "batch_wait_ms": 50.0, "max_queued_texts": 1000, **settings})


def test_a_lone_request_never_waits_and_requests_that_come_while_the_model_computes_form_the_next_batch():
    import asyncio
    import time

    async def scenario():
        model = _SlowModel(0.2)
        batcher = _batcher(model)
        batcher.start()
        started = time.perf_counter()
        assert await batcher.submit(Job("embed", ("alone",))) == {"texts": ("alone",)}
        alone = time.perf_counter() - started  # the model's 0.2 s, not the 50 ms deadline on top
        first = asyncio.ensure_future(batcher.submit(Job("embed", ("first",))))
        await asyncio.sleep(0.05)  # the model is busy with "first": these queue
        rest = [asyncio.ensure_future(batcher.submit(Job("embed", (f"t{i}",)))) for i in range(5)]
        answers = await asyncio.gather(first, *rest)
        await batcher.stop()
        return model.batches, alone, answers

    batches, alone, answers = asyncio.run(scenario())
    assert alone < 0.2 + 0.04, alone
    assert batches == [["alone"], ["first"], ["t0", "t1", "t2", "t3", "t4"]]
    assert [a["texts"][0] for a in answers] == ["first", "t0", "t1", "t2", "t3", "t4"]


def test_a_full_queue_refuses_at_once_and_what_it_accepted_is_answered():
    import asyncio
    import time

    from bertcore.inference.batcher import Overloaded

    async def scenario():
        batcher = _batcher(_SlowModel(0.3), max_queued_texts=4, max_batch_requests=2)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(Job("embed", ("running",))))
        await asyncio.sleep(0.05)  # in the model now: the queue is empty
        queued = [asyncio.ensure_future(batcher.submit(Job("embed", ("a", "b")))) for _ in range(2)]
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        with pytest.raises(Overloaded) as refused:
            await batcher.submit(Job("embed", ("one too many",)))
        refused_after = time.perf_counter() - started
        await batcher.drain()
        answers = await asyncio.gather(running, *queued)
        await batcher.stop()
        return refused.value, refused_after, answers

    refused, seconds, answers = asyncio.run(scenario())
    assert seconds < 0.05 and refused.retry_after >= 1 and "serve.max_queued_texts 4" in str(refused)
    assert [a["texts"] for a in answers] == [("running",), ("a", "b"), ("a", "b")]


def test_a_failing_batch_fails_its_requests_and_the_next_batch_runs():
    import asyncio

    calls = []

    def model(jobs):
        calls.append(len(jobs))
        if len(calls) == 1:
            raise RuntimeError("boom")
        return [RequestError(413, "too long") if job.texts[0] == "long" else {"ok": True} for job in jobs], None

    async def scenario():
        batcher = _batcher(model)
        batcher.start()
        with pytest.raises(RuntimeError, match="boom"):
            await batcher.submit(Job("embed", ("first",)))
        results = await asyncio.gather(
            batcher.submit(Job("embed", ("fine",))), batcher.submit(Job("embed", ("long",))), return_exceptions=True
        )
        await batcher.stop()
        return results

    fine, long = asyncio.run(scenario())
    assert fine == {"ok": True} and isinstance(long, RequestError) and long.status == 413


# -- whether batching pays ----------------------------------------------------------------------


def _simulate(choice, per_token: dict[str, float], runs: int) -> dict[str, int]:
    """Tokens run each way in `runs` choices, each way costing `per_token` seconds a token
    (a batch: 32 requests of 100 tokens; alone: one)."""
    done = {"alone": 0, "batched": 0}
    for _ in range(runs):
        way = choice.way()
        tokens = 3200 if way == "batched" else 100
        choice.record(way, tokens, tokens * per_token[way])
        done[way] += tokens
    return done


def test_auto_batching_measures_both_ways_and_keeps_to_the_cheaper_one_per_token():
    from bertcore.inference.batch_choice import EXPLORE_RATIO, BatchChoice

    choice = BatchChoice("auto")
    assert choice.way() == "alone" and choice.state()["now"] == "alone"  # it starts alone (the engine runs on a CPU)
    _simulate(choice, {"alone": 1e-5, "batched": 1.6e-5}, 100)  # a CPU's padded batches: dearer per token
    assert choice.chosen == "alone"
    done = _simulate(choice, {"alone": 1e-5, "batched": 1.6e-5}, 2000)
    assert choice.chosen == "alone" and 0 < done["batched"] / sum(done.values()) <= 1.5 / (1 + EXPLORE_RATIO)
    measured = choice.state()["measured"]
    assert measured["alone"]["ms_per_1k_tokens"] == pytest.approx(10.0) and measured["batched"]["tokens"] > 0
    # the load changes: batches now cost less per token (long texts of one length, say): the choice turns
    done = _simulate(choice, {"alone": 1e-5, "batched": 0.4e-5}, 8000)
    assert choice.chosen == "batched" and done["batched"] > 0.8 * sum(done.values())
    assert measured is not choice.state()["measured"] and choice.state()["now"] == "batched"
    for setting, way in (("on", "batched"), ("off", "alone")):
        fixed = BatchChoice(setting)
        _simulate(fixed, {"alone": 1.0, "batched": 1e-9}, 50)
        assert fixed.way() == way and fixed.state()["measured"] is None


def test_the_batcher_runs_requests_alone_while_auto_measures_batches_dearer():
    """A stand-in model whose batches cost 1.5x per request: under load, auto runs most
    requests alone; with batching on, the same load runs in batches."""
    import asyncio
    import time

    from bertcore.inference.batch_choice import BatchChoice

    def model(jobs):
        time.sleep(0.002 * len(jobs) * (1.5 if len(jobs) > 1 else 1.0))
        return [{"texts": job.texts} for job in jobs], len(jobs) * 400  # 400 tokens a request

    async def scenario(setting: str) -> list[int]:
        sizes = []
        batcher = _batcher(
            lambda jobs: (sizes.append(len(jobs)), model(jobs))[1],
            choice=BatchChoice(setting),
            tokens=lambda tokens: tokens,
            batch_wait_ms=0.0,
        )
        batcher.start()

        async def client(k: int) -> None:
            for i in range(30):
                await batcher.submit(Job("embed", (f"{k}-{i}",)))

        await asyncio.gather(*(client(k) for k in range(8)))
        await batcher.stop()
        return sizes

    auto, on = asyncio.run(scenario("auto")), asyncio.run(scenario("on"))
    assert sum(1 for n in auto if n == 1) > 0.75 * 240 and max(auto) > 1  # measured batched, then alone
    assert sum(n for n in on if n > 1) > 0.75 * 240


def test_batching_on_and_off_read_from_yaml_as_the_settings_not_as_booleans():
    import yaml

    from bertcore.inference.config import ServeConfig

    for text, setting in (("batching: on", "on"), ("batching: off", "off"), ("batching: auto", "auto")):
        assert ServeConfig.model_validate(yaml.safe_load(text)).batching == setting
    with pytest.raises(ValueError, match="batching"):
        ServeConfig.model_validate({"batching": "sometimes"})
