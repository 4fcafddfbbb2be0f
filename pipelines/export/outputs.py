"""What the commands outside the flow (`bertpipe export`, `bertpipe serve`) read of a run: a
stage's complete output and the files its manifest lists. Both refuse alike, in one line
that names the stage, where its output should be and the command that makes it.
"""

from __future__ import annotations

from bertcore.errors import InputDataError
from pipelines.registry import REGISTRY
from pipelines.stage import UpstreamMissing
from pipelines.stage_dir import Manifest, ShardInfo, StageDir
from pipelines.storage import Storage


def stage_output(storage: Storage, root: str, stage: str, reader: str) -> tuple[StageDir, Manifest]:
    """The directory and manifest of `stage`'s complete output under `root`; UpstreamMissing
    when there is none. `reader` says who reads it and what for, e.g. "ONNX export reads the
    model in" (the line goes on: "the pretrain stage's output, and there is none under ...")."""
    directory = StageDir(storage, root, REGISTRY[stage].directory)
    manifest = directory.manifest()
    if manifest is None:
        raise UpstreamMissing(
            f"{reader} the {stage} stage's output, and there is none under {directory.uri}: run `bertpipe run "
            f"--only {stage}` first"
        )
    return directory, manifest


def listed(directory: StageDir, manifest: Manifest, relative: str) -> ShardInfo:
    """The manifest's record of the file `relative` (to the stage directory); InputDataError
    when the manifest does not list it."""
    record = next((s for s in manifest.shards if s.path == relative), None)
    if record is None:
        raise InputDataError(
            f"{directory.path(relative)} is not in the {manifest.stage} stage's manifest; re-run that stage "
            f"(`bertpipe run --only {manifest.stage} --force`)"
        )
    return record
