"""The visible text of templates that carry inline prose: a small table.

Most templates (infoboxes, citations, navigation boxes, maintenance tags) show no running
text and are dropped. A few put words into the sentence they sit in: `{{convert|5|km}}`
shows "5 km", `{{lang|fr|la vie}}` shows "la vie", `{{nihongo|Tokyo|東京|Tōkyō}}` shows
"Tokyo (東京, Tōkyō)". Dropping those leaves holes in the sentence ("a road of long"), so
they are rendered here from their arguments. No maintained Python library expands
templates without the wiki's template pages (mwparserfromhell parses them, it does not
render them), so this is a table of the common ones; anything else renders as nothing.

`render(body)` gets the text between `{{` and `}}` of an innermost template (no template
inside: wikitext.py renders templates inside out), which may still hold links.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_MONTHS = ("January February March April May June July August September October November December").split()

# Units as convert shows them by default (spelled out); others appear as written.
_UNITS = {
    "km": "kilometres",
    "m": "metres",
    "cm": "centimetres",
    "mm": "millimetres",
    "mi": "miles",
    "ft": "feet",
    "in": "inches",
    "yd": "yards",
    "nmi": "nautical miles",
    "km2": "square kilometres",
    "sqkm": "square kilometres",
    "sqmi": "square miles",
    "mi2": "square miles",
    "ha": "hectares",
    "acre": "acres",
    "kg": "kilograms",
    "g": "grams",
    "t": "tonnes",
    "lb": "pounds",
    "oz": "ounces",
    "C": "°C",
    "F": "°F",
    "K": "K",
    "km/h": "kilometres per hour",
    "mph": "miles per hour",
    "l": "litres",
    "L": "litres",
    "m2": "square metres",
}
_RANGE = {
    "to": "to",
    "-": "–",
    "–": "–",
    "and": "and",
    "or": "or",
    "by": "by",
    "x": "×",
    "×": "×",
    "+": "+",
    "to(-)": "to",
}


def split_arguments(body: str) -> tuple[str, list[str], dict[str, str]]:
    """(name, positional arguments, named arguments) of a template body; a `|` inside a
    link (`[[a|b]]`) does not separate arguments."""
    parts, depth, current = [], 0, []
    i = 0
    while i < len(body):
        two = body[i : i + 2]
        if two in ("[[", "]]"):
            depth += 1 if two == "[[" else -1 if depth else 0
            current.append(two)
            i += 2
            continue
        if body[i] == "|" and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(body[i])
        i += 1
    parts.append("".join(current))
    name = " ".join(parts[0].replace("_", " ").split()).lower().removeprefix("template:")
    positional, named = [], {}
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if eq and re.fullmatch(r"\s*[\w -]+\s*", key) and "[[" not in key:
            named[key.strip()] = value.strip()
        else:
            positional.append(part.strip())
    return name, positional, named


def _arg(args: list[str], i: int) -> str:
    return args[i] if i < len(args) else ""


def _convert(args: list[str], named: dict[str, str]) -> str:
    if not args:
        return ""
    spelled = named.get("abbr") not in ("on", "values")
    if len(args) >= 4 and args[1] in _RANGE:
        value, unit = f"{args[0]} {_RANGE[args[1]]} {args[2]}", args[3]
    else:
        value, unit = args[0], _arg(args, 1)
    return f"{value} {_UNITS.get(unit, unit) if spelled else unit}".strip()


def _nihongo(args: list[str], named: dict[str, str]) -> str:
    english, native, romaji = _arg(args, 0), _arg(args, 1), _arg(args, 2)
    inside = ", ".join(x for x in (native, romaji) if x)
    if not english:
        return native + (f" ({romaji})" if romaji else "")
    return english + (f" ({inside})" if inside else "")


def _date(args: list[str], named: dict[str, str]) -> str:
    numbers = [a for a in args if a.strip().isdigit()][:3]
    if len(numbers) == 3 and 1 <= int(numbers[1]) <= 12:
        return f"{int(numbers[2])} {_MONTHS[int(numbers[1]) - 1]} {numbers[0]}"
    if len(numbers) == 2 and 1 <= int(numbers[1]) <= 12:
        return f"{_MONTHS[int(numbers[1]) - 1]} {numbers[0]}"
    return numbers[0] if numbers else ""


def _first(args: list[str], named: dict[str, str]) -> str:
    return _arg(args, 0)


def _second(args: list[str], named: dict[str, str]) -> str:
    return _arg(args, 1)


def _last(args: list[str], named: dict[str, str]) -> str:
    return args[-1] if args else ""


def _constant(text: str) -> Callable[[list[str], dict[str, str]], str]:
    return lambda args, named: text


_RENDER: dict[str, Callable[[list[str], dict[str, str]], str]] = {
    "convert": _convert,
    "cvt": _convert,
    "lang": _second,
    "transl": _last,
    "transliteration": _last,
    "nihongo": _nihongo,
    "nihongo2": _first,
    "nowrap": _first,
    "nobr": _first,
    "nobreak": _first,
    "small": _first,
    "smaller": _first,
    "big": _first,
    "larger": _first,
    "sic": _first,
    "abbr": _first,
    "ill": _first,
    "interlanguage link": _first,
    "visible anchor": _first,
    "vanchor": _first,
    "em": _first,
    "strong": _first,
    "mvar": _first,
    "var": _first,
    "code": _first,
    "sort": _second,
    "ipa": _last,
    "smallcaps": _first,
    "sc": _first,
    "not a typo": _first,
    "proper name": _first,
    "math": _first,
    "sortname": lambda args, named: f"{_arg(args, 0)} {_arg(args, 1)}".strip(),
    "frac": lambda args, named: f"{args[0]} {args[1]}/{args[2]}" if len(args) >= 3 else "/".join(args),
    "circa": lambda args, named: f"c. {_arg(args, 0)}".strip(),
    "c.": lambda args, named: f"c. {_arg(args, 0)}".strip(),
    "as of": lambda args, named: f"As of {_date(args, named)}".strip(),
    "birth date": _date,
    "death date": _date,
    "birth date and age": _date,
    "death date and age": _date,
    "start date": _date,
    "end date": _date,
    "dts": _date,
    "snd": _constant(" – "),
    "spaced ndash": _constant(" – "),
    "ndash": _constant("–"),
    "mdash": _constant("—"),
    "nbsp": _constant(" "),
    "=": _constant("="),
    "!": _constant("|"),
}


def render(body: str) -> str:
    """The inline text of the template `{{body}}` (empty for templates not in the table)."""
    head = " ".join(body.split("|", 1)[0].replace("_", " ").split()).lower().removeprefix("template:")
    if head not in _RENDER and not head.startswith("lang-"):
        return ""
    name, args, named = split_arguments(body)
    if name.startswith("lang-"):
        return _last(args, named)
    renderer = _RENDER.get(name)
    return renderer(args, named) if renderer else ""
