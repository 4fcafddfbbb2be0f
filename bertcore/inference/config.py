"""The `serve:` config section: how `bertpipe serve` batches requests and what it accepts.
Imports neither torch nor Ray. What the model reads (its window length, long inputs) comes
from the run itself: the evaluate stage's `embeddings` settings for /embed, the task
head's own for /classify.
"""

from __future__ import annotations

from pydantic import Field

from bertcore.section import Section


class ServeConfig(Section):
    """`bertpipe serve`: dynamic batching (a token budget and a wait deadline) and request limits, per replica."""

    max_batch_tokens: int = Field(8192, ge=16)
    """Token budget of one model call: rows x the longest row (padding included). The requests a batch gathered are tokenized, sorted by length and cut into calls within the budget; one row longer than the budget runs alone."""
    max_batch_requests: int = Field(64, ge=1)
    """Most requests one batch gathers; 1 turns batching off (each request runs alone, as it comes)."""
    batch_wait_ms: float = Field(5.0, ge=0.0, le=10_000.0)
    """Deadline: how long the first request of a batch waits for others before the batch runs (it runs at once when max_batch_requests have come)."""
    max_texts: int = Field(64, ge=1)
    """Most texts in one request; more is refused (413)."""
    max_text_bytes: int = Field(16_384, ge=16)
    """Most UTF-8 bytes of one text; more is refused (413). A body over max_texts x (max_text_bytes + 16) + 4 KiB is refused before it is parsed."""
    max_ongoing_requests: int = Field(256, ge=1)
    """Requests one replica holds at once (Ray Serve's max_ongoing_requests); more wait at the proxy. At least max_batch_requests, or batches never fill."""
    threads: int | None = Field(None, ge=1)
    """Compute threads per replica (ONNX Runtime intra-op threads, or torch's), also the CPUs each replica reserves in Ray; None: the cluster's CPUs divided among the replicas (at most one node's)."""
    top_k: int = Field(5, ge=1, le=100)
    """/fill-mask: predictions returned per [MASK] unless the request asks for another top_k."""
