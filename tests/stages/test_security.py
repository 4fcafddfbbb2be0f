"""What a hostile recipe or a planted file cannot do: names that would leave the run root
are refused, checkpoint files that would run code are never unpickled, config values are
not coerced, and the embedded Ray listens on the loopback interface only."""

from __future__ import annotations

import os
import pickle
import shutil

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest
import torch

from bertcore.errors import ConfigError
from bertcore.paths import PathEscape
from bertcore.train.checkpoint import CHECKPOINTS, LocalStageFiles, UnsafeCheckpoint, check_pickles, checkpoint_tag
from bertcore.train.export import consolidate_checkpoint
from bertcore.train.objectives import Pretraining
from bertcore.train.trainer import Trainer
from pipelines.registry import parse_config
from pipelines.stage_dir import StageDir
from pipelines.storage import Storage
from test_train import SEED, make_run_root, phase_data, tiny_pretrain

torch.set_num_threads(1)


# -- names that become paths ---------------------------------------------------------------------


TASK = {"type": "classification", "format": "tsv", "train": "t.tsv", "cross_validation_folds": 2}


@pytest.mark.parametrize(
    "section, key",
    [
        ({"evaluate": {"tasks": [{**TASK, "name": "../../x"}]}}, r"evaluate\.tasks\.0\.name"),
        ({"evaluate": {"tasks": [{**TASK, "name": ".hidden"}]}}, r"evaluate\.tasks\.0\.name"),
        (
            {"examples": {"phases": [{"name": "../seq", "max_seq_length": 64, "max_predictions_per_seq": 5}]}},
            r"examples\.phases\.0\.name",
        ),
        ({"pretrain": {"phases": [{"name": "a/b", "steps": 1, "batch_size": 2}]}}, r"pretrain\.phases\.0\.name"),
        ({"corpus": {"inputs": [{"uri": "a.txt", "name": "x/../../y"}]}}, r"corpus\.inputs\.0\.name"),
    ],
)
def test_a_name_that_would_leave_the_run_root_is_refused_when_the_recipe_loads(section, key):
    data = {"corpus": {"inputs": ["a.txt"]}, **section}
    with pytest.raises(ConfigError, match=rf"{key}: .* cannot name a file or folder"):
        parse_config(data)


def test_paths_inside_a_stage_directory_cannot_escape_it(tmp_path):
    stage = StageDir(Storage(parse_config({"corpus": {"inputs": ["a"]}}).storage), str(tmp_path), "eval")
    assert stage.path("plots/tasks.png") == f"{tmp_path}/eval/plots/tasks.png"
    for bad in ("../corpus/_manifest.json", "plots/../../x", "/etc/passwd", ".."):
        with pytest.raises(PathEscape, match="would leave"):
            stage.path(bad)


# -- config values are not coerced ---------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ({"vocab": {"vocab_size": True}}, r"vocab\.vocab_size: Input should be a valid integer \(got true\)"),
        ({"vocab": {"vocab_size": 30522.0}}, r"vocab\.vocab_size: Input should be a valid integer \(got 30522\.0\)"),
        ({"pretrain": {"num_workers": "2"}}, r"pretrain\.num_workers: Input should be a valid integer \(got '2'\)"),
        (
            {"corpus": {"inputs": ["a"], "near_dedup": 1}},
            r"corpus\.near_dedup: Input should be a valid boolean \(got 1\)",
        ),
    ],
)
def test_config_types_are_strict(override, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"corpus": {"inputs": ["a"]}, **override})
    # lists still give tuples (YAML has no tuples), and integers are fine for floats
    cfg = parse_config({"corpus": {"inputs": ["a"]}, "pretrain": {"betas": [0.9, 0.98], "learning_rate": 1}})
    assert cfg.pretrain.betas == (0.9, 0.98) and cfg.pretrain.learning_rate == 1.0


def test_lengths_beyond_the_models_positions_are_refused_when_the_recipe_loads():
    task = {**TASK, "name": "t", "max_seq_length": 1024}
    with pytest.raises(
        ConfigError, match=r"evaluate\.tasks\[0\]\.max_seq_length \(1024\) exceeds the pretrained model's 512 positions"
    ):
        parse_config({"corpus": {"inputs": ["a"]}, "evaluate": {"tasks": [task]}})
    with pytest.raises(ConfigError, match=r"evaluate\.intrinsic\.phases: \['seq64'\] are not examples phases"):
        parse_config({"corpus": {"inputs": ["a"]}, "evaluate": {"intrinsic": {"phases": ["seq64"]}}})


# -- no code from data ----------------------------------------------------------------------------


class _Planted:
    """A pickle payload that creates a file when it is unpickled (harmless, and visible)."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, gensim_data, world_of_one):
    """A run root with a ZeRO-2 checkpoint of three steps of the tiny model."""
    root = tmp_path_factory.mktemp("planted")
    info = make_run_root(root, gensim_data, max_documents=60, dupe_factor=1)
    cfg = tiny_pretrain(
        phases=[{"name": "seq64", "steps": 3, "batch_size": 8, "max_seq_length": 64}],
        warmup_steps=1,
        validation_batches=0,
        zero_stage=2,
        checkpoint_every=3,
    )
    model_cfg = cfg.build_model_config(len(info["tokens"]))
    Trainer(
        cfg,
        Pretraining(model_cfg),
        phase_data(root, info),
        LocalStageFiles(str(root / "pretrain")),
        seed=SEED,
        resume_key="k",
    ).run()
    return root, info, cfg, model_cfg


def _planted_copy(trained, tmp_path, victim: str, legacy: bool = False):
    root, info, cfg, model_cfg = trained
    stage = tmp_path / "pretrain"
    shutil.copytree(root / "pretrain", stage)
    folder = stage / CHECKPOINTS / checkpoint_tag(3)
    names = sorted(os.listdir(folder))
    target = next(n for n in names if victim in n)
    marker = tmp_path / "the-payload-ran"
    if legacy:  # a plain pickle, not torch's zip format
        with open(folder / target, "wb") as handle:
            pickle.dump({"module": _Planted(str(marker))}, handle)
    else:
        torch.save({"module": _Planted(str(marker))}, folder / target)
    return stage, folder, marker


@pytest.mark.parametrize(
    "victim, legacy",
    [("mp_rank_00_model_states.pt", False), ("optim_states.pt", False), ("mp_rank_00_model_states.pt", True)],
)
def test_a_planted_pickle_is_refused_by_export_and_resume_without_running(trained, tmp_path, victim, legacy):
    root, info, cfg, model_cfg = trained
    # the genuine checkpoint passes the scan
    check_pickles(str(root / "pretrain" / CHECKPOINTS / checkpoint_tag(3)))
    stage, folder, marker = _planted_copy(trained, tmp_path, victim, legacy)
    with pytest.raises(
        UnsafeCheckpoint,
        match=rf"{folder}/\S+\.pt: (refusing to load: it would call (builtins|io)\.open|not a checkpoint file)",
    ):
        consolidate_checkpoint(str(folder), model_cfg)
    resumed = cfg.model_copy(update={"phases": [cfg.phases[0].model_copy(update={"steps": 6})]})
    trainer = Trainer(
        resumed, Pretraining(model_cfg), phase_data(root, info), LocalStageFiles(str(stage)), seed=SEED, resume_key="k"
    )
    with pytest.raises(UnsafeCheckpoint):
        trainer.run()
    assert not marker.exists(), "the planted payload ran"


def test_a_planted_pickle_in_an_init_from_folder_is_refused_in_one_line_without_running(tmp_path):
    """pretrain.init_from with a pytorch_model.bin that would run code: bertpipe reads
    safetensors only, so nothing unpickles it; the user gets one line naming the file and
    the conversion command, never torch's advice about its loader's settings."""
    from bertcore.errors import InputDataError
    from bertcore.model.pretrained import read_weights

    marker = tmp_path / "the-payload-ran"
    (tmp_path / "model").mkdir()
    torch.save(
        {"bert.embeddings.word_embeddings.weight": _Planted(str(marker))}, tmp_path / "model" / "pytorch_model.bin"
    )
    with pytest.raises(InputDataError) as refused:
        read_weights(str(tmp_path / "model"))
    message = str(refused.value)
    assert message.startswith(
        f"pretrain.init_from: {tmp_path / 'model' / 'pytorch_model.bin'} is a pickle; bertpipe reads safetensors only"
    )
    assert "weights_only" not in message and "\n" not in message
    assert not marker.exists()


def test_trainer_state_is_json_and_safetensors(trained):
    root, *_ = trained
    names = os.listdir(root / "pretrain" / CHECKPOINTS / checkpoint_tag(3))
    assert {"trainer-rank-00000.json", "trainer-rank-00000.safetensors"} <= set(names)
    assert not [n for n in names if n.startswith("trainer-rank") and n.endswith(".pt")]


# -- the embedded Ray ------------------------------------------------------------------------------


LISTENERS = r"""
import json, psutil, ray
from bertcore.config import RayConfig
from pipelines.ray_runtime import ensure_ray

ensure_ray(RayConfig(num_cpus=1))
ray.get(ray.remote(lambda: 1).remote())  # a worker process is up too
listening = {}
for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
    try:
        for conn in process.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                listening.setdefault(process.name(), []).append(conn.laddr.ip)
    except psutil.NoSuchProcess:
        pass
print("RESULT " + json.dumps(listening))
ray.shutdown()
"""


def test_embedded_ray_listens_on_loopback_only(tmp_path):
    """In a process of its own (this one also runs torch.distributed's store for other
    tests): every socket the embedded Ray and its processes listen on is a loopback one."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LISTENERS], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert result, out.stderr[-3000:]
    listening = json.loads(result[-1].removeprefix("RESULT "))
    assert {"gcs_server", "raylet"} <= set(listening), listening
    loopback = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
    exposed = {name: sorted(set(ips) - loopback) for name, ips in listening.items() if set(ips) - loopback}
    assert exposed == {}, exposed


def test_cluster_files_keep_the_dashboard_off_public_interfaces():
    from pathlib import Path

    import yaml

    infra = Path(__file__).resolve().parents[2] / "infra"
    launcher = yaml.safe_load((infra / "ray" / "cluster.yaml").read_text())
    head = " ".join(launcher["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
    policy = yaml.safe_load((infra / "k8s" / "networkpolicy.yaml").read_text())
    cluster = yaml.safe_load((infra / "k8s" / "raycluster.yaml").read_text())
    selector = {"ray.io/cluster": cluster["metadata"]["name"]}
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["podSelector"]["matchLabels"] == selector
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    assert cluster["spec"]["headGroupSpec"]["serviceType"] == "ClusterIP"
