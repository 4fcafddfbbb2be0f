"""The checkout is lint-clean and formatted as ruff decides (pyproject.toml's [tool.ruff]), every
`# noqa` names its rule and says why, and the ruff of the dev extra is the one pre-commit runs."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = [sys.executable, "-m", "ruff"]

# A directive reads "noqa: E402 - why" (or "ruff: noqa: E402 - why" for a whole file): one or more codes,
# then " - " and the reason.
NOQA = re.compile(r"#\s*(?:ruff\s*:\s*)?noqa\b", re.IGNORECASE)
NOQA_WITH_REASON = re.compile(r"#\s*(?:ruff:\s*)?noqa: [A-Z]+[0-9]+(?:, [A-Z]+[0-9]+)* - \w.{4,}")


def noqa_without_reason(source: str) -> list[tuple[int, str]]:
    """(line, comment) of every comment that mentions noqa without the codes and the reason."""
    out = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and NOQA.search(token.string) and not NOQA_WITH_REASON.search(token.string):
            out.append((token.start[0], token.string))
    return out


def python_files() -> list[Path]:
    """The Python files git tracks or would add (what ruff reads: .gitignore'd paths left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [ROOT / name for name in listed.stdout.splitlines() if (ROOT / name).exists()]


def test_ruff_check_is_clean():
    out = subprocess.run([*RUFF, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_the_checkout_is_formatted_by_ruff():
    out = subprocess.run(
        [*RUFF, "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, "run `make lint` (ruff format) on:\n" + out.stdout[-4000:] + out.stderr[-2000:]


def test_every_noqa_names_its_rule_and_says_why():
    files = python_files()
    assert len(files) > 100, files  # the whole checkout, not an empty listing
    found = {
        f"{path.relative_to(ROOT)}:{line}": comment
        for path in files
        for line, comment in noqa_without_reason(path.read_text(encoding="utf-8"))
    }
    assert not found, found


@pytest.mark.parametrize(
    "comment",
    [
        "# noqa",
        "# NOQA",
        "# noqa: E402",
        "# noqa:E402 - after sys.path.insert",
        "# noqa: E402, F401",
        "# noqa: E402 (a reason in parentheses)",
        "# noqa: E402 -",
        "# ruff: noqa",
        "# ruff: noqa: E402",
        "# type: ignore[override]  # noqa: B023",
    ],
)
def test_a_noqa_without_its_codes_and_reason_is_found(comment):
    source = f"import os\nimport sys  {comment}\n"
    assert noqa_without_reason(source) == [(2, comment)]


@pytest.mark.parametrize(
    "comment",
    [
        "# noqa: E402 - benchmarks/ is not a package",
        "# noqa: E402, F401 - inputs is a fixture",
        "# ruff: noqa: E402 - set before transformers is imported",
        "# prose that mentions noqa is not a directive",
    ],
)
def test_a_noqa_with_codes_and_reason_passes(comment):
    assert noqa_without_reason(f"import sys  {comment}\n'a string that says # noqa stays a string'\n") == []


def test_ruff_is_the_version_the_dev_extra_and_pre_commit_pin():
    pinned = re.search(r'"ruff==([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    hook = re.search(r"ruff-pre-commit\s+rev: v(\S+)", (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    installed = subprocess.run([*RUFF, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    assert pinned and hook, "pyproject.toml's dev extra and .pre-commit-config.yaml both pin ruff"
    assert pinned.group(1) == hook.group(1) == installed, (pinned.group(1), hook.group(1), installed)
