"""The embedding clients people use today, unmodified, against `bertpipe serve` as docs/serve-clients.md
sets each one up: LangChain's OpenAIEmbeddings (check_embedding_ctx_length=False), LlamaIndex's
TextEmbeddingsInference, chromadb's HuggingFaceEmbeddingServer and Haystack's OpenAI
embedders. Each embeds a query and three documents and must get the vectors the server's own
/embed gives. Beside them, what a client gets where the server cannot answer right: token
ids from another tokenizer (LangChain's default body), a model the server does not serve,
and a text the vocabulary cannot read.

One in-process server for the module (the serve: section's defaults, one alias), serving a
tiny run's model in PyTorch (no export to make); the clients are pinned in the dev extra."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # no telemetry call from Haystack's import

import numpy as np
import pytest

from serving import KEYS, call, post, served_run, serving

RECIPE = {
    "evaluate": {"embeddings": {"max_seq_length": 32}},
    "serve": {"threads": 1, "model_aliases": ["text-embedding-3-small"]},
    "ray": {"num_cpus": 2},
}
QUERY = "Who fought the fires near the houses?"
DOCUMENTS = [
    "Fire crews worked through the night to save the houses.",
    "The council met on Tuesday to discuss the budget.",
    "Rain is expected across the state this weekend.",
]
UNREADABLE = "😀🎉🚀"
"""Emoji: every token is [UNK] in the tiny English vocabulary."""


@pytest.fixture(scope="module")
def url(tmp_path_factory, gensim_data):
    _, recipe, _ = served_run(tmp_path_factory, gensim_data, dict(RECIPE), task=None, export=False)
    with serving(recipe, "--format", "torch") as (address, *_):
        yield address


@pytest.fixture(scope="module")
def want(url) -> dict[str, np.ndarray]:
    """The server's own vectors (/embed) of the query and the documents."""
    status, vectors = post(url + "/embed", {"inputs": [QUERY, *DOCUMENTS]})
    assert status == 200
    return {"query": np.array(vectors[0]), "documents": np.array(vectors[1:])}


def _same(got, expected) -> None:
    got = np.array(got, dtype=np.float64)
    assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-5


def test_langchain_openai_embeddings_without_its_tiktoken_step(url, want):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model="pretrained", base_url=url + "/v1", api_key=KEYS[0], check_embedding_ctx_length=False, max_retries=0
    )
    _same(embeddings.embed_query(QUERY), want["query"])
    _same(embeddings.embed_documents(DOCUMENTS), want["documents"])


def test_llamaindex_text_embeddings_inference(url, want):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embeddings = TextEmbeddingsInference(model_name="pretrained", base_url=url, auth_token=KEYS[0])
    _same(embeddings.get_query_embedding(QUERY), want["query"])
    _same(embeddings.get_text_embedding_batch(DOCUMENTS), want["documents"])


def test_chromadb_huggingface_embedding_server(url, want, monkeypatch):
    from chromadb.utils.embedding_functions import HuggingFaceEmbeddingServer

    monkeypatch.setenv("BERTPIPE_API_KEY", KEYS[1])
    embed = HuggingFaceEmbeddingServer(url=url + "/embed", api_key_env_var="BERTPIPE_API_KEY")
    _same(embed.embed_query([QUERY])[0], want["query"])
    _same(embed(DOCUMENTS), want["documents"])


def test_haystack_openai_embedders_with_their_default_model_name_as_an_alias(url, want):
    from haystack import Document
    from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
    from haystack.utils import Secret

    key = Secret.from_token(KEYS[0])
    text = OpenAITextEmbedder(api_key=key, api_base_url=url + "/v1", max_retries=0)  # model: text-embedding-3-small
    answer = text.run(QUERY)
    _same(answer["embedding"], want["query"])
    assert answer["meta"]["model"] == "pretrained" and "unknown_tokens" in answer["meta"]["usage"]  # passed on
    documents = OpenAIDocumentEmbedder(api_key=key, api_base_url=url + "/v1", max_retries=0, progress_bar=False)
    embedded = documents.run([Document(content=d) for d in DOCUMENTS])["documents"]
    _same([d.embedding for d in embedded], want["documents"])


def test_tiktoken_ids_and_an_unknown_model_are_refused_through_the_openai_client(url):
    from openai import NotFoundError, OpenAI, UnprocessableEntityError

    client = OpenAI(base_url=url + "/v1", api_key=KEYS[0], max_retries=0)
    # LangChain's default body: "What is the time?" as tiktoken ids, which this vocabulary would misread
    with pytest.raises(UnprocessableEntityError, match="check_embedding_ctx_length=False"):
        client.embeddings.create(input=[[3923, 374, 279, 892, 30]], model="pretrained")
    with pytest.raises(NotFoundError) as caught:
        client.embeddings.create(input=QUERY, model="other-model")
    assert caught.value.code == "model_not_found" and "this server serves 'pretrained'" in caught.value.message
    assert [m.id for m in client.models.list()] == ["pretrained"]


def test_an_unreadable_text_is_answered_and_flagged_and_the_good_ones_beside_it_are_answered(url, want):
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key=KEYS[0], max_retries=0)
    answer = client.embeddings.create(input=[*DOCUMENTS, UNREADABLE], model="pretrained")
    assert [d.unreadable for d in answer.data] == [False, False, False, True]
    assert answer.data[3].unknown_tokens >= 1 and answer.usage.unknown_tokens == answer.data[3].unknown_tokens
    _same([d.embedding for d in answer.data[:3]], want["documents"])
    # TEI's bare answer says it in headers; ?details=true in the body as well
    status, headers, _ = call(url + "/embed", b'{"inputs": ["Rain.", "%s"]}' % UNREADABLE.encode())
    assert status == 200 and headers["x-bertpipe-unreadable"] == "1"
    assert headers["x-bertpipe-unknown-tokens"].split(",")[0] == "0"
    status, details = post(url + "/embed?details=true", {"inputs": ["Rain.", "🍕", "안녕하세요"]})
    assert details["unreadable"] == [False, True, True] and details["unknown_tokens"][0] == 0
    # the same vector for every unreadable text: why it is flagged
    assert np.abs(np.array(details["embeddings"][1]) - np.array(details["embeddings"][2])).max() < 1e-6
    page = call(url + "/metrics")[2].decode()
    assert 'bertpipe_unreadable_inputs_total{replica="main",kind="embed"}' in page
