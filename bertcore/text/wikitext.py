"""MediaWiki markup -> the paragraphs a reader sees as running text.

Kept: prose, link labels (the piped label, else the target), list item text, text inside
formatting tags, the inline text of templates such as {{convert}}, {{lang}}, {{nihongo}}
(wikitemplates.py). Dropped: headings (the section bodies stay, except back matter such
as "See also", "References", "External links" in the wiki's language: citations and link
lists, not prose; wikisite.py), other templates, tables (indented ones too), refs,
non-prose tags (<math>, <gallery>, ...), comments, file, image and category links under
the wiki's own namespace names (from the dump's <siteinfo>), interlanguage links,
external link URLs (their label stays), magic words, bold/italic quotes. HTML entities
are decoded.

mwparserfromhell is the parser. Before it runs, constructs that never yield sentence text
and make up much of an article's bytes (comments, <ref>s, templates, wiki tables,
non-prose tag blocks) are cut with linear regex/line scans, and links holding only plain
text are resolved by regex: building a Python node per template and link is most of the
parser's cost. On the shipped enwiki sample, parsing the raw wikitext alone runs ~2 MB/s
on one core; the whole read + clean + sentence-split path with this pre-stripping ~8 MB/s.

The parser is superlinear on unclosed constructs ("<ref>x <ref>x ...", "[http://a b
[http://a b ..."): 4,000 unclosed "{{" took 16 s. So leftovers of what the pre-strip
removes ("{{", "<ref") are deleted, and the rest is parsed in chunks of at most
_CHUNK_CHARS characters cut at paragraph (else line) boundaries, which bounds the cost
of a hostile page to about linear in its size.
"""

from __future__ import annotations

import html
import re

import mwparserfromhell
from mwparserfromhell.nodes import ExternalLink, Heading, HTMLEntity, Node, Tag, Text, Wikilink
from mwparserfromhell.parser import ParserError
from mwparserfromhell.wikicode import Wikicode

from bertcore.text.wikisite import SiteInfo, back_matter_titles
from bertcore.text.wikitemplates import render as render_template

# ------------------------------------------------------------------ fast pre-stripping

# Tags whose contents are not prose (or not shown on the article page).
_DROP_TAGS = frozenset(
    """ref references gallery math chem ce score timeline imagemap graph mapframe maplink
    templatedata templatestyles syntaxhighlight source pre hiero inputbox categorytree
    includeonly indicator charinsert table caption""".split()
)
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)


def _tag_pattern(names: str) -> re.Pattern[str]:
    # <name attrs>, <name attrs/>, </name>; a closing tag with attributes is not a tag
    # (real pages have "</ref name=x>" inside refs that close later).
    return re.compile(rf"<(?:(?P<open>{names})\b[^<>]*?(?P<self>/?)\s*|/(?P<close>{names})\s*)>", re.I)


_REF_TAG = _tag_pattern("ref")
_BLOCK_TAG = _tag_pattern("|".join(sorted(_DROP_TAGS - {"ref"})))
# An innermost template: no "{{" or "}}" inside. Possessive quantifiers keep a failed
# match (an unclosed "{{") linear. Applied until nothing changes: one pass per nesting
# level, at most _TEMPLATE_PASSES (real articles nest < 10 deep).
_TEMPLATE = re.compile(r"\{\{(?:[^{}]++|\{(?!\{)|\}(?!\}))*+\}\}")
_TEMPLATE_PASSES = 40
_SIMPLE_LINK = re.compile(r"\[\[([^\[\]{}|<>\n]+)(?:\|([^\[\]{}<>\n]*))?\]\]")
_CHUNK_CHARS = 8_000


def _inline_template(match: re.Match[str]) -> str:
    return render_template(match.group(0)[2:-2])


def _drop_templates(text: str) -> str:
    """Templates removed, inside out, except the inline text of those in the table of
    wikitemplates.py (`{{convert|5|km}}` -> "5 kilometres")."""
    for _ in range(_TEMPLATE_PASSES):
        if "{{" not in text:
            break
        text, n = _TEMPLATE.subn(_inline_template, text)
        if not n:
            break
    # What is left is unclosed or nested too deep: markup either way, never prose.
    if "{{" in text or "}}" in text:
        text = text.replace("{{", "").replace("}}", "")
    return text


def _drop_tables(text: str) -> str:
    # Wiki tables open with "{|" and close with "|}" at the start of a line and may nest;
    # a table indented as a definition or list item (":{|", "::{|", "*{|") is one too.
    if "{|" not in text:
        return text
    kept, depth = [], 0
    for line in text.split("\n"):
        head = line.lstrip(" \t:*#")
        if head.startswith("{|"):
            depth += 1
        elif depth:
            if head.startswith("|}"):
                depth -= 1
        else:
            kept.append(line)
    return "\n".join(kept)


def _drop_elements(text: str, tags: re.Pattern[str], *, nested: bool) -> str:
    """Remove <x ...>...</x> and <x .../> for the tag names `tags` matches, in one linear
    pass over the tags (a regex with ".*?" would rescan the rest of the page for every
    unclosed tag). With `nested`, an element may contain elements of its own name
    (<table>); without, a second opening tag means the first was never closed (<ref>),
    which is then dropped alone, its text kept. An element still open at the end loses
    only its opening tag."""
    out: list[str] = []
    pos = 0  # text[pos:] is not decided yet
    open_name: str | None = None
    depth = 0
    for match in tags.finditer(text):
        closing = match["close"] is not None
        name = (match["close"] or match["open"]).lower()
        self_closing = bool(match["self"])
        if open_name is None:
            out.append(text[pos : match.start()])
            pos = match.end()  # the tag itself is dropped, whatever it is
            if not closing and not self_closing:
                open_name, depth = name, 1
        elif name != open_name or self_closing:
            continue  # inside the open element's body
        elif closing:
            depth -= 1
            if depth == 0:
                open_name, pos = None, match.end()  # the whole element is dropped
        elif nested:
            depth += 1
        else:
            out.append(text[pos : match.start()])
            pos = match.end()
    out.append(text[pos:])
    return "".join(out)


def _prestrip(wikitext: str, site: SiteInfo) -> str:
    text = _COMMENT.sub("", wikitext) if "<!--" in wikitext else wikitext
    text = _drop_elements(text, _REF_TAG, nested=False)
    text = _drop_elements(text, _BLOCK_TAG, nested=True)
    text = _drop_tables(_drop_templates(text))
    # Links with nothing but plain text inside (most of them) are resolved here. The rest
    # (labels with markup, captions with nested links) go through the parser.
    return _SIMPLE_LINK.sub(lambda match: _resolve_simple_link(match, site), text)


def _chunks(text: str) -> list[str]:
    """Consecutive pieces of at most _CHUNK_CHARS, cut at blank lines, else at line
    breaks, else (a single longer line) after a sentence end or a space."""
    if len(text) <= _CHUNK_CHARS:
        return [text]
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for block in text.split("\n\n"):
        pieces = [block] if len(block) <= _CHUNK_CHARS else [p for line in block.split("\n") for p in _cut(line)]
        for piece in pieces:
            if size + len(piece) > _CHUNK_CHARS and current:
                chunks.append("\n\n".join(current))
                current, size = [], 0
            current.append(piece)
            size += len(piece) + 2
    chunks.append("\n\n".join(current))
    return chunks


def _cut(line: str) -> list[str]:
    pieces = []
    while len(line) > _CHUNK_CHARS:
        at = line.rfind(". ", 0, _CHUNK_CHARS) + 1  # after the full stop; 0 when none
        if at <= 0:
            at = line.rfind(" ", 0, _CHUNK_CHARS)
        if at <= 0:
            at = _CHUNK_CHARS
        pieces.append(line[:at])
        line = line[at:]
    pieces.append(line)
    return pieces


# ---------------------------------------------------------------------- node walking

# Tags that start a block of their own: list items, rules.
_BLOCK_MARKUP = frozenset({"*", "#", ":", ";", "----"})
# Namespaces whose links are not running text: wikisite.SiteInfo (from the dump's
# <siteinfo>, else English, Korean and a few other languages' names).
_DEFAULT_SITE = SiteInfo.default()
# Interlanguage prefixes ("de:", "zh-min-nan:", "simple:"): never displayed inline.
_LANGUAGE_PREFIX = re.compile(r"[a-z]{2,3}(?:-[a-z0-9]{2,8})*|simple")
# Interwiki project prefixes: displayed only when piped with a label.
_INTERWIKI = frozenset(
    """wikt wiktionary commons c s wikisource q wikiquote b wikibooks n wikinews v
    wikiversity voy wikivoyage species wikispecies d wikidata m meta mw mediawiki
    foundation wmf phab""".split()
)

_DEFAULT_BACK_MATTER = back_matter_titles(["en", "ko"])

_PARAGRAPH = "\n\n"
_BLOCK = "\n\x01"  # a line of its own: one list item is one paragraph
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
# A tag the parser left as text (unclosed, or cut from its partner by chunking).
_STRAY_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_QUOTES = re.compile(r"'{2,}")  # bold ''' and italic '' (style tags are not parsed)
_EMPTY_PARENS = re.compile(r"[(\[]\s*[,;:]?\s*[)\]]")
_SPACE_BEFORE_PUNCT = re.compile(r" +([,.;:!?)])")
_SPACE_AFTER_PAREN = re.compile(r"\( +")


def _render(code: Wikicode, out: list[str], site: SiteInfo) -> None:
    for node in code.nodes:
        _render_node(node, out, site)


def _render_node(node: Node, out: list[str], site: SiteInfo) -> None:
    if isinstance(node, Text):
        out.append(node.value)
    elif isinstance(node, Wikilink):
        _render_link(node, out, site)
    elif isinstance(node, Tag):
        markup = node.wiki_markup
        if markup is not None and str(markup) in _BLOCK_MARKUP:
            out.append(_BLOCK)
        elif (tag := str(node.tag).strip().lower()) in _DROP_TAGS:
            return
        elif tag == "br":
            out.append(" ")
        elif node.contents is not None and not node.self_closing:
            _render(node.contents, out, site)
    elif isinstance(node, HTMLEntity):
        out.append(node.normalize())
    elif isinstance(node, Heading):
        out.append(_PARAGRAPH)
    elif isinstance(node, ExternalLink) and node.brackets and node.title is not None:
        _render(node.title, out, site)
    # Templates (normally gone already), template arguments, comments: nothing.


def _link_target(title: str, labelled: bool, site: SiteInfo) -> str | None:
    """The text a link to `title` shows when it has no label, or None when the link is
    not part of the running text (media, category, interlanguage, bare interwiki)."""
    title = title.strip()
    shown = title.startswith(":")  # [[:Category:X]] is an ordinary visible link
    title = title.lstrip(":").strip()
    prefix, colon, _ = title.partition(":")
    if colon and not shown:
        prefix = prefix.strip()
        lower = prefix.lower()
        if site.hides(prefix) or _LANGUAGE_PREFIX.fullmatch(prefix):
            return None
        if lower in _INTERWIKI and not labelled:
            return None
    return title.replace("_", " ")  # MediaWiki shows [[New_York]] as "New York"


def _render_link(node: Wikilink, out: list[str], site: SiteInfo) -> None:
    labelled = node.text is not None and bool(str(node.text).strip())
    target = _link_target(str(node.title), labelled, site)
    if target is None:
        return
    if labelled:
        _render(node.text, out, site)
    else:
        out.append(html.unescape(target))  # a title is raw text: [[OS&nbsp;X]]


def _resolve_simple_link(match: re.Match[str], site: SiteInfo) -> str:
    title, label = match.group(1), match.group(2)
    labelled = bool(label and label.strip())
    target = _link_target(title, labelled, site)
    if target is None:
        return ""
    return label if labelled else target


def _paragraphs(text: str) -> list[str]:
    paragraphs: list[str] = []
    lines: list[str] = []

    def flush() -> None:
        if lines:
            paragraph = " ".join(" ".join(lines).split())
            paragraph = _EMPTY_PARENS.sub("", paragraph)
            paragraph = _SPACE_AFTER_PAREN.sub("(", _SPACE_BEFORE_PUNCT.sub(r"\1", paragraph)).strip()
            if any(c.isalnum() for c in paragraph):
                paragraphs.append(paragraph)
            lines.clear()

    for line in text.split("\n"):
        if line.startswith("\x01"):
            flush()
            lines.append(line[1:])
            flush()
        elif line.strip():
            lines.append(line)
        else:
            flush()
    flush()
    return paragraphs


def wikitext_to_paragraphs(
    wikitext: str, site: SiteInfo | None = None, dropped_sections: frozenset[str] | None = None
) -> list[str]:
    """The prose of one article's wikitext, one string per paragraph (whitespace
    collapsed; list items are paragraphs of their own). `site`: the wiki's namespace
    names (default: English, Korean and a few more); `dropped_sections`: section titles
    dropped with their subsections (lowercased; default: the English and Korean ones)."""
    site = site or _DEFAULT_SITE
    dropped_titles = _DEFAULT_BACK_MATTER if dropped_sections is None else dropped_sections
    out: list[str] = []
    back_matter = 0  # > 0: inside a back-matter section of this heading level
    for chunk in _chunks(_prestrip(wikitext, site)):
        try:
            code = mwparserfromhell.parse(chunk, skip_style_tags=True)
        except ParserError:
            continue  # the parser gave up on this piece: no prose we can trust
        for node in code.nodes:
            if isinstance(node, Heading):
                if back_matter and node.level > back_matter:
                    continue  # a subsection of back matter
                title = " ".join(node.title.strip_code().lower().split())
                back_matter = node.level if title in dropped_titles else 0
                out.append(_PARAGRAPH)
            elif not back_matter:
                _render_node(node, out, site)
        out.append(_PARAGRAPH)
    text = _QUOTES.sub("", "".join(out))
    text = _STRAY_TAG.sub("", _MAGIC_WORD.sub("", text))
    if "[[" in text or "]]" in text:
        # Every well-formed link was rendered: these are unclosed ones (or halves of a
        # link cut by chunking a hostile over-long line).
        text = text.replace("[[", "").replace("]]", "")
    return _paragraphs(text)


# ---------------------------------------------------------------------- disambiguation

_TEMPLATE_NAME = re.compile(r"\{\{\s*([^{}|\n]+?)\s*(?:\||\}\})")
_DISAMBIGUATION_NAMES = frozenset(
    {
        "disambiguation",
        "disambig",
        "disamb",
        "dab",
        "dbig",
        "hndis",
        "hndis-cleanup",
        "geodis",
        "numberdis",
        "mathdab",
        "schooldis",
        "roaddis",
        "disambiguation cleanup",
        "letter-number combination disambiguation",
        "동음이의",
        "동음이의어",
    }
)


def is_disambiguation(wikitext: str) -> bool:
    """Whether the page is a disambiguation page: it uses {{disambiguation}}, {{disambig}},
    {{dab}}, {{hndis}}, {{geodis}}, ... or any "<topic> disambiguation" template (name
    case-insensitive; "disambiguation needed", an inline cleanup tag, does not count)."""
    for match in _TEMPLATE_NAME.finditer(wikitext):
        name = " ".join(match.group(1).replace("_", " ").lower().split())
        name = name.removeprefix("template:")
        if name in _DISAMBIGUATION_NAMES or name.endswith((" disambiguation", " disambig")):
            return True
    return False
