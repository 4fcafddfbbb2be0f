"""The suite's fixtures for the probe that runs under pytest (`pytest -s probes/fault_matrix_nodes.py`).

tests/conftest.py reaches only what lies under tests/, so it is loaded here under a name of its
own and its fixtures are offered to probes/ as they are to the suite (the same local Ray, moto
server, Prefect harness and demo pipeline). The helper and test modules the probe imports by
name (`processes`, `test_ray_cluster`, ...) are on sys.path through pyproject.toml's pytest
`pythonpath`. Run the probe on its own, not in the same session as tests/: each conftest would
hold its own session fixtures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "suite_conftest", Path(__file__).resolve().parents[1] / "tests" / "conftest.py"
)
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)

gensim_data = _suite.gensim_data
enwiki_dump = _suite.enwiki_dump
ray_cluster = _suite.ray_cluster
s3_server = _suite.s3_server
s3_bucket = _suite.s3_bucket
prefect_harness = _suite.prefect_harness
demo_pipeline = _suite.demo_pipeline
world_of_one = _suite.world_of_one
minilm_or_stand_in = _suite.minilm_or_stand_in
