"""A run root written directly, as the stages leave it, for tests of what reads a finished
run (`bertpipe export`, `bertpipe serve`): corpus/ (one validation shard of real news
sentences), pretrain/model/ (a tiny BertForPreTraining, exported as the pretrain stage
exports) and eval/ (a fine-tuned task model as the evaluate stage keeps it, and with
`embedding_scores` its metrics.json), each with its manifest. Nothing is trained: the
weights are seeded random ones, far from their initial values."""

from __future__ import annotations

import json
import os

from pipelines.stage_dir import Manifest


def manifest(stage: str, shards, **extra) -> Manifest:
    return Manifest(
        stage=stage,
        code_version="test",
        fingerprint=f"{stage}-test-fp",
        inputs={},
        config={},
        shards=shards,
        stats={},
        timings={},
        **extra,
    )


def news_sentences(gensim_data) -> list[str]:
    lines = [line.strip() for line in open(gensim_data / "lee_background.cor", encoding="utf-8") if line.strip()]
    return [s.strip() + "." for line in lines[:60] for s in line.split(". ") if len(s) > 15]


def write_run_root(root: str, sentences: list[str], *, task: str | None, embedding_scores: dict | None = None) -> None:
    """corpus/, pretrain/model/ and, with `task`, eval/heads/pretrained/<task>.safetensors
    (a random two-label classification head, mean pooling, max_seq_length 48)."""
    import pyarrow as pa
    import torch

    from bertcore.config import StorageConfig
    from bertcore.eval import kinds
    from bertcore.eval.encoder import Features, TaskModel, load_encoder
    from bertcore.eval.heads import TaskHead, head_path, save_task_model
    from bertcore.model.bert import BertForPreTraining, ModelConfig
    from bertcore.train.export import HF_FILES, MODEL_DIR, export_checkpoint
    from bertcore.vocab.config import VocabConfig
    from bertcore.vocab.tokenizer import save_tokenizer, train_wordpiece
    from pipelines.shards import write_table
    from pipelines.stage_dir import StageDir
    from pipelines.storage import Storage, sha256_file

    storage = Storage(StorageConfig())
    corpus = StageDir(storage, root, "corpus")
    docs = [sentences[i : i + 10] for i in range(0, len(sentences), 10)]
    table = pa.table(
        {
            "doc_id": [f"d{i}" for i in range(len(docs))],
            "source": ["lee"] * len(docs),
            "title": [""] * len(docs),
            "sentences": docs,
        }
    )
    shard = corpus.publish("validation/part-00000.arrow", lambda path: write_table(path, table), rows=len(docs))
    corpus.write_manifest(manifest("corpus", [shard]), "")

    vocab_cfg = VocabConfig(vocab_size=400, min_frequency=1)
    vocab_dir = os.path.join(root, "vocab-files")
    save_tokenizer(train_wordpiece(sentences, vocab_cfg), vocab_cfg, vocab_dir, model_max_length=64)
    with open(os.path.join(vocab_dir, "vocab.txt"), encoding="utf-8") as handle:
        size = len(handle.read().rstrip("\n").split("\n"))
    model_cfg = ModelConfig(
        vocab_size=size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = BertForPreTraining(model_cfg, torch.Generator().manual_seed(0))
    with torch.no_grad():  # weights far from their initial zeros and ones
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    pretrain = StageDir(storage, root, "pretrain")
    export_checkpoint(model.state_dict(), model_cfg, vocab_dir, pretrain.path(MODEL_DIR))
    shards = [pretrain.publish_copy(f"{MODEL_DIR}/{n}", pretrain.path(f"{MODEL_DIR}/{n}"), rows=1) for n in HF_FILES]
    pretrain.write_manifest(manifest("pretrain", shards), "")

    if task is None:
        return
    # A task model as the evaluate stage keeps it (bertcore/eval/heads.py): the head is
    # random here, what reads it only has to reproduce it.
    model_dir = pretrain.path(MODEL_DIR)
    torch.manual_seed(2)
    task_model = TaskModel(load_encoder(model_dir), kinds.get("classification"), 2, features=Features(pooling="mean"))
    head = TaskHead(
        task=task,
        type="classification",
        labels=["neg", "pos"],
        num_outputs=2,
        layers=[-1],
        combine="concat",
        pooling="mean",
        seed=1,
        trained_on="test",
        encoder_sha256=sha256_file(os.path.join(model_dir, "model.safetensors")),
        max_seq_length=48,
    )
    evaluate = StageDir(storage, root, "eval")
    saved = [
        evaluate.publish(head_path("pretrained", task), lambda path: save_task_model(path, task_model, head), rows=0)
    ]
    if embedding_scores is not None:
        metrics = {
            "subject": "pretrained",
            "models": {"pretrained": {"uri": model_dir}},
            "embeddings": {"pretrained": embedding_scores},
        }
        saved.append(
            evaluate.publish(
                "metrics.json", lambda path: open(path, "w", encoding="utf-8").write(json.dumps(metrics)), rows=0
            )
        )
    evaluate.write_manifest(manifest("evaluate", saved), "")
