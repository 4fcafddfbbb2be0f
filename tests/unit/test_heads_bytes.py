"""A fine-tuned head's file has the same bytes in every run: safetensors writes its metadata
from a hash map whose order changes from process to process, so the header is sorted."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SAVE = r"""
import sys, torch
from bertcore.eval.heads import TaskHead, save_task_model

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(4, 2)

head = TaskHead(task="polarity", type="classification", labels=["neg", "pos"], num_outputs=2, layers=[-1],
                combine="mean", pooling="cls", seed=1, trained_on="the whole training file (8 examples)",
                encoder_sha256="ab" * 32, max_seq_length=64)
save_task_model(sys.argv[1], Model(), head)
"""


def test_the_same_head_saved_in_two_processes_has_the_same_bytes(tmp_path):
    digests = set()
    for i in range(6):  # each process seeds its hash maps anew (two keys: 1 in 32 that six agree by chance)
        path = tmp_path / f"head-{i}.safetensors"
        subprocess.run([sys.executable, "-c", SAVE, str(path)], check=True, cwd=ROOT, timeout=120)
        digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
    assert len(digests) == 1

    from safetensors.torch import load_file

    from bertcore.eval.heads import read_head

    assert read_head(str(path)).labels == ["neg", "pos"]
    assert set(load_file(str(path))) == {"head.weight", "head.bias"}
