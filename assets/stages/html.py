"""HTML helpers for extraction: a cheap nesting-depth scan, and resiliparse's text extraction as
module-level functions (so an isolated worker process can be given them by reference).

resiliparse's extraction time grows with the square of the tag nesting depth (10k nested `<div>`s
take seconds, 40k over a minute), and the parse is C code that no signal interrupts. The depth
scan is the cheap first line: a page nested deeper than browsers build (Blink stops nesting at 512
levels) is rejected before it is parsed; the worker's time budget is the hard second line.
"""

from __future__ import annotations

import re

# Elements that never take an end tag, and elements whose end tag may be left out (HTML's
# "optional end tag" list, the ones that hold content): neither may count as a level, or an
# unclosed <p> or <li> per paragraph would drift the depth up through a long page.
_NOT_NESTING = frozenset(
    "area base br col embed hr img input link meta param source track wbr "
    "p li dt dd tr td th thead tbody tfoot option optgroup rb rt rtc rp colgroup caption html head body".split()
)
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]{0,31})[^<>]*?(/?)>")


def tag_depth(html: str, limit: int) -> int:
    """The deepest nesting of elements in `html`, counting only elements that must be closed;
    stops counting (and returns) as soon as the depth passes `limit`. A page with fewer tags than
    `limit` cannot pass it and is not scanned."""
    if html.count("<") <= limit:
        return 0
    depth = deepest = 0
    for closing, name, self_closing in _TAG.findall(html):
        name = name.lower()
        if self_closing or name in _NOT_NESTING:
            continue
        if closing:
            depth = max(0, depth - 1)
        else:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
    return deepest


def _extract(html: str, main_content: bool) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, main_content=main_content)


def main_content_text(html: str) -> str:
    """The page's main content as plain text (resiliparse, DCLM's extractor)."""
    return _extract(html, True)


def full_text(html: str) -> str:
    """All of the page's text, boilerplate included."""
    return _extract(html, False)
