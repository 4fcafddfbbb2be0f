"""Character-level normalization shared by every text path.

The same cleaning Google's BasicTokenizer applies before tokenizing (drop NUL, U+FFFD and
control/format characters, every whitespace to a plain space), done once here so the
corpus holds text the tokenizer will not change further, plus Unicode NFC so the same
word is always the same code points (Hangul syllables stay composed).
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata


@functools.cache
def _invisible() -> re.Pattern[str]:
    # Every Cc/Cf code point except those Python counts as whitespace (tab, newline,
    # \x1c-\x1f, \x85 ...): those separate words, so they become spaces or line breaks
    # instead of gluing their neighbours together. U+FFFD (category So) marks bytes that
    # failed to decode upstream and carries no text. Built once per process (~0.1 s) as
    # ~26 code point ranges (a class of ranges matches ~5x faster than 229 single chars).
    ranges: list[list[int]] = []
    for c in range(sys.maxunicode + 1):
        ch = chr(c)
        if (unicodedata.category(ch) in ("Cc", "Cf") and not ch.isspace()) or ch == "\ufffd":
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
    body = "".join(re.escape(chr(a)) + ("-" + re.escape(chr(b)) if b > a else "") for a, b in ranges)
    return re.compile(f"[{body}]+")


def normalize_text(s: str, *, keep_newlines: bool = True) -> str:
    """Unicode NFC; drop NUL, U+FFFD, control and format characters; collapse whitespace.

    Within each line every run of whitespace becomes one space and the line is stripped;
    line breaks (\\n, \\r\\n, U+2028, ...) become "\\n" when `keep_newlines`, else a space
    too. The result is stripped. Idempotent.
    """
    # isprintable() is False for every Cc/Cf character (and for whitespace other than
    # " "), so clean printable text skips the regex.
    if not s.isprintable() or "\ufffd" in s:
        s = _invisible().sub("", s)
    if not s.isascii():
        # After dropping: a removed format character may have separated a base letter
        # from its combining mark.
        s = unicodedata.normalize("NFC", s)
    if not keep_newlines:
        return " ".join(s.split())
    return "\n".join(" ".join(line.split()) for line in s.splitlines()).strip()
