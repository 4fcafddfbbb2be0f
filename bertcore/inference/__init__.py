"""Inference: an exported model folder as an ONNX graph (fp32 and int8) for ONNX Runtime,
checked against PyTorch on held-out sentences (onnx.py, checks.py, export.py).

May import: torch, onnx, onnxruntime (inside the functions that need them), and the model,
train and eval components. Must not import: ray, prefect, or storage of any kind: the
caller (pipelines/export/) hands it local folders.
"""
