"""Checkpoint -> the Hugging Face folder that `transformers` loads.

    config.json              the family's config (bertcore/model/families/): a BertConfig
                             (architectures: BertForPreTraining, or BertForMaskedLM for
                             objectives without NSP); a RobertaConfig of a RobertaForMaskedLM
                             for a roberta model; a ModernBertConfig of a ModernBertForMaskedLM
                             for a modernbert model
    model.safetensors        fp32 weights, tied matrices stored once (as save_pretrained does);
                             without NSP, neither the NSP head nor the pooler (which only NSP
                             trains), exactly what transformers' BertForMaskedLM holds; a
                             roberta model's under RobertaForMaskedLM's names (`roberta.*`,
                             `lm_head.*`), never with an NSP head (transformers has no
                             RoBERTa class that holds one); a modernbert model's under
                             ModernBertForMaskedLM's names, which are its own; an embedding
                             model (`sentence=`): the encoder alone (BertModel's names and
                             pooler, or ModernBertModel's), no head
    vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json
                             the vocab stage's files (model_max_length set to the longest
                             sequence the model's positions cover, so pipelines truncate where
                             it ends); a byte-level BPE's vocab.json and merges.txt instead of
                             vocab.txt

An embedding model (the student of a teacher without an MLM head, such as
all-MiniLM-L6-v2) is written as such a teacher is published: a BertModel
(config.json's architectures, unprefixed names, the pooler kept so that AutoModel loads it
with nothing missing or unexpected) and the sentence-transformers files
(bertcore/model/sentence_files.py).

`consolidate_checkpoint` turns one DeepSpeed checkpoint folder (checkpoints/step-NNNNNNN/,
any ZeRO stage, any number of ranks) into a full fp32 state dict with the family model's
names, which are transformers' names; `export_checkpoint` writes the folder from a state
dict. Neither needs a GPU or torch.distributed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Callable, Mapping

import safetensors.torch
import torch

from bertcore.errors import InputDataError
from bertcore.examples.vocab_tables import SpecialIds
from bertcore.model.config import ModelConfig
from bertcore.model.families import Head
from bertcore.model.hf_files import CONFIG_FILE, MODEL_DIR, WEIGHTS_FILE  # noqa: F401 - MODEL_DIR re-exported
from bertcore.model.sentence_files import SentenceLayout, write_layout
from bertcore.train.checkpoint import check_pickles, safe_load
from bertcore.train.optim import parameter_group_names
from bertcore.vocab.config import BPE_FILES, VOCAB_JSON
from bertcore.vocab.tokenizer import TOKENIZER_FILES, load_tokenizer, vocab_list

HF_FILES = (CONFIG_FILE, WEIGHTS_FILE, *TOKENIZER_FILES)
ROBERTA_HF_FILES = (CONFIG_FILE, WEIGHTS_FILE, *BPE_FILES)


def _expected_keys(
    model_config: ModelConfig, build: Callable[[], torch.nn.Module] | None = None
) -> tuple[list[str], list[list[str]]]:
    """(state-dict keys, parameter names per optimizer group) of the model (`build()`, by
    default the family's pretraining model), computed on the meta device (no memory, no
    initialisation cost)."""
    with torch.device("meta"):
        model = build() if build is not None else model_config.family.build(model_config)
    return list(model.state_dict()), parameter_group_names(model)


def consolidate_checkpoint(
    checkpoint_dir: str, model_config: ModelConfig, build: Callable[[], torch.nn.Module] | None = None
) -> dict[str, torch.Tensor]:
    """Full fp32 state dict (tied entries included) of a DeepSpeed checkpoint folder of the
    pretraining model of `model_config` (its family's), or of the module `build()` makes
    (e.g. a distillation student with its projections; called on the meta device).

    ZeRO 1-3 checkpoints keep the fp32 master weights partitioned in the optimizer files;
    DeepSpeed's zero_to_fp32 joins them. A stage-0 checkpoint holds the whole module; with
    bf16/fp16 its module weights are 16-bit copies, so the fp32 masters are taken from the
    optimizer wrapper's groups instead, in `parameter_groups` order.
    """
    checkpoint_dir = os.path.abspath(checkpoint_dir.rstrip("/"))
    if not os.path.isdir(checkpoint_dir):
        raise InputDataError(f"{checkpoint_dir}: no such checkpoint folder")
    names = os.listdir(checkpoint_dir)
    keys, groups = _expected_keys(model_config, build)
    check_pickles(checkpoint_dir)  # DeepSpeed's reader unpickles: only its own classes may be named
    if any("zero_pp_rank_" in n and n.endswith("optim_states.pt") for n in names):
        if not torch.cuda.is_available():  # what DeepSpeed would detect, said so it does not warn
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from bertcore.train.op_builds import import_deepspeed

        import_deepspeed()  # the lighter start-up (bertcore/train/op_builds.py)
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        # zero_to_fp32 prints what it reads, step by step, on stdout; the caller reports the result
        with contextlib.redirect_stdout(io.StringIO()):
            state = get_fp32_state_dict_from_zero_checkpoint(
                os.path.dirname(checkpoint_dir), tag=os.path.basename(checkpoint_dir)
            )
    elif "mp_rank_00_model_states.pt" in names:
        saved = safe_load(os.path.join(checkpoint_dir, "mp_rank_00_model_states.pt"))
        state = dict(saved["module"])
        optimizer = saved.get("optimizer") or {}
        masters = optimizer.get("fp32_groups") if isinstance(optimizer, dict) else None
        if masters is not None:
            if [len(g) for g in masters] != [len(g) for g in groups]:
                raise InputDataError(
                    f"{checkpoint_dir}: the optimizer's parameter groups do not match this model config"
                )
            for group_names, group_tensors in zip(groups, masters):
                for name, tensor in zip(group_names, group_tensors):
                    state[name] = tensor
    else:
        raise InputDataError(f"{checkpoint_dir}: not a DeepSpeed checkpoint (no model or optimizer states file)")
    state = {k: v.detach().to(torch.float32).cpu() for k, v in state.items()}
    for tied, source in model_config.family.tied.items():
        if source in state:
            state[tied] = state[source]
    missing, unexpected = sorted(set(keys) - set(state)), sorted(set(state) - set(keys))
    if missing or unexpected:
        raise InputDataError(
            f"{checkpoint_dir}: the checkpoint does not fit the model config (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    return {k: state[k] for k in keys}


def head_of(nsp: bool, sentence: SentenceLayout | None) -> Head:
    """What a folder holds: the encoder alone (an embedding model), the pretraining heads, or the masked-LM head."""
    if sentence is not None:
        if nsp:
            raise ValueError("an embedding model (sentence=) has no NSP head; export it with nsp=False")
        return "encoder"
    return "pretraining" if nsp else "mlm"


def export_checkpoint(
    state_dict: Mapping[str, torch.Tensor],
    model_config: ModelConfig,
    tokenizer_dir: str,
    out_dir: str,
    *,
    nsp: bool = True,
    sentence: SentenceLayout | None = None,
) -> list[str]:
    """Write the Hugging Face folder `out_dir` (created if missing) from a state dict with
    the family's model names, the model config and the vocab stage's folder; returns the file
    names written (relative to `out_dir`). Tied entries, if present, must equal the tensors
    they alias. The family (model_config.model_type) decides the architecture and the names
    (bertcore/model/families/): nsp=False (an objective without NSP) writes a BERT as a
    BertForMaskedLM, without NSP head and pooler; a RoBERTa is a RobertaForMaskedLM and a
    modern encoder a ModernBertForMaskedLM whatever `nsp` says. `sentence` writes an
    embedding model: the encoder alone (a BertModel with its pooler, a ModernBertModel) and
    the sentence-transformers files of that layout."""
    family = model_config.family
    head = head_of(nsp, sentence)
    try:
        family.architecture(head)  # a family may have no folder of this kind
    except InputDataError as exc:
        raise InputDataError(f"{out_dir}: {exc}") from None
    byte_level = os.path.isfile(os.path.join(tokenizer_dir, VOCAB_JSON))
    files = ROBERTA_HF_FILES if byte_level else HF_FILES
    for name in files[2:]:
        if not os.path.isfile(os.path.join(tokenizer_dir, name)):
            raise InputDataError(f"{tokenizer_dir}: {name} is missing; rerun the vocab stage")
    if family.vocab_layout not in (None, "roberta" if byte_level else "bert"):
        raise InputDataError(
            f"{tokenizer_dir}: a {'byte-level BPE' if byte_level else 'WordPiece'} vocabulary for a "
            f"{model_config.model_type} model; export with the vocabulary the model was trained with"
        )
    tokens = vocab_list(load_tokenizer(tokenizer_dir))
    # load_tokenizer also refuses a vocab.txt (vocab.json) that disagrees with tokenizer.json
    size = len(tokens)
    hf_config = model_config.to_hf_config_dict(head, SpecialIds.from_vocab(tokens))  # refuses pre-LN models
    if size != model_config.vocab_size:
        raise InputDataError(
            f"{tokenizer_dir}/{files[2]} has {size} entries but the model's vocab_size is {model_config.vocab_size}; "
            "export with the vocabulary the model was trained with"
        )
    tensors = {}
    for name, tensor in state_dict.items():
        if name in family.tied:
            source = state_dict.get(family.tied[name])
            if source is not None and not torch.equal(tensor, source):
                raise ValueError(f"{name} must equal {family.tied[name]} (they are one tied parameter)")
            continue
        if (saved := family.exported_name(name, head)) is not None:
            tensors[saved] = tensor.detach().cpu().contiguous()
    os.makedirs(out_dir, exist_ok=True)
    safetensors.torch.save_file(tensors, os.path.join(out_dir, WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(out_dir, CONFIG_FILE), "w", encoding="utf-8") as handle:
        json.dump(hf_config, handle, indent=2)
        handle.write("\n")
    for name in files[2:]:
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))
    config_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as handle:
        tokenizer_config = json.load(handle)
    tokenizer_config["model_max_length"] = model_config.max_sequence_length
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump(tokenizer_config, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    if sentence is None:
        return list(files)
    return [*files, *write_layout(out_dir, sentence, model_config.hidden_size, model_config.max_sequence_length)]
