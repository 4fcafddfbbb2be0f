"""Distillation in bertcore: each loss term on tiny tensors (zero when the student is the
teacher, blind to padding, gradients reaching the projections), the student's shape and
its start from a teacher that transformers wrote from random weights, the `distill:`
section and what it does to the recipe (the pretrain stage left out, the vocabulary
checked), and the distillation objective in the one training loop (world size 1): it
learns, and a crash resumes to the same steps."""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest
import torch
import torch.nn.functional as F
import transformers

from bertcore.distill import losses
from bertcore.distill.config import DistillConfig, DistillLoss, StudentConfig
from bertcore.distill.objective import PROJECTIONS, Distillation, DistillStudent, TeacherSignals
from bertcore.distill.student import check_from_teacher, layer_map, student_config
from bertcore.errors import ConfigError
from bertcore.model.bert import ModelConfig
from bertcore.model.pretrained import model_config, read_weights
from bertcore.train.checkpoint import LocalStageFiles
from bertcore.train.metrics_log import VALIDATION, MetricsLog
from bertcore.train.trainer import Trainer
from test_train import SEED, Crash, crash_at, make_run_root, phase_data, tiny_pretrain

torch.set_num_threads(1)
GEN = torch.Generator().manual_seed(0)


def _mask() -> torch.Tensor:
    """(2, 6): the second sequence has two padded positions at the end."""
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    return mask


def _attention(heads: int, mask: torch.Tensor, seed: int) -> torch.Tensor:
    """Attention distributions (B, heads, T, T) over the real keys of `mask`."""
    scores = torch.randn(
        mask.shape[0], heads, mask.shape[1], mask.shape[1], generator=torch.Generator().manual_seed(seed)
    )
    return scores.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)


# -- the loss terms ----------------------------------------------------------------------------


def test_every_term_is_zero_when_the_student_is_the_teacher():
    mask = _mask()
    logits = torch.randn(5, 30, generator=GEN)
    hidden = torch.randn(2, 6, 8, generator=GEN)
    attention = _attention(2, mask, 1)
    assert losses.soft_target_loss(logits, logits.clone(), 2.0).item() == pytest.approx(0.0, abs=1e-6)
    for metric in ("cosine", "mse"):
        assert losses.hidden_state_loss(hidden, hidden.clone(), mask, metric).item() == pytest.approx(0.0, abs=1e-6)
    for metric in ("kl", "mse"):
        assert losses.attention_loss(attention, attention.clone(), mask, metric).item() == pytest.approx(0.0, abs=1e-6)
    # and above zero when they differ
    assert losses.soft_target_loss(logits, torch.randn(5, 30, generator=GEN), 2.0) > 0.01
    assert losses.hidden_state_loss(hidden, torch.randn(2, 6, 8, generator=GEN), mask, "cosine") > 0.1
    assert losses.attention_loss(attention, _attention(2, mask, 2), mask, "kl") > 0.01


def test_soft_targets_are_torchs_kl_divergence_of_softened_distributions_times_t_squared():
    student, teacher = torch.randn(7, 40, generator=GEN), torch.randn(7, 40, generator=GEN)
    for temperature in (1.0, 2.0, 4.0):
        expected = (
            F.kl_div(
                F.log_softmax(student / temperature, -1),
                F.log_softmax(teacher / temperature, -1),
                reduction="batchmean",
                log_target=True,
            )
            * temperature**2
        )
        assert losses.soft_target_loss(student, teacher, temperature).item() == pytest.approx(expected.item(), rel=1e-5)
    assert losses.soft_target_loss(student[:0], teacher[:0], 2.0).item() == 0.0  # no masked position in the batch


def test_padding_changes_no_term():
    mask = _mask()
    student, teacher = torch.randn(2, 6, 8, generator=GEN), torch.randn(2, 6, 8, generator=GEN)
    noisy_student, noisy_teacher = student.clone(), teacher.clone()
    noisy_student[1, 4:] = 100.0  # what padded positions hold is arbitrary
    noisy_teacher[1, 4:] = -3.0
    for metric in ("cosine", "mse"):
        assert losses.hidden_state_loss(noisy_student, noisy_teacher, mask, metric).item() == pytest.approx(
            losses.hidden_state_loss(student, teacher, mask, metric).item(), rel=1e-6
        )
    mine, theirs = _attention(2, mask, 3), _attention(2, mask, 4)
    noisy_mine, noisy_theirs = mine.clone(), theirs.clone()
    noisy_mine[1, :, 4:, :] = 0.5  # rows of padded queries
    noisy_theirs[1, :, 4:, :] = 0.1
    for metric in ("kl", "mse"):
        assert losses.attention_loss(noisy_mine, noisy_theirs, mask, metric).item() == pytest.approx(
            losses.attention_loss(mine, theirs, mask, metric).item(), rel=1e-6
        )


def test_attention_is_compared_head_averaged_when_the_head_counts_differ():
    mask = _mask()
    teacher = _attention(4, mask, 5)
    student = teacher.view(2, 2, 2, 6, 6).mean(2)  # 2 heads, each the mean of two teacher heads
    assert losses.attention_loss(student, teacher, mask, "kl").item() == pytest.approx(0.0, abs=1e-6)
    assert losses.attention_loss(_attention(2, mask, 6), teacher, mask, "kl") > 0.01


def _tiny(vocab: int = 50, **overrides) -> ModelConfig:
    fields = dict(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ModelConfig(vocab_size=vocab, **{**fields, **overrides})


def test_gradients_reach_the_projections_that_map_the_student_to_the_teachers_width():
    weights = DistillLoss(soft_targets=1.0, hidden=1.0, attention=1.0, mlm=1.0)
    student = DistillStudent(_tiny(), teacher_hidden=24, weights=weights, generator=torch.Generator().manual_seed(1))
    assert [name for name in student.state_dict() if name.startswith(PROJECTIONS)] == [
        "hidden_projections.0.weight",
        "hidden_projections.0.bias",
        "hidden_projections.1.weight",
        "hidden_projections.1.bias",
    ]
    ids = torch.randint(5, 50, (2, 6), generator=GEN)
    mask = _mask().long()
    labels = torch.full((2, 6), -100)
    labels[0, 2], labels[1, 1] = 7, 9
    signals = TeacherSignals(
        hidden=[torch.randn(2, 6, 24, generator=GEN) for _ in range(2)],
        attentions=[_attention(3, _mask(), s) for s in (7, 8)],
        logits=torch.randn(2, 50, generator=GEN),
    )
    out = student(ids, torch.zeros_like(ids), mask, labels, teacher=signals)
    assert set(out.terms) == {"mlm", "soft_targets", "hidden", "attention"}
    assert out.loss.item() == pytest.approx(sum(t.item() for t in out.terms.values()), rel=1e-5)
    out.loss.backward()
    for projection in student.hidden_projections:
        assert projection.weight.grad is not None and projection.weight.grad.abs().sum() > 0
    # the same width needs no projection
    assert DistillStudent(_tiny(), teacher_hidden=16, weights=weights).hidden_projections is None


# -- the student ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory):
    """A 4-layer BertForPreTraining written by transformers from random weights, with a vocab.txt."""
    folder = tmp_path_factory.mktemp("teacher")
    config = transformers.BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(3)
    transformers.BertForPreTraining(config).save_pretrained(str(folder))
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text("\n".join(specials + [f"w{i}" for i in range(115)]) + "\n")
    return str(folder)


def test_from_teacher_starts_with_the_embeddings_mlm_head_and_the_paired_layers(teacher_folder):
    teacher_cfg, state = model_config(teacher_folder), read_weights(teacher_folder)
    student_cfg = student_config(StudentConfig(), teacher_cfg)
    assert (student_cfg.num_hidden_layers, student_cfg.hidden_size, student_cfg.intermediate_size) == (
        2,
        32,
        64,
    )  # half the layers
    pairs = layer_map(DistillConfig(), 2, 4)
    assert pairs == [2, 4]
    objective = Distillation(student_cfg, teacher_cfg, state, pairs, DistillLoss())
    student = objective.build(torch.Generator().manual_seed(0), torch.device("cpu")).state_dict()
    for i, j in enumerate(pairs):  # student layer i is teacher layer j (1-based)
        for name, tensor in state.items():
            if name.startswith(f"bert.encoder.layer.{j - 1}."):
                assert torch.equal(student[name.replace(f"layer.{j - 1}.", f"layer.{i}.")], tensor), name
    for name in (
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.LayerNorm.bias",
        "cls.predictions.transform.dense.weight",
    ):
        assert torch.equal(student[name], state[name])
    assert objective.init_report["from_teacher"]["fresh"] == [
        "cls.seq_relationship.weight",
        "cls.seq_relationship.bias",
    ]  # NSP: not distilled
    # the teacher is frozen and outside what the loop optimises
    assert not any(p.requires_grad for p in objective.teacher.parameters())


def test_a_student_of_another_width_cannot_start_from_the_teacher(teacher_folder):
    teacher_cfg = model_config(teacher_folder)
    narrow = student_config(StudentConfig(hidden_size=16, num_attention_heads=2), teacher_cfg)
    assert narrow.intermediate_size == 64  # 4 x 16
    with pytest.raises(
        ConfigError,
        match=r"^distill.student.init: .* the student's hidden_size is 16 and the teacher's 32; .*init: random$",
    ):
        check_from_teacher(narrow, teacher_cfg)
    named = student_config(StudentConfig(model_size="tiny"), teacher_cfg)
    assert (named.num_hidden_layers, named.hidden_size, named.num_attention_heads, named.vocab_size) == (2, 128, 2, 120)
    with pytest.raises(ConfigError, match=r"distill.layer_map \[2, 5\]: the teacher has 4 layers"):
        layer_map(DistillConfig(layer_map=[2, 5]), 2, 4)
    with pytest.raises(ValueError, match="distill.layer_map names 3 teacher layers but the student has 2 layers"):
        DistillConfig(layer_map=[1, 2, 3], student={"num_hidden_layers": 2})
    with pytest.raises(ValueError, match="every weight is 0"):
        DistillLoss(soft_targets=0, hidden=0, attention=0, mlm=0)


# -- the distillation objective in the training loop -------------------------------------------


@pytest.fixture(scope="module")
def news(tmp_path_factory, gensim_data):
    root = tmp_path_factory.mktemp("distil")
    info = make_run_root(root, gensim_data, max_documents=80, dupe_factor=1)
    return root, info


def _distillation(info: dict, folder) -> Distillation:
    """A 1-layer student of a 2-layer BertForPreTraining teacher on the news vocabulary,
    every loss term on."""
    config = transformers.BertConfig(
        vocab_size=len(info["tokens"]),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(5)
    transformers.BertForPreTraining(config).save_pretrained(str(folder))
    teacher_cfg = model_config(str(folder))
    student_cfg = student_config(StudentConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2), teacher_cfg)
    weights = DistillLoss(soft_targets=1.0, hidden=1.0, attention=1.0, mlm=1.0)
    return Distillation(student_cfg, teacher_cfg, read_weights(str(folder)), [2], weights, init="random")


def test_distillation_trains_in_the_one_loop_and_a_crash_resumes_to_the_same_steps(world_of_one, news, tmp_path):
    root, info = news
    cfg = DistillConfig.model_validate(
        tiny_pretrain(checkpoint_every=5, eval_every=6, learning_rate=2e-3).model_dump(
            exclude={"model_size", "model_overrides", "init_from", "family"}
        )
    )
    assert cfg.SECTION == "distill"

    def trainer(stage, on_step=None) -> Trainer:
        return Trainer(
            cfg,
            _distillation(info, tmp_path / "teacher"),
            phase_data(root, info),
            LocalStageFiles(str(stage)),
            seed=SEED,
            resume_key="k",
            on_step=on_step,
        )

    marker = trainer(tmp_path / "reference").run()
    assert marker["step"] == 20 and marker["layer_map"] == [2] and marker["teacher_config"]["hidden_size"] == 32
    records = MetricsLog(str(tmp_path / "reference" / "metrics.jsonl")).records()
    for key in (
        "loss",
        "hidden_loss",
        "mlm_loss",
    ):  # (a random teacher's soft targets and attention are near uniform: ~0 already)
        assert records[-1][key] < records[0][key] - 0.05, key
    assert all(r["soft_target_loss"] > 0 and r["attention_loss"] > 0 for r in records)
    validation = MetricsLog(str(tmp_path / "reference" / VALIDATION)).records()
    assert [r["step"] for r in validation] == [6, 12, 18, 20] and validation[-1]["hidden_loss"] < validation[0][
        "hidden_loss"
    ]

    with pytest.raises(Crash):
        trainer(tmp_path / "crashed", crash_at(8)).run()
    shutil.rmtree(tmp_path / "teacher")
    trainer(tmp_path / "crashed").run()  # resumes from step 5, projections and optimizer state included

    def steps(stage):
        return [
            (r["step"], r["data_hash"], round(r["loss"], 5)) for r in MetricsLog(str(stage / "metrics.jsonl")).records()
        ]

    assert steps(tmp_path / "crashed") == steps(tmp_path / "reference")

    # the export: the checkpoint holds the projections beside the student; the folder written from it does not
    from bertcore.train.checkpoint import checkpoint_tag
    from bertcore.train.export import export_checkpoint
    from pipelines.stages.distill.work import DistillSpec

    spec = DistillSpec(
        marker["model_config"], marker["teacher_config"], None, [2], DistillLoss(attention=1.0), "random", True
    )
    state = spec.exportable(str(tmp_path / "reference" / "checkpoints" / checkpoint_tag(20)), marker)
    assert (
        not any(name.startswith(PROJECTIONS) for name in state) and "bert.encoder.layer.0.output.dense.weight" in state
    )
    folder = tmp_path / "student"
    export_checkpoint(
        state, ModelConfig.model_validate(marker["model_config"]), str(root / "vocab"), str(folder), nsp=False
    )
    student = transformers.BertForMaskedLM.from_pretrained(str(folder))
    assert student.config.num_hidden_layers == 1 and student.config.hidden_size == 16


# -- the recipe ----------------------------------------------------------------------------------


DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "demo.yaml")
DISTIL = ["distill.enabled=true", "distill.phases=[{name: seq128, steps: 10, batch_size: 8}]"]


def test_the_examples_must_be_built_with_the_teachers_vocabulary_one_line_naming_both(teacher_folder, tmp_path):
    from pipelines.registry import load_config

    with pytest.raises(ConfigError) as trained:
        load_config(DEMO, [*DISTIL, f"distill.teacher={teacher_folder}"])
    message = str(trained.value)
    assert "\n" not in message and f"distill.teacher {teacher_folder}" in message and "vocab.source: train" in message
    other = tmp_path / "other-vocab.txt"
    other.write_text("[PAD]\n")
    with pytest.raises(
        ConfigError,
        match=rf"distill.teacher {teacher_folder} and the examples' vocabulary \(vocab.pretrained {other}\) differ",
    ):
        load_config(
            DEMO, [*DISTIL, f"distill.teacher={teacher_folder}", "vocab.source=pretrained", f"vocab.pretrained={other}"]
        )
    # adopted from the teacher (vocab.pretrained defaults to it), or named as its vocab.txt: accepted
    cfg = load_config(DEMO, [*DISTIL, f"distill.teacher={teacher_folder}", "vocab.source=pretrained"])
    assert cfg.vocab.pretrained == teacher_folder
    load_config(
        DEMO,
        [
            *DISTIL,
            f"distill.teacher={teacher_folder}",
            "vocab.source=pretrained",
            f"vocab.pretrained={teacher_folder}/vocab.txt",
        ],
    )


def test_an_external_teacher_leaves_the_pretrain_stage_out_and_status_says_why(teacher_folder, tmp_path):
    from pipelines.registry import load_config, select
    from pipelines.runner import Pipeline

    plain = load_config(DEMO, [f"run.root={tmp_path / 'plain'}"])
    assert plain.off == {"distill": "distill.enabled is false"}
    assert select(None, None, plain.off) == ["corpus", "vocab", "examples", "pretrain", "evaluate"]
    assert Pipeline(plain).reads("evaluate") == ("pretrain", "examples", "corpus")

    cfg = load_config(
        DEMO,
        [f"run.root={tmp_path / 'distil'}", *DISTIL, f"distill.teacher={teacher_folder}", "vocab.source=pretrained"],
    )
    assert set(cfg.off) == {"pretrain"} and teacher_folder in cfg.off["pretrain"]
    assert select(None, None, cfg.off) == ["corpus", "vocab", "examples", "distill", "evaluate"]
    assert select(None, "examples", cfg.off) == ["examples", "distill", "evaluate"]
    with pytest.raises(ConfigError, match="the pretrain stage is off in this recipe: distill.teacher"):
        select(["pretrain"], None, cfg.off)
    pipeline = Pipeline(cfg)
    assert pipeline.reads("distill") == ("examples", "vocab")
    rows = {row["stage"]: row for row in pipeline.status()}
    assert rows["pretrain"]["state"] == "off" and "nothing is pretrained" in rows["pretrain"]["note"]
    assert rows["distill"]["state"] == "missing" and rows["distill"]["expected_fingerprint"], rows["distill"]["note"]
    with pytest.raises(ConfigError, match="the pretrain stage is off"):
        pipeline.run("pretrain")

    # the pretrain stage's model as the teacher: pretrain runs, distill reads it
    internal = load_config(DEMO, [f"run.root={tmp_path / 'internal'}", *DISTIL])
    assert internal.off == {} and Pipeline(internal).reads("distill") == ("pretrain", "examples", "vocab")


def test_the_distill_recipe_trains_a_fixed_number_of_steps_and_the_time_budget_is_an_opt_in(minilm_or_stand_in):
    from pipelines.registry import load_config

    recipe = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "distill.yaml")
    cfg = load_config(recipe).distill
    # no wall-clock stop: the student is the one of the recipe's steps, whatever the machine's load
    assert cfg.time_budget_s is None and cfg.total_steps == 150 and cfg.checkpoint_every == cfg.total_steps
    capped = load_config(recipe, ["distill.time_budget_s=240"]).distill
    assert capped.time_budget_s == 240
    # a capped run's checkpoint resumes into the uncapped recipe: the budget does not shape the trajectory
    assert capped.resume_key({"seed": 1}) == cfg.resume_key({"seed": 1})
