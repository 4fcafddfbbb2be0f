"""The evaluate stage's Ray jobs (pipelines/stages/evaluate/work.py plans them, runs them and folds
their results into metrics): held-out MLM/NSP scores with the unigram and label-balance
floors, fill-mask examples, one fine-tuning seed of a task (keeping the model fine-tuned on
the whole training file when asked), sentence embeddings and STS, and the inference speed of
the models together. Each reads the models and task files through local copies, since
transformers and the task readers read local folders; messages name the original URIs.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import asdict, dataclass

import ray

from bertcore.errors import BertpipeError
from bertcore.eval import finetune
from bertcore.eval.config import EmbeddingsConfig, IntrinsicConfig, SpeedConfig, TaskConfig
from bertcore.eval.settings import TASK_FILES
from bertcore.examples.config import ExamplesConfig, PhaseConfig
from bertcore.rng import keyed_seed
from bertcore.train.shard_cache import CacheSpec, ShardRef
from pipelines.shards import local_copy, local_folder, read_batches
from pipelines.stage_dir import ShardInfo, StageDir
from pipelines.storage import Storage, is_local

# -- local copies -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """A model under evaluation: its name in metrics.json (pretrained; or teacher, student
    after distillation; random_init), the folder its encoder is read from (for random_init:
    the architecture's), the files read there, and whether its weights are fresh."""

    name: str
    uri: str
    files: tuple[str, ...]
    cache_key: str
    random_init: bool = False

    def local(self, storage: Storage) -> str:
        """A local folder with its files (the folder itself when it is local)."""
        return local_folder(storage, self.uri, list(self.files), self.cache_key)


def _local_file(storage: Storage, uri: str, file_keys: dict[str, str]) -> str:
    """A local path for a task or STS file. A local one is read where it is, under the
    name the recipe gave (local_copy would turn a file:// URI into a bare path); a remote
    one is cached per content, so an edited file is fetched again."""
    return uri if is_local(uri) else local_copy(storage, uri, f"eval-{file_keys[uri]}")


def local_task(task: TaskConfig, storage: Storage, file_keys: dict[str, str]) -> tuple[TaskConfig, dict[str, str]]:
    """The task with its files as local paths, and {local path: original URI} for messages."""
    uris = {split: getattr(task, split) for split in TASK_FILES if getattr(task, split) is not None}
    update = {split: _local_file(storage, uri, file_keys) for split, uri in uris.items()}
    return task.model_copy(update=update), {update[split]: uri for split, uri in uris.items()}


def original_paths(text: str, back: dict[str, str]) -> str:
    for local, uri in back.items():
        text = text.replace(local, uri)
    return text


def _threads(num_threads: int) -> None:
    import torch

    torch.set_num_threads(num_threads)


# -- Ray jobs -----------------------------------------------------------------------------------


UNIGRAM_ROWS = 200_000
"""Training sequences read to count token frequencies for the unigram MLM baseline."""


def _unigram_counts(storage: Storage, shard_uris: list[str], vocab: list[str]):
    """Token counts of the MLM targets of a phase's training shards (at most UNIGRAM_ROWS sequences)."""
    from bertcore.eval.baselines import target_counts

    specials = [i for i, token in enumerate(vocab) if token.startswith("[") and token.endswith("]")]
    batches = (batch for uri in shard_uris for batch in read_batches(storage, uri))
    return target_counts(batches, len(vocab), specials, max_rows=UNIGRAM_ROWS)


EVAL_WINDOW = 16
"""Validation shards the held-out scoring reads at a time (it stops after max_batches)."""


@ray.remote(max_retries=1)
def intrinsic_job(
    model: Model,
    shards: list[ShardRef],
    train_uris: list[str],
    phase: PhaseConfig,
    examples_cfg: ExamplesConfig,
    cfg: IntrinsicConfig,
    seed: int,
    storage: Storage,
    num_threads: int,
) -> dict:
    """MLM/NSP scores of one phase's validation shards, with the unigram and label-balance baselines."""
    from bertcore.eval.finetune import device
    from bertcore.eval.intrinsic import held_out_scores, load_pretraining_model
    from bertcore.examples.masking import VocabTables
    from bertcore.train.loader import ExamplesLoader
    from bertcore.vocab.config import entries_file
    from bertcore.vocab.tokenizer import read_entries

    _threads(num_threads)
    model_dir = model.local(storage)
    tokens = read_entries(os.path.join(model_dir, entries_file(os.listdir(model_dir))))
    model = load_pretraining_model(model_dir, random_init=model.random_init, seed=seed).to(device())
    mask_config = None
    if examples_cfg.masking == "dynamic":
        rate = cfg.masked_lm_prob or examples_cfg.masked_lm_prob
        if cfg.masked_lm_prob is not None:  # another rate than training's: its own quota, not the phase's cap
            cap = max(phase.max_predictions_per_seq, math.ceil(phase.max_seq_length * rate))
            phase = phase.model_copy(update={"max_predictions_per_seq": cap})
        mask_config = examples_cfg.model_copy(update={"masked_lm_prob": rate}).mask_config(
            phase, VocabTables.from_tokens(tokens)
        )
    # the shards come through a folder of this job's (remote ones downloaded, a window at a
    # time; every one hashed as it is read), removed when the job ends
    cache = CacheSpec(storage, tempfile.mkdtemp(prefix="bertpipe-eval-shards-"), 1 << 62).open("eval")
    loader = ExamplesLoader(
        shards,
        cfg.batch_size,
        cache=cache,
        window_shards=EVAL_WINDOW,
        seed=keyed_seed(seed, "evaluate", "intrinsic", phase.name)
        >> 1,  # the dynamic masks: fixed, the same for both models
        masking=examples_cfg.masking,
        mask_config=mask_config,
        pad_id=model.cfg.pad_token_id,
        token_types=model.cfg.type_vocab_size > 1,  # RoBERTa has one token type, the modern encoder none
        shuffle=False,
        even_batches=False,
        vocab_size=len(tokens),
    )
    counts = _unigram_counts(storage, train_uris, tokens) if train_uris else None
    try:
        scores = held_out_scores(model, loader, max_batches=cfg.max_batches, unigram_counts=counts)
    finally:
        cache.remove()
    if not _has_nsp_head(model_dir):  # e.g. a distilled student: its NSP head would be random, its scores noise
        scores = {k: v for k, v in scores.items() if not k.startswith("nsp_")}
        scores["baselines"] = {**scores["baselines"], "nsp_balance": None}
    unigram = scores["baselines"]["unigram"]
    if unigram:
        unigram["token"] = tokens[unigram["token_id"]]
    return scores


def _architectures(model_dir: str) -> tuple[list[str], str]:
    """config.json's architectures (BertForPreTraining when it names none, as the pretrain
    stage's first exports) and model_type."""
    import json

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as handle:
        data = json.load(handle)
    return data.get("architectures") or ["BertForPreTraining"], data.get("model_type", "bert")


def _holds(model_dir: str, *heads: str) -> bool:
    """Whether the folder's architecture is its family's (bertcore/model/families/) for one of `heads`."""
    from bertcore.model.families import FAMILIES

    architectures, model_type = _architectures(model_dir)
    family = FAMILIES.get(model_type)
    if family is None or (heads == ("pretraining",) and not family.nsp_head):
        return False
    return any(family.architecture(head) in architectures for head in heads)


def _has_nsp_head(model_dir: str) -> bool:
    """Whether the folder's model was exported with its next-sentence head (BertForPreTraining)."""
    return _holds(model_dir, "pretraining")


def has_mlm_head(model_dir: str) -> bool:
    """Whether the folder's model was exported with its masked-LM head (BertForPreTraining,
    BertForMaskedLM, RobertaForMaskedLM, ModernBertForMaskedLM), not as an encoder alone
    (BertModel, ModernBertModel: an embedding model)."""
    return _holds(model_dir, "pretraining", "mlm")


@ray.remote(max_retries=1)
def fill_mask_job(
    model: Model, sentences: list[str], count: int, seed: int, storage: Storage, num_threads: int
) -> list[dict]:
    """The pretrained model's top guesses for one masked word in each of a few held-out sentences."""
    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.intrinsic import fill_mask, load_pretraining_model

    _threads(num_threads)
    model_dir = model.local(storage)
    return fill_mask(load_pretraining_model(model_dir), load_tokenizer(model_dir), sentences, seed=seed, count=count)


@ray.remote(max_retries=1)
def finetune_job(
    task: TaskConfig,
    model: Model,
    tokenizer: Model,
    task_seed: int,
    storage: Storage,
    file_keys: dict[str, str],
    num_threads: int,
    keep_in: StageDir | None = None,
    fraction: float = 1.0,
    subset_seed: int = 0,
) -> dict:
    """One fine-tuning run (all folds of one seed, on `fraction` of the training examples,
    the subset drawn with `subset_seed`, the run seed); file names in messages are the
    task's URIs. `tokenizer`: the model whose folder holds the tokenizer files (every model
    shares the vocabulary). With `keep_in` (the stage directory), the model fine-tuned on
    the whole training file (or that fraction of it) is saved there for `bertpipe export
    --task`; the result's "saved" is its shard record."""
    model_dir = model.local(storage)
    local, back = local_task(task, storage, file_keys)
    kept: list | None = [] if keep_in is not None else None
    try:
        result = finetune.run_task(
            local,
            model_dir,
            tokenizer.local(storage),
            task_seed,
            random_init=model.random_init,
            num_threads=num_threads,
            keep=kept,
            fraction=fraction,
            subset_seed=subset_seed,
        )
    except BertpipeError as exc:
        raise type(exc)(original_paths(str(exc), back)) from None
    result["skipped_problems"] = [original_paths(p, back) for p in result["skipped_problems"]]
    if kept:
        result["saved"] = asdict(_save_task_model(keep_in, task, model.name, kept[0], model_dir, task_seed, result))
    return result


def _save_task_model(
    stage: StageDir, task: TaskConfig, name: str, model, model_dir: str, seed: int, result: dict
) -> ShardInfo:
    """heads/<name>/<task>.safetensors (name: pretrained, or student): the fine-tuned model
    and what export needs to know of it."""
    from bertcore.eval.heads import TaskHead, head_path, save_task_model
    from bertcore.train.export import WEIGHTS_FILE
    from pipelines.storage import sha256_file

    head = TaskHead(
        task=task.name,
        type=task.type,
        labels=list(result["labels"]),
        num_outputs=model.head.out_features,
        layers=task.layers if isinstance(task.layers, str) else list(task.layers),
        combine=task.combine,
        pooling=task.pooling,
        seed=seed,
        trained_on=_trained_on(result),
        encoder_sha256=sha256_file(os.path.join(model_dir, WEIGHTS_FILE)),
        max_seq_length=task.max_seq_length,
        long_inputs={
            "window_stride": task.window_stride,
            "window_pool": task.window_pool,
            "max_windows": task.max_windows,
        }
        if task.long_inputs == "windows"
        else None,
        pairs=task.text_b is not None,
    )
    return stage.publish(head_path(name, task.name), lambda path: save_task_model(path, model, head), rows=0)


def _trained_on(result: dict) -> str:
    """What the kept model was fine-tuned on, in words."""
    whole = result["train_examples"]
    if result.get("fraction", 1.0) >= 1.0:
        return f"the whole training file ({whole} examples)"
    from bertcore.eval.fractions import subset_size

    return (
        f"a seeded {result['fraction']:g} of the training file ({subset_size(result['fraction'], whole)} of "
        f"{whole} examples)"
    )


@ray.remote(max_retries=1)
def embeddings_job(
    model: Model,
    tokenizer: Model,
    sentences: list[str],
    cfg: EmbeddingsConfig,
    seed: int,
    storage: Storage,
    file_keys: dict[str, str],
    num_threads: int,
) -> dict:
    """Anisotropy (and STS Spearman) for [CLS] and mean pooling, and how many of the
    sentences were longer than the window."""
    from bertcore.eval.embeddings import embedding_report, read_sts
    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.windows import Windowing, long_input_counts

    pairs, skipped, problems = None, 0, []
    if cfg.sts is not None:
        path = _local_file(storage, cfg.sts.file, file_keys)
        try:
            read = read_sts(cfg.sts, path)
        except BertpipeError as exc:
            raise type(exc)(original_paths(str(exc), {path: cfg.sts.file})) from None
        pairs, skipped = read.examples, read.skipped
        problems = [original_paths(p, {path: cfg.sts.file}) for p in read.problems]
    tokenizer_dir = tokenizer.local(storage)
    scores = embedding_report(
        model.local(storage),
        tokenizer_dir,
        sentences,
        seed=seed,
        sts_pairs=pairs,
        num_pairs=cfg.num_pairs,
        max_seq_length=cfg.max_seq_length,
        random_init=model.random_init,
        num_threads=num_threads,
        windowing=Windowing.of(cfg),
    )
    texts = list(sentences) + [text for p in pairs or [] for text in (p.text_a, p.text_b or "")]
    long_inputs = {
        "mode": cfg.long_inputs,
        "max_seq_length": cfg.max_seq_length,
        **long_input_counts(load_tokenizer(tokenizer_dir), texts, None, cfg),
    }
    return {
        "scores": scores,
        "sts_pairs": len(pairs or []),
        "skipped": skipped,
        "skipped_problems": problems,
        "long_inputs": long_inputs,
    }


@ray.remote(max_retries=1)
def speed_job(models: list[Model], cfg: SpeedConfig, seed: int, storage: Storage, num_threads: int) -> dict:
    """Sequences/s of each model's encoder forward, measured together (bertcore/eval/speed.py)."""
    from bertcore.eval.speed import measure

    folders = {m.name: (m.local(storage), m.random_init) for m in models}
    return measure(
        folders,
        batch_size=cfg.batch_size,
        seq_length=cfg.max_seq_length,
        passes=cfg.passes,
        seed=seed,
        threads=num_threads,
    )
