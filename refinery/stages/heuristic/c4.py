"""C4's line rules (Raffel et al. 2020, section 2.2; tensorflow_datasets c4_utils).

C4 removes lines, not only documents (as datatrove's C4QualityFilter and FineWeb do), so it rewrites
the documents it keeps. Its line rules, each switched off by its name in `rules_off` (stage-wide,
per language or per source, like the document rules): lines with a word over `max_word_length`
characters (`c4_lines/too_long_word`), without terminal punctuation when
`filter_no_terminal_punct` is set (`c4_lines/no_terminal_punct`), with fewer than
`min_words_per_line` words, blank lines included (`c4_lines/too_few_words`), mentioning
"javascript" (`c4_lines/javascript`), or quoting a cookie/terms policy (`c4_lines/policy`) are
dropped from the text, and counted by rule in the stage counters; Wikipedia citation marks are
cut (`c4_lines/citation`); every kept line is stripped and the lines are joined with "\n"
(`c4_lines/whitespace`: indentation, trailing spaces, `\r\n` and blank lines at either end go).
With all of them off a kept document's text is unchanged byte for byte. The document is kept if it
still has `min_num_sentences` sentences. "lorem ipsum" and a "{" in a prose line drop the whole
document (`c4/lorem_ipsum`, `c4/curly_bracket`; too few sentences left is `c4/too_few_sentences`);
with `curly_bracket_skip_code` a "{" in a code line, or one used as syntax, does not (C4 drops on
any "{"; see `code_line`). This
keeps pages whose navigation crumbs and cookie banners survived extraction, and feeds the FineWeb
rules the same text FineWeb fed them. The bytes the line rules take out of kept documents are the
stage's `bytes_rewritten` (refinery/stages/stats.py); docs/languages.md has the table.

Where we differ from datatrove's code: sentences are counted by terminal punctuation followed by
whitespace rather than by spaCy's sentencizer.
"""

from __future__ import annotations

import re
from collections import Counter

from refinery.config import C4Config
from refinery.stages.heuristic.verdict import Verdict, under
from refinery.stages.stats import Drop
from refinery.stages.text import DocumentText

# C4 (Raffel et al. 2020; tensorflow_datasets c4_utils): what a kept line may end with, the marks
# cut from lines, and the policy phrases whose lines are removed.
C4_END_PUNCTUATION = (".", "?", "!", '"', "'")
C4_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
C4_POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
# A sentence ends at terminal punctuation (optionally closed by quotes or brackets) followed by
# spaces and more text on the same line; CJK full stops need no space after them.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*[^\S\n]+(?=\S)|[。！？]+[」』”’）]*(?=\S)")
# A line that is code, where C4's `{` rule does not look when `c4.curly_bracket_skip_code` is set: a
# line inside a ``` or ~~~ fence, one that opens, closes or ends a block or a statement, or one that
# expands a shell variable. Documentation quotes code this way; a `{` in a prose line still drops
# the page (bench/heuristic_docs.py has the evidence, docs/languages.md the rule).
_FENCES = ("```", "~~~")
_CODE_ENDS = ("{", "}", ";", "{}", "};", "})", "});", "},", "\\")
# A brace that is syntax inside a prose line: glued to the word before it (`ATTR{stat}`,
# `.tar.{gz,xz}`, `%{Referer}i`), empty (find's `{}`), or holding alternatives (a synopsis's
# `{start|stop}`). A brace after a space that holds a word (`now {click} here`), or a `{{`, is
# not.
_CODE_BRACE = re.compile(r"[^\s{]\{[^{}]*\}?|\{\}|\{[^{}]*\|[^{}]*\}")
EXCERPT_CHARS = 120


def code_line(line: str) -> bool:
    """Whether a stripped line outside a fence reads as code, or holds braces only as syntax."""
    return (line.endswith(_CODE_ENDS) or line.startswith(("}", "{", "$ ")) or "${" in line
            or "{" not in _CODE_BRACE.sub("", line))


def excerpt(line: str) -> str:
    """The start of a line, for a reject's detail."""
    return line if len(line) <= EXCERPT_CHARS else line[:EXCERPT_CHARS] + "..."


def c4_lines(
    doc: DocumentText, cfg: C4Config, removed: Counter, verdict: Verdict | None = None
) -> tuple[str | None, Drop | None, int | None]:
    """(text with C4's failing lines removed, None, its word count) or (None, the drop, None);
    removed lines are counted by rule. The word count is given only for a segmented document
    (None: count the text's whitespace words), so FineWeb's rules need not segment again.

    The rules judge each line stripped and without citation marks, whether or not
    `c4_lines/whitespace` and `c4_lines/citation` are off; those two decide only what is written
    back. In explain mode (`verdict.every`) a document-level failure is recorded and the lines go on
    being checked, so every failing rule is reported."""
    v = Verdict() if verdict is None else verdict
    start = len(v.drops)
    off = v.off
    max_len = cfg.max_word_length
    check_long = "c4_lines/too_long_word" not in off
    check_punct = cfg.filter_no_terminal_punct and "c4_lines/no_terminal_punct" not in off
    check_few = "c4_lines/too_few_words" not in off
    check_js = cfg.filter_javascript and "c4_lines/javascript" not in off
    check_policy = cfg.filter_policy and "c4_lines/policy" not in off
    check_lorem, check_curly = cfg.filter_lorem_ipsum, cfg.filter_curly_bracket
    skip_code = cfg.curly_bracket_skip_code
    fenced = False
    cut_citations = "c4_lines/citation" not in off
    tidy = "c4_lines/whitespace" not in off
    # Untidied, a kept line is written back as it came, with its own line break, so the lines of a
    # document that no rule touches join back into its text byte for byte.
    with_breaks = None if tidy else doc.text.splitlines(keepends=True)
    line_words = doc.line_words if doc.segment is not None else None
    kept: list[str] = []
    kept_words = 0
    for i, raw_line in enumerate(doc.lines):
        stripped = raw_line.strip()
        if stripped.startswith(_FENCES):
            fenced = not fenced
        segments = line_words[i] if line_words is not None else None
        # A line no longer than max_word_length cannot hold a longer word; most lines skip the check.
        if check_long and len(stripped) > max_len and any(len(w) > max_len for w in (segments or stripped.split())):
            removed["c4_lines/too_long_word"] += 1
            continue
        words = len(segments) if segments is not None else len(stripped.split(None, cfg.min_words_per_line))
        line = C4_CITATION.sub("", stripped) if "[" in stripped else stripped
        if check_punct and (not line.endswith(C4_END_PUNCTUATION) or line.endswith("...")):
            removed["c4_lines/no_terminal_punct"] += 1
            continue
        if check_few and words < cfg.min_words_per_line:
            removed["c4_lines/too_few_words"] += 1
            continue
        lower = line.lower()
        if check_lorem and "lorem ipsum" in lower:
            if v.fail("c4/lorem_ipsum", None, "'lorem ipsum' in a line"):
                return None, v.drops[start], None
            check_lorem = False
        if check_js and "javascript" in lower:
            removed["c4_lines/javascript"] += 1
            continue
        if check_curly and "{" in line and not (skip_code and (fenced or code_line(line))):
            # The value is the line's number (from 1), the detail the line itself: on a long chapter
            # the user need not hunt for the `{`.
            where = "a line that is not code" if skip_code else "a line"
            detail = f"'{{' in {where}: {excerpt(line)!r}"
            if v.fail("c4/curly_bracket", i + 1, detail):
                return None, v.drops[start], None
            check_curly = False  # explain mode: reported once
        if check_policy and any(p in lower for p in C4_POLICY_PHRASES):
            removed["c4_lines/policy"] += 1
            continue
        if tidy:
            kept.append(line if cut_citations else stripped)
        else:
            original = with_breaks[i]
            kept.append(C4_CITATION.sub("", original) if cut_citations and "[" in stripped else original)
        kept_words += words
    text = "\n".join(kept) if tidy else "".join(kept)
    # Every kept line holds at least one sentence, so counting is needed only for a few lines.
    if len(kept) < cfg.min_num_sentences:
        sentences = len(kept) + len(_SENTENCE_END.findall(text))
        if sentences < cfg.min_num_sentences:
            v.fail("c4/too_few_sentences", sentences, under(cfg.min_num_sentences))
    first = v.first_since(start)
    if first is not None:
        return None, first, None
    return (text.strip() if tidy else text), None, (kept_words if line_words is not None else None)
