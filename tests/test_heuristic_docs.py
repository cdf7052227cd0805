"""Documentation with code samples and option lists passes language ID and the heuristics in several
languages, while real low-value pages and spam are still removed, and a curly-bracket removal names
its line."""

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from helpers.doc_pages import DOC_EN, DOCS, MANPAGE_RU, PROSE_BRACE_LINE, TABLE_OF_CONTENTS
from refinery.config import C4Config, HeuristicConfig, LanguageConfig
from refinery.stages.heuristic import HeuristicFilter
from refinery.stages.language import LanguageFilter, load_language_model
from refinery.stages.line_kinds import prose_text
from refinery.stages.stats import Drop

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


@pytest.mark.parametrize("lang,text", [*sorted(DOCS.items()), ("ru", MANPAGE_RU)])
def test_documentation_passes_language_id_then_the_heuristics(lang, text):
    # as a `languages: all` config runs them: language ID reads the prose, the heuristics the page
    found = LanguageFilter(LanguageConfig(languages="all"), load_language_model(None)).process({"text": text}, Counter())
    assert found["language"] == lang and found["language_score"] >= 0.65
    assert HeuristicFilter(HeuristicConfig()).apply(text, None, Counter(), found["language"])[1] is None


def _doc_page(url: str) -> dict:
    return next(p for p in _pages(DATA / "heuristic_docs" / "docs.jsonl.gz", "") if p["url"] == url)


@pytest.mark.parametrize("url,whole_text_score", [
    # a Danish man page whose synopses and option names lid.176 reads as no language in particular
    ("https://manpages.debian.org/da/bzfgrep.1.gz", 0.567),
    # Indonesian prose around addresses and commands
    ("https://debian-handbook.info/id-ID/sect.ipv6.html#0", 0.638),
    # Croatian prose, which lid.176 splits among hr, sh, sr and bs
    ("https://debian-handbook.info/hr-HR/sect.who-is-this-book-for.html#0", 0.437),
])
def test_language_id_reads_the_prose_of_a_mixed_page(url, whole_text_score):
    page = _doc_page(url)
    model = load_language_model(None)
    published = LanguageFilter(LanguageConfig(languages="all", prose_lines=False, macrolanguages=False), model)
    drop = published.process({"text": page["text"]}, Counter())
    assert isinstance(drop, Drop) and (drop.rule, drop.detail) == ("language/low_score", page["lang"])
    assert round(drop.value, 3) == whole_text_score
    kept = LanguageFilter(LanguageConfig(languages="all"), model).process({"text": page["text"]}, Counter())
    assert kept["language"] == page["lang"] and kept["language_score"] >= 0.65


def test_macrolanguage_kin_add_up_only_when_asked():
    text = _doc_page("https://debian-handbook.info/hr-HR/sect.who-is-this-book-for.html#0")["text"]
    model = load_language_model(None)
    ranked = model.top(prose_text(text), 4)
    own = LanguageFilter(LanguageConfig(languages="all", macrolanguages=False), model).identify(text)
    kin = LanguageFilter(LanguageConfig(languages="all"), model).identify(text)
    assert own == ranked[0] and own[0] == kin[0] == "hr" and own[1] < 0.65 <= kin[1]
    assert {lang for lang, _ in ranked[1:]} >= {"sh", "sr"}
    assert kin[1] == pytest.approx(own[1] + sum(score for lang, score in ranked[1:] if lang in ("sh", "sr", "bs")))


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


def test_a_generated_table_of_contents_is_still_removed():
    stage = HeuristicFilter(HeuristicConfig())
    assert stage.apply(TABLE_OF_CONTENTS, None, Counter(), "en")[1] is not None
    # no option list and no code: FineWeb's line punctuation reads it as FineWeb does
    assert ("fineweb/line_punct_ratio", 0.0) in [(d.rule, d.value) for d in stage.explain(TABLE_OF_CONTENTS, None, "en")]
