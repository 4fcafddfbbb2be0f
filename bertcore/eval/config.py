"""The `evaluate:` section of a run recipe: what the evaluate stage measures on the
pretrained model and how, including each fine-tuning task (`TaskConfig`).

File URIs of tasks (and of the STS file) may use the `{demo_data}` and `{korean_data}`
placeholders of corpus inputs; they are expanded when the section is validated, so a
recipe, a `--set` override and a Prefect form all get the same paths.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from bertcore.section import DataFile, Encoding, Name, Section

TaskType = Literal["classification", "regression", "token_classification", "qa", "word_similarity"]
FileFormat = Literal["tsv", "csv", "jsonl", "fasttext", "conll", "squad", "word_pairs"]
Split = Literal["train", "validation", "test"]
TASK_FILES: tuple[Split, ...] = get_args(Split)
"""TaskConfig's file fields, one per split."""

_FORMATS_OF: dict[str, tuple[str, ...]] = {
    "classification": ("tsv", "csv", "jsonl", "fasttext"),
    "regression": ("tsv", "csv", "jsonl"),
    "token_classification": ("conll",),
    "qa": ("squad",),
    "word_similarity": ("word_pairs",),
}
Pooling = Literal["pooler", "cls", "mean"]
"""How a sequence task turns hidden states into one vector."""
Combine = Literal["concat", "sum", "scalar_mix"]
"""How several chosen hidden states become one."""
PRIMARY_METRIC = {"classification": "accuracy", "regression": "spearman", "token_classification": "f1", "qa": "f1", "word_similarity": "spearman"}
"""The score a task is ranked by (GLUE/CoNLL/SQuAD conventions), chosen on by early stopping and judged by the report's verdict."""
TRAINED_TYPES = ("classification", "regression", "token_classification", "qa")
"""Task types that fine-tune a model; word_similarity only reads the encoder."""
TagScheme = Literal["IOB1", "IOB2", "BIO", "IOBES"]
"""Tagging schemes of CoNLL files (bertcore.eval.metrics.entity_scores reads them)."""
LongInputs = Literal["truncate", "windows"]
"""What happens to a text longer than max_seq_length (bertcore/eval/windows.py)."""
WindowPool = Literal["mean", "max", "first"]
"""How the pooled vectors of one input's windows become one."""
WINDOWED_TYPES = ("classification", "regression")
"""Task types that can read long inputs in windows (QA always does, by doc_stride)."""


class TaskConfig(Section):
    """One fine-tuning task: its files, how to read them, and how to fine-tune on them."""

    name: Name
    """Task name used in metrics, reports and random keys (sst2, mrpc, conll2003, squad)."""
    type: TaskType
    """classification (one label per text or text pair), regression (one number per text or pair, e.g. STS-B), token_classification (one tag per word, e.g. NER), qa (extractive answer spans, SQuAD), word_similarity (word pairs with human similarity scores, e.g. WordSim-353, SimLex-999: Spearman correlation of the cosine of the encoder's word vectors; nothing is trained)."""
    train: DataFile | None = None
    """Training file (local path or fsspec URI; .gz/.bz2/.xz are decompressed); required except for word_similarity."""
    validation: DataFile | None = None
    """Validation file the metrics are computed on (word_similarity: the pairs file); if absent, set cross_validation_folds."""
    test: DataFile | None = None
    """Optional labelled test file, scored with the model fine-tuned on train."""
    format: FileFormat
    """tsv/csv/jsonl rows (GLUE files work as they are), fasttext (`__label__pos text` lines), conll (token per line, tag in the last column), squad (SQuAD v1.1/v2.0 JSON), word_pairs (`word1 word2 score` per line, tab or space separated, `#` starts a comment: wordsim353.tsv and simlex999.txt as gensim ships them)."""
    text_a: str | int = "sentence"
    """tsv/csv/jsonl: column of the (first) text, a header name or a 0-based index."""
    text_b: str | int | None = None
    """tsv/csv/jsonl: column of the second text of a pair (MRPC, MNLI, STS-B); None for single texts."""
    label_column: str | int = "label"
    """tsv/csv/jsonl: column of the label (classification) or score (regression)."""
    labels: list[str] | None = None
    """Allowed labels (classification) or tags (token_classification), in output-index order; a row with any other label is malformed. None: the sorted set of labels in the training file."""
    positive_label: str | None = None
    """Binary classification: the label whose F1 is reported (MRPC, QQP: "1"); default the second entry of `labels`."""
    header: bool = True
    """tsv/csv: the first line names the columns (GLUE's CoLA files have none)."""
    encoding: Encoding = "utf-8"
    """Text encoding of the files (any ASCII-compatible codec Python knows: utf-8, cp1252, latin-1)."""
    cross_validation_folds: int | None = Field(None, ge=2)
    """Small data sets without a validation file: k-fold cross-validation on train (folds fixed per task, stratified for classification); metrics are the mean over folds."""
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
    max_seq_length: int = Field(128, ge=8)
    """Tokens per input including special tokens; longer inputs are truncated, or read in windows with `long_inputs: windows` (QA: always split into windows)."""
    long_inputs: LongInputs = "truncate"
    """classification/regression: an input longer than max_seq_length is cut to it (truncate, BERT's way), or read as overlapping windows of max_seq_length tokens (windows: `[CLS] piece [SEP]` each, for a pair `[CLS] text_a [SEP] piece of text_b [SEP]`), whose pooled vectors `window_pool` combines before the head, in training and in scoring. The report counts the inputs longer than the window either way."""
    window_stride: int | None = Field(None, ge=1)
    """long_inputs windows: tokens between the starts of consecutive windows (as QA's doc_stride); None: half of a window's text, so each token is read twice. A stride longer than a window's text is shortened to it, so no token is skipped."""
    window_pool: WindowPool = "mean"
    """long_inputs windows: how the windows' pooled vectors become one: mean, max (element-wise) or first (the first window's alone, which reads what truncation reads)."""
    max_windows: int = Field(16, ge=1)
    """long_inputs windows: most windows read per input (memory grows with them); text past the last is cut, and the report counts the inputs cut."""
    freeze_encoder: bool = False
    """Feature-based evaluation: keep the encoder's weights fixed and train only the task head (BERT paper, section 5.3)."""
    freeze_layers: int = Field(0, ge=0)
    """Keep the embeddings and the lowest this many transformer layers fixed while fine-tuning the rest (0: train everything)."""
    layer_lr_decay: float = Field(1.0, gt=0.0, le=1.0)
    """Layer-wise learning-rate decay: layer l of L gets learning_rate x decay^(L + 1 - l), the embeddings decay^(L + 1), the head learning_rate (Sun et al. 2019 use 0.95; 1.0: one rate for all)."""
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    """Dropout of the encoder (hidden and attention) and of the head while fine-tuning; None: the model's config.json values (BERT: 0.1)."""
    pooling: Pooling = "pooler"
    """classification/regression: pooler (BERT's tanh layer on [CLS], trained by next-sentence prediction when the checkpoint has one, else fresh), cls (the [CLS] hidden state) or mean (mean over the text's tokens, which suits small or briefly pretrained models whose [CLS] state barely varies)."""
    layers: list[int] | Literal["all"] = Field(default_factory=lambda: [-1])
    """Hidden states the head reads: 0 is the embedding output, k the output of layer k, negative counts from the end (-1 the last layer, [-4, -3, -2, -1] the last four), "all" every one. Combined by `combine`."""
    combine: Combine = "concat"
    """How several `layers` become one vector: concat, sum, or scalar_mix (a learned softmax-weighted sum, Peters et al. 2018); with freeze_encoder this is the BERT paper's feature-based comparison."""
    early_stopping_patience: int | None = Field(None, ge=1)
    """Early stopping: hold out `early_stopping_fraction` of the training data, score it after every epoch, stop after this many epochs without improvement and keep the best epoch's weights (None: train all `epochs`). The validation file is never used to choose."""
    early_stopping_fraction: float = Field(0.1, gt=0.0, lt=0.5)
    """Share of the training examples held out for early stopping (stratified by label for classification; fixed per task, fold and seed)."""
    word_vectors: Literal["input", "contextual"] = "contextual"
    """word_similarity: input (mean of the word's WordPiece rows of the input embedding matrix, which MLM training shapes through the tied output layer) or contextual (the word alone as `[CLS] word [SEP]`, mean over its pieces of the hidden states chosen by `layers`/`combine`)."""
    tag_scheme: TagScheme = "IOB2"
    """token_classification: how tags mark entities (IOB1 for the original CoNLL-2003 files, IOB2/BIO, IOBES); decides entity-level scoring."""
    doc_stride: int = Field(128, ge=1)
    """qa: tokens between the starts of consecutive context windows (Google's run_squad meaning; Hugging Face's `stride` is the overlap instead)."""
    max_query_length: int = Field(64, ge=1)
    """qa: questions longer than this many tokens are cut."""
    max_answer_length: int = Field(30, ge=1)
    """qa: longest answer span, in tokens, the decoder may predict."""
    n_best: int = Field(20, ge=1)
    """qa: start and end candidates per window considered when decoding spans."""
    version_2: bool = False
    """qa: SQuAD 2.0, questions may have no answer; the model predicts none when the null score beats the best span by more than `null_score_threshold`."""
    null_score_threshold: float = 0.0
    """qa, version_2: predict no answer when null score - best span score > this value."""
    on_error: Literal["raise", "skip"] = "raise"
    """raise: a malformed row stops with its file and line; skip: malformed rows are left out and counted."""
    train_fractions: list[float] = Field(default_factory=lambda: [1.0], min_length=1)
    """Learning curve: fine-tune on these shares of the training examples too, e.g. [0.01, 0.1, 1.0]: nested seeded subsets (the 1% inside the 10% inside the whole; stratified by label for classification, every label kept), drawn per run seed and task, the same for every model and fine-tuning seed. Each fraction runs every seed on every model; the report plots the primary metric over the fraction. The largest fraction gives the task's headline scores and verdict. With cross_validation_folds each fold's training part is subsampled and scored on its whole held-out fold."""

    @model_validator(mode="after")
    def _consistent(self) -> TaskConfig:
        self._check_training()
        self._check_windows_and_fractions()
        if self.format not in _FORMATS_OF[self.type]:
            allowed = ", ".join(_FORMATS_OF[self.type])
            raise ValueError(f"format {self.format!r} cannot hold a {self.type} task; use one of {allowed}")
        if self.validation is None and self.cross_validation_folds is None:
            raise ValueError("validation is not set: give a validation file or cross_validation_folds")
        if self.validation is not None and self.cross_validation_folds is not None:
            raise ValueError("set either validation or cross_validation_folds, not both")
        if self.type == "regression" and self.labels is not None:
            raise ValueError("labels must be unset for a regression task")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ValueError("labels contains duplicates")
        if self.format in ("tsv", "csv") and not self.header:
            named = [c for c in (self.text_a, self.text_b, self.label_column) if isinstance(c, str)]
            if named:
                raise ValueError(f"header is false, so columns must be 0-based indexes, not names ({named[0]!r})")
        if self.format == "jsonl":
            indexed = [c for c in (self.text_a, self.text_b, self.label_column) if isinstance(c, int)]
            if indexed:
                raise ValueError("jsonl columns are field names, not indexes")
        if self.positive_label is not None and self.labels is not None and self.positive_label not in self.labels:
            raise ValueError(f"positive_label {self.positive_label!r} is not in labels")
        if self.type == "qa" and self.max_query_length + 4 >= self.max_seq_length:
            raise ValueError("max_query_length leaves no room for context within max_seq_length")
        if isinstance(self.layers, list) and not self.layers:
            raise ValueError("layers is empty: give hidden-state indexes (e.g. [-1]) or \"all\"")
        if self.pooling == "pooler" and self.layers != [-1] and self.type in ("classification", "regression"):
            raise ValueError("pooling 'pooler' reads the last layer only; with other layers use pooling 'cls' or 'mean'")
        return self

    def _check_training(self) -> None:
        if self.type == "word_similarity":
            if self.combine == "scalar_mix":
                raise ValueError("combine scalar_mix learns its weights, and a word_similarity task trains nothing; use concat or sum")
            if self.validation is None or self.train is not None or self.cross_validation_folds is not None or self.test is not None:
                raise ValueError("a word_similarity task is scored on its `validation` file (the word pairs) alone; leave train, test and cross_validation_folds unset")
            return
        if self.train is None:
            raise ValueError("train is not set: give the training file")
        if self.freeze_encoder and self.freeze_layers:
            raise ValueError("freeze_encoder already freezes every layer; leave freeze_layers at 0")

    def _check_windows_and_fractions(self) -> None:
        if self.long_inputs == "windows" and self.type not in WINDOWED_TYPES:
            raise ValueError(f"long_inputs windows is for classification and regression; a {self.type} task truncates (qa: set doc_stride)")
        bad = [f for f in self.train_fractions if not 0.0 < f <= 1.0]
        if bad:
            raise ValueError(f"train_fractions must lie in (0, 1] (1.0: the whole training file); got {bad[0]}")
        if len(set(self.train_fractions)) != len(self.train_fractions):
            raise ValueError("train_fractions contains duplicates")
        if self.train_fractions != sorted(self.train_fractions):
            raise ValueError(f"train_fractions must be in increasing order, e.g. {sorted(self.train_fractions)}")
        if self.type not in TRAINED_TYPES and self.train_fractions != [1.0]:
            raise ValueError("a word_similarity task trains nothing, so train_fractions does not apply; leave it at [1.0]")


class IntrinsicConfig(Section):
    """Masked-LM and next-sentence scores on the examples stage's held-out sequences."""

    enabled: bool = True
    """Score MLM loss, perplexity and accuracy (and NSP/SOP accuracy) on examples/<phase>/validation/."""
    phases: list[str] | None = None
    """Examples phases to score (e.g. [seq128]); None: the phases the pretrain stage trained on, or every examples phase. Phases longer than the model's max_position_embeddings are left out."""
    batch_size: int = Field(32, ge=1)
    """Sequences per forward pass."""
    max_batches: int | None = Field(None, ge=1)
    """Most batches scored per phase (None: every validation sequence)."""
    fill_mask: int = Field(5, ge=0)
    """Held-out corpus sentences shown in the report with one word masked and the pretrained model's top predictions (0: none)."""


class StsConfig(Section):
    """A file of sentence pairs with a similarity score (STS-B style) for the embedding check."""

    file: DataFile
    """Local path or fsspec URI (.gz/.bz2/.xz are decompressed)."""
    format: Literal["tsv", "csv", "jsonl"] = "tsv"
    """tsv (GLUE's STS-B files as they are), csv or jsonl."""
    text_a: str | int = "sentence1"
    """Column of the first sentence: a header name or a 0-based index."""
    text_b: str | int = "sentence2"
    """Column of the second sentence."""
    score_column: str | int = "score"
    """Column of the gold similarity score."""
    header: bool = True
    """tsv/csv: the first line names the columns."""
    encoding: Encoding = "utf-8"
    """Text encoding of the file."""
    on_error: Literal["raise", "skip"] = "raise"
    """raise: a malformed row stops with its file and line; skip: malformed rows are left out and counted."""


class EmbeddingsConfig(Section):
    """Sentence embeddings straight from the encoder, [CLS] against mean pooling."""

    enabled: bool = True
    """Measure anisotropy (mean cosine of random sentence pairs) on held-out corpus sentences, and STS Spearman when `sts` is set."""
    sentences: int = Field(1000, ge=2)
    """Sentences drawn (seeded) from the corpus stage's validation split."""
    num_pairs: int = Field(1000, ge=1)
    """Random sentence pairs averaged for the anisotropy."""
    max_seq_length: int = Field(128, ge=8)
    """Tokens per sentence including special tokens; longer sentences are truncated, or read in windows with `long_inputs: windows`."""
    long_inputs: LongInputs = "truncate"
    """A sentence longer than max_seq_length is cut to it (truncate), or read as overlapping windows of max_seq_length tokens, `[CLS] piece [SEP]` each, whose [CLS] or mean vectors `window_pool` combines (windows). The report counts the sentences longer than the window either way."""
    window_stride: int | None = Field(None, ge=1)
    """long_inputs windows: tokens between the starts of consecutive windows; None: half of a window's text."""
    window_pool: WindowPool = "mean"
    """long_inputs windows: mean, max (element-wise) or first (the first window's vector alone)."""
    max_windows: int = Field(16, ge=1)
    """long_inputs windows: most windows read per sentence; text past the last is cut and counted."""
    sts: StsConfig | None = None
    """Optional STS-style file: Spearman correlation of cosine similarity with the gold scores."""


class SpeedConfig(Section):
    """Inference speed of the models an evaluation of a distillation compares (teacher,
    student, random init), measured on the evaluating machine: the encoder forward on the
    same batch, with the same threads (evaluate.num_threads), interleaved."""

    enabled: bool = True
    """Measure it when the distill stage ran (the report's "at 2.3x its speed")."""
    batch_size: int = Field(32, ge=1)
    """Sequences per forward pass."""
    max_seq_length: int = Field(128, ge=8)
    """Tokens per sequence, every one a real token."""
    passes: int = Field(5, ge=1)
    """Timed passes per model after a warm-up pass; the median counts."""


class EvaluateConfig(Section):
    """The evaluate stage (`evaluate:` in a run recipe): held-out pretraining scores,
    fine-tuning tasks against a randomly initialised baseline, sentence embeddings, and a
    report under <run.root>/eval/."""

    tasks: list[TaskConfig] = Field(default_factory=list)
    """Fine-tuning tasks (classification, regression, token_classification, qa), each run once per seed in its `seeds`."""
    baseline: bool = True
    """Also evaluate the same architecture with random weights (every task and seed, the MLM scores and the embeddings), so the report shows what pretraining bought; after distillation, the student's architecture."""
    intrinsic: IntrinsicConfig = Field(default_factory=IntrinsicConfig)
    """Masked-LM and NSP scores on the held-out examples."""
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    """Sentence-embedding check."""
    speed: SpeedConfig = Field(default_factory=SpeedConfig)
    """Inference speed of teacher, student and random init (only when the distill stage ran)."""
    num_threads: int = Field(1, ge=1)
    """torch threads of each evaluation job (each Ray task reserves as many CPUs)."""
    num_gpus: float = Field(0.0, ge=0.0)
    """GPUs each evaluation job reserves from Ray (a fraction lets jobs share one). A job runs on the GPU Ray gives it; with 0 it runs on the CPU."""

    @field_validator("tasks")
    @classmethod
    def _unique_names(cls, tasks: list[TaskConfig]) -> list[TaskConfig]:
        names = [t.name for t in tasks]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"task names must be unique (metrics are keyed by name); repeated: {', '.join(repeated)}")
        return tasks
