"""The shape of a stage's log, as an operator reads it: a start line with the plan, at
least one progress line while it runs, an end line with the headline figures, no line over
200 characters; and a rerun on the same fingerprint says it was cached. Real stages on a
real local Ray, on the news text shipped in the gensim wheel."""

from __future__ import annotations

import logging
import re

import pytest

from pipelines.registry import parse_config
from pipelines.runner import Pipeline

STAGES = ("corpus", "vocab", "examples")


@pytest.fixture
def config(tmp_path, gensim_data):
    return parse_config(
        {
            "run": {"root": str(tmp_path)},
            "corpus": {
                "inputs": [{"uri": str(gensim_data / "lee_background.cor"), "format": "lines"}],
                "validation_fraction": 0.1,
                "shard_chars": 100_000,
            },
            "vocab": {"vocab_size": 2000},
            "examples": {
                "dupe_factor": 1,
                "phases": [{"name": "seq64", "max_seq_length": 64, "max_predictions_per_seq": 10}],
            },
            "pretrain": {"phases": [{"name": "seq64", "steps": 1, "batch_size": 2}]},
        }
    )


def test_each_stage_logs_start_progress_and_end(ray_cluster, config, caplog):
    caplog.set_level(logging.INFO, logger="pipelines")
    pipeline = Pipeline(config)
    manifests = {name: pipeline.run(name)[0] for name in STAGES}
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("pipelines")]
    assert lines and all(len(line) <= 200 for line in lines), max(lines, key=len)
    for name in STAGES:
        mine = [line for line in lines if line.startswith(f"{name}:") or line.startswith(f"{name} ")]
        assert re.fullmatch(
            rf"{name}: start · reads .+ · workers .+ · fingerprint {manifests[name].fingerprint}", mine[0]
        ), mine[0]
        progress = [line for line in mine if re.search(r" (\d+)/\1 units", line)]
        assert progress, f"{name} logged no progress line: {mine}"
        assert re.fullmatch(rf"{name}: done in \S+ · .+", mine[-1]), mine[-1]
    corpus_end = next(line for line in lines if line.startswith("corpus: done"))
    assert f"documents {manifests['corpus'].stats['documents_kept']}" in corpus_end
    assert "[UNK] rate" in next(line for line in lines if line.startswith("vocab: done"))

    records = [r for r in caplog.records if getattr(r, "event", None) == "stage_end"]
    assert [(r.stage, r.computed) for r in records] == [(name, True) for name in STAGES]
    assert records[0].headline == manifests["corpus"].headline

    caplog.clear()
    for name in STAGES:
        assert pipeline.run(name)[1] is False
    ends = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "stage_end"]
    assert [line.split(":")[0] for line in ends] == list(STAGES)
    assert all("cached (its complete output has this fingerprint)" in line for line in ends)
    assert not [r for r in caplog.records if getattr(r, "event", None) in ("stage_start", "progress")]
