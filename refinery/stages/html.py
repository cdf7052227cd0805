"""HTML helpers for extraction: a cheap nesting-depth scan, and resiliparse's text extraction as
module-level functions (so an isolated worker process can be given them by reference), by method
(`EXTRACTORS`, named by `stages.extract.method`).

`resiliparse_article` is resiliparse's main content without the parts of a page that are never
article text (image alt texts, link targets, form fields, <noscript>, and the nav, header, footer,
aside, figure and form elements), then a boilerplate pass over its lines in the manner of jusText,
on length alone so it holds in every language and script: a line of `ARTICLE_LINE_CHARS` or more is
article; a line shorter than `BOILERPLATE_LINE_CHARS` is kept only between two article lines, one in
between only next to one. Menus, dates, share buttons and "related" lists are runs of short lines
away from the paragraphs; headings and short list items inside the article sit next to them.
`resiliparse_main` is resiliparse's own main content (the extract stage before issue 46) and
`resiliparse_full` all of a page's text.

resiliparse's extraction time grows with the square of the tag nesting depth (10k nested `<div>`s
take seconds, 40k over a minute), and the parse is C code that no signal interrupts. The depth
scan is the cheap first line: a page nested deeper than browsers build (Blink stops nesting at 512
levels) is rejected before it is parsed; the worker's time budget is the hard second line.
"""

from __future__ import annotations

import numpy as np

# Elements that never take an end tag, and elements whose end tag may be left out (HTML's
# "optional end tag" list, the ones that hold content): neither may count as a level, or an
# unclosed <p> or <li> per paragraph would drift the depth up through a long page.
NOT_NESTING = (
    "area base br col embed hr img input link meta param source track wbr "
    "p li dt dd tr td th thead tbody tfoot option optgroup rb rt rtc rp colgroup caption html head body"
).split()
_KEY_BYTES = 8  # every name above fits in 8 bytes, so a name is one uint64 key
_NOT_NESTING_KEYS = np.sort(np.array(
    [int.from_bytes(n.encode().ljust(_KEY_BYTES, b"\0"), "little") for n in NOT_NESTING], dtype=np.uint64
))
_LT, _GT, _SLASH = ord("<"), ord(">"), ord("/")


def _name_chars(b: np.ndarray) -> np.ndarray:
    """Lower-case letters, digits and "-": what a tag name is made of (after lower-casing)."""
    return ((b >= ord("a")) & (b <= ord("z"))) | ((b >= ord("0")) & (b <= ord("9"))) | (b == ord("-"))


def tag_depth(html: str, limit: int) -> int:
    """The deepest nesting of elements in `html`, counting only elements that must be closed: the
    running count of opening tags minus closing tags, never below zero. A tag is `<name` or
    `</name` closed by a `>` before the next `<` (so `a<b` in a script is not one). A page with
    no more `<` than `limit` cannot pass it and is not scanned; the scan itself is vectorised
    over the page's bytes, so it costs a small part of the page's extraction."""
    if html.count("<") <= limit:
        return 0
    b = np.frombuffer(html.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    lt = np.flatnonzero(b == _LT)
    gt = np.flatnonzero(b == _GT)
    padded = np.concatenate((b, np.zeros(_KEY_BYTES + 3, dtype=np.uint8)))
    closing = padded[lt + 1] == _SLASH
    name_at = lt + 1 + closing
    # A tag ends at a ">" that comes before the next "<".
    next_gt = np.searchsorted(gt, lt)
    ends = np.where(next_gt < len(gt), gt[np.minimum(next_gt, len(gt) - 1)], len(b))
    next_lt = np.append(lt[1:], len(b))
    window = padded[name_at[:, None] + np.arange(_KEY_BYTES + 1)]
    window = np.where((window >= ord("A")) & (window <= ord("Z")), window | 0x20, window)
    first = window[:, 0]
    is_tag = (first >= ord("a")) & (first <= ord("z")) & (ends < next_lt)
    in_name = np.logical_and.accumulate(_name_chars(window), axis=1)
    key_bytes = np.where(in_name[:, :_KEY_BYTES], window[:, :_KEY_BYTES], 0).astype(np.uint8)
    keys = np.ascontiguousarray(key_bytes).view("<u8").ravel()
    short = ~in_name[:, _KEY_BYTES]  # names of 9 bytes or more are none of the listed ones
    at = np.minimum(np.searchsorted(_NOT_NESTING_KEYS, keys), len(_NOT_NESTING_KEYS) - 1)
    counted = is_tag & ~(short & (_NOT_NESTING_KEYS[at] == keys))
    steps = np.where(closing, -1, 1)[counted]
    if steps.size == 0:
        return 0
    running = np.cumsum(steps)
    # Closing tags with nothing open do not take the depth below zero.
    floor = np.minimum(np.minimum.accumulate(running), 0)
    return int((running - floor).max())


# Lengths tuned on the development split of trafilatura's evaluation pages (bench/extraction.py).
ARTICLE_LINE_CHARS = 60
BOILERPLATE_LINE_CHARS = 40
# Elements whose text is never the article's (HTML's sectioning elements for page furniture).
NOT_ARTICLE_ELEMENTS = ["nav", "header", "footer", "aside", "figure", "form", "button", "select", "iframe"]
# How far (in lines) an article line lends a kept neighbour to a middle-length line.
NEIGHBOUR_LINES = 2


def _extract(html: str, main_content: bool) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, main_content=main_content)


def main_content_text(html: str) -> str:
    """The page's main content as plain text (resiliparse, DCLM's extractor)."""
    return _extract(html, True)


def full_text(html: str) -> str:
    """All of the page's text, boilerplate included."""
    return _extract(html, False)


def article_lines(lines: list[str]) -> list[str]:
    """The lines of extracted text that the boilerplate pass keeps (module docstring), blank lines
    dropped. Text with no article line at all is kept whole: a short page is not all boilerplate."""
    lines = [line.strip() for line in lines if line.strip()]
    article = [len(line) >= ARTICLE_LINE_CHARS for line in lines]
    if not any(article):
        return lines
    kept = []
    for i, line in enumerate(lines):
        before = any(article[max(0, i - NEIGHBOUR_LINES):i])
        after = any(article[i + 1:i + 1 + NEIGHBOUR_LINES])
        if article[i] or (before and after) or (len(line) >= BOILERPLATE_LINE_CHARS and (before or after)):
            kept.append(line)
    return kept


def article_text(html: str) -> str:
    """The page's article text: resiliparse main content without page furniture, then the line pass."""
    from resiliparse.extract.html2text import extract_plain_text

    text = extract_plain_text(html, main_content=True, alt_texts=False, links=False, form_fields=False,
                              noscript=False, skip_elements=NOT_ARTICLE_ELEMENTS)
    return "\n".join(article_lines(text.split("\n")))


# `stages.extract.method` -> the function that extracts a page's text.
EXTRACTORS = {"resiliparse_article": article_text, "resiliparse_main": main_content_text, "resiliparse_full": full_text}
