"""Held-out pretraining scores of an exported model: masked-LM loss, perplexity and
accuracy, and next-sentence (or sentence-order) accuracy, on batches of the examples
stage's validation sequences, each beside what learning nothing scores (the unigram
predictor, the NSP label balance; bertcore.eval.baselines); and fill-mask predictions on
held-out sentences, for the report.

The model is bertcore's own of the folder's family (bertcore/model/families/: BERT's
BertForPreTraining, the modern encoder's ModernBertForMaskedLM) loaded from the Hugging
Face folder the pretrain stage exports (same parameter names), so the MLM head runs on the
masked positions only, not on every token. The baseline is the same architecture with
seeded fresh weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import safetensors.torch
import torch
from torch import nn

from bertcore.errors import ConfigError, InputDataError
from bertcore.eval.baselines import UnigramMeter, nsp_balance
from bertcore.eval.config import IntrinsicConfig
from bertcore.eval.metrics import PretrainingMeter
from bertcore.examples.config import ExamplesConfig, PhaseConfig
from bertcore.model.config import IGNORE_INDEX, ModelConfig
from bertcore.model.folder import read_config
from bertcore.model.pretrained import canonical_names, load_into
from bertcore.rng import keyed_numpy, keyed_seed


def model_config_of(model_dir: str) -> ModelConfig:
    """The ModelConfig recorded in `model_dir`/config.json, through its family (keys transformers adds are ignored)."""
    return read_config(model_dir, "evaluate")


def load_pretraining_model(model_dir: str, *, random_init: bool = False, seed: int = 0) -> nn.Module:
    """The model in `model_dir` (config.json + model.safetensors) as its family's
    pretraining model, in eval mode; with random_init, the same architecture with fresh
    weights drawn from (seed, "random-init")."""
    cfg = model_config_of(model_dir)
    generator = torch.Generator().manual_seed(keyed_seed(seed, "random-init") >> 1)
    model = cfg.family.build(cfg, generator)  # a private generator: the global RNG is left alone
    if not random_init:
        path = os.path.join(model_dir, "model.safetensors")
        try:
            state = safetensors.torch.load_file(path)
        except (OSError, safetensors.SafetensorError) as exc:
            raise InputDataError(f"{path}: cannot read the weights ({exc})") from None
        # a masked-LM export has no NSP head or pooler: those stay seeded
        load_into(model, canonical_names(state, cfg.family), where=path)
    return model.eval()


def phases_to_score(
    cfg: IntrinsicConfig, examples_cfg: ExamplesConfig, trained: Sequence[str], max_positions: int, notes: list[str]
) -> list[PhaseConfig]:
    """The examples phases to score: `cfg.phases`, else those the pretrain stage trained
    on (`trained`), else all; a phase longer than the model's positions is left out with
    a note."""
    available = [p.name for p in examples_cfg.phases]
    wanted = cfg.phases
    if wanted is not None:
        unknown = [p for p in wanted if p not in available]
        if unknown:
            raise ConfigError(f"evaluate.intrinsic.phases: {unknown} are not examples phases (have {available})")
    else:
        wanted = [p for p in available if p in trained] or available
    phases = []
    for name in wanted:
        phase = examples_cfg.phase(name)
        if phase.max_seq_length > max_positions:
            notes.append(
                f"intrinsic: phase {name} ({phase.max_seq_length} tokens) is longer than the model's "
                f"{max_positions} positions; left out"
            )
        else:
            phases.append(phase)
    return phases


@torch.no_grad()
def held_out_scores(
    model: nn.Module, batches: Iterable[dict], *, max_batches: int | None = None, unigram_counts=None
) -> dict:
    """MLM loss (mean over masked tokens), perplexity exp(loss) and accuracy, NSP loss and
    accuracy where the batches carry NSP labels, and the counts behind them. Beside them,
    "baselines": {"unigram": the unigram predictor of `unigram_counts` (training token
    counts, (V,)) on the same targets, "nsp_balance": the held-out label shares}.

    batches: dicts as `bertcore.train.loader.ExamplesLoader` yields them (input_ids,
    token_type_ids, attention_mask (B, T); labels (B, T) with -100 where nothing is
    predicted; next_sentence_label (B,) with -100 where there is no NSP target)."""
    model.eval()
    where = next(model.parameters()).device
    meter = PretrainingMeter()
    unigram = UnigramMeter(unigram_counts) if unigram_counts is not None else None
    nsp_labels = {0: 0, 1: 0}
    sequences = count = 0
    for batch in batches:
        if max_batches is not None and count >= max_batches:
            break
        batch = {k: v.to(where) for k, v in batch.items()}
        sequence = model.encode(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])  # (B, T, H)
        selected = batch["labels"] != IGNORE_INDEX  # (B, T)
        mlm_logits = model.mlm_logits(sequence[selected])  # (M, V)
        nsp_logits = model.nsp_logits(sequence)  # (B, 2), None without a next-sentence head
        meter.update(mlm_logits, batch["labels"][selected], nsp_logits, batch["next_sentence_label"])
        if unigram is not None:
            unigram.update(batch["labels"][selected].cpu().numpy())
        for label in (0, 1):
            nsp_labels[label] += int((batch["next_sentence_label"] == label).sum())
        sequences += batch["input_ids"].shape[0]
        count += 1
    baselines = {"unigram": unigram.result() if unigram is not None else None, "nsp_balance": nsp_balance(nsp_labels)}
    return {
        **meter.result(),
        "sequences": sequences,
        "batches": count,
        "masked_tokens": meter.mlm_count,
        "baselines": baselines,
    }


def _maskable(tokens: Sequence[str], specials: set[str]) -> list[int]:
    """Positions of whole words of three or more letters (one piece, not continued by a
    ## piece; in a byte-level BPE, a `Ġ` piece followed by another word's start): the
    words a reader can judge a guess for."""
    byte_level = any(t.startswith("\u0120") for t in tokens)

    def starts_word(token: str) -> bool:
        return token in specials or (token.startswith("\u0120") if byte_level else not token.startswith("##"))

    out = []
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        word = token.removeprefix("\u0120") if byte_level else token
        if (
            token not in specials
            and starts_word(token)
            and (following is None or starts_word(following))
            and word.isalpha()
            and len(word) >= 3
        ):
            out.append(i)
    return out


@torch.no_grad()
def fill_mask(
    model: nn.Module,
    tokenizer,
    sentences: Sequence[str],
    *,
    seed: int,
    count: int = 5,
    top_k: int = 5,
    max_length: int = 64,
) -> list[dict]:
    """Up to `count` held-out sentences with one word replaced by [MASK] (a keyed random
    choice among whole words of 3+ letters) and the model's `top_k` guesses:
    [{"text", "answer", "predictions": [[token, probability], ...], "answer_rank"
    (1-based, None beyond top_k)}]. tokenizer: a transformers fast tokenizer."""
    model.eval()
    rng = keyed_numpy(seed, "evaluate", "fill-mask")
    specials = set(tokenizer.all_special_tokens)
    out = []
    for index in rng.permutation(len(sentences)):
        if len(out) >= count:
            break
        encoded = tokenizer(
            sentences[index], truncation=True, max_length=max_length, return_tensors="pt", return_token_type_ids=True
        )
        ids = encoded["input_ids"][0]
        tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
        candidates = _maskable(tokens, specials)
        if len(candidates) < 2 or len(tokens) < 8:
            continue
        position = int(candidates[rng.integers(len(candidates))])
        answer = tokens[position]
        ids[position] = tokenizer.mask_token_id
        logits = model.full_logits(
            ids[None], encoded["token_type_ids"], encoded["attention_mask"]
        ).prediction_logits  # (1, T, V)
        probabilities = torch.softmax(logits[0, position].float(), dim=-1)
        top = torch.topk(probabilities, top_k)
        guesses = tokenizer.convert_ids_to_tokens(top.indices.tolist())
        if answer.startswith("\u0120"):  # a byte-level piece carries the space before it: the mask gets it back
            text = (
                f"{tokenizer.convert_tokens_to_string(tokens[1:position])} "
                f"{tokenizer.mask_token}{tokenizer.convert_tokens_to_string(tokens[position + 1 : -1])}"
            )
        else:
            shown = tokens[1:-1]
            shown[position - 1] = tokenizer.mask_token
            text = tokenizer.convert_tokens_to_string(shown)
        out.append(
            {
                "text": text,
                "answer": answer,
                "predictions": [[g, round(float(p), 4)] for g, p in zip(guesses, top.values.tolist())],
                "answer_rank": guesses.index(answer) + 1 if answer in guesses else None,
            }
        )
    return out
