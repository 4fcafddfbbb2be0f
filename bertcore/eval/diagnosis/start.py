"""Forgetting and the starting point: does fine-tuning start from what pretraining made, how
much of it survives fine-tuning, and does starting there beat random weights.

- The path from pretraining (bertcore/eval/diagnostics.py): the encoder fine-tuning loads
  against the exported weights, the model folder's tokenizer against the vocab stage's (a
  run's own model only), the pair layout, and whether the pooler a task reads was trained.
- Forgetting: held-out MLM accuracy on the task's own evaluation texts (15% of each text's
  pieces masked, a keyed draw), read through the pretrained MLM head, of the pretrained
  encoder and of the encoder after the task's fine-tuning, and how far its weights moved.
  A model without an MLM head (an embedding model) has nothing to read it with.
- Pretrained against random init: the same verdict the evaluate stage gives
  (bertcore/eval/summary.py), over the diagnosis's seeds on its evaluation split.
"""

from __future__ import annotations

from collections.abc import Sequence

from bertcore import figures
from bertcore.eval.diagnosis.findings import Finding, not_applicable
from bertcore.rng import keyed_numpy

MASK_SHARE = 0.15
FORGOT = 0.5
"""Held-out MLM accuracy after fine-tuning below this share of before: forgetting."""


def mlm_batches(tokenizer, texts: Sequence[str], seed: int, max_length: int = 128, batch_size: int = 32) -> list[dict]:
    """Masked-LM batches of `texts` as bertcore.eval.intrinsic.held_out_scores reads them:
    MASK_SHARE of each text's non-special pieces (at least one) replaced by [MASK], drawn
    with a keyed RNG; no NSP targets."""
    import torch

    rng = keyed_numpy(seed, "diagnose", "mlm-mask")
    special = set(tokenizer.all_special_ids)
    rows = []
    for text in texts:
        ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
        candidates = [i for i, token in enumerate(ids) if token not in special]
        if not candidates:
            continue
        chosen = rng.choice(candidates, size=max(1, round(MASK_SHARE * len(candidates))), replace=False)
        labels = [-100] * len(ids)
        masked = list(ids)
        for position in chosen:
            labels[position] = ids[position]
            masked[position] = tokenizer.mask_token_id
        rows.append((masked, labels))
    batches = []
    pad = tokenizer.pad_token_id or 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (row_ids, row_labels) in enumerate(chunk):
            ids[row, : len(row_ids)] = torch.tensor(row_ids)
            labels[row, : len(row_labels)] = torch.tensor(row_labels)
            mask[row, : len(row_ids)] = 1
        batches.append(
            {
                "input_ids": ids,
                "token_type_ids": torch.zeros_like(ids),
                "attention_mask": mask,
                "labels": labels,
                "next_sentence_label": torch.full((len(chunk),), -100, dtype=torch.long),
            }
        )
    return batches


def forgetting(model_dir: str, fine_tuned_encoder: dict, batches: list[dict]) -> dict:
    """{"before", "after": held-out MLM accuracy, "masked_tokens", "weight_change"} of the
    pretrained encoder and the fine-tuned one (a BertModel state dict), both read through
    the pretrained MLM head."""
    from bertcore.eval.diagnostics import mlm_scores_of_encoder, relative_change
    from bertcore.eval.encoder import load_encoder

    before = mlm_scores_of_encoder(model_dir, None, batches, max_batches=len(batches))
    after = mlm_scores_of_encoder(model_dir, fine_tuned_encoder, batches, max_batches=len(batches))
    return {
        "before": before["mlm_accuracy"],
        "after": after["mlm_accuracy"],
        "masked_tokens": before["masked_tokens"],
        "weight_change": relative_change(load_encoder(model_dir).state_dict(), fine_tuned_encoder),
    }


def forgetting_finding(measured: dict | None, why_not: str, frozen: bool) -> Finding:
    if frozen:
        return Finding("forgetting", "ok", "the task freezes the encoder (freeze_encoder): it forgets nothing")
    if measured is None:
        return not_applicable("forgetting", why_not)
    before, after = measured["before"], measured["after"]
    text = (
        f"held-out MLM accuracy on the task's texts {figures.percent(before)} before fine-tuning, "
        f"{figures.percent(after)} after ({measured['masked_tokens']:,} masked pieces); the encoder's weights moved "
        f"{figures.percent(measured['weight_change'])}"
    )
    if before > 0.02 and after < FORGOT * before:
        return Finding(
            "forgetting",
            "warning",
            f"fine-tuning erased most of what pretraining learned: {text}",
            "lower learning_rate, set layer_lr_decay (0.9) or freeze_layers, or train fewer epochs",
            measured,
        )
    return Finding("forgetting", "ok", text, figures=measured)


def pipeline_checks(model_dir: str, vocab_dir: str | None, texts: Sequence[str]) -> dict:
    """The checks of bertcore/eval/diagnostics.py on `model_dir`, with `texts` for the
    tokenizer and the pair layout; the tokenizer check needs the run's vocab folder."""
    import os

    from bertcore.eval import diagnostics
    from bertcore.eval.encoder import pooler_source

    out: dict = {"pooler": pooler_source(model_dir)}
    if os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        out["encoder_start"] = diagnostics.encoder_start(model_dir)
    if vocab_dir is not None:
        out["tokenizer"] = diagnostics.tokenizer_agreement(model_dir, vocab_dir, list(texts))
    if len(texts) >= 2:
        out["pair_layout"] = diagnostics.pair_layout(model_dir, texts[0], texts[1])
    return out


def pipeline_finding(checks: dict, pooled: bool, pooling: str) -> Finding:
    """Problems on the way from pretraining to fine-tuning, or that there are none."""
    problems, fine = [], []
    start = checks.get("encoder_start")
    if start is not None:
        fresh = [name for name in start["fresh"] if not name.startswith("pooler.")]
        if start["max_abs_diff"] > 0 or fresh:
            problems.append(
                f"fine-tuning does not start from the exported weights (max |diff| {start['max_abs_diff']:.2g} over "
                f"{start['tensors']} tensors; fresh: {', '.join(fresh[:3]) or 'none'})"
            )
        else:
            fine.append(f"starts from the exported weights ({start['tensors']} tensors identical)")
    tokenizer = checks.get("tokenizer")
    if tokenizer is not None:
        if tokenizer["identical"] < tokenizer["sentences"]:
            problems.append(
                f"the model folder's tokenizer splits {tokenizer['sentences'] - tokenizer['identical']} of "
                f"{tokenizer['sentences']} task texts differently from the vocab stage's"
            )
        else:
            fine.append(f"tokenizes all {tokenizer['sentences']} task texts as pretraining did")
    layout = checks.get("pair_layout")
    if layout is not None:
        wrong = [name for name, ok in layout.items() if not ok]
        if wrong:
            problems.append(f"pair layout differs from pretraining's: {', '.join(wrong)}")
        else:
            fine.append("pairs laid out as in pretraining")
    reads_pooler = pooled and pooling == "pooler"
    warning = ""
    if checks["pooler"] == "fresh" and reads_pooler:
        warning = "the task reads the pooler (pooling: pooler), which this model never trained (fresh weights)"
    else:
        fine.append(f"pooler {checks['pooler']}" + ("" if reads_pooler else " (the task does not read it)"))
    if problems:
        return Finding(
            "pipeline",
            "problem",
            "; ".join(problems + ([warning] if warning else [])),
            "use the model folder the pretrain (or distill) stage exported, with its own tokenizer files",
            checks,
        )
    if warning:
        return Finding("pipeline", "warning", "; ".join([warning, *fine]), "set pooling: mean (or cls)", checks)
    return Finding("pipeline", "ok", "; ".join(fine), figures=checks)


def starting_point_finding(entry: dict, metric: str) -> Finding:
    """The pretrained model against random weights on the evaluation split (the evaluate stage's verdict)."""
    from bertcore.eval.summary import task_verdict

    verdict = task_verdict(entry)
    mine = entry["pretrained"]["validation"][metric]["median"]
    theirs = entry["random_init"]["validation"][metric]["median"]
    text = (
        f"pretrained {figures.metric(metric, mine)} against random init {figures.metric(metric, theirs)} "
        f"{figures.name(metric)}: {verdict['text']}"
    )
    figures_ = {"pretrained": mine, "random_init": theirs, "verdict": verdict}
    if verdict["measurable"]:
        return Finding("starting_point", "ok", text, figures=figures_)
    return Finding(
        "starting_point",
        "warning",
        text,
        "pretraining bought nothing measurable here: check the pipeline finding, pretrain longer, or start from a "
        "model pretrained on text like the task's",
        figures_,
    )
