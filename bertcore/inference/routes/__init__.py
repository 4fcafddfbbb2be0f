"""The HTTP routes of `bertpipe serve`, one module per family of clients, each a tuple of
`Route`s that read a request's JSON into a Job and shape the Engine's answer back into
what those clients expect:

    tei.py       text-embeddings-inference: POST /embed, /, /predict, /tokenize
    openai.py    OpenAI: POST /v1/embeddings, GET /v1/models
    pipeline.py  the Hugging Face inference API's fill-mask: POST /fill-mask

`ROUTES` is the one registry (route.py: what a route is); the server (pipelines/serve/app.py) adds the service's own
GET /health, /metrics and /info. Pure functions of JSON values, the Offer and the Limits:
no HTTP library, no Ray.
"""

from __future__ import annotations

from bertcore.inference.routes import openai, pipeline, tei
from bertcore.inference.routes.route import Route, Work

__all__ = ["MOVED", "ROUTES", "Route", "Work"]

ROUTES: tuple[Route, ...] = (*tei.ROUTES, *openai.ROUTES, *pipeline.ROUTES)
MOVED = {"/classify": "/predict"}
"""Routes of earlier versions, and where their work is answered now (the 404 says so)."""
