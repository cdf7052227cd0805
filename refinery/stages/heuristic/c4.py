"""C4's line rules (Raffel et al. 2020, section 2.2; tensorflow_datasets c4_utils).

C4 removes lines, not only documents (as datatrove's C4QualityFilter and FineWeb do): lines with a
word over `max_word_length` characters, with fewer than `min_words_per_line` words, mentioning
"javascript", or quoting a cookie/terms policy are dropped from the text, and Wikipedia citation
marks are cut; the document is kept if it still has `min_num_sentences` sentences. Removed lines
are counted under `c4_lines/<rule>` in the stage counters. "lorem ipsum" and "{" drop the whole
document (`c4/lorem_ipsum`, `c4/curly_bracket`; too few sentences left is `c4/too_few_sentences`).
This keeps pages whose navigation crumbs and cookie banners survived extraction, and feeds the
FineWeb rules the same text FineWeb fed them.

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


def c4_lines(
    doc: DocumentText, cfg: C4Config, removed: Counter, verdict: Verdict | None = None
) -> tuple[str | None, Drop | None, int | None]:
    """(text with C4's failing lines removed, None, its word count) or (None, the drop, None);
    removed lines are counted by rule. The word count is given only for a segmented document
    (None: count the text's whitespace words), so FineWeb's rules need not segment again.

    In explain mode (`verdict.every`) a document-level failure is recorded and the lines go on
    being checked, so every failing rule is reported."""
    v = Verdict() if verdict is None else verdict
    start = len(v.drops)
    off = v.off
    max_len = cfg.max_word_length
    check_long = "c4_lines/too_long_word" not in off
    check_few = "c4_lines/too_few_words" not in off
    check_js = cfg.filter_javascript and "c4_lines/javascript" not in off
    check_policy = cfg.filter_policy and "c4_lines/policy" not in off
    check_lorem, check_curly = cfg.filter_lorem_ipsum, cfg.filter_curly_bracket
    line_words = doc.line_words if doc.segment is not None else None
    kept: list[str] = []
    kept_words = 0
    for i, raw_line in enumerate(doc.lines):
        line = raw_line.strip()
        segments = line_words[i] if line_words is not None else None
        # A line no longer than max_word_length cannot hold a longer word; most lines skip the check.
        if check_long and len(line) > max_len and any(len(w) > max_len for w in (segments or line.split())):
            removed["c4_lines/too_long_word"] += 1
            continue
        words = len(segments) if segments is not None else len(line.split(None, cfg.min_words_per_line))
        line = C4_CITATION.sub("", line) if "[" in line else line
        if cfg.filter_no_terminal_punct and (not line.endswith(C4_END_PUNCTUATION) or line.endswith("...")):
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
        if check_curly and "{" in line:
            if v.fail("c4/curly_bracket", None, "'{' in a line"):
                return None, v.drops[start], None
            check_curly = False  # explain mode: reported once
        if check_policy and any(p in lower for p in C4_POLICY_PHRASES):
            removed["c4_lines/policy"] += 1
            continue
        kept.append(line)
        kept_words += words
    text = "\n".join(kept)
    # Every kept line holds at least one sentence, so counting is needed only for a few lines.
    if len(kept) < cfg.min_num_sentences:
        sentences = len(kept) + len(_SENTENCE_END.findall(text))
        if sentences < cfg.min_num_sentences:
            v.fail("c4/too_few_sentences", sentences, under(cfg.min_num_sentences))
    first = v.first_since(start)
    if first is not None:
        return None, first, None
    return text.strip(), None, (kept_words if line_words is not None else None)
