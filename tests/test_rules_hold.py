"""Issue 26, rules that hold: a URL's host cannot be hidden from the blocklists (scheme-less URLs
with a later `//`, user-info, ports, IP forms, IDN names), banned URL words match as documented
(substrings, with whole words as their own option), and PII is found next to any script, IPv6
networks whole. Each case runs through the heuristic URL rule and the safety filter (or the PII
redactor's column path), asserting the reason, the documents kept, and nothing else lost."""

import polars as pl
import pytest

from refinery.config import HeuristicConfig
from refinery.stages.heuristic import HeuristicFilter, url_rules
from refinery.stages.pii import KINDS, PiiRedactor, redact
from refinery.stages.safety import SafetyFilter
from refinery.stages.urls import url_host
from helpers.texts import PROSE

ALL_KINDS = frozenset(KINDS)


def frame(urls: list[str | None], texts: list[str] | None = None) -> pl.DataFrame:
    n = len(urls)
    return pl.DataFrame({
        "doc_id": [f"web-0/{i:07d}" for i in range(n)],
        "url": pl.Series(urls, dtype=pl.String),
        "source": ["web"] * n,
        "bucket": ["web"] * n,
        "text": pl.Series(texts or [PROSE] * n, dtype=pl.String),
    })


def assert_blocked_by_both(urls: list[str], blocklist: list[str], kept_url: str = "https://fine.example/a") -> None:
    """Each of `urls` is dropped by the heuristic URL rule and by the safety filter, with the
    documented reason, and a clean document beside them is kept by both."""
    docs = frame([*urls, kept_url])
    kept = [f"web-0/{len(urls):07d}"]
    heuristic = HeuristicFilter(HeuristicConfig(url_blocklist=blocklist)).run(docs)
    assert heuristic.rejects["rule"].to_list() == ["url/blocklisted_domain"] * len(urls)
    assert heuristic.documents["doc_id"].to_list() == kept
    safety = SafetyFilter([], blocklist).run(docs)
    assert safety.rejects["rule"].to_list() == ["safety/blocked_domain"] * len(urls)
    assert safety.documents["doc_id"].to_list() == kept


def assert_passed_by_both(urls: list[str], blocklist: list[str]) -> None:
    docs = frame(urls)
    assert HeuristicFilter(HeuristicConfig(url_blocklist=blocklist)).run(docs).documents.height == len(urls)
    assert SafetyFilter([], blocklist).run(docs).documents.height == len(urls)


# ---- Host extraction ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url,host",
    [
        # Scheme-less: a later `//` no longer hides the host.
        ("blocked.com/redirect?to=https://x.org", "blocked.com"),
        ("www.blocked.com/a//b", "www.blocked.com"),
        ("blocked.com:8080//a", "blocked.com"),
        ("//blocked.com/x", "blocked.com"),
        # Slashes and backslashes a browser reads past.
        ("https:/blocked.com/x", "blocked.com"),
        ("http:\\\\blocked.com\\x", "blocked.com"),
        ("http://blocked.com\\@evil.org/", "blocked.com"),
        # User-info ends at the last `@`; a port after the host.
        ("https://user:pass@www.blocked.com:8443/x", "www.blocked.com"),
        ("user:pass@blocked.com/x", "blocked.com"),
        ("https://blocked.com@evil.org/", "evil.org"),
        ("https://a@b@blocked.com/", "blocked.com"),
        # Percent-escapes, case, trailing dots.
        ("http://blocked%2Ecom/", "blocked.com"),
        ("HTTPS://WWW.Blocked.COM./", "www.blocked.com"),
        # IDN: Unicode names in punycode, full-width letters and dots mapped.
        ("http://BÜCHER.example/", "xn--bcher-kva.example"),
        ("http://xn--bcher-kva.example/", "xn--bcher-kva.example"),
        ("ｂｌｏｃｋｅｄ．ｃｏｍ/x", "blocked.com"),
        # IP addresses in every form a browser accepts.
        ("http://192.0.2.7:8080/", "192.0.2.7"),
        ("http://0xc0.0.2.7/", "192.0.2.7"),
        ("http://3221226055/", "192.0.2.71"),
        ("http://[2001:DB8:0::1]:8080/", "2001:db8::1"),
        ("", ""),
    ],
)
def test_url_host_reads_the_host_a_browser_would(url, host):
    assert url_host(url) == host


@pytest.mark.parametrize("url", ["http://[::1", "http://[not-an-address]/x"])
def test_broken_ipv6_literal_is_malformed(url):
    with pytest.raises(ValueError, match="Invalid IPv6 URL"):
        url_host(url)
    drop = url_rules(url, frozenset({"blocked.com"}))
    assert drop.rule == "url/malformed"


def test_scheme_less_urls_with_a_later_double_slash_are_blocked():
    assert_blocked_by_both(["blocked.com/redirect?to=https://x.org", "www.blocked.com/a//b"], ["blocked.com"])


def test_user_info_and_port_do_not_hide_the_host():
    assert_blocked_by_both(
        ["https://user:pass@www.blocked.com:8443/x", "user:pass@blocked.com/x", "evil.org@blocked.com:80//x",
         "http://blocked.com\\@evil.org/", "https:/blocked.com", "http://blocked%2Ecom/"],
        ["blocked.com"],
    )
    # The host of `blocked.com@evil.org` is evil.org, and a blocked name in the path or query is no host.
    assert_passed_by_both(["https://blocked.com@evil.org/", "https://x.org/?u=blocked.com", "notblocked.com/a//b"],
                          ["blocked.com"])


def test_idn_hosts_match_in_punycode_and_in_unicode():
    written_either_way = ["http://bücher.example/", "http://xn--bcher-kva.example/", "http://WWW.BÜCHER.example/"]
    assert_blocked_by_both(written_either_way, ["bücher.example"])
    assert_blocked_by_both(written_either_way, ["xn--bcher-kva.example"])
    assert_passed_by_both(["http://bucher.example/"], ["bücher.example"])


def test_ip_hosts_match_only_the_same_address():
    assert_blocked_by_both(["http://192.0.2.7/", "http://0xc0.0.2.7:81/", "http://3221225991/"], ["192.0.2.7"])
    assert_blocked_by_both(["http://[2001:db8::1]/", "http://[2001:db8:0:0::1]:8080/x"], ["2001:db8::1"])
    # An address is no domain: a blocked 0.2.7 or 2.7 does not block 192.0.2.7.
    assert_passed_by_both(["http://192.0.2.7/", "http://192.0.2.70/"], ["0.2.7", "2.7"])


# ---- Banned words --------------------------------------------------------------------------------------


def test_banned_words_are_substrings_of_the_url():
    drop = url_rules("https://bestcasinoguide.example/", frozenset(), substrings=frozenset({"casino"}))
    assert (drop.rule, drop.value, drop.detail) == ("url/banned_word", 1.0, "casino")
    assert url_rules("https://harbour.example/", frozenset(), substrings=frozenset({"casino", ""})) is None


def test_whole_word_banned_words_are_their_own_option():
    words = frozenset({"casino"})
    assert url_rules("https://bestcasinoguide.example/", frozenset(), words) is None
    assert url_rules("https://guide.example/casino-night", frozenset(), words).rule == "url/banned_word"


def test_banned_word_options_through_the_stage():
    urls = ["https://bestcasinoguide.example/a", "https://guide.example/casino/b", "https://harbour.example/c"]
    substring = HeuristicFilter(HeuristicConfig(url_banned_words=["Casino"])).run(frame(urls))
    assert substring.rejects["rule"].to_list() == ["url/banned_word", "url/banned_word"]
    assert substring.rejects["detail"].to_list() == ["casino", "casino"]
    assert substring.documents["doc_id"].to_list() == ["web-0/0000002"]
    whole = HeuristicFilter(HeuristicConfig(url_banned_whole_words=["Casino"])).run(frame(urls))
    assert whole.rejects["doc_id"].to_list() == ["web-0/0000001"]
    assert whole.rejects["rule"].to_list() == ["url/banned_word"]
    assert whole.documents["doc_id"].to_list() == ["web-0/0000000", "web-0/0000002"]


# ---- PII next to any script, IPv6 networks whole ----------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected,kind,n",
    [
        ("张伟zhangwei@example.com或者", "张伟<EMAIL>或者", "email", 1),
        ("メールはtaro.yamada@example.jpまで", "メールは<EMAIL>まで", "email", 1),
        ("пишите:ivan@example.ru.", "пишите:<EMAIL>.", "email", 1),
        ("电话+86 10 1234 5678转分机", "电话<PHONE>转分机", "phone", 1),
        ("電話(555) 123-4567まで", "電話<PHONE>まで", "phone", 1),
        ("服务器192.168.1.1上", "服务器<IP_ADDRESS>上", "ip", 1),
        ("服务器fe80::1上", "服务器<IP_ADDRESS>上", "ip", 1),
        ("账户DE89 3704 0044 0532 0130 00。", "账户<IBAN>。", "iban", 1),
        ("loopback ::1/128 only", "loopback <IP_ADDRESS> only", "ip", 1),
        ("default route ::/0.", "default route <IP_ADDRESS>.", "ip", 1),
        ("nets 2a00:1450::/32 and fe80::/10", "nets <IP_ADDRESS> and <IP_ADDRESS>", "ip", 2),
        # A prefix length past 128 is no prefix: the address alone is redacted, as before.
        ("bad ::1/129 and ::1/1280", "bad <IP_ADDRESS>/129 and <IP_ADDRESS>/1280", "ip", 2),
    ],
)
def test_pii_next_to_any_script_and_whole_ipv6_networks(text, expected, kind, n):
    out, counts = redact(text, ALL_KINDS)
    assert out == expected
    assert counts == {k: (n if k == kind else 0) for k in KINDS}
    staged = PiiRedactor().run(frame(["https://site.example/"], [text]))  # the column path, with prefilters
    assert staged.documents["text"].to_list() == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "see version 1.2.3.4/5, release 2.0.0.1/24 and v10.0.0.1/8",
        "Python 3.11.4/3.12 and ratios 1.5/2.5 or 1:2:3/4",
        "a bare :: and a::b/2, dead::beef/64 and std::max/2 are code",
    ],
)
def test_prose_with_a_slash_after_version_strings_is_not_redacted(text):
    out, counts = redact(text, ALL_KINDS)
    assert out == text and sum(counts.values()) == 0
    assert PiiRedactor().run(frame(["https://site.example/"], [text])).documents["text"].to_list() == [text]
