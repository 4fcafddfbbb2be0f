"""What a wiki calls things: its namespaces (from the dump's `<siteinfo>`) and the titles
of its back-matter sections, per language.

A MediaWiki export starts with `<siteinfo>`, which lists every namespace under its local
name (`<namespace key="6">Tập tin</namespace>` on Vietnamese Wikipedia). Links into the
File (6), Category (14) and Media (-2) namespaces are not running text: an image link's
parameters and caption or an article's category list would otherwise leak into the
prose. MediaWiki also accepts the canonical English names (File, Image, Category, Media)
on every wiki, and a few long-standing local aliases that the export does not list
(de "Bild", vi "Hình", ...): both are added.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from xml.etree import ElementTree

MEDIA, FILE, CATEGORY = -2, 6, 14
HIDDEN_KEYS = (MEDIA, FILE, CATEGORY)

# Canonical names (valid on every wiki) and local aliases MediaWiki accepts but exports do
# not list; also the fallback when a dump has no <siteinfo> (English, Korean, a few more).
_ALIASES: dict[int, tuple[str, ...]] = {
    MEDIA: ("media", "미디어", "phương tiện", "medium"),
    FILE: (
        "file",
        "image",
        "datei",
        "bild",
        "fichier",
        "archivo",
        "imagen",
        "파일",
        "그림",
        "ファイル",
        "画像",
        "hình",
        "tập tin",
        "文件",
        "檔案",
        "图像",
        "файл",
        "картинка",
    ),
    CATEGORY: (
        "category",
        "kategorie",
        "catégorie",
        "categoría",
        "분류",
        "カテゴリ",
        "thể loại",
        "分类",
        "分類",
        "категория",
    ),
}

# Sections made of citations and link lists rather than prose; dropped with their
# subsections. Titles compare lowercased with whitespace collapsed.
BACK_MATTER: dict[str, tuple[str, ...]] = {
    "en": (
        "see also",
        "references",
        "notes",
        "notes and references",
        "footnotes",
        "citations",
        "sources",
        "bibliography",
        "further reading",
        "external links",
        "works cited",
    ),
    "ko": ("같이 보기", "각주", "참고 문헌", "참고문헌", "외부 링크", "관련 항목", "내용주", "출처"),
    "vi": (
        "tham khảo",
        "liên kết ngoài",
        "xem thêm",
        "chú thích",
        "đọc thêm",
        "ghi chú",
        "tài liệu tham khảo",
        "nguồn",
        "thư mục",
    ),
    "de": ("siehe auch", "literatur", "weblinks", "einzelnachweise", "anmerkungen", "quellen", "belege", "fußnoten"),
    "fr": (
        "voir aussi",
        "notes et références",
        "références",
        "liens externes",
        "bibliographie",
        "articles connexes",
        "notes",
        "sources",
    ),
    "ja": ("脚注", "注釈", "出典", "参考文献", "関連項目", "外部リンク", "註釈", "関連文献"),
    "zh": (
        "参见",
        "參見",
        "参考文献",
        "參考文獻",
        "参考资料",
        "參考資料",
        "外部链接",
        "外部連結",
        "注释",
        "註釋",
        "相关条目",
        "相關條目",
        "延伸阅读",
        "延伸閱讀",
    ),
    "bg": ("вижте също", "източници", "външни препратки", "бележки", "литература", "библиография"),
}


def _fold(title: str) -> str:
    return " ".join(title.replace("_", " ").lower().split())


@dataclass(frozen=True)
class SiteInfo:
    """Namespace names of one wiki (lowercased, name -> key) and its language code."""

    namespaces: Mapping[str, int] = field(default_factory=dict)
    language: str | None = None

    @classmethod
    def default(cls) -> SiteInfo:
        return cls({name: key for key, names in _ALIASES.items() for name in names})

    @classmethod
    def from_xml(cls, header: bytes) -> SiteInfo:
        """From the bytes of a dump before its first <page> (the `<siteinfo>` element);
        the defaults when there is none or it cannot be parsed."""
        start, end = header.find(b"<siteinfo"), header.find(b"</siteinfo>")
        if start < 0 or end < 0:
            return cls.default()
        try:
            root = ElementTree.fromstring(header[start : end + len(b"</siteinfo>")])
        except ElementTree.ParseError:
            return cls.default()
        names: dict[str, int] = {name: key for key, aliases in _ALIASES.items() for name in aliases}
        for ns in root.iter():
            if ns.tag.rsplit("}", 1)[-1] == "namespace" and (ns.text or "").strip():
                try:
                    names[_fold(ns.text)] = int(ns.get("key", "0"))
                except ValueError:
                    continue
        return cls(names, _language(root))

    def key(self, prefix: str) -> int | None:
        """The namespace key of a link prefix ("Tập tin" -> 6), None when it is not one."""
        return self.namespaces.get(_fold(prefix))

    def hides(self, prefix: str) -> bool:
        """Whether a link with this prefix is not running text (file, category, media)."""
        return self.key(prefix) in HIDDEN_KEYS


def _language(root: ElementTree.Element) -> str | None:
    for child in root:
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "dbname" and child.text and (m := re.fullmatch(r"([a-z_]+?)wiki\w*", child.text.strip())):
            return m.group(1).replace("_", "-")
        if tag == "base" and child.text and (m := re.match(r"https?://([a-z-]+)\.wikipedia\.org", child.text.strip())):
            return m.group(1)
    return None


def back_matter_titles(
    languages: Iterable[str | None], overrides: Mapping[str, list[str]] | None = None
) -> frozenset[str]:
    """The back-matter section titles for these languages: per language the `overrides`
    list when given, else the built-in one (none for a language without one)."""
    titles: set[str] = set()
    for language in {lang for lang in languages if lang}:
        base = language.split("-")[0].lower()
        chosen = (overrides or {}).get(language, (overrides or {}).get(base, BACK_MATTER.get(base, ())))
        titles.update(_fold(t) for t in chosen)
    return frozenset(titles)
