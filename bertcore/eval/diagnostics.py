"""Checks of the path from pretraining to fine-tuning, for when a pretrained model does
no better than random weights: does fine-tuning start from exactly the exported weights,
does it tokenise text as pretraining did, are token types and masks laid out the same,
is the pooler trained or fresh, and how much of what pretraining learned survives
fine-tuning (held-out MLM accuracy of the fine-tuned encoder, read through the
pretrained MLM head). benchmarks/learning.py prints them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import safetensors.torch
import torch

from bertcore.eval.encoder import load_encoder, load_tokenizer, pooler_source


def encoder_start(model_dir: str) -> dict:
    """What fine-tuning starts from against the exported file: {"tensors", "max_abs_diff"
    (over the tensors both hold; 0.0 means bit-identical), "fresh": encoder tensors the
    file does not hold (initialised by the loader), "pooler": pretrained | fresh}."""
    exported = safetensors.torch.load_file(os.path.join(model_dir, "model.safetensors"))
    encoder = load_encoder(model_dir)
    diff, fresh, compared = 0.0, [], 0
    for name, tensor in encoder.state_dict().items():
        stored = exported.get(f"bert.{name}", exported.get(name))
        if stored is None:
            fresh.append(name)
            continue
        compared += 1
        diff = max(diff, float((tensor.float() - stored.float()).abs().max()))
    return {"tensors": compared, "max_abs_diff": diff, "fresh": fresh, "pooler": pooler_source(model_dir)}


def tokenizer_agreement(model_dir: str, vocab_dir: str, sentences: Sequence[str]) -> dict:
    """Share of sentences that the model folder's tokenizer (what fine-tuning loads) and
    the vocab stage's tokenizer (what the examples stage used) turn into the same ids."""
    from bertcore.vocab.tokenizer import load_tokenizer as load_vocab_tokenizer

    fine_tuning = load_tokenizer(model_dir)
    pretraining = load_vocab_tokenizer(vocab_dir)
    same = sum(fine_tuning(s)["input_ids"] == pretraining.encode(s).ids for s in sentences)
    return {
        "sentences": len(sentences),
        "identical": same,
        "share": same / len(sentences) if sentences else float("nan"),
    }


def pair_layout(model_dir: str, first: str, second: str) -> dict:
    """Token types and attention mask of a sentence pair as fine-tuning encodes it,
    against pretraining's layout ([CLS] A [SEP] B [SEP]: type 0 through the first [SEP],
    1 after; every real token attended)."""
    tokenizer = load_tokenizer(model_dir)
    encoded = tokenizer(first, second, return_token_type_ids=True)
    ids, types = encoded["input_ids"], encoded["token_type_ids"]
    b_start = ids.index(tokenizer.sep_token_id) + 1
    expected = [0] * b_start + [1] * (len(ids) - b_start)
    return {
        "starts_with_cls": ids[0] == tokenizer.cls_token_id,
        "ends_with_sep": ids[-1] == tokenizer.sep_token_id,
        "token_types_match": types == expected,
        "all_attended": all(encoded["attention_mask"]),
    }


@torch.no_grad()
def mlm_scores_of_encoder(
    model_dir: str, encoder_state: dict[str, torch.Tensor] | None, batches: Iterable[dict], max_batches: int = 20
) -> dict[str, float]:
    """Held-out MLM (and NSP) scores (accuracy, loss, perplexity) of the pretrained
    model with its encoder weights replaced by `encoder_state` (a transformers BertModel
    state dict, e.g. after fine-tuning; None keeps the pretrained ones). The MLM head
    stays the pretrained one."""
    from bertcore.eval.intrinsic import held_out_scores, load_pretraining_model

    model = load_pretraining_model(model_dir)
    if encoder_state is not None:
        own = model.state_dict()
        model.load_state_dict({**own, **{f"bert.{k}": v for k, v in encoder_state.items() if f"bert.{k}" in own}})
    return held_out_scores(model, batches, max_batches=max_batches)


def relative_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """||after - before|| / ||before|| over every floating-point tensor both hold."""
    num = den = 0.0
    for name, old in before.items():
        new = after.get(name)
        if new is None or not old.is_floating_point():
            continue
        num += float((new.float() - old.float()).pow(2).sum())
        den += float(old.float().pow(2).sum())
    return (num / den) ** 0.5 if den else float("nan")
