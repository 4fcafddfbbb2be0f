"""`bertpipe serve`: the models a run made, behind an HTTP endpoint on Ray Serve.

- `source`: what is served (a stage's model folder, or its ONNX export; a task head),
  found in the run root on the driver and fetched, sha256-checked, by each replica;
- `app`: the Ray Serve deployment: HTTP routing, the shared batch queue, metrics;
- `launch`: Ray, Serve's proxy on the chosen address, the replicas, a clean stop.

It may import the machinery at the top of pipelines/ (storage, manifests, the Ray runtime),
pipelines/export (where an export lives and what it holds) and bertcore's inference
component, where everything that needs no Ray lives: request checks, token-budget
batching, pooling, the model runtime, Prometheus text. No stage imports it, and it imports
no stage's package.
"""
