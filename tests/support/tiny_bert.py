"""A tiny Hugging Face BERT folder for tests: a WordPiece tokenizer trained in-process on
a few lines and a BertForPreTraining with seeded random weights, saved as the pretrain
stage's model/ folder holds them (tokenizer.json, config.json, model.safetensors)."""

from __future__ import annotations

from collections.abc import Sequence


def save_tiny_bert(
    folder,
    lines: Sequence[str],
    *,
    vocab_size: int,
    layers: int = 2,
    max_positions: int = 128,
    hidden: int = 32,
    words: Sequence[str] | None = None,
    modern: bool = False,
) -> str:
    """`words`: a fixed vocabulary of whole words (after the special tokens, in this order)
    instead of one trained on `lines`. The trainer breaks ties between equally frequent
    pieces by hash order, which differs from one process to the next, so a trained
    vocabulary (and what a model fine-tuned on it learns) can change between runs.
    `modern`: a ModernBertForMaskedLM of the modernbert family's shape instead (window 16)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import (
        BertConfig,
        BertForPreTraining,
        ModernBertConfig,
        ModernBertForMaskedLM,
        PreTrainedTokenizerFast,
    )

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if words is None:
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    else:
        vocab = {token: i for i, token in enumerate(dict.fromkeys([*specials, *words]))}
        tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if words is None:
        tokenizer.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer.decoder = decoders.WordPiece()
    # The generic fast class, with the special tokens named, as bertcore.vocab.tokenizer saves it.
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
    ).save_pretrained(folder)
    if modern:
        from bertcore.model.config import ModelConfig

        shape = ModelConfig.named(
            "tiny",
            tokenizer.get_vocab_size(),
            model_type="modernbert",
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=layers + 1,
            local_attention=16,
            max_position_embeddings=max_positions,
        )
        torch.manual_seed(0)
        ModernBertForMaskedLM(ModernBertConfig(**shape.to_hf_config_dict("mlm"))).save_pretrained(folder)
        return str(folder)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(0)
    BertForPreTraining(config).save_pretrained(folder)
    return str(folder)
