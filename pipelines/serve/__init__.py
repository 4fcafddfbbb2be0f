"""`bertpipe serve`: the models a run made, behind HTTP routes the clients people already
have speak (OpenAI's, text-embeddings-inference's, Hugging Face's fill-mask).

- `source`: what is served (a stage's model folder, or its ONNX export; a task head),
  found in the run root on the driver and fetched, sha256-checked, where the model runs;
- `app`: the one ASGI app (Starlette): the route families of bertcore/inference/routes,
  /health /metrics /info, the body limit, the batcher, metrics;
- `keys`: API keys (Bearer), checked in front of the app;
- `launch`: the two modes: in-process (uvicorn, the default) or Ray Serve (`--replicas N`
  > 1 or `ray.address`), the start line, a draining stop;
- `replica`: the Ray Serve ingress deployment holding the same app, its metrics board.

It may import the machinery at the top of pipelines/ (storage, manifests, the Ray runtime),
pipelines/export (where an export lives and what it holds) and bertcore's inference
component, where everything that needs neither HTTP nor Ray lives: the route families,
request checks, batching, pooling, the model runtime, Prometheus text. Only replica.py and
launch.py import Ray. No stage imports it, and it imports no stage's package.
"""
