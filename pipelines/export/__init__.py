"""`bertpipe export`: where an export may write (`target`: a new folder, or one an earlier
export made; never a stage directory of any run root), the ONNX export itself with its
checks against PyTorch (`onnx`), and how it (and `bertpipe serve`) look up a stage's
complete output and the files its manifest lists (`outputs`).

It may import the machinery at the top of pipelines/ and bertcore's model and inference
code; no stage imports it, and it imports no stage's package.
"""
