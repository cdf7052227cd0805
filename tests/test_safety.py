"""The safety filter: blocked words (whole words, any case, counted) and blocked domains."""

import polars as pl
import pytest

from refinery.stages.safety import SafetyFilter, url_host
from refinery.stages.stats import Drop
from refinery.stages.urls import blocked_suffix as host_is_blocked


def row(text="", url="https://ok.example/page"):
    return {"text": text, "url": url}


@pytest.mark.parametrize(
    "url,host",
    [
        ("https://Sub.Blocked.Example:8443/path?q=1", "sub.blocked.example"),
        ("blocked.example/page", "blocked.example"),
        ("http://blocked.example./x", "blocked.example"),
        ("", None),
        (None, None),
        ("http://[::1", None),  # malformed: no host rather than an exception
    ],
)
def test_url_host(url, host):
    assert url_host(url) == host


def test_domain_matches_itself_and_subdomains_only():
    blocked = frozenset({"blocked.example"})
    assert host_is_blocked("blocked.example", blocked) == "blocked.example"
    assert host_is_blocked("a.b.blocked.example", blocked) == "blocked.example"
    assert host_is_blocked("notblocked.example", blocked) is None
    assert host_is_blocked("blocked.example.org", blocked) is None


def test_blocked_domain_reason_and_detail():
    f = SafetyFilter([], ["Blocked.Example"])
    drop = f.check(row(url="https://www.blocked.example/a"))
    assert drop.rule == "safety/blocked_domain" and drop.value is None
    assert drop.detail == "www.blocked.example (blocked: blocked.example)"
    assert f.check(row(url="https://fine.example/a")) is None
    assert f.check(row(url=None)) is None


def test_blocked_words_are_whole_word_and_case_insensitive():
    f = SafetyFilter(["slur", "bad phrase"], [], max_blocked_word_hits=0)
    assert f.check(row("a SLUR here")).rule == "safety/blocked_words"
    assert f.check(row("this is a Bad   Phrase indeed")).value == 1.0
    assert f.check(row("slurp and slurry and preslur are fine")) is None
    assert f.check(row("")) is None and f.check(row(None)) is None


def test_blocked_words_drop_only_above_the_allowed_hits():
    f = SafetyFilter(["spam"], [], max_blocked_word_hits=2)
    assert f.check(row("spam spam")) is None
    drop = f.check(row("Spam spam SPAM"))
    assert drop == Drop("safety/blocked_words", 3.0, "spamx3")


def test_run_counts_removals_and_writes_rejects():
    f = SafetyFilter(["spam"], ["blocked.example"])
    docs = pl.DataFrame({
        "doc_id": ["d/0", "d/1", "d/2", "d/3"],
        "url": ["https://a.example", "https://blocked.example/x", "https://b.example", "https://c.example"],
        "source": ["web"] * 4,
        "bucket": ["web"] * 4,
        "text": ["clean", "clean but blocked host", "buy spam now", None],
    })
    out = f.run(docs)
    assert out.documents["doc_id"].to_list() == ["d/0", "d/3"]
    assert out.stats.dropped == {"safety/blocked_domain": 1, "safety/blocked_words": 1}
    assert dict(zip(out.rejects["doc_id"], out.rejects["rule"])) == {
        "d/1": "safety/blocked_domain", "d/2": "safety/blocked_words"}


def test_empty_configuration_keeps_everything():
    f = SafetyFilter([" ", ""], [])
    assert f.words_regex is None
    assert f.check(row("anything at all", "https://x.example")) is None
