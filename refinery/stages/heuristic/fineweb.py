"""FineWeb quality (Penedo et al. 2024, section 3.3; datatrove FineWebQualityFilter): lines ending
in punctuation, short lines, characters in duplicated lines, newlines per word
(`fineweb/<rule>`), read on the text C4's line rules kept, as in the FineWeb pipeline.

Where we differ from FineWeb: with `line_punct_prose_only` (the default) the line-punctuation
ratio counts prose lines only, not code lines nor the entries of an option list, whose
descriptions a man page writes without a full stop (refinery/stages/line_kinds.py,
docs/languages.md); false counts every line, as FineWeb does.

Where we differ from datatrove's code: a line's trailing whitespace is not part of it, so a line
of a `\r\n` text still ends in its punctuation. C4's line rules strip every line, so this matters
only where `c4_lines/whitespace` is off and the text reaches FineWeb as it came.
"""

from __future__ import annotations

from refinery.config import FineWebQualityConfig
from refinery.stages.heuristic.gopher_repetition import repeated
from refinery.stages.heuristic.verdict import Verdict, over, rule_family, under
from refinery.stages.line_kinds import TERMINAL_PUNCTUATION, is_code


def punctuation_lines(lines: list[str], entries: frozenset[str]) -> list[str]:
    """The lines the line-punctuation ratio counts when it reads prose only: not code, not an
    option list's entry (`entries`, from the page before C4 cut its bare terms). Every line when
    none is left: a page with no prose line is measured as FineWeb measures it."""
    prose = [line for line in lines if line.strip() not in entries and not is_code(line.strip())]
    return prose or lines


@rule_family
def fineweb_quality(v: Verdict, text: str, cfg: FineWebQualityConfig, words: int | None = None,
                    entries: frozenset[str] = frozenset()) -> None:
    """FineWeb's rules on C4's edited text; `words` is its word count when the caller has it (a
    segmented document), else its whitespace words are counted. `entries` are the stripped lines of
    the page's option lists (line_kinds.option_entries), which the line-punctuation ratio leaves
    out with code lines when `cfg.line_punct_prose_only` is set."""
    lines = [line.rstrip() for line in text.split("\n") if line.strip()]
    if not lines:
        v.fail("fineweb/empty", 0, "no non-blank line")
        return
    counted = punctuation_lines(lines, entries) if cfg.line_punct_prose_only else lines
    ratio = sum(1 for line in counted if line[-1] in TERMINAL_PUNCTUATION) / len(counted)
    if ratio < cfg.line_punct_thr and v.fail("fineweb/line_punct_ratio", ratio, under(cfg.line_punct_thr)):
        return
    ratio = sum(1 for line in lines if len(line) <= cfg.short_line_length) / len(lines)
    if ratio > cfg.short_line_thr and v.fail("fineweb/short_line_ratio", ratio, over(cfg.short_line_thr)):
        return
    ratio = repeated(lines)[1] / max(1, len(text) - text.count("\n"))
    if ratio > cfg.char_duplicates_ratio and v.fail("fineweb/char_dup_ratio", ratio, over(cfg.char_duplicates_ratio)):
        return
    newlines = text.count("\n")
    if newlines:
        ratio = newlines / max(1, len(text.split()) if words is None else words)
        if ratio > cfg.new_line_ratio:
            v.fail("fineweb/list_ratio", ratio, over(cfg.new_line_ratio))
