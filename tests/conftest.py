"""Shared fixtures: one local Ray per session, a real S3 endpoint (moto server on
127.0.0.1), Prefect's test harness, and paths of the bundled sample data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
# Dummy credentials for the moto S3 server, set before any Ray worker starts so workers
# find them in their environment the way they would find real ones.
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")


@pytest.fixture(scope="session")
def gensim_data() -> Path:
    from bertcore.sample_data import gensim_data_dir

    return gensim_data_dir()


@pytest.fixture(scope="session")
def enwiki_dump(gensim_data) -> Path:
    from bertcore.sample_data import ENWIKI_DUMP

    return gensim_data / ENWIKI_DUMP


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray with 2 CPUs, shared by every test that needs one."""
    import ray

    if not ray.is_initialized():
        from bertcore.config import RayConfig
        from pipelines.ray_runtime import ensure_ray

        ensure_ray(RayConfig(num_cpus=2))
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 HTTP endpoint (moto) on 127.0.0.1; yields its URL."""
    from moto.server import ThreadedMotoServer

    from processes import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    url = f"http://127.0.0.1:{port}"
    yield url
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh bucket per test; yields (endpoint_url, bucket name)."""
    import boto3

    name = "bp-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return s3_server, name


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API (SQLite) for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


DEMO_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


@pytest.fixture(scope="session")
def demo_pipeline(tmp_path_factory, ray_cluster):
    """corpus -> vocab -> examples on the demo recipe, run once per session (a smaller
    vocabulary and one pass keep it quick). Yields (config, {stage: manifest})."""
    from pipelines.registry import load_config
    from pipelines.runner import Pipeline

    root = tmp_path_factory.mktemp("pipeline")
    cfg = load_config(DEMO_RECIPE, [f"run.root={root}", "vocab.vocab_size=4000", "examples.dupe_factor=1"])
    pipeline = Pipeline(cfg)
    manifests = {name: pipeline.run(name)[0] for name in ("corpus", "vocab", "examples")}
    return cfg, manifests


@pytest.fixture(scope="session")
def world_of_one():
    """torch.distributed with one gloo process in this process (what DeepSpeed needs)."""
    import torch

    from processes import free_port

    if not torch.distributed.is_initialized():
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
        )
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield


@pytest.fixture
def minilm_or_stand_in(tmp_path, monkeypatch):
    """`{minilm}` in a recipe: the all-MiniLM-L6-v2 folder when its optional wheel is
    installed (`make teacher`), else a tiny BERT folder written here, so recipes that name
    the teacher validate without the wheel. Returns the stand-in's folder, or None when
    the wheel is there."""
    import importlib.util

    from bertcore import sample_data

    if importlib.util.find_spec(sample_data.MINILM_PACKAGE) is not None:
        return None
    from tiny_bert import save_tiny_bert

    folder = Path(
        save_tiny_bert(
            tmp_path / "minilm-stand-in", ["a small stand-in for the teacher", "with a few words"], vocab_size=60
        )
    )
    monkeypatch.setattr(sample_data, "minilm_dir", lambda check=True: folder)
    return folder


# -- GPU tests ----------------------------------------------------------------------------------


def _gpu_session(config) -> bool:
    """Whether this session asked for the GPU tests (`pytest -m gpu`). They need a process of
    their own: DeepSpeed's accelerator is chosen once per process, and a process that opened
    the CPU tests' gloo group cannot open NCCL."""
    expression = config.getoption("markexpr") or ""
    return "gpu" in expression and "not gpu" not in expression


def pytest_configure(config):
    if _gpu_session(config):  # before any test module sets DS_ACCELERATOR=cpu
        os.environ.setdefault("DS_ACCELERATOR", "cuda")


def pytest_collection_modifyitems(config, items):
    """Every other session leaves the GPU tests out (deselected, not skipped). The longest
    test files go first (tests/durations.json), so that the two workers of `make test`
    (pytest-xdist, a file per worker at a time) start the long ones early and end
    together instead of one waiting on the last long file. xdist keeps this order only with
    `--no-loadscope-reorder` (pyproject.toml's addopts); by default it sends the files with
    the most tests first."""
    if not _gpu_session(config):
        gpu = [item for item in items if item.get_closest_marker("gpu")]
        if gpu:
            config.hook.pytest_deselected(items=gpu)
            items[:] = [item for item in items if not item.get_closest_marker("gpu")]
    seconds = json.loads((Path(__file__).parent / "durations.json").read_text())
    root = Path(__file__).resolve().parents[1]
    items.sort(
        key=lambda item: -seconds.get(item.path.relative_to(root).as_posix(), 0)
    )  # stable: a file's tests keep their order
