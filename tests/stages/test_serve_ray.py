"""`bertpipe serve --replicas 2`: the same app as the in-process server, as a Ray Serve
ingress deployment on its own embedded Ray (a subprocess, one start for the module):
the openai package gets the model's vectors through Ray Serve's proxy, the API key is
checked in the replicas, both replicas answer and /metrics shows both, every socket of the
process tree (Ray's included) listens on loopback only, and SIGTERM stops it all."""

from __future__ import annotations

import base64
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from processes import LOOPBACK, stop
from serving import KEYS, call, get, post, served_run, serving

RECIPE = {
    "evaluate": {"embeddings": {"max_seq_length": 16}},
    "serve": {"max_texts": 4, "max_text_bytes": 200, "threads": 1},
    "ray": {"num_cpus": 2},
}
TEXTS = ["The council met on Tuesday.", "Fire crews worked through the night.", "Rain."]


@pytest.fixture(scope="module")
def run(tmp_path_factory, gensim_data):
    return served_run(tmp_path_factory, gensim_data, dict(RECIPE), task=None)


@pytest.fixture(scope="module")
def server(run):
    with serving(run[1], "--format", "onnx", "--replicas", "2", timeout=400) as served:
        yield served


def test_two_replicas_behind_ray_serve_answer_the_openai_client(server, run):
    from openai import AuthenticationError, OpenAI

    from bertcore.eval.embeddings import embed
    from bertcore.eval.encoder import load_encoder, load_tokenizer

    url, _, _, lines = server
    line = next(line for line in lines if line.startswith("bertpipe serve:"))
    assert f"at {url}; Ray Serve, 2 replica(s) x 1 thread(s); API key required;" in line, line
    model_dir = os.path.join(run[0], "pretrain", "model")
    want = embed(load_encoder(model_dir), load_tokenizer(model_dir), TEXTS, pooling="mean", max_seq_length=16)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    client = OpenAI(base_url=url + "/v1", api_key=KEYS[0], max_retries=0)
    for encoding in ("float", "base64"):
        answer = client.embeddings.create(input=TEXTS, model="pretrained", encoding_format=encoding)
        got = np.array(
            [
                d.embedding if encoding == "float" else np.frombuffer(base64.b64decode(d.embedding), "<f4")
                for d in answer.data
            ]
        )
        assert (got * want).sum(1).min() >= 0.999 and answer.model == "pretrained"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=url + "/v1", api_key="not-a-key-of-this-server", max_retries=0).embeddings.create(
            input="a", model="m"
        )
    assert get(url + "/health", key=None)[0] == 200


def test_both_replicas_answer_and_the_metrics_page_shows_both(server):
    from concurrent.futures import ThreadPoolExecutor

    url, *_ = server
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: post(url + "/embed", {"inputs": [f"{TEXTS[i % 3]} {i}"]}), range(48)))
        replicas = set(pool.map(lambda _: get(url + "/info")[1]["replica"]["id"], range(24)))
    assert all(status == 200 for status, _ in answers) and len(replicas) == 2, replicas
    status, _, page = call(url + "/metrics")
    assert status == 200 and all(f'replica="{r}"' in page.decode() for r in replicas)


def test_nothing_listens_beyond_loopback_and_sigterm_stops_it(server):
    url, proc, seen, lines = server
    assert call(url + "/health")[0] == 200
    assert seen, "no listening socket seen"
    exposed = {name: sorted(addresses - LOOPBACK) for name, addresses in seen.items() if addresses - LOOPBACK}
    assert not exposed, exposed
    listening = {name: sorted(addresses) for name, addresses in seen.items()}
    print(f"listening sockets of the Ray Serve process tree: {listening}")
    stop(proc, timeout=90)
    assert proc.returncode == 0, "".join(lines)[-3000:]
    assert not any("Traceback" in line for line in lines), "".join(lines)[-3000:]
