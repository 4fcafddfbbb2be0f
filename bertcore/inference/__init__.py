"""Inference: an exported model folder as a fused ONNX graph (fp32 and int8) for ONNX
Runtime, checked against PyTorch on held-out sentences (onnx.py, checks.py, export.py); and
what `bertpipe serve` does without HTTP or Ray: its config section (config.py), the route
families its clients speak (routes/: OpenAI, text-embeddings-inference, Hugging Face's
fill-mask), request checks (validate.py), adaptive batching with backpressure
(batcher.py) and whether batching pays (batch_choice.py), token-budget model calls
(batching.py), pooling (pooling.py), the engine that runs a batch of requests through the
model (engine.py) and the Prometheus page (prometheus.py).

May import: torch, onnx, onnxruntime (inside the functions that need them), and the model,
train and eval components. Must not import: ray, prefect, HTTP servers or frameworks, or
storage of any kind: the caller (pipelines/export/, pipelines/serve/) hands it local
folders, bytes and decoded JSON.
"""
