"""Inference: an exported model folder as an ONNX graph (fp32 and int8) for ONNX Runtime,
checked against PyTorch on held-out sentences (onnx.py, checks.py, export.py)."""
