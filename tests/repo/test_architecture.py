"""The shape of the code: imports point one way with no cycle, stage modules do not import
each other, Prefect stays in flows/, the docs' stage table is the registry's, and a new
stage needs nothing but its declaration to run under the contract."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bertcore", "pipelines", "flows")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Every module of the three packages -> the modules it imports anywhere in its body
    (function-level imports included: a deferred import is still a dependency)."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = _module_name(path)
            found: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module)
                    found.update(f"{node.module}.{alias.name}" for alias in node.names)
            graph[name] = found
    return graph


GRAPH = _imports()


def _internal(imported: set[str]) -> set[str]:
    return {m for m in imported if m in GRAPH}


def test_layers_point_one_way():
    for module, imported in GRAPH.items():
        top = {m.split(".")[0] for m in imported}
        if module.startswith("bertcore"):
            assert not top & {"ray", "prefect", "pipelines", "flows"}, (
                module,
                top & {"ray", "prefect", "pipelines", "flows"},
            )
        if module.startswith("pipelines"):
            assert not top & {"prefect", "flows"}, (module, top & {"prefect", "flows"})


def _stage_modules() -> dict[str, set[str]]:
    """Each stage's modules: everything in its folder, pipelines/stages/<name>/ (the
    declaration in `__init__.py`, the work in `work.py`, and that stage's helpers)."""
    from pipelines.registry import STAGES

    return {
        stage.name: {
            m for m in GRAPH if m == f"pipelines.stages.{stage.name}" or m.startswith(f"pipelines.stages.{stage.name}.")
        }
        for stage in STAGES
    }


def test_no_stage_module_imports_another():
    modules = _stage_modules()
    everything = set().union(*modules.values())
    assert all(len(own) >= 2 for own in modules.values()), modules
    for name, own in modules.items():
        for module in own:
            assert not (_internal(GRAPH[module]) & everything) - own, (name, module)


def test_every_stage_declares_its_work_by_name_and_its_declaration_stays_light():
    """The registry imports the declarations; the work (Ray, torch, pyarrow) is imported when
    the stage runs. A declaration that imported its work would bring it back."""
    from pipelines.registry import STAGES

    for stage in STAGES:
        declaration, work = f"pipelines.stages.{stage.name}", stage.run.partition(":")[0]
        assert work == f"{declaration}.work", (stage.name, work)
        assert work not in _internal(GRAPH[declaration]), (
            stage.name
        )  # a light helper (corpus/inputs.py) may be imported


def test_ray_is_imported_only_by_the_ray_module_and_the_stages_work():
    """Ray calls live in the machinery's Ray module (pipelines/ray_runtime.py), in the stages'
    folders (their work and its helpers), in pipelines/training/, the training stages'
    shared work, and in the Ray Serve deployment and its start-up (pipelines/serve/replica.py,
    launch.py: Ray Serve is the scale-out serving layer, as Ray Train is the training one);
    the rest of pipelines/ (contract, runner, storage, lease, shards, export, what serve
    serves, the serving app itself) is plain Python that a driver or a test calls without a
    cluster."""
    allowed = (
        "pipelines.ray_runtime",
        "pipelines.stages.",
        "pipelines.training",
        "pipelines.serve.replica",
        "pipelines.serve.launch",
    )
    importers = {
        m
        for m, imported in GRAPH.items()
        if m.startswith("pipelines") and any(i.split(".")[0] == "ray" for i in imported)
    }
    assert importers and all(m.startswith(allowed) for m in importers), sorted(
        m for m in importers if not m.startswith(allowed)
    )
    declarations = {f"pipelines.stages.{name}" for name in _stage_modules()}
    assert not importers & declarations


def test_the_top_levels_stay_small():
    """A newcomer finds the machinery at the top of pipelines/ and what every component
    shares at the top of bertcore/; stage work lives in the stages' folders, the library's
    in its components' folders, each with its config section beside it."""
    assert len(list((ROOT / "pipelines").glob("*.py"))) <= 14
    assert len(list((ROOT / "bertcore").glob("*.py"))) <= 10
    assert not list((ROOT / "bertcore").rglob("*_config.py"))
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            lines = path.read_text(encoding="utf-8").splitlines()
            assert len(lines) <= 500 or lines[0].startswith("# Over 500 lines on purpose:"), path


COMPONENTS = {
    "text": set(),
    "vocab": set(),
    "examples": set(),
    "model": set(),
    "train": {"model", "examples", "vocab"},
    "distill": {"model", "train"},
    "eval": {"text", "vocab", "examples", "model", "train"},
    "inference": {"model", "train", "eval"},
}
"""bertcore's components and the components each may import (the top-level helpers, such
as section, errors and rng, are free to all); what a folder's __init__ docstring says."""


def test_bertcore_components_import_only_the_ones_below_them():
    folders = {path.parent.name for path in (ROOT / "bertcore").glob("*/__init__.py")}
    assert folders == set(COMPONENTS), folders ^ set(COMPONENTS)
    for module, imported in GRAPH.items():
        parts = module.split(".")
        if parts[0] != "bertcore" or len(parts) < 2 or parts[1] not in COMPONENTS:
            continue
        used = {
            m.split(".")[1] for m in _internal(imported) if m.startswith("bertcore.") and m.split(".")[1] in COMPONENTS
        }
        assert used - {parts[1]} <= COMPONENTS[parts[1]], (module, sorted(used - {parts[1]} - COMPONENTS[parts[1]]))
    for name in COMPONENTS:
        doc = " ".join(
            (
                ast.get_docstring(ast.parse((ROOT / "bertcore" / name / "__init__.py").read_text(encoding="utf-8")))
                or ""
            ).split()
        )
        assert "May import" in doc and "Must not import" in doc, (
            f"bertcore/{name}/__init__.py: say what it may and must not import"
        )


HEAVY = ("torch", "ray", "matplotlib", "scipy", "transformers", "deepspeed", "datasketch", "sklearn", "prefect")
"""What reading a recipe or a manifest must not import (seconds each, before the command does anything)."""


def heavy_imports(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter has imported after running `code`."""
    probe = f"{code}\nimport json, sys\nprint('HEAVY=' + json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    found = [line for line in out.stdout.splitlines() if line.startswith("HEAVY=")]
    assert found, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(found[-1].removeprefix("HEAVY="))


def test_loading_every_shipped_recipe_imports_nothing_heavy(minilm_or_stand_in):
    # without the optional teacher wheel, `{minilm}` points at a tiny stand-in written by the fixture
    stand_in = (
        ""
        if minilm_or_stand_in is None
        else (
            "from pathlib import Path\nfrom bertcore import sample_data\nsample_data.minilm_dir = lambda "
            f"check=True: Path({str(minilm_or_stand_in)!r})\n"
        )
    )
    code = stand_in + (
        "import glob\nfrom pipelines.registry import load_config\nfor path in "
        "sorted(glob.glob('configs/*.yaml')):\n    load_config(path)"
    )
    assert heavy_imports(code) == []


def test_no_import_cycle():
    # Tarjan's strongly connected components over the project's own modules
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in _internal(GRAPH[node]) - {node}:
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert cycles == []


def test_docs_stage_table_is_the_registry():
    from flows.architecture import DOCS, END, START, render_table

    table = render_table()
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        assert f"{START}\n{table}{END}" in text, f"{path}: run `python -m flows.architecture`"
    for name in ("corpus", "vocab", "examples", "pretrain", "evaluate"):
        assert f"| {name} |" in table


def test_every_stage_section_is_in_the_recipe_model():
    from pipelines.registry import STAGES, PipelineConfig

    for stage in STAGES:
        assert PipelineConfig.model_fields[stage.name].annotation is stage.section


def test_pretrain_phases_are_checked_against_examples_when_the_recipe_loads():
    from bertcore.errors import ConfigError
    from pipelines.registry import parse_config

    base = {
        "corpus": {"inputs": ["a.txt"]},
        "examples": {"phases": [{"name": "seq128", "max_seq_length": 128, "max_predictions_per_seq": 20}]},
    }
    with pytest.raises(ConfigError, match=r"pretrain\.phases\[1\]\.name: the examples stage has no phase 'seq512'"):
        parse_config(base)  # the default pretrain phases are seq128 and seq512
    short = {**base, "pretrain": {"phases": [{"name": "seq128", "steps": 10, "batch_size": 8, "max_seq_length": 64}]}}
    with pytest.raises(
        ConfigError, match=r"pretrain\.phases\[0\]\.max_seq_length \(64\) is shorter than the examples of phase seq128"
    ):
        parse_config(short)
    fine = parse_config({**base, "pretrain": {"phases": [{"name": "seq128", "steps": 10, "batch_size": 8}]}})
    assert fine.pretrain.phases[0].max_seq_length is None  # taken from the examples phase when training starts


def test_a_new_stage_runs_under_the_contract_from_its_declaration_alone(demo_pipeline, tmp_path, monkeypatch):
    """A word-count stage over the corpus: one module's worth of code and one registry entry
    give it upstream lookup, a fingerprint that follows the corpus, reuse, unit markers and
    a manifest."""
    import json

    import pyarrow.compute as pc

    from bertcore.section import Section
    from pipelines import registry
    from pipelines.runner import run_stage
    from pipelines.shards import read_batches
    from pipelines.stage import Output, Stage, StageRun, UpstreamMissing
    from pipelines.storage import Storage

    class WordCountConfig(Section):
        lowercase: bool = True

    calls = []

    def run(r: StageRun) -> Output:
        corpus = r.inputs["corpus"]
        shards = []
        for shard in corpus.manifest.shards_under("train/"):
            unit = r.dir.done(shard.path, r.fingerprint)
            if unit is None:
                calls.append(shard.path)
                words = sum(
                    len(s.split())
                    for b in read_batches(r.storage, corpus.path(shard.path))
                    for s in pc.list_flatten(b.column("sentences")).to_pylist()
                )
                info = r.dir.publish(
                    shard.path + ".json", lambda p, w=words: open(p, "w").write(json.dumps({"words": w})), rows=1
                )
                unit = r.dir.complete(shard.path, r.fingerprint, [info], words)
            shards.extend(unit.shards)
        return Output(shards=shards, stats={"words": sum(json.load(open(r.dir.path(s.path)))["words"] for s in shards)})

    stage = Stage(name="wordcount", section=WordCountConfig, run=run, reads=("corpus",), writes="word counts per shard")
    monkeypatch.setitem(registry.REGISTRY, "wordcount", stage)

    cfg, _ = demo_pipeline
    storage = Storage(cfg.storage)
    with pytest.raises(
        UpstreamMissing, match=r"the corpus stage has no output under .*: run `bertpipe run --only corpus`"
    ):
        run_stage("wordcount", WordCountConfig(), root=str(tmp_path / "empty"), storage=storage, seed=1)
    root = tmp_path / "run"
    shutil.copytree(Path(cfg.run.root) / "corpus", root / "corpus")
    manifest, computed = run_stage("wordcount", WordCountConfig(), root=str(root), storage=storage, seed=1)
    assert computed and manifest.stats["words"] > 10_000 and (root / "wordcount" / "_manifest.json").exists()
    # the manifest records what went into the fingerprint besides the section (here: a seeded stage)
    assert manifest.inputs == {
        "corpus": json.loads((root / "corpus" / "_manifest.json").read_text())["fingerprint"],
        "seed": 1,
    }
    assert not run_stage("wordcount", WordCountConfig(), root=str(root), storage=storage, seed=1)[1]
    # an interrupted attempt: the manifest is gone, the finished units are kept
    (root / "wordcount" / "_manifest.json").unlink()
    before = len(calls)
    again, computed = run_stage("wordcount", WordCountConfig(), root=str(root), storage=storage, seed=1)
    assert computed and len(calls) == before and again.stats == manifest.stats
    # another setting: another fingerprint, recomputed
    other, computed = run_stage("wordcount", WordCountConfig(lowercase=False), root=str(root), storage=storage, seed=1)
    assert computed and other.fingerprint != manifest.fingerprint and len(calls) > before


def _cli(*args: str) -> str:
    """Python code that runs `bertpipe ARGS` in this interpreter (its exit is caught)."""
    return (
        f"import sys\nfrom flows import cli\nsys.argv = ['bertpipe', *{list(args)!r}]\ntry:\n    "
        "cli.main()\nexcept SystemExit:\n    pass"
    )


@pytest.fixture(scope="module")
def read_only_root(tmp_path_factory):
    """A run root with the outputs `status`, `verify` and `inspect` read without running
    anything: complete pretrain and evaluate directories (manifest, metrics.jsonl, a
    checkpoint marker, metrics.json), as the stages write them."""
    from pipelines.stage_dir import Manifest, ShardInfo

    root = tmp_path_factory.mktemp("read-only")
    pretrain, evaluate = root / "pretrain", root / "eval"
    (pretrain / "checkpoints" / "step-0000004").mkdir(parents=True)
    (pretrain / "checkpoints" / "step-0000004" / "_complete.json").write_text(
        json.dumps({"step": 4, "phase": "seq128", "tokens_seen": 512, "train_time_s": 1.5})
    )
    records = [
        {"step": s, "phase": "seq128", "loss": 9.0 - s, "mlm_accuracy": 0.01 * s, "tokens": 128, "step_time_s": 0.1}
        for s in range(1, 5)
    ]
    (pretrain / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    stats = {"steps": 4, "validation": {"step": 4, "sequences": 8, "loss": 6.0, "mlm_accuracy": 0.05}, "loss_jumps": []}
    shard = ShardInfo("metrics.jsonl", rows=4, bytes=(pretrain / "metrics.jsonl").stat().st_size, sha256="0" * 64)
    manifest = Manifest("pretrain", "1", "f" * 20, {}, {"log_every": 2}, [shard], stats, {"total_s": 75.0})
    (pretrain / "_manifest.json").write_text(json.dumps(manifest.to_json()))
    evaluate.mkdir()
    metrics = {"intrinsic": {}, "tasks": {}, "embeddings": None, "verdicts": ["a verdict"], "notes": []}
    (evaluate / "metrics.json").write_text(json.dumps(metrics))
    manifest = Manifest(
        "evaluate", "1", "e" * 20, {}, {}, [], {"tasks": {}, "intrinsic": {}}, {"total_s": 9.0}, report="report.md"
    )
    (evaluate / "_manifest.json").write_text(json.dumps(manifest.to_json()))
    return root


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("run", "-h"),
        ("config", "show", "-c", "configs/demo.yaml"),
        ("run", "-c", "configs/demo.yaml", "--only", "trainer"),  # a mistyped stage, refused
        ("status", "-c", "configs/demo.yaml", "--set", "run.root={root}"),
        ("verify", "-c", "configs/demo.yaml", "--set", "run.root={root}"),
        ("inspect", "pretrain", "--root", "{root}"),
        ("inspect", "evaluate", "--root", "{root}"),
        ("inspect", "vocab", "--root", "{root}"),  # not there: refused in one line
    ],
)
def test_commands_that_read_recipes_and_manifests_import_nothing_heavy(args, read_only_root):
    """`bertpipe --help`, `config show`, a refused stage name, `status` (which lists the
    corpus inputs and their content identity), `verify` and `inspect` answer without
    importing torch, Ray, Prefect, matplotlib and the like."""
    assert heavy_imports(_cli(*(a.format(root=read_only_root) for a in args))) == []
