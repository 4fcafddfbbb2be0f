"""Distill stage's work (its declaration is pipelines/stages/distill/__init__.py): a teacher (the
pretrain stage's model, or `distill.teacher`, a Hugging Face folder outside the run root)
+ examples + vocab -> a smaller student under
`<run.root>/distill/`: DeepSpeed checkpoints, `model/` (the same Hugging Face layout as
`pretrain/model/`, a BertForMaskedLM; the student of a teacher without an MLM head, an
embedding model such as all-MiniLM-L6-v2, is exported as the teacher is published: a
BertModel with the sentence-transformers files, the teacher's pooling), `student-start/`
(the student before its first training step, in the same layout: what evaluate scores to
tell the start's part of the student's gain from training's), `metrics.jsonl`,
`validation.jsonl`.

Ray shape: the training stages' shared launch (pipelines/training/launch.py), with the
distillation objective (bertcore/distill/objective.py): each Ray Train worker holds the
frozen teacher beside the DeepSpeed engine of the student, so checkpoints, exact resume,
the time budget, validation and the trackers are pretraining's. Off unless
`distill.enabled`; with an external teacher the recipe leaves the pretrain stage out.

The student uses the teacher's vocabulary: with an external teacher the vocab stage adopts
it (vocab.pretrained defaults to distill.teacher), which the recipe check insists on, and
before training the teacher's vocab.txt is compared with the one the examples were built with.

Light at import: torch, Ray and the model code are imported by the functions that use them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bertcore.distill.config import DistillConfig, DistillLoss
from bertcore.errors import ConfigError
from bertcore.model.hf_files import MODEL_DIR, START_DIR
from pipelines.stage import Output, StageRun, Upstream
from pipelines.storage import Storage, join
from pipelines.training.export import export_start, model_shards
from pipelines.training.inputs import read_inputs
from pipelines.training.launch import WorkerJob, prepare_checkpoints, train_and_export
from pipelines.training.stats import headline

if TYPE_CHECKING:
    from bertcore.model.config import ModelConfig
    from bertcore.model.sentence_files import SentenceLayout
    from pipelines.external import ExternalFolder

log = logging.getLogger(__name__)

# -- the teacher --------------------------------------------------------------------------------


@dataclass
class Teacher:
    folder: ExternalFolder
    config: ModelConfig
    has_mlm_head: bool
    local: str
    """A local folder holding its files."""


def _teacher(r: StageRun, vocab_size: int) -> Teacher:
    """The teacher's folder (external, or pretrain/model/), its config checked against its
    weights' header (bertcore/model/folder.py, before any worker builds it) and whether
    those weights hold an MLM head; its vocabulary must be the examples'."""
    from bertcore.model.folder import check_model_folder
    from pipelines.external import model_folder

    folder = (
        r.external
        if r.external is not None
        else model_folder(r.storage, r.inputs["pretrain"].path(MODEL_DIR), "pretrain/model")
    )
    local = folder.local(r.storage)
    checked = check_model_folder(local, "distill.teacher")
    config = checked.config
    if config.vocab_size != vocab_size:
        raise ConfigError(
            f"distill.teacher: the model at {folder.uri} has {config.vocab_size} word embeddings but the "
            "examples were built with "
            f"a vocabulary of {vocab_size} entries; build them with the teacher's (vocab.source: pretrained, "
            "vocab.pretrained unset)"
        )
    return Teacher(folder, config, checked.has_mlm_head, local)


def _check_vocabulary(r: StageRun, teacher: Teacher) -> None:
    """The teacher folder's vocab.txt (a byte-level BPE's vocab.json), when it has one,
    equals the vocab stage's entry for entry."""
    from bertcore.vocab.config import entries_file
    from bertcore.vocab.tokenizer import read_entries
    from pipelines.shards import local_copy

    vocab: Upstream = r.inputs["vocab"]
    listed = entries_file(s.path for s in vocab.manifest.shards)
    theirs_uri = join(teacher.folder.uri, listed)
    if not r.storage.exists(theirs_uri):
        return
    ours = read_entries(local_copy(r.storage, vocab.path(listed), f"distill-{vocab.fingerprint}"))
    theirs = read_entries(local_copy(r.storage, theirs_uri, f"distill-teacher-{r.storage.signature(theirs_uri)}"))
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise ConfigError(
            f"distill.teacher: {theirs_uri} and {vocab.path(listed)} (the examples' vocabulary) differ from "
            f"entry {first} on; "
            "the student uses the teacher's vocabulary: build the examples with it (vocab.source: pretrained)"
        )


# -- the objective, as the workers and the export task build it ----------------------------------


@dataclass
class DistillSpec:
    """Distillation of `student_config` from the teacher in `teacher` (pickled to the workers)."""

    student_config: dict
    teacher_config: dict
    teacher: ExternalFolder
    pairs: list[int]
    loss: DistillLoss
    init: str
    soft_targets: bool
    sentence: SentenceLayout | None = None
    """With a teacher without an MLM head: the export is an embedding model in this layout (the teacher's pooling)."""
    nsp: bool = False
    """Distillation trains no NSP head (nor the pooler it feeds): the export is a BertForMaskedLM, or an embedding
    model."""

    def objective(self, storage: Storage):
        from bertcore.distill.objective import Distillation
        from bertcore.model.bert import ModelConfig
        from bertcore.model.pretrained import read_weights

        return Distillation(
            ModelConfig.model_validate(self.student_config),
            ModelConfig.model_validate(self.teacher_config),
            read_weights(self.teacher.local(storage), "distill.teacher"),
            self.pairs,
            self.loss,
            self.init,
            self.soft_targets,
        )

    def exportable(self, checkpoint_dir: str, marker: dict) -> dict:
        from bertcore.distill.objective import DistillStudent, exportable_state
        from bertcore.model.bert import ModelConfig
        from bertcore.train.export import consolidate_checkpoint

        student = ModelConfig.model_validate(marker["model_config"])
        teacher_hidden = marker["teacher_config"]["hidden_size"]
        state = consolidate_checkpoint(
            checkpoint_dir, student, build=lambda: DistillStudent(student, teacher_hidden, self.loss)
        )
        return exportable_state(state)

    def start_state(self, module_state: dict) -> dict:
        """The student of a freshly built DistillStudent, its projections left out."""
        from bertcore.distill.objective import exportable_state

        return exportable_state(module_state)


# -- the stage ----------------------------------------------------------------------------------


def run(r: StageRun) -> Output:
    """Distil (resuming per distill.resume), export the student to model/, and list model/,
    metrics.jsonl and validation.jsonl as the stage's shards. Ray must be running."""
    from bertcore.distill.student import check_from_teacher, layer_map, student_config
    from bertcore.train.checkpoint import latest_checkpoint
    from pipelines.stage_files import stage_files

    cfg, inputs = read_inputs(r.section, r.inputs["examples"], r.inputs["vocab"], r.storage)
    teacher = _teacher(r, inputs.vocab.vocab_size)
    _check_vocabulary(r, teacher)
    student = student_config(cfg.student, teacher.config)
    pairs = layer_map(cfg, student.num_hidden_layers, teacher.config.num_hidden_layers)
    if cfg.student.init == "from_teacher":
        check_from_teacher(student, teacher.config)
    try:
        cfg.check_positions(
            [p.max_seq_length for p in cfg.phases], teacher.config.max_position_embeddings, "shorten the phase"
        )
    except ValueError as exc:
        raise ConfigError(f"{exc} (distill.teacher: {teacher.folder.uri})") from None
    notes = _notes(cfg, teacher)
    sentence = None
    if not teacher.has_mlm_head:  # an embedding model: its student is one too
        from bertcore.model.sentence_files import read_layout

        sentence = read_layout(teacher.local)
        notes += _layout_notes(sentence, teacher)
    for note in notes:
        log.warning("distill: %s", note)
    files = stage_files(r.storage, r.dir.uri, "driver")
    resume_key = cfg.resume_key(
        {
            "examples": inputs.examples_fingerprint,
            "vocab": inputs.vocab_fingerprint,
            "seed": r.seed,
            "teacher": teacher.folder.identity,
        }
    )
    prepare_checkpoints(cfg, files, resume_key, r.dir, force=r.force)
    spec = DistillSpec(
        student.model_dump(mode="json"),
        teacher.config.model_dump(mode="json"),
        teacher.folder,
        pairs,
        cfg.loss,
        cfg.student.init,
        teacher.has_mlm_head,
        sentence,
    )
    job = WorkerJob.of_stage(r, cfg, spec, resume_key, inputs)
    start = latest_checkpoint(files)
    log.info(
        (
            "distill: teacher %s (%d layers x %d) -> student %d layers x %d (%s, teacher layers %s) on %d %s "
            "workers; %s; %s"
        ),
        teacher.folder.uri,
        teacher.config.num_hidden_layers,
        teacher.config.hidden_size,
        student.num_hidden_layers,
        student.hidden_size,
        cfg.student.init,
        pairs,
        cfg.num_workers,
        "GPU" if cfg.use_gpu else "CPU",
        ", ".join(f"{p.name} {p.steps} steps x {p.batch_size}" for p in cfg.phases),
        f"resuming from step {start['step']}" if start else "from scratch",
    )
    marker, shards, stats = train_and_export(cfg, job, r.dir, r.inputs["vocab"])
    shards += model_shards(export_start(cfg, r.dir, spec, r.inputs["vocab"], r.seed, r.dir.path(START_DIR)))
    stats.update(_model_stats(teacher, student, pairs, marker, notes))
    stats["export"] = {
        "model": MODEL_DIR,
        "start": START_DIR,
        "layout": "sentence-transformers" if sentence else "masked-lm",
        "sentence": sentence.to_json() if sentence else None,
    }
    out_headline = headline(stats)
    out_headline["student"] = (
        f"{student.num_hidden_layers}x{student.hidden_size}, {stats['student']['parameters'] / 1e6:.1f}M parameters"
    )
    out_headline["teacher"] = (
        f"{teacher.config.num_hidden_layers}x{teacher.config.hidden_size}, "
        f"{stats['teacher']['parameters'] / 1e6:.1f}M parameters"
    )
    return Output(shards=shards, stats=stats, headline=out_headline, inputs={"teacher": teacher.folder.uri})


def _notes(cfg: DistillConfig, teacher: Teacher) -> list[str]:
    """What the user should know about the losses this run actually uses."""
    notes = []
    if cfg.loss.soft_targets > 0 and not teacher.has_mlm_head:
        notes.append(
            f"the teacher at {teacher.folder.uri} has no MLM head (its weights are a BertModel's), so the "
            "soft-target loss "
            f"(distill.loss.soft_targets={cfg.loss.soft_targets}) is skipped; the hidden-state, attention "
            "and MLM terms remain"
        )
        if not any((cfg.loss.hidden, cfg.loss.attention, cfg.loss.mlm)):
            raise ConfigError(
                f"distill.loss: only soft_targets has a weight, and the teacher at {teacher.folder.uri} has no MLM "
                "head; give distill.loss.hidden, attention or mlm a weight"
            )
    return notes


def _layout_notes(layout: SentenceLayout, teacher: Teacher) -> list[str]:
    """What the user should know about how the embedding student is exported."""
    notes = []
    if layout.source == "default":
        notes.append(
            f"the teacher at {teacher.folder.uri} has no MLM head and no sentence-transformers files (modules.json); "
            "its student is exported as an embedding model with mean pooling"
        )
    if layout.left_out:
        notes.append(
            f"the teacher's sentence-transformers modules {', '.join(layout.left_out)} hold weights that distillation "
            "does not train; the student is exported without them (Transformer, Pooling"
            + (", Normalize)" if layout.normalize else ")")
        )
    return notes


def _model_stats(
    teacher: Teacher, student: ModelConfig, pairs: list[int], marker: dict, notes: list[str]
) -> dict[str, Any]:
    sizes = {name: cfg.family.parameter_count(cfg) for name, cfg in (("teacher", teacher.config), ("student", student))}
    return {
        "teacher": {
            "uri": teacher.folder.uri,
            "parameters": sizes["teacher"],
            "layers": teacher.config.num_hidden_layers,
            "hidden_size": teacher.config.hidden_size,
            "has_mlm_head": teacher.has_mlm_head,
        },
        "student": {
            "parameters": sizes["student"],
            "layers": student.num_hidden_layers,
            "hidden_size": student.hidden_size,
        },
        "layer_map": pairs,
        "init": marker.get("init"),
        "notes": notes,
    }
