"""Quality filters for web text: one module per family behind one interface, one registry.

Owns: the `Page` a filter reads (the lines of a document's text, its language), the
`Rejection` it returns (page.py), and `FILTERS`, the families in the order they run:
gopher_repetition.py, gopher_quality.py (Gopher, Rae et al. 2021) and c4.py (Raffel et al.
2020); their settings are in config.py, words and per-language rules in words.py. A
filter either drops the page (a `Rejection` naming its family, the rule and the measured
value) or removes lines from it (recorded on the page); the cleaner counts both per family.

May import: the standard library, pydantic (config.py) and bertcore's section helpers.
Must not import: torch, ray, prefect, or any other bertcore component.
"""

from __future__ import annotations

from collections.abc import Callable

from bertcore.text.quality.config import QualityConfig
from bertcore.text.quality.page import Page, QualityFilter, Rejection

__all__ = ["FILTERS", "Page", "QualityFilter", "Rejection", "build", "screen"]


def _registry() -> dict[str, Callable[[QualityConfig], QualityFilter | None]]:
    from bertcore.text.quality import c4, gopher_quality, gopher_repetition

    return {
        "gopher_repetition": lambda cfg: (
            gopher_repetition.GopherRepetition(cfg.gopher_repetition) if cfg.gopher_repetition.enabled else None
        ),
        "gopher_quality": lambda cfg: (
            gopher_quality.GopherQuality(cfg.gopher_quality) if cfg.gopher_quality.enabled else None
        ),
        "c4": lambda cfg: c4.C4(cfg.c4) if cfg.c4.enabled else None,
    }


FILTERS = ("gopher_repetition", "gopher_quality", "c4")
"""The filter families, in the order they run."""


def build(cfg: QualityConfig) -> list[QualityFilter]:
    """The enabled filters, in order."""
    makers = _registry()
    return [f for f in (makers[name](cfg) for name in FILTERS) if f is not None]


def screen(page: Page, filters: list[QualityFilter]) -> Rejection | None:
    """Run the filters in order on `page` (line filters change it); the first rejection."""
    for quality_filter in filters:
        rejection = quality_filter.apply(page)
        if rejection is not None:
            return rejection
    return None
