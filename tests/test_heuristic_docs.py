"""Documentation with code samples and option lists passes the heuristics in several languages,
while real low-value pages and spam are still removed, and a curly-bracket removal names its line."""

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from helpers.doc_pages import DOC_EN, DOCS, PROSE_BRACE_LINE
from refinery.config import C4Config, HeuristicConfig
from refinery.stages.heuristic import HeuristicFilter

DATA = Path(__file__).resolve().parents[1] / "data"


def _pages(path: Path, kind: str) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["kind"].startswith(kind)]


@pytest.mark.parametrize("lang", sorted(DOCS))
def test_documentation_with_code_and_options_passes(lang):
    text, drop = HeuristicFilter(HeuristicConfig()).apply(DOCS[lang], None, Counter(), lang)
    assert drop is None
    # the option list and the prose are kept; C4's line rules cut only lines of too few words
    lines = DOCS[lang].split("\n")
    assert [line for line in lines if line.startswith("--config")][0] in text and lines[-1] in text


def test_published_c4_still_drops_the_same_page():
    drop = HeuristicFilter(HeuristicConfig(c4=C4Config(curly_bracket_skip_code=False))).apply(
        DOC_EN, None, Counter(), "en")[1]
    assert (drop.rule, drop.value, drop.detail) == ("c4/curly_bracket", 7, "'{' in a line: 'location / {'")


def test_curly_bracket_removal_names_the_line():
    text = DOC_EN + "\n" + PROSE_BRACE_LINE
    drop = HeuristicFilter(HeuristicConfig()).apply(text, None, Counter(), "en")[1]
    assert drop.rule == "c4/curly_bracket"
    assert drop.value == text.split("\n").index(PROSE_BRACE_LINE) + 1
    assert drop.detail == f"'{{' in a line that is not code: {PROSE_BRACE_LINE!r}"
    # explain mode (funnel --explain, why) reports the same value and line
    failures = HeuristicFilter(HeuristicConfig()).explain(text, None, "en")
    assert [(d.rule, d.value, d.detail) for d in failures] == [(drop.rule, drop.value, drop.detail)]


def test_a_long_line_is_excerpted_in_the_detail():
    line = "A {placeholder} in a sentence that runs on " + " ".join(f"item{i}" for i in range(40)) + "."
    drop = HeuristicFilter(HeuristicConfig()).apply(DOC_EN + "\n" + line, None, Counter(), "en")[1]
    assert drop.detail.endswith("...'") and len(drop.detail) < 170 and "{placeholder}" in drop.detail


@pytest.mark.parametrize("path,kind", [
    (DATA / "labelled" / "labelled.jsonl.gz", "templated"),
    (DATA / "labelled" / "labelled.jsonl.gz", "wordlist"),
    (DATA / "labelled" / "labelled.jsonl.gz", "spam/"),
    (DATA / "labelled" / "labelled.jsonl.gz", "navigation"),
    (DATA / "heuristic_docs" / "docs.jsonl.gz", "wordlist"),
])
def test_templated_index_word_list_and_spam_pages_are_still_removed(path, kind):
    pages = _pages(path, kind)
    stage = HeuristicFilter(HeuristicConfig())
    kept = [p["url"] for p in pages if stage.apply(p["text"], p["url"], Counter(), p["lang"])[1] is None]
    assert len(pages) >= 10 and kept == []
