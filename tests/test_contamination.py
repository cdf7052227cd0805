"""The n-gram contamination scan, on hand-written eval sets and documents."""

import json

import numpy as np
import pytest

from refinery.config import parse_config
from refinery.contamination import (ContaminationError, EvalIndex, ngram_hashes, normalized_words, scan,
                                   unscannable, verdict, word_hashes)

EVAL_TEXT = (
    "Natalia sold clips to forty eight of her friends in April and then she sold half as many clips in May "
    "how many clips did Natalia sell altogether in April and May"
)
CLEAN = (
    "The river delta supports a wide range of birds during the spring migration and local volunteers count "
    "them every year to estimate how populations change over the decades"
)


def make_cfg(tmp_path, items, ngram=13, max_docs=0):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return parse_config(
        {
            "data_root": str(tmp_path / "root"),
            "buckets": ["web"],
            "sources": [{"name": "web", "path": "x", "format": "jsonl", "bucket": "web"}],
            "contamination": {
                "eval_sets": [{"name": "gsm8k", "path": str(path)}],
                "ngram": ngram,
                "max_contaminated_docs": max_docs,
            },
        }
    )


def hashed(text: str) -> np.ndarray:
    return word_hashes([text])[0]


def test_ngram_hash_is_positional_and_stable():
    a = ngram_hashes(hashed("a b c d"), 3)
    assert len(a) == 2 and (a == ngram_hashes(hashed("A, b; C d!"), 3)).all()
    assert ngram_hashes(hashed("b a c"), 3)[0] != ngram_hashes(hashed("a b c"), 3)[0]
    assert len(ngram_hashes(hashed("a b"), 3)) == 0


def test_batched_words_match_one_text_at_a_time():
    texts = ["Alpha beta gamma", None, "", "délta épsilon", "x"]
    flat, counts = word_hashes(texts)
    assert counts.tolist() == [3, 0, 0, 2, 1]
    assert flat.tolist() == [h for t in texts for h in word_hashes([t])[0].tolist()]
    assert normalized_words("Délta, ÉPSILON!") == ["délta", "épsilon"]


def test_scan_finds_planted_leak_despite_case_and_punctuation(tmp_path):
    cfg = make_cfg(tmp_path, [{"id": "q17", "text": EVAL_TEXT}])
    index = EvalIndex.build(cfg)
    leaked = "Some preamble. " + EVAL_TEXT.upper().replace(" in May", ", in May!") + " and an ending."
    docs = [("web-0/0000001", "http://a.example/1", "web", CLEAN), ("web-0/0000002", None, "web", leaked)]
    report = scan("anneal", cfg.contamination, index, docs, {"manifest": "x"})
    assert report.docs_scanned == 2
    assert report.contaminated_docs == 1 and not report.passed
    hit = report.hits[0]
    assert (hit.doc_id, hit.eval_set, hit.eval_id) == ("web-0/0000002", "gsm8k", "q17")
    assert len(hit.ngram.split()) == 13 and hit.ngram in " ".join(normalized_words(EVAL_TEXT))
    assert hit.matched_ngrams == len(normalized_words(EVAL_TEXT)) - 13 + 1


def test_scan_has_no_false_positive_on_shared_short_phrases(tmp_path):
    cfg = make_cfg(tmp_path, [{"id": "q1", "text": EVAL_TEXT}])
    # Twelve consecutive eval words are below the 13-gram standard and must not count.
    twelve = " ".join(normalized_words(EVAL_TEXT)[:12])
    report = scan("main", cfg.contamination, EvalIndex.build(cfg), [("d/1", None, "web", CLEAN + " " + twelve)], {})
    assert report.contaminated_docs == 0 and report.passed


def test_limit_allows_configured_number_of_documents(tmp_path):
    cfg = make_cfg(tmp_path, [{"id": "q1", "text": EVAL_TEXT}], max_docs=1)
    report = scan("main", cfg.contamination, EvalIndex.build(cfg), [("d/1", None, "web", EVAL_TEXT)], {})
    assert report.contaminated_docs == 1 and report.passed


def test_bad_eval_set_line_is_a_clear_error(tmp_path):
    cfg = make_cfg(tmp_path, [{"id": "q1", "text": EVAL_TEXT}])
    (tmp_path / "eval.jsonl").write_text('{"id": "q1"}\n')
    with pytest.raises(ContaminationError, match=r"eval.jsonl:1: each line must be a JSON object with `id` and `text`"):
        EvalIndex.build(cfg)


def test_missing_eval_set_names_the_field(tmp_path):
    cfg = make_cfg(tmp_path, [])
    (tmp_path / "eval.jsonl").unlink()
    with pytest.raises(ContaminationError, match=r"contamination.eval_sets\[gsm8k\].path"):
        EvalIndex.build(cfg)


def test_nothing_to_scan_for_is_not_scanned_never_passed(tmp_path):
    """No eval set, or eval items all shorter than the n-gram: no document can be checked, and the
    verdict says so instead of "0 of 0 ... passed"."""
    none = parse_config({"data_root": str(tmp_path / "root"), "buckets": ["web"],
                         "sources": [{"name": "web", "path": "x", "format": "jsonl", "bucket": "web"}]})
    assert unscannable(none.contamination, EvalIndex.build(none)) == (
        "no eval sets configured (list JSONL files of {id, text} under contamination.eval_sets)")
    short = make_cfg(tmp_path, [{"id": "q1", "text": "twelve words are not enough for a thirteen word window here"}])
    assert unscannable(short.contamination, EvalIndex.build(short)) == (
        "no item of the eval sets (gsm8k) has the 13 words (contamination.ngram) a match needs")
    full = make_cfg(tmp_path, [{"id": "q1", "text": EVAL_TEXT}])
    assert unscannable(full.contamination, EvalIndex.build(full)) is None
    report = {"not_scanned": "no eval sets configured", "docs_unscanned": 1234, "passed": False}
    assert verdict(report) == ("not scanned: no eval sets configured; none of the phase's 1,234 documents was checked "
                               "for contamination (a warning: training is not held back for it)")
    scanned = scan("main", full.contamination, EvalIndex.build(full), [("d1", None, "web", CLEAN)], {})
    assert (scanned.status, scanned.passed) == ("passed", True)
    assert verdict(scanned.to_json()) == "0 of 1 documents share a 13-gram with an eval set (limit 0): passed"
