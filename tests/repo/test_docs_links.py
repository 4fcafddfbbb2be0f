"""The docs hold together: every relative link in README.md and docs/ reaches a file of the
project and, with `#anchor`, a heading of that page (GitHub's anchors); the README stays a
quickstart and a map (at most 300 lines, 10 `##` sections) and no docs page grows past 400
lines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_LINES, README_SECTIONS, PAGE_LINES = 300, 10, 400

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def prose(text: str) -> list[str]:
    """The paragraphs outside code fences, with inline code spans removed."""
    kept, fence = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fence = not fence
            kept.append("")
        else:
            kept.append("" if fence else line)
    return [CODE_SPAN.sub("", p) for p in "\n".join(kept).split("\n\n")]


def headings(text: str) -> list[tuple[int, str]]:
    """The ATX headings outside code fences: (level, text as written)."""
    out, fence = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fence = not fence
        elif not fence and (m := re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)):
            out.append((len(m.group(1)), m.group(2)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lowercased, punctuation but '-' and '_'
    dropped, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives the page's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, heading in headings(page.read_text(encoding="utf-8")):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(root: Path = ROOT) -> list[str]:
    """One line per relative link whose file is missing, outside the project, or lacks the
    heading its anchor names."""
    problems = []
    for page in pages(root):
        for paragraph in prose(page.read_text(encoding="utf-8")):
            for text, target in LINK.findall(paragraph):
                if EXTERNAL.match(target):
                    continue
                where = f"{page.relative_to(root)}: [{' '.join(text.split())}]({target})"
                path, _, anchor = target.partition("#")
                file = (page.parent / path).resolve() if path else page
                if not file.is_relative_to(root.resolve()):
                    problems.append(f"{where}: points outside the project")
                elif not file.exists():
                    problems.append(f"{where}: {path} does not exist")
                elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
                    problems.append(f"{where}: {file.relative_to(root.resolve())} has no heading #{anchor}")
    return problems


def test_every_relative_link_reaches_a_file_and_heading_of_the_project():
    assert broken_links() == []


def test_the_link_check_finds_a_missing_file_a_missing_anchor_and_a_link_out(tmp_path):
    (tmp_path / "docs" / "stages").mkdir(parents=True)
    (tmp_path / "README.md").write_text(
        "# Title\n\nSee [the corpus](docs/stages/corpus.md#bad-input), [gone](docs/gone.md),\n"
        "[a typo](docs/stages/corpus.md#bad-inputs) and [the web](https://example.com).\n"
        "`[code](not/a/link.md)`\n\n```\n[fenced](not/a/link.md)\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "docs" / "stages" / "corpus.md").write_text(
        "# The corpus stage\n\n## Bad input\n\n## Inference speed: `benchmarks/inference.py`\n\n"
        "Back to [the top](../../README.md#title), [speed](#inference-speed-benchmarksinferencepy),\n"
        "[up and out](../../../elsewhere/DESIGN.md).\n",
        encoding="utf-8",
    )
    assert broken_links(tmp_path) == [
        "README.md: [gone](docs/gone.md): docs/gone.md does not exist",
        "README.md: [a typo](docs/stages/corpus.md#bad-inputs): docs/stages/corpus.md has no heading #bad-inputs",
        "docs/stages/corpus.md: [up and out](../../../elsewhere/DESIGN.md): points outside the project",
    ]


def test_the_readme_is_a_quickstart_and_a_map():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    sections = [heading for level, heading in headings(text) if level == 2]
    assert len(text.splitlines()) <= README_LINES, f"README.md has {len(text.splitlines())} lines; move depth to docs/"
    assert len(sections) <= README_SECTIONS, f"README.md has {len(sections)} ## sections: {sections}"


def test_no_docs_page_is_over_400_lines():
    long = {
        str(page.relative_to(ROOT)): n
        for page in pages()[1:]
        if (n := len(page.read_text(encoding="utf-8").splitlines())) > PAGE_LINES
    }
    assert long == {}, f"split these pages at a ## boundary: {long}"
