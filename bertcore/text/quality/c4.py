"""C4's filters (Raffel et al. 2020, section 2.2), in the order C4 applies them: lines that
do not end in terminal punctuation (or end in an ellipsis), have fewer than 5 words, mention javascript or carry
policy boilerplate are removed; then a page holding "lorem ipsum" or a curly brace, or
left with fewer than 3 sentences, is dropped. Not carried over: C4's list of bad words
(an English list that bertpipe does not ship), and its removal of citation markers.

bertpipe's additions: closing quotation marks of German, French and CJK typography and
the CJK full stops count as terminal punctuation; the policy phrases have German and
Korean counterparts; languages written without spaces skip the words-per-line rule.
"""

from __future__ import annotations

import re

from bertcore.text.quality.config import C4Config
from bertcore.text.quality.page import Page, Rejection
from bertcore.text.quality.words import rules_for, words

_ELLIPSES = ("...", "\u2026")
_TERMINAL = (
    ".",
    "!",
    "?",
    '"',
    "\u201d",
    "\u201c",
    "\u2019",
    "\u00bb",
    "\u00ab",
    "\u3002",
    "\uff01",
    "\uff1f",
    "\u300d",
    "\u300f",
)
POLICY = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",  # C4
    "nutzungsbedingungen",
    "datenschutzerklärung",
    "cookie-richtlinie",
    "verwendet cookies",
    "verwenden cookies",  # German
    "이용약관",
    "개인정보처리방침",
    "개인정보 처리방침",
    "쿠키 정책",  # Korean
)
_SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f]+[\"'\u201d\u2019\u00bb)\]]*(?=\s|$)")


def sentence_count(text: str) -> int:
    """Sentences as C4 counts them, approximately: runs of terminal punctuation at a word's end."""
    return len(_SENTENCE_END.findall(text))


class C4:
    family = "c4"

    def __init__(self, cfg: C4Config):
        self.cfg = cfg

    def _keep(self, spaced: bool):
        cfg = self.cfg

        def keep(line: str) -> bool:
            lower = line.lower()
            end = line.rstrip()
            if cfg.terminal_punctuation and (not end.endswith(_TERMINAL) or end.endswith(_ELLIPSES)):
                return False
            if spaced and cfg.min_line_words and len(words(line)) < cfg.min_line_words:
                return False
            if cfg.javascript and "javascript" in lower:
                return False
            return not (cfg.policy and any(phrase in lower for phrase in POLICY))

        return keep

    def apply(self, page: Page) -> Rejection | None:
        cfg = self.cfg
        page.remove(self.family, self._keep(rules_for(page.language).spaced))
        text = page.text
        lower = text.lower()
        if cfg.lorem_ipsum and "lorem ipsum" in lower:
            return Rejection(self.family, "lorem_ipsum", "the page holds 'lorem ipsum'")
        if cfg.curly_braces and "{" in text:
            at = text.index("{")
            return Rejection(self.family, "curly_braces", f"a curly brace: {text[max(0, at - 30) : at + 30]!r}")
        n = sentence_count(text)
        if n < cfg.min_sentences:
            return Rejection(
                self.family, "min_sentences", f"{n} sentences left after its line filters, needs {cfg.min_sentences}"
            )
        return None
