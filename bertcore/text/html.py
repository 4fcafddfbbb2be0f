"""A web page's HTML -> the lines of its main text, with resiliparse's extractor.

resiliparse (the Webis group's maintained C++ HTML parser and text extractor, used to build
DCLM's corpus) parses the page into a DOM, removes what is not main content (navigation,
headers and footers, sidebars, forms, scripts, styles, hidden elements) and writes the
rest as text, a block element per line. Alt texts, link targets and form fields are left
out; list items keep a bullet, so the quality filters can count bullet lines
(bertcore/text/quality/), and lose it before sentence splitting (`strip_bullet`).
"""

from __future__ import annotations

import re

BULLET = "\u2022"
_BULLET = re.compile(r"^\s*[\u2022\u25cf\u25aa\u2023\u2043\u25e6\-\*]\s+")


def main_text_lines(html: str) -> list[str]:
    """The non-empty lines of the page's main text, in order, stripped."""
    from resiliparse.extract.html2text import extract_plain_text

    text = extract_plain_text(
        html, main_content=True, alt_texts=False, links=False, form_fields=False, noscript=False, list_bullets=True
    )
    return [line.strip() for line in text.split("\n") if line.strip()]


def strip_bullet(line: str) -> str:
    """A list line without its bullet ("• Fresh bread" -> "Fresh bread")."""
    return _BULLET.sub("", line, count=1)
