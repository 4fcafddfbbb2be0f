"""The `serve:` config section: how `bertpipe serve` batches requests, what it accepts and
how much it queues. Imports neither torch nor Ray. What the model reads (its window
length, long inputs) comes from the run itself: the evaluate stage's `embeddings` settings
for embeddings, the task head's own for predictions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from bertcore.section import Section


class ServeConfig(Section):
    """`bertpipe serve`: adaptive batching (a token budget, a wait for the rest of a burst), request limits and
    backpressure, per server (per replica with Ray Serve)."""

    max_batch_tokens: int = Field(8192, ge=16)
    """Token budget of one model call: rows x the longest row (padding included). The requests a batch gathered are
    tokenized, sorted by length and cut into calls within the budget; one row longer than the budget runs alone."""
    max_batch_requests: int = Field(64, ge=1)
    """Most requests one batch gathers; 1 turns batching off (each request runs alone, as it comes)."""
    batch_wait_ms: float = Field(5.0, ge=0.0, le=10_000.0)
    """The longest a batch waits for the rest of a burst: only when the last batch was larger than what is queued now. A
    request that finds the model free and nothing else queued never waits; 0: never wait."""
    max_queued_texts: int = Field(1024, ge=1)
    """Most inputs waiting in the queue; a request that would pass it is refused at once with 429 and Retry-After, so
    accepted requests keep a bounded latency."""
    drain_timeout_s: float = Field(30.0, ge=0.0, le=3600.0)
    """On SIGTERM or Ctrl-C, the server stops taking requests and answers those it holds, for at most this long."""
    max_texts: int = Field(64, ge=1)
    """Most texts in one request; more is refused (413)."""
    max_text_bytes: int = Field(16_384, ge=16)
    """Most UTF-8 bytes of one text; more is refused (413). A body over max_texts x (max_text_bytes + 16) + 4 KiB is
    refused (413) before it is parsed."""
    max_ongoing_requests: int = Field(256, ge=1)
    """Ray Serve only: requests one replica holds at once (Ray Serve's max_ongoing_requests); more wait at its proxy. At
    least max_batch_requests, or batches never fill."""
    threads: int | None = Field(None, ge=1)
    """Compute threads of the model (ONNX Runtime intra-op threads, or torch's); with Ray Serve, per replica, also the
    CPUs each replica reserves in Ray. None: every core in-process; with Ray Serve, the cluster's CPUs divided among the
    replicas (at most one node's)."""
    top_k: int = Field(5, ge=1, le=100)
    """/fill-mask: predictions returned per [MASK] unless the request asks for another top_k."""
    accept_token_ids: bool = False
    """/v1/embeddings: take lists of token ids as input. Only ids from this model's own tokenizer (POST /tokenize)
    mean anything to it: ids from another tokenizer (tiktoken's, which LangChain's OpenAIEmbeddings sends unless
    check_embedding_ctx_length=False) would be read as this vocabulary's and give a wrong vector without an error.
    false (the default): a list of ids is refused (422) with a line that says so; true: accepted, and ids that
    already begin with [CLS] and end with [SEP] are not wrapped again."""
    model_aliases: list[str] = Field(default_factory=list)
    """Other names /v1/embeddings answers to in `model`, besides the served model's own (the one GET /v1/models
    lists: pretrained, student), e.g. the name a client has built in (Haystack's and LangChain's OpenAI embedders
    default to OpenAI's model names). Any other name gets 404 model_not_found, as OpenAI answers it; a request
    without `model` is answered by the served model."""
    unreadable: Literal["flag", "refuse"] = "flag"
    """A text that is nothing but unknown tokens (emoji, or a script the vocabulary never saw, each token [UNK]),
    whose vector would be the same for every such text. flag (the default): answered and flagged (unreadable: true
    beside its vector, its index in the x-bertpipe-unreadable header), so one unreadable document does not fail a
    batch of good ones; refuse: the request is refused with a 422 that names the text. Every answer gives each
    input's unknown-token count either way."""
    batching: Literal["auto", "on", "off"] = "auto"
    """Whether requests that wait together run as one batch. on: a batch takes up to max_batch_requests requests;
    off: each request runs alone; auto (the default): the server measures as it serves what a token costs in batches
    and alone (while more than one request waits), and batches only while batches measure cheaper, trying the other
    way with about 5% of the work. It starts alone: the model runs on the CPU, where padded batches of texts of mixed
    lengths measured dearer per text than the texts one at a time. The start line says the setting; GET /info the way
    chosen now and what each way measured."""

    @field_validator("batching", mode="before")
    @classmethod
    def _on_off(cls, value: object) -> object:
        """YAML reads a bare on or off as true or false: they mean the settings of those names."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value
