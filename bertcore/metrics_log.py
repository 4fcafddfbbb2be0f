"""The pretraining logs, JSON lines keyed by optimizer step: metrics.jsonl (one record per
step: losses, accuracies, rates) and validation.jsonl (one record per validation of the
held-out sample, every pretrain.eval_every steps and at the end)."""

from __future__ import annotations

import json
import os

METRICS = "metrics.jsonl"
VALIDATION = "validation.jsonl"
TENSORBOARD = "tensorboard"
"""TensorBoard event files (bertcore.tracking)."""
TRACKING_STATE = "tracking.json"
"""The MLflow and W&B run ids of the run (bertcore.tracking)."""

class MetricsLog:
    """A JSON-lines log whose records carry the optimizer `step`, appended by rank 0."""

    def __init__(self, path: str):
        self.path = path

    def truncate(self, step: int) -> None:
        """Keep the records of steps <= `step` (a resumed run rewrites the later ones)."""
        kept = []
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a kill
                        continue
                    if record.get("step", 0) <= step:
                        kept.append(line if line.endswith("\n") else line + "\n")
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.writelines(kept)

    def append(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def records(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
