"""Inference speed of the models an evaluation compares (teacher, student, random init),
measured where the evaluation runs: the encoder forward (transformers' AutoModel, eval
mode, no gradient) on the same batches of token ids, the same torch threads, every model
in one process, interleaved pass by pass so a change of load on the machine reaches all
of them alike. A small timing for the report's "at 2.3x its speed", not a benchmark: the
serving benchmark is benchmarks/inference.py.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

import torch

from bertcore.eval.encoder import load_encoder
from bertcore.rng import keyed_seed


@torch.inference_mode()
def measure(
    models: Mapping[str, tuple[str, bool]], *, batch_size: int, seq_length: int, passes: int, seed: int, threads: int
) -> dict[str, dict]:
    """{name: {"sequences_per_s", "seconds_per_batch", "passes", "batch_size", "seq_length",
    "threads"}} for `models` ({name: (model folder, random_init)}): `passes` timed forward
    passes per model after one warm-up pass, the median taken. The batch is random ids of
    the first model's vocabulary (all models share it), every position a real token."""
    torch.set_num_threads(threads)
    encoders = {}
    for name, (folder, random_init) in models.items():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(keyed_seed(seed, "speed", name))
            encoders[name] = load_encoder(folder, random_init=random_init).eval()
    vocab = min(e.config.vocab_size for e in encoders.values())
    generator = torch.Generator().manual_seed(keyed_seed(seed, "speed", "batch"))
    ids = torch.randint(
        5, vocab, (batch_size, seq_length), generator=generator
    )  # ids below 5: specials in either layout
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    seconds: dict[str, list[float]] = {name: [] for name in encoders}
    for encoder in encoders.values():  # warm-up: allocations, kernel choice
        encoder(**inputs)
    for _ in range(passes):
        for name, encoder in encoders.items():
            start = time.perf_counter()
            encoder(**inputs)
            seconds[name].append(time.perf_counter() - start)
    out = {}
    for name, times in seconds.items():
        median = statistics.median(times)
        out[name] = {
            "sequences_per_s": batch_size / median,
            "seconds_per_batch": median,
            "passes": passes,
            "batch_size": batch_size,
            "seq_length": seq_length,
            "threads": threads,
        }
    return out
