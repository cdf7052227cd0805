"""heuristic_filtered: one tiny hand-written document per rule asserting the exact reason string,
the n-gram arithmetic against a plain reference, C4's line removal, and the stage's counts."""

import random
from collections import Counter

import pytest

from refinery.stages.heuristic import (
    HeuristicFilter,
    NGrams,
    c4_lines,
    duplicate_ngram_chars,
    fineweb_quality,
    gopher_quality,
    gopher_repetition,
    top_ngram_chars,
    url_rules,
)
from refinery.stages.text import DocumentText, split_words
from refinery.config import C4Config, FineWebQualityConfig, GopherQualityConfig, GopherRepetitionConfig, HeuristicConfig
from refinery.documents import PROVENANCE_COLUMNS, REJECTS_SCHEMA
from helpers.documents import provenance_frame

CLEAN = """The harbour town wakes slowly when the fishing boats return with the morning tide.
Traders set out their stalls along the quay and argue about the price of fresh mackerel.
Children run between the nets while their parents count the catch and mend the torn ropes.
By noon the market is loud with voices, and the smell of salt and smoke drifts over the water.
Visitors who come for a single day often stay for a week, charmed by the narrow streets.
In the evening the lamps are lit and the old sailors tell stories that grow longer every year."""
CLEAN_LINES = CLEAN.split("\n")


def rule(drop):
    return None if drop is None else drop.rule


def test_clean_document_passes_every_rule_unchanged():
    text, drop = HeuristicFilter(HeuristicConfig()).apply(CLEAN, "https://harbour.example/town", Counter())
    assert drop is None
    assert text == CLEAN


# ---- URL -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url,expected,detail",
    [
        ("https://spam.example/offer", "url/blocklisted_domain", "spam.example"),
        ("http://www.deals.spam.example:8080/x?y=1", "url/blocklisted_domain", "spam.example"),
        ("https://notspam.example/offer", None, None),
        ("https://shop.example/buy-cheap-viagra-now", "url/banned_word", "viagra"),
        ("https://shop.example/viagraless", None, None),
        (None, None, None),
    ],
)
def test_url_rules(url, expected, detail):
    drop = url_rules(url, frozenset({"spam.example"}), frozenset({"viagra"}))
    assert rule(drop) == expected
    if detail:
        assert drop.detail == detail


# ---- Gopher quality ----------------------------------------------------------------------------------

LONG_WORDS = " ".join(f"extraordinarily{i} incomprehensibility{i}" for i in range(40)) + " the and"
SHORT_WORDS = " ".join("I am at it of to be on an ox as we go" for _ in range(5))
NUMBERS = CLEAN + "\n" + " ".join(str(1000 + i) for i in range(60))
NO_STOP_WORDS = " ".join(
    f"Quick brown foxes jump over lazy dogs number {i}." for i in range(12)
)


@pytest.mark.parametrize(
    "text,cfg,expected",
    [
        ("Too short to count. Just a few words here.", GopherQualityConfig(), "gopher_quality/min_words"),
        (CLEAN, GopherQualityConfig(max_words=60), "gopher_quality/max_words"),
        (SHORT_WORDS, GopherQualityConfig(), "gopher_quality/min_avg_word_length"),
        (LONG_WORDS, GopherQualityConfig(), "gopher_quality/max_avg_word_length"),
        (CLEAN + " " + "#tag " * 20, GopherQualityConfig(), "gopher_quality/hash_ratio"),
        (CLEAN + " and so on..." * 20, GopherQualityConfig(), "gopher_quality/ellipsis_ratio"),
        ("\n".join("- " + line for line in CLEAN_LINES), GopherQualityConfig(), "gopher_quality/bullet_lines_ratio"),
        ("\n".join(line[:-1] + "..." for line in CLEAN_LINES), GopherQualityConfig(), "gopher_quality/ellipsis_lines_ratio"),
        (NUMBERS, GopherQualityConfig(), "gopher_quality/alpha_words_ratio"),
        # punctuation attached to words does not make them non-alphabetic (whitespace words, as in Gopher)
        (CLEAN.replace(" ", ", "), GopherQualityConfig(min_stop_words=0), None),
        (NO_STOP_WORDS, GopherQualityConfig(), "gopher_quality/stop_words"),
        (CLEAN, GopherQualityConfig(), None),
    ],
)
def test_gopher_quality_rules(text, cfg, expected):
    assert rule(gopher_quality(DocumentText(text), cfg)) == expected


def test_gopher_quality_reports_the_measured_value():
    drop = gopher_quality(DocumentText("Too short to count. Just a few words here."), GopherQualityConfig())
    assert drop.value == 9 and drop.detail == "< 50"


# ---- Gopher repetition -------------------------------------------------------------------------------

NO_NGRAMS = GopherRepetitionConfig(top_n_grams=[], dup_n_grams=[])


@pytest.mark.parametrize(
    "text,cfg,expected",
    [
        ("\n\n".join([CLEAN_LINES[0], CLEAN_LINES[1], CLEAN_LINES[0], CLEAN_LINES[0]]), GopherRepetitionConfig(), "gopher_rep/dup_para_frac"),
        ("\n\n".join([CLEAN, "Short one.", "Another short.", CLEAN]), GopherRepetitionConfig(), "gopher_rep/dup_para_char_frac"),
        ("\n".join(CLEAN_LINES[:3] + CLEAN_LINES[:2]), GopherRepetitionConfig(), "gopher_rep/dup_line_frac"),
        ("\n".join(CLEAN_LINES + ["Yes.", "No.", "Maybe.", "Later."] + CLEAN_LINES[:2]), GopherRepetitionConfig(), "gopher_rep/dup_line_char_frac"),
        (CLEAN + " " + " ".join(f"red fox {w}" for w in CLEAN.split()[:30]), GopherRepetitionConfig(dup_n_grams=[]), "gopher_rep/top_2_gram"),
        (CLEAN + " " + " ".join(f"big red {'x' * 18} {w}" for w in CLEAN.split()[:5]), GopherRepetitionConfig(dup_n_grams=[]), "gopher_rep/top_3_gram"),
        (CLEAN + " " + " ".join(f"one big red fox {w}" for w in CLEAN.split()[:12]), GopherRepetitionConfig(top_n_grams=[[4, 0.16]], dup_n_grams=[]), "gopher_rep/top_4_gram"),
        (CLEAN + " " + CLEAN.replace("\n", " "), GopherRepetitionConfig(top_n_grams=[]), "gopher_rep/dup_5_gram"),
        (CLEAN + " " + CLEAN.replace("\n", " "), GopherRepetitionConfig(top_n_grams=[], dup_n_grams=[[8, 0.12]]), "gopher_rep/dup_8_gram"),
        (CLEAN, GopherRepetitionConfig(), None),
    ],
)
def test_gopher_repetition_rules(text, cfg, expected):
    assert rule(gopher_repetition(DocumentText(text), cfg)) == expected


def _reference_top(words, n):
    grams = Counter(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))
    gram, count = grams.most_common(1)[0]
    return len(gram) * count


def _reference_dup(words, n):
    seen, idx, chars = set(), 0, 0
    while idx < len(words) - n + 1:
        gram = tuple(words[idx : idx + n])
        if gram in seen:
            chars += sum(map(len, gram))
            idx += n
        else:
            seen.add(gram)
            idx += 1
    return chars


@pytest.mark.parametrize("seed", range(20))
def test_ngram_arithmetic_matches_a_plain_reference(seed):
    rng = random.Random(seed)
    vocab = [rng.choice("abcdefgh") * rng.randint(1, 4) for _ in range(rng.randint(2, 9))]
    words = [rng.choice(vocab) for _ in range(rng.randint(10, 300))]
    grams = NGrams(words)
    for n in (1, 2, 3, 4, 5, 7, 10):
        # limit -1 forces the exact values; the bounds are never below them
        assert top_ngram_chars(grams, n, -1) == _reference_top(words, n)
        assert grams.top_bound(n) >= _reference_top(words, n)
        assert duplicate_ngram_chars(grams, n, -1) == _reference_dup(words, n)
        assert grams.repeat_bound(n) >= _reference_dup(words, n)
        # under a limit the answer is exact, or a bound that is within the limit
        for limit in (10, 100, 1000):
            top, dup = top_ngram_chars(grams, n, limit), duplicate_ngram_chars(grams, n, limit)
            assert top == _reference_top(words, n) or _reference_top(words, n) <= top <= limit
            assert dup == _reference_dup(words, n) or _reference_dup(words, n) <= dup <= limit


def test_no_repeated_ngram_gives_zero():
    grams = NGrams("one two three four five six seven eight nine ten".split())
    assert duplicate_ngram_chars(grams, 5, -1) == 0
    assert grams.repeat_bound(5) == 0


# ---- C4 --------------------------------------------------------------------------------------------


def test_c4_removes_failing_lines_and_counts_them():
    text = "\n".join(
        [
            "Home",
            "Menu Login",
            CLEAN_LINES[0] + "[1]",
            "Please enable JavaScript to view the comments powered by a widget.",
            CLEAN_LINES[1],
            "This site uses cookies to improve your experience of the site.",
            CLEAN_LINES[2] + "[edit]",
            "word " + "x" * 1001 + " tail",
            *CLEAN_LINES[3:],
        ]
    )
    removed = Counter()
    kept, drop, _ = c4_lines(DocumentText(text), C4Config(), removed)
    assert drop is None
    assert kept == CLEAN
    assert removed == {
        "c4_lines/too_few_words": 2,
        "c4_lines/javascript": 1,
        "c4_lines/policy": 1,
        "c4_lines/too_long_word": 1,
    }


@pytest.mark.parametrize(
    "text,cfg,expected",
    [
        (CLEAN + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.", C4Config(), "c4/lorem_ipsum"),
        (CLEAN + "\nThe function body goes between the braces { like this }.", C4Config(), "c4/curly_bracket"),
        ("\n".join(CLEAN_LINES[:4]), C4Config(), "c4/too_few_sentences"),
        (CLEAN + "\nA line without an end mark at all here", C4Config(filter_no_terminal_punct=True), None),
        ("\n".join(line[:-1] for line in CLEAN_LINES), C4Config(filter_no_terminal_punct=True), "c4/too_few_sentences"),
    ],
)
def test_c4_document_rules(text, cfg, expected):
    removed = Counter()
    kept, drop, _ = c4_lines(DocumentText(text), cfg, removed)
    assert rule(drop) == expected
    assert (kept is None) == (expected is not None)
    if cfg.filter_no_terminal_punct:
        assert removed["c4_lines/no_terminal_punct"] >= 1


# ---- FineWeb ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,cfg,expected",
    [
        ("   \n\n  ", FineWebQualityConfig(), "fineweb/empty"),
        ("\n".join(line[:-1] for line in CLEAN_LINES), FineWebQualityConfig(), "fineweb/line_punct_ratio"),
        ("\n".join(["A short line here."] * 1 + [f"Item number {i} is here." for i in range(9)]), FineWebQualityConfig(), "fineweb/short_line_ratio"),
        ("\n".join(CLEAN_LINES + CLEAN_LINES[:1]), FineWebQualityConfig(), "fineweb/char_dup_ratio"),
        ("\n".join(f"Apples, pears, plums and figs number {i}." for i in range(8)), FineWebQualityConfig(new_line_ratio=0.05), "fineweb/list_ratio"),
        (CLEAN, FineWebQualityConfig(), None),
    ],
)
def test_fineweb_rules(text, cfg, expected):
    assert rule(fineweb_quality(text, cfg)) == expected


# ---- the stage ---------------------------------------------------------------------------------------


def _docs(rows):
    return provenance_frame([t for _, t in rows], [u for u, _ in rows], file="a.warc.gz",
                            fetch_time="2024-03-01T00:00:00Z", content_type="text/html", language="en")


def test_stage_counts_rejects_and_edits():
    docs = _docs(
        [
            ("https://harbour.example/1", "Home\n" + CLEAN),
            ("https://spam.example/2", CLEAN),
            ("https://harbour.example/3", "Too short."),
            ("https://harbour.example/4", None),
            ("https://harbour.example/5", CLEAN + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit."),
        ]
    )
    out = HeuristicFilter(HeuristicConfig(url_blocklist=["spam.example"])).run(docs)
    assert out.documents["doc_id"].to_list() == ["web-a/0000000"]
    assert out.documents["text"].to_list() == [CLEAN]
    assert out.documents.columns == docs.columns
    assert out.documents.select(PROVENANCE_COLUMNS).row(0) == docs.select(PROVENANCE_COLUMNS).row(0)
    assert dict(out.rejects.schema) == REJECTS_SCHEMA
    assert dict(zip(out.rejects["doc_id"], out.rejects["rule"])) == {
        "web-a/0000001": "url/blocklisted_domain",
        "web-a/0000002": "gopher_quality/min_words",
        "web-a/0000003": "gopher_quality/min_words",
        "web-a/0000004": "c4/lorem_ipsum",
    }
    assert set(out.rejects["stage"]) == {"heuristic_filtered"}
    s = out.stats
    assert (s.docs_in, s.docs_out) == (5, 1)
    assert s.dropped == {"url/blocklisted_domain": 1, "gopher_quality/min_words": 2, "c4/lorem_ipsum": 1}
    assert s.counters == {"c4_lines/too_few_words": 1}
    assert s.bytes_out == len(CLEAN.encode())
    assert s.by_bucket["web"].docs_in == 5


def test_empty_table_gives_empty_outputs():
    out = HeuristicFilter(HeuristicConfig()).run(_docs([]))
    assert out.documents.height == 0 and out.rejects.height == 0
    assert (out.stats.docs_in, out.stats.docs_out) == (0, 0)


def test_words_are_whitespace_words_and_symbol_words_do_not_count():
    assert DocumentText("Hello, world... it's 2024!").words == ["Hello,", "world...", "it's", "2024!"]
    assert split_words("Hello, world... it's 2024!") == ["Hello", ",", "world", "...", "it", "'", "s", "2024", "!"]
    # 49 words and a dash line: the dash is not a word, so the document is one word short
    text = " ".join(["word"] * 24 + ["the", "and"] + ["word"] * 23) + "\n- - -"
    assert gopher_quality(DocumentText(text), GopherQualityConfig()).value == 49


@pytest.mark.parametrize("seed", range(30))
def test_fast_splits_match_their_regex_definitions(seed):
    import re

    rng = random.Random(seed)
    text = "".join(rng.choice(["a", "b.", " ", "\n", "\n\n", "é", "\x1c", "--", "_"]) for _ in range(rng.randint(0, 60)))
    doc = DocumentText(text)
    assert doc.line_runs == re.split(r"\n+", text)
    assert doc.paragraphs == re.split(r"\n{2,}", text.strip())
    keys = doc.token_keys
    assert [k.decode() if isinstance(k, bytes) else k for k in keys] == split_words(text)
    ascii_text = text.replace("é", "e")
    assert [k.decode() for k in DocumentText(ascii_text).token_keys] == split_words(ascii_text)
