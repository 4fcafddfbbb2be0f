"""Recipes: YAML sections validated by pydantic; errors name the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bertcore.config import resolved_yaml
from bertcore.errors import ConfigError
from pipelines.registry import PipelineConfig, load_config, parse_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("recipe", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_recipe_validates(recipe, minilm_or_stand_in):
    cfg = load_config(recipe)
    assert isinstance(cfg, PipelineConfig)
    for spec in cfg.corpus.inputs:
        assert "{" not in spec.uri, "placeholders must be expanded"


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_key_is_named(tmp_path):
    path = write(tmp_path, "r.yaml", {"corpus": {"inputs": ["a.txt"], "min_sentencs": 3}})
    with pytest.raises(ConfigError, match=r"corpus\.min_sentencs: unknown key"):
        load_config(path)


def test_bad_value_is_named(tmp_path):
    path = write(tmp_path, "r.yaml", {"corpus": {"inputs": [{"uri": "a", "format": "pdf"}]}})
    with pytest.raises(ConfigError, match=r"corpus\.inputs\.0\.format"):
        load_config(path)


def test_unknown_section_is_named():
    with pytest.raises(ConfigError, match=r"^invalid config: trainer: unknown key"):
        parse_config({"trainer": {}, "corpus": {"inputs": ["a"]}})


def test_set_overrides_parse_yaml_values(tmp_path):
    path = write(tmp_path, "r.yaml", {"corpus": {"inputs": ["a.txt"]}})
    cfg = load_config(path, ["corpus.min_sentences=4", "corpus.near_dedup=true", "run.root=s3://b/p/"])
    assert cfg.corpus.min_sentences == 4 and cfg.corpus.near_dedup is True
    assert cfg.run.root == "s3://b/p"
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(path, ["corpus.min_sentences"])
    with pytest.raises(ConfigError, match=r"corpus\.min_sentences"):
        load_config(path, ["corpus.min_sentences=zero"])


def test_extends_merges_over_base(tmp_path):
    write(tmp_path, "base.yaml", {"run": {"seed": 7}, "corpus": {"inputs": ["a.txt"], "min_chars": 10}})
    child = write(tmp_path, "child.yaml", {"extends": "base.yaml", "corpus": {"min_chars": 50}})
    cfg = load_config(child)
    assert (cfg.run.seed, cfg.corpus.min_chars, cfg.corpus.inputs[0].uri) == (7, 50, "a.txt")
    loop = write(tmp_path, "loop.yaml", {"extends": "loop.yaml"})
    with pytest.raises(ConfigError, match="cycle"):
        load_config(loop)


def test_impossible_combination_rejected():
    with pytest.raises(ConfigError, match="min_chars must not exceed max_doc_chars"):
        parse_config({"corpus": {"inputs": ["a"], "min_chars": 10, "max_doc_chars": 5}})


def test_secrets_never_written():
    cfg = parse_config({"corpus": {"inputs": ["a"]}, "storage": {"key": "AKIAEXAMPLE", "secret": "s3cr3t-value"}})
    assert cfg.storage.fsspec_options("s3")["secret"] == "s3cr3t-value"
    text = resolved_yaml(cfg) + repr(cfg)
    assert "s3cr3t-value" not in text and "AKIAEXAMPLE" not in text


def test_missing_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("corpus: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_config_reference_matches_the_models():
    """docs/config.md is generated from the pydantic models; regenerate it with
    `python -m flows.config_reference > docs/config.md` after changing a field."""
    from flows.config_reference import render

    reference = Path(__file__).resolve().parents[2] / "docs" / "config.md"
    assert reference.read_text(encoding="utf-8") == render()
    for key in (
        "corpus.inputs[].uri",
        "vocab.vocab_size",
        "examples.objective",
        "pretrain.zero_stage",
        "evaluate.tasks[].type",
    ):
        assert f"`{key}`" in render(), key


def test_exponent_without_a_decimal_point_is_a_number(tmp_path):
    # PyYAML's YAML 1.1 rules read `1e-4` as a string; recipes are read as YAML 1.2 writes it
    path = write(tmp_path, "r.yaml", {"corpus": {"inputs": ["a.txt"]}})
    path.write_text(path.read_text() + "pretrain:\n  learning_rate: 1e-4\n  eps: 1E-6\n")
    cfg = load_config(path, ["pretrain.weight_decay=1e-2"])
    assert (cfg.pretrain.learning_rate, cfg.pretrain.eps, cfg.pretrain.weight_decay) == (1e-4, 1e-6, 1e-2)


class _DataParallel:
    """What DeepSpeed's config parser asks of a model-parallel unit: the data-parallel size."""

    def __init__(self, workers: int):
        self.workers = workers

    def get_data_parallel_world_size(self) -> int:
        return self.workers


LAMB_ON_GPU = ("pretrain.optimizer=lamb", "pretrain.zero_stage=0")  # the switch bert-large.yaml describes


@pytest.mark.parametrize(
    ("recipe", "overrides"),
    [(path, ()) for path in CONFIGS] + [(CONFIGS[0].parent / "bert-large.yaml", LAMB_ON_GPU)],
    ids=[p.name for p in CONFIGS] + ["bert-large.yaml+lamb"],
)
def test_every_recipe_gives_deepspeed_a_config_and_optimizer_arguments_it_accepts(
    recipe, overrides, world_of_one, minilm_or_stand_in
):
    """The GPU recipes cannot train here; what DeepSpeed reads from them still can be
    checked: its own config parser takes the JSON of every phase at the recipe's worker
    count, and the optimizer it would build (FusedAdam, FusedLamb, torch's AdamW) accepts
    the parameters, so a GPU run does not fail on a key. A recipe that distils is checked
    on its distill section, which trains through the same DeepSpeed set-up."""
    import inspect

    import deepspeed
    import torch
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.runtime.config import DeepSpeedConfig

    from bertcore.train.optim import deepspeed_config

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)  # over world_of_one's process group
    loaded = load_config(recipe, list(overrides))
    cfg = loaded.distill if loaded.distill.enabled else loaded.pretrain  # the training section that runs
    for phase in cfg.phases:
        ds = deepspeed_config(cfg, cfg.micro_batch_size(phase))
        parsed = DeepSpeedConfig(ds, mpu=_DataParallel(cfg.num_workers))
        assert parsed.train_batch_size == phase.batch_size and parsed.zero_optimization_stage == cfg.zero_stage
        assert parsed.bfloat16_config.enabled == (cfg.precision == "bf16")
        if "optimizer" not in ds:
            assert cfg.optimizer == "lamb" and not cfg.use_gpu  # the client LAMB
            continue
        params = dict(ds["optimizer"]["params"])
        kind = ds["optimizer"]["type"]
        if kind == "Lamb":
            constructor = FusedLamb.__init__
        elif params.pop("torch_adam", False):
            constructor, params = torch.optim.AdamW.__init__, {**params, "foreach": None}
        else:
            constructor, params = FusedAdam.__init__, {**params, "adam_w_mode": True}
        inspect.signature(constructor).bind(None, [], **params)  # raises TypeError on an unknown key
    if recipe.name in ("bert-base.yaml", "bert-large.yaml", "roberta-base.yaml") and not overrides:
        assert cfg.use_gpu and cfg.precision == "bf16" and cfg.zero_stage in (1, 2) and not cfg.torch_adam
    if overrides:
        assert ds["optimizer"]["type"] == "Lamb"


# -- hostile recipes (issue 18, cases 4 and 6) ----------------------------------------------


BOMB = """\
pretrain:
  model_overrides:
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
corpus:
  inputs: [a.txt]
"""


def test_a_yaml_alias_bomb_is_refused_with_one_line_instead_of_hanging(tmp_path):
    """The probe's 500-byte recipe hung `config show` and `run` while pydantic's error was
    formatted. Run in a child process, so the old behaviour fails the test (timeout) rather
    than hanging the suite; the timeout guards against a hang and measures nothing."""
    import subprocess
    import sys

    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(BOMB)
    assert len(BOMB) < 600
    try:
        out = subprocess.run(
            [sys.executable, "-m", "flows.cli", "config", "show", "-c", str(recipe)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("config show still hangs on an alias bomb")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        (
            f"bertpipe: error: {recipe}: YAML aliases (*name) of lists or mappings are not allowed in recipes; "
            "write the value out, or use `extends`"
        )
    ]
    with pytest.raises(ConfigError, match=r"--set pretrain\.model_overrides: YAML aliases"):
        load_config(None, ["corpus.inputs=[a]", "pretrain.model_overrides={a: &a [1, 2], b: [*a, *a]}"])
    # an alias of a plain value expands to nothing bigger than itself: allowed
    assert load_config(None, ["corpus.inputs=[&x a.txt, *x]"]).corpus.inputs[1].uri == "a.txt"


def test_a_recipe_over_the_size_limit_is_refused_with_one_line(tmp_path):
    from bertcore.config import MAX_RECIPE_BYTES

    recipe = tmp_path / "big.yaml"
    recipe.write_text("corpus:\n  inputs: [a.txt]\n# " + "x" * MAX_RECIPE_BYTES + "\n")
    with pytest.raises(ConfigError, match=rf"{recipe}: [\d,]+ bytes; a recipe may hold at most {MAX_RECIPE_BYTES:,}"):
        load_config(recipe)


def test_many_validation_errors_make_one_short_line(tmp_path):
    """Only the first few errors are named, each cut short; pydantic's own text (every input
    in full) is never formatted."""
    data = {
        "corpus": {"inputs": ["a.txt"], **{f"typo{i}": "x" * 10_000 for i in range(2000)}},
        "pretrain": {"model_overrides": {"hidden_size": "y" * 100_000}},
    }
    with pytest.raises(ConfigError) as error:
        parse_config(data)
    message = str(error.value)
    assert "\n" not in message and len(message) < 2000, len(message)
    assert "corpus.typo0: unknown key" in message and "and 1996 more" in message  # 1995 typos and the model override


@pytest.mark.parametrize(
    "root, message",
    [
        ("", r"run\.root: is empty"),
        (None, r"run\.root: is empty"),  # `--set run.root=`
        ("/", r"run\.root: '/' is the file system's root"),
        ("/tmp/..", r"run\.root: '/tmp/\.\.' is the file system's root"),
        (
            "$BERTPIPE_TEST_UNSET_VARIABLE/x",
            r"run\.root: .*the environment variable BERTPIPE_TEST_UNSET_VARIABLE is not set",
        ),
        ("s3://", r"run\.root: 's3://' is a whole file system"),
    ],
)
def test_run_roots_that_are_empty_whole_disks_or_unset_variables_are_refused(root, message, monkeypatch):
    """The probe: '' became the current directory, '/' was accepted, '$HOME/x' made a folder
    literally named `$HOME`."""
    monkeypatch.delenv("BERTPIPE_TEST_UNSET_VARIABLE", raising=False)
    with pytest.raises(ConfigError, match=message):
        parse_config({"corpus": {"inputs": ["a"]}, "run": {"root": root}})


def test_run_root_expands_variables_and_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTPIPE_TEST_RUNS", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for root, expected in [
        ("$BERTPIPE_TEST_RUNS/x", tmp_path / "x"),
        ("${BERTPIPE_TEST_RUNS}/y", tmp_path / "y"),
        ("~/runs", tmp_path / "home" / "runs"),
        ("s3://bucket/$BERTPIPE_TEST_RUNS", f"s3://bucket/{tmp_path}"),
    ]:
        assert parse_config({"corpus": {"inputs": ["a"]}, "run": {"root": root}}).run.root == str(expected)


def test_a_setting_added_later_leaves_runs_made_before_it_complete():
    """vocab.model came after runs were made: a manifest recorded without it, and a section at
    its default, give the same fingerprint; a section that sets it otherwise does not."""
    from pipelines.registry import REGISTRY
    from pipelines.stage import fingerprint

    stage = REGISTRY["vocab"]
    now = stage.section.model_validate({"vocab_size": 3000})
    recorded = {k: v for k, v in now.model_dump(mode="json").items() if k != "model"}  # what an older manifest holds
    before = fingerprint(stage.name, stage.code_version, stage.config_identity(recorded), {"corpus": "c", "seed": 1})
    assert stage.fingerprint(now, 1, {"corpus": "c"}, None) == before
    bpe = stage.section.model_validate({"vocab_size": 3000, "model": "byte_level_bpe", "lowercase": False})
    assert stage.fingerprint(bpe, 1, {"corpus": "c"}, None) != before
