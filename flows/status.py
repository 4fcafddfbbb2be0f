"""`bertpipe status`: what each stage's directory holds compared with what the config asks for."""

from __future__ import annotations

from typing import Any

from bertcore.config import PipelineConfig
from bertcore.errors import BertpipeError
from flows.stages import REGISTRY
from pipelines.stage import StageDir
from pipelines.storage import Storage


def stage_status(cfg: PipelineConfig) -> list[dict[str, Any]]:
    storage = Storage(cfg.storage)
    rows = []
    for name, spec in REGISTRY.items():
        stage = StageDir(storage, cfg.run.root, spec.directory)
        manifest = stage.manifest()
        try:
            expected = spec.expected_fingerprint(cfg, storage)
        except BertpipeError as exc:  # e.g. inputs that no longer exist: nothing to compare with
            expected, note = None, str(exc)
        else:
            note = ""
        state = stage.state(expected) if expected is not None else ("missing" if manifest is None else "unknown")
        rows.append(
            {
                "stage": name,
                "state": state,
                "fingerprint": manifest.fingerprint if manifest else None,
                "expected_fingerprint": expected,
                "rows": manifest.rows if manifest else None,
                "bytes": manifest.bytes if manifest else None,
                "seconds": manifest.timings.get("total_s") if manifest else None,
                "uri": stage.uri,
                "note": note,
            }
        )
    return rows
