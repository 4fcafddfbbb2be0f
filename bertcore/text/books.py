"""Plain text laid out for print: licence boilerplate, hard-wrapped lines, over-long
"sentences".

- Project Gutenberg texts carry a header and a licence footer around the book, marked by
  "*** START OF THE PROJECT GUTENBERG EBOOK ... ***" and "*** END OF ... ***" lines
  (older files: "*END*THE SMALL PRINT!" and "End of the Project Gutenberg EBook of ...").
  Only the text between the markers is kept.
- Hard-wrapped text breaks every line near a fixed width (70-80 characters). A line was
  wrapped when the next line's first word would not have fitted on it: then the two are
  joined; otherwise the line ended on purpose (a paragraph's last line, a verse line, a
  heading, a list item) and ends a paragraph. The width is the 95th percentile of the line
  lengths when most lines come close to it; text whose lines are longer than any print
  width is not wrapped and each line is a paragraph. A file with a blank line after every
  wrapped line (double-spaced) is recognised by most paragraphs being one line long.
- A "sentence" longer than `max_chars` (a table of contents, a verse paragraph without
  full stops) is cut at the last clause mark (; : , and dashes) before the limit, else at
  the last space, else at the limit.
"""

from __future__ import annotations

import re

import numpy as np

_START = re.compile(
    r"^\s*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK.*$|^\s*\*END\*\s*THE SMALL PRINT!.*$", re.I | re.M
)
_END = re.compile(
    r"^\s*\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK.*$|^\s*End of (?:the )?Project Gutenberg'?s?\b.*$",
    re.I | re.M,
)
_LOOK = 30_000  # characters at each end searched for the markers

_MAX_WRAP_WIDTH = 120  # lines longer than this are not a print layout
_MIN_LINES = 4
_NEAR_WIDTH = 0.75  # a wrapped text has most lines at least this share of the width long
_CLAUSE = re.compile(r"[;:,\u2013\u2014](?=\s)|\s[-\u2013\u2014]\s")


def strip_gutenberg(text: str) -> tuple[str, int]:
    """The text between Project Gutenberg's start and end markers, and how many characters
    were removed (0 when the text has no markers)."""
    if "gutenberg" not in text[:_LOOK].lower() and "gutenberg" not in text[-_LOOK:].lower():
        return text, 0
    begin, end = 0, len(text)
    if (start := _START.search(text, 0, min(len(text), _LOOK))) is not None:
        begin = start.end()
    tail_from = max(begin, len(text) - _LOOK)
    ends = list(_END.finditer(text, tail_from))
    if ends:
        end = ends[0].start()
    if begin == 0 and end == len(text):
        return text, 0
    return text[begin:end], len(text) - (end - begin)


def _wrap_width(lengths: np.ndarray) -> int | None:
    """The width the text was wrapped at, or None when it is not hard-wrapped."""
    if len(lengths) < _MIN_LINES:
        return None
    width = int(np.percentile(lengths, 95))
    if width > _MAX_WRAP_WIDTH or width < 20:
        return None
    if np.mean(lengths >= _NEAR_WIDTH * width) < 0.3:
        return None  # mostly short lines: verse, lists, a table of contents
    return width


def _first_word(line: str) -> int:
    stripped = line.lstrip()
    space = stripped.find(" ")
    return len(stripped) if space < 0 else space


def paragraphs(text: str) -> list[str]:
    """The paragraphs of plain text (blank lines separate them; hard wraps are undone;
    lines that end on purpose end a paragraph), whitespace collapsed."""
    lines = text.split("\n")
    present = [line.rstrip() for line in lines if line.strip()]
    width = _wrap_width(np.fromiter((len(line) for line in present), dtype=np.int64, count=len(present)))
    blocks = _blocks(lines)
    if width is None:
        return [" ".join(line.split()) for block in blocks for line in block]
    if len(blocks) > _MIN_LINES and sum(len(b) == 1 for b in blocks) >= 0.7 * len(blocks):
        blocks = _double_spaced(lines)
    out: list[str] = []
    for block in blocks:
        current: list[str] = []
        for i, line in enumerate(block):
            current.append(line.strip())
            last = i + 1 == len(block)
            if last or len(line.rstrip()) + 1 + _first_word(block[i + 1]) <= width:
                out.append(" ".join(" ".join(current).split()))
                current = []
    return [p for p in out if p]


def _blocks(lines: list[str]) -> list[list[str]]:
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [b for b in blocks if b]


def _double_spaced(lines: list[str]) -> list[list[str]]:
    """Blocks of a double-spaced text: one blank line is a line break, two or more a
    paragraph break."""
    blocks: list[list[str]] = [[]]
    blank = 0
    for line in lines:
        if not line.strip():
            blank += 1
            continue
        if blank >= 2 and blocks[-1]:
            blocks.append([])
        blank = 0
        blocks[-1].append(line)
    return [b for b in blocks if b]


def split_long(sentence: str, max_chars: int) -> list[str]:
    """`sentence` cut into pieces of at most `max_chars` characters: after the last clause
    mark in the second half of the window, else at the last space, else at the limit."""
    pieces: list[str] = []
    rest = sentence
    while len(rest) > max_chars:
        window = rest[: max_chars + 1]
        marks = [m.end() for m in _CLAUSE.finditer(window, max_chars // 2, max_chars)]
        cut = marks[-1] if marks else window.rfind(" ", max_chars // 4)
        if cut <= 0:
            cut = max_chars
        piece, rest = rest[:cut].strip(), rest[cut:].strip()
        if piece:
            pieces.append(piece)
    if rest:
        pieces.append(rest)
    return pieces
