"""The settings of a task whatever its kind, and the named choices the evaluate section
shares with the code that acts on them.

`TaskSettings` holds every field of a task in a recipe; bertcore/eval/config.py's
`TaskConfig` adds the check of its `type` against the registry of task kinds
(bertcore/eval/kinds/), which read these settings. This module sits below both, so a kind
can name the settings it reads without importing the registry that lists it.
"""

from __future__ import annotations

from typing import ClassVar, Literal, get_args

from pydantic import Field

from bertcore.section import DataFile, Encoding, Name, Section

FileFormat = Literal["tsv", "csv", "jsonl", "fasttext", "conll", "squad", "word_pairs"]
Split = Literal["train", "validation", "test"]
TASK_FILES: tuple[Split, ...] = get_args(Split)
"""TaskSettings' file fields, one per split."""
Pooling = Literal["pooler", "cls", "mean"]
"""How a sequence task turns hidden states into one vector."""
Combine = Literal["concat", "sum", "scalar_mix"]
"""How several chosen hidden states become one."""
TagScheme = Literal["IOB1", "IOB2", "BIO", "IOBES"]
"""Tagging schemes of CoNLL files (bertcore.eval.metrics.entity_scores reads them)."""
LongInputs = Literal["truncate", "windows", "whole"]
"""What happens to a text longer than max_seq_length (bertcore/eval/windows.py)."""
WindowPool = Literal["mean", "max", "first"]
"""How the pooled vectors of one input's windows become one."""


class InputLength(Section):
    """How long an input the encoder reads, and what happens to a longer one: the settings
    a task and the sentence-embedding check share (bertcore/eval/windows.py)."""

    max_seq_length: int = Field(128, ge=8)
    """Tokens per input (a task's text or pair, a sentence) including special tokens; longer inputs are truncated, or
    read in windows with `long_inputs: windows` (QA: always split into windows, by doc_stride)."""
    long_inputs: LongInputs = "truncate"
    """An input longer than max_seq_length is cut to it (truncate, BERT's way), or read as overlapping windows of
    max_seq_length tokens (windows: `[CLS] piece [SEP]` each, for a pair `[CLS] text_a [SEP] piece of text_b
    [SEP]`), whose pooled ([CLS] or mean) vectors `window_pool` combines (a task: before its head, in training and
    in scoring; classification and regression only), or read whole up to the model's own length (whole: a task's
    max_seq_length becomes the encoder's positions, 8,192 for the modern family; cut only beyond). The report counts
    the inputs longer than the window either way."""
    window_stride: int | None = Field(None, ge=1)
    """long_inputs windows: tokens between the starts of consecutive windows (as QA's doc_stride); None: half of a
    window's text, so each token is read twice. A stride longer than a window's text is shortened to it, so no token
    is skipped."""
    window_pool: WindowPool = "mean"
    """long_inputs windows: how the windows' pooled vectors become one: mean, max (element-wise) or first (the first
    window's alone, which reads what truncation reads)."""
    max_windows: int = Field(16, ge=1)
    """long_inputs windows: most windows read per input (memory grows with them); text past the last is cut, and the
    report counts the inputs cut."""


class TaskSettings(InputLength):
    """One task: its files, how to read them, and how to fine-tune on them."""

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("choices",)

    name: Name
    """Task name used in metrics, reports and random keys (sst2, mrpc, conll2003, squad)."""
    type: str
    """The task's kind, a name in the registry of bertcore/eval/kinds/ (config.TaskConfig checks it)."""
    train: DataFile | None = None
    """Training file (local path or fsspec URI; .gz/.bz2/.xz are decompressed); required except for word_similarity."""
    validation: DataFile | None = None
    """Validation file the metrics are computed on (word_similarity: the pairs file); if absent, set
    cross_validation_folds."""
    test: DataFile | None = None
    """Optional labelled test file, scored with the model fine-tuned on train."""
    format: FileFormat
    """tsv/csv/jsonl rows (GLUE files work as they are), fasttext (`__label__pos text` lines), conll (token per line,
    tag in the last column), squad (SQuAD v1.1/v2.0 JSON), word_pairs (`word1 word2 score` per line, tab or space
    separated, `#` starts a comment: wordsim353.tsv and simlex999.txt as gensim ships them)."""
    text_a: str | int = "sentence"
    """tsv/csv/jsonl: column of the (first) text, a header name or a 0-based index."""
    text_b: str | int | None = None
    """tsv/csv/jsonl: column of the second text of a pair (MRPC, MNLI, STS-B); None for single texts."""
    label_column: str | int = "label"
    """tsv/csv/jsonl: column of the label (classification) or score (regression)."""
    choices: list[str | int] | None = None
    """multiple_choice: the columns of the candidate answers, in order (SWAG: [ending0, ending1, ending2, ending3];
    COPA: [choice1, choice2]); every row offers that many, `text_a` is the context, `text_b` (optional) the start
    every candidate continues, and `label_column` the 0-based index of the right one."""
    labels: list[str] | None = None
    """Allowed labels (classification) or tags (token_classification), in output-index order; a row with any other
    label is malformed. None: the sorted set of labels in the training file."""
    positive_label: str | None = None
    """Binary classification: the label whose F1 is reported (MRPC, QQP: "1"); default the second entry of `labels`."""
    header: bool = True
    """tsv/csv: the first line names the columns (GLUE's CoLA files have none)."""
    encoding: Encoding = "utf-8"
    """Text encoding of the files (any ASCII-compatible codec Python knows: utf-8, cp1252, latin-1)."""
    cross_validation_folds: int | None = Field(None, ge=2)
    """Small data sets without a validation file: k-fold cross-validation on train (folds fixed per task, stratified
    for classification); metrics are the mean over folds."""
    seeds: list[int] = Field(default_factory=lambda: [1, 2, 3], min_length=1)
    """Fine-tuning seeds; each gives one run and the report shows the median and spread."""
    epochs: int = Field(3, ge=1)
    """Passes over the training data."""
    learning_rate: float = Field(2e-5, gt=0.0)
    """Peak AdamW learning rate (linear warm-up, then linear decay to zero)."""
    warmup_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of the optimizer steps spent warming up."""
    weight_decay: float = Field(0.01, ge=0.0)
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""
    batch_size: int = Field(32, ge=1)
    """Training examples (or QA windows) per optimizer step."""
    freeze_encoder: bool = False
    """Feature-based evaluation: keep the encoder's weights fixed and train only the task head (BERT paper, section
    5.3)."""
    freeze_layers: int = Field(0, ge=0)
    """Keep the embeddings and the lowest this many transformer layers fixed while fine-tuning the rest (0: train
    everything)."""
    layer_lr_decay: float = Field(1.0, gt=0.0, le=1.0)
    """Layer-wise learning-rate decay: layer l of L gets learning_rate x decay^(L + 1 - l), the embeddings decay^(L +
    1), the head learning_rate (Sun et al. 2019 use 0.95; 1.0: one rate for all)."""
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    """Dropout of the encoder (hidden and attention) and of the head while fine-tuning; None: the model's config.json
    values (BERT: 0.1)."""
    pooling: Pooling = "pooler"
    """classification/regression: pooler (BERT's tanh layer on [CLS], trained by next-sentence prediction when the
    checkpoint has one, else fresh), cls (the [CLS] hidden state) or mean (mean over the text's tokens, which suits
    small or briefly pretrained models whose [CLS] state barely varies)."""
    layers: list[int] | Literal["all"] = Field(default_factory=lambda: [-1])
    """Hidden states the head reads: 0 is the embedding output, k the output of layer k, negative counts from the end
    (-1 the last layer, [-4, -3, -2, -1] the last four), "all" every one. Combined by `combine`."""
    combine: Combine = "concat"
    """How several `layers` become one vector: concat, sum, or scalar_mix (a learned softmax-weighted sum, Peters et
    al. 2018); with freeze_encoder this is the BERT paper's feature-based comparison."""
    early_stopping_patience: int | None = Field(None, ge=1)
    """Early stopping: hold out `early_stopping_fraction` of the training data, score it after every epoch, stop after
    this many epochs without improvement and keep the best epoch's weights (None: train all `epochs`). The
    validation file is never used to choose."""
    early_stopping_fraction: float = Field(0.1, gt=0.0, lt=0.5)
    """Share of the training examples held out for early stopping (stratified by label for classification; fixed per
    task, fold and seed)."""
    word_vectors: Literal["input", "contextual"] = "contextual"
    """word_similarity: input (mean of the word's WordPiece rows of the input embedding matrix, which MLM training
    shapes through the tied output layer) or contextual (the word alone as `[CLS] word [SEP]`, mean over its pieces
    of the hidden states chosen by `layers`/`combine`)."""
    tag_scheme: TagScheme = "IOB2"
    """token_classification: how tags mark entities (IOB1 for the original CoNLL-2003 files, IOB2/BIO, IOBES); decides
    entity-level scoring."""
    doc_stride: int = Field(128, ge=1)
    """qa: tokens between the starts of consecutive context windows (Google's run_squad meaning; Hugging Face's
    `stride` is the overlap instead)."""
    max_query_length: int = Field(64, ge=1)
    """qa: questions longer than this many tokens are cut."""
    max_answer_length: int = Field(30, ge=1)
    """qa: longest answer span, in tokens, the decoder may predict."""
    n_best: int = Field(20, ge=1)
    """qa: start and end candidates per window considered when decoding spans."""
    version_2: bool = False
    """qa: SQuAD 2.0, questions may have no answer; the model predicts none when the null score beats the best span by
    more than `null_score_threshold`."""
    null_score_threshold: float = 0.0
    """qa, version_2: predict no answer when null score - best span score > this value."""
    on_error: Literal["raise", "skip"] = "raise"
    """raise: a malformed row stops with its file and line; skip: malformed rows are left out and counted."""
    train_fractions: list[float] = Field(default_factory=lambda: [1.0], min_length=1)
    """Learning curve: fine-tune on these shares of the training examples too, e.g. [0.01, 0.1, 1.0]: nested seeded
    subsets (the 1% inside the 10% inside the whole; stratified by label for classification, every label kept),
    drawn per run seed and task, the same for every model and fine-tuning seed. Each fraction runs every seed on
    every model; the report plots the primary metric over the fraction. The largest fraction gives the task's
    headline scores and verdict. With cross_validation_folds each fold's training part is subsampled and scored on
    its whole held-out fold."""
