"""The locks (locks/*.txt, written by locks/update.sh) agree with pyproject.toml, with each
other on the cluster's Ray, and with what is installed here: `make test` installs from the
dev lock, so a version that drifted from it is a test that ran on something the lock does
not say."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKS = {"dev-cpu": ("dev",), "cluster-cuda": ("tracking", "onnx", "korean")}
"""Each lock and the extras it holds beside the runtime dependencies (as locks/update.sh compiles them)."""


def pins(lock: str) -> dict[str, str]:
    """{canonical name: version} of a lock file."""
    text = (ROOT / "locks" / f"{lock}.txt").read_text(encoding="utf-8")
    return {canonicalize_name(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+?)(?: \\)?$", text, re.M)}


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """The project's requirements with these extras, following `bertpipe[...]` references."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project["optional-dependencies"]
    out, todo, seen = [Requirement(r) for r in project["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "bertpipe":
                todo += sorted(requirement.extras)
            else:
                out.append(requirement)
    return out


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_requirement_is_pinned_within_its_range(lock):
    pinned = pins(lock)
    wrong = []
    for requirement in requirements(LOCKS[lock]):
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        version = pinned.get(canonicalize_name(requirement.name))
        if version is None or not requirement.specifier.contains(Version(version), prereleases=True):
            wrong.append(f"{requirement} -> {version or 'not in the lock'}")
    assert not wrong, f"locks/{lock}.txt disagrees with pyproject.toml (run locks/update.sh): {wrong}"


def test_the_locks_share_the_clusters_ray_and_torch():
    dev, cluster = pins("dev-cpu"), pins("cluster-cuda")
    assert dev["ray"] == cluster["ray"]
    assert Version(dev["torch"]).public == Version(cluster["torch"]).public  # 2.13.0+cpu and 2.13.0
    # the cluster files start Ray's images of that version, whose Ray the lock must not replace
    for path in ("infra/ray/cluster.yaml", "infra/k8s/raycluster.yaml"):
        text = (ROOT / path).read_text(encoding="utf-8")
        images = re.findall(r"rayproject/ray:(\d+\.\d+\.\d+)", text)
        declared = re.findall(r"rayVersion:\s*['\"]?(\d+\.\d+\.\d+)", text)
        versions = set(images) | set(declared)
        assert versions == {cluster["ray"]}, (path, versions)
        assert "locks/cluster-cuda.txt" in text, f"{path} does not install from the lock"


def test_what_is_installed_here_is_what_the_dev_lock_says():
    drifted = {}
    for name, version in pins("dev-cpu").items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            drifted[name] = (version, None)
            continue
        if Version(installed) != Version(version):
            drifted[name] = (version, installed)
    assert not drifted, f"installed versions differ from locks/dev-cpu.txt (reinstall with make install): {drifted}"
