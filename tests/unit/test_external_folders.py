"""A teacher folder outside the run root (`distill.teacher`): what the stages that read it
make of a change to it, and what is refused before anything runs.

- its weights change: `status` says distill and evaluate are stale (evaluate reads the
  teacher too), evaluate refuses to score the new teacher against a student that learned
  from the old one (it did, silently), and `run --only evaluate` says distill is stale;
- it has no config.json, or only a pytorch_model.bin, or a config.json of absurd sizes:
  `bertpipe run`'s preflight refuses it in one line, before vocab and examples are
  recomputed (they were, for 60 s, before the distill stage said so)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
import transformers

from bertcore.errors import BertpipeError, ConfigError
from pipelines.registry import REGISTRY, load_config
from pipelines.runner import Pipeline
from pipelines.stage import Upstream
from pipelines.stage_dir import Manifest, StageDir

torch.set_num_threads(1)

DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "demo.yaml")
DISTIL = [
    "distill.enabled=true",
    "distill.phases=[{name: seq128, steps: 10, batch_size: 8}]",
    "vocab.source=pretrained",
]
STAGES = ["corpus", "vocab", "examples", "distill", "evaluate"]


def _teacher(folder, seed: int = 3) -> str:
    config = transformers.BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    transformers.BertForPreTraining(config).save_pretrained(str(folder))
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text("\n".join(specials + [f"w{i}" for i in range(115)]) + "\n")
    return str(folder)


def _config(tmp_path, teacher: str):
    return load_config(DEMO, [f"run.root={tmp_path / 'run'}", *DISTIL, f"distill.teacher={teacher}"])


def _complete(pipeline: Pipeline, name: str) -> Manifest:
    """A complete output of `name` with the fingerprint the recipe expects now."""
    stage = REGISTRY[name]
    upstream = {read: pipeline.expected_fingerprint(read) for read in pipeline.reads(name)}
    manifest = Manifest(
        stage=name,
        code_version=stage.code_version,
        fingerprint=pipeline.expected_fingerprint(name),
        inputs={
            **stage.fingerprint_inputs(
                pipeline.section(name), pipeline.cfg.run.seed, upstream, pipeline.external(name)
            ),
            **({"teacher": pipeline.cfg.distill.teacher} if name == "distill" else {}),
        },
        config=pipeline.section(name).model_dump(mode="json"),
        shards=[],
        stats={},
        timings={},
    )
    pipeline.dir(name).write_manifest(manifest, "")
    return manifest


def test_new_teacher_weights_make_distill_and_evaluate_stale_and_evaluate_refuses_them(tmp_path):
    from pipelines.stages.evaluate.plan import _teacher as evaluate_teacher

    teacher = _teacher(tmp_path / "teacher")
    pipeline = Pipeline(_config(tmp_path, teacher))
    manifests = {name: _complete(pipeline, name) for name in STAGES}
    assert {row["stage"]: row["state"] for row in Pipeline(_config(tmp_path, teacher)).status()}[
        "evaluate"
    ] == "complete"

    _teacher(tmp_path / "teacher", seed=4)  # the same folder, other weights
    rows = {row["stage"]: row for row in Pipeline(_config(tmp_path, teacher)).status()}
    assert rows["distill"]["state"] == "stale" and any(
        "model.safetensors" in reason for reason in rows["distill"]["changed"]
    ), rows["distill"]
    assert rows["evaluate"]["state"] == "stale", rows["evaluate"]
    assert [rows[n]["state"] for n in ("corpus", "vocab", "examples")] == ["complete"] * 3

    run = SimpleNamespace(storage=pipeline.storage)
    distill = Upstream(StageDir(pipeline.storage, pipeline.cfg.run.root, "distill"), manifests["distill"])
    with pytest.raises(ConfigError) as refused:
        evaluate_teacher(run, distill)
    message = str(refused.value)
    assert (
        "model.safetensors" in message
        and "changed since the distill stage ran" in message
        and "--only distill,evaluate" in message
    )


def test_run_only_evaluate_after_the_teacher_changed_says_that_distill_is_stale(tmp_path):
    """`run --only evaluate` keeps evaluate's output (the old teacher against the old
    student), which `status` calls stale: the run says so, with the command that recomputes
    both (it said `evaluate: cached` and nothing more)."""
    teacher = _teacher(tmp_path / "teacher")
    pipeline = Pipeline(_config(tmp_path, teacher))
    for name in STAGES:
        _complete(pipeline, name)
    assert Pipeline(_config(tmp_path, teacher)).stale_reads("evaluate", ["evaluate"]) == []

    _teacher(tmp_path / "teacher", seed=4)
    pipeline = Pipeline(_config(tmp_path, teacher))
    [line] = pipeline.stale_reads("evaluate", ["evaluate"])
    assert (
        line.startswith("evaluate: reads the distill stage's output, which is stale (input teacher.")
        and "model.safetensors" in line
    ), line
    assert line.endswith("`bertpipe run --only distill,evaluate` recomputes both"), line
    assert pipeline.stale_reads("evaluate", ["distill", "evaluate"]) == []  # distill runs first: nothing to say


@pytest.mark.parametrize(
    "spoil, expected",
    [
        (
            lambda f: os.remove(os.path.join(f, "config.json")),
            "distill.teacher: {f} holds no Hugging Face model (it needs config.json",
        ),
        (
            lambda f: (
                torch.save({}, os.path.join(f, "pytorch_model.bin")),
                os.remove(os.path.join(f, "model.safetensors")),
            ),
            "distill.teacher: {f}/pytorch_model.bin is a pickle; bertpipe reads safetensors only",
        ),
        (
            lambda f: (
                json.dump(
                    {**json.load(open(os.path.join(f, "config.json"))), "num_hidden_layers": 100_000},
                    open(os.path.join(f, "config.json.new"), "w"),
                )
                or os.replace(os.path.join(f, "config.json.new"), os.path.join(f, "config.json"))
            ),
            "{f}/config.json: num_hidden_layers 100,000 is above the 256 bertcore builds",
        ),
    ],
    ids=["no-config", "bin-only", "absurd-config"],
)
def test_a_bad_teacher_folder_is_refused_at_preflight_before_vocab_and_examples(tmp_path, spoil, expected):
    teacher = _teacher(tmp_path / "teacher")
    cfg = _config(tmp_path, teacher)  # the recipe loads: the folder is read when the run starts
    spoil(teacher)
    with pytest.raises(BertpipeError) as refused:
        Pipeline(cfg).preflight(STAGES)
    message = str(refused.value)
    assert message.startswith(expected.format(f=teacher)) and "\n" not in message, message
    assert not os.path.exists(tmp_path / "run" / "vocab")
