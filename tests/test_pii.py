"""PII redaction: each kind and its placeholder, the false positives it must leave alone, counts,
and the pii_redacted stage (safety first, then redaction)."""

import polars as pl
import pytest

from refinery.stages.pii import KINDS, PiiRedactor, SafetyThenRedact, iban_valid, luhn_valid, redact
from refinery.stages.safety import SafetyFilter

ALL = frozenset(KINDS)


def docs(texts, urls=None) -> pl.DataFrame:
    n = len(texts)
    return pl.DataFrame({
        "doc_id": [f"web-0/{i:07d}" for i in range(n)],
        "url": urls or [f"https://site{i}.example/page" for i in range(n)],
        "source": ["web"] * n,
        "bucket": ["web"] * n,
        "text": pl.Series(texts, dtype=pl.String),
    })


@pytest.mark.parametrize(
    "text,expected,kind,n",
    [
        ("Mail john.doe@example.com or JANE_x+tag@mail.co.uk.", "Mail <EMAIL> or <EMAIL>.", "email", 2),
        ("Hosts 10.0.0.1, 192.168.1.254 and 8.8.8.8.", "Hosts <IP_ADDRESS>, <IP_ADDRESS> and <IP_ADDRESS>.", "ip", 3),
        ("Hosts use 81.2.69.160 and 127.0.0.1", "Hosts use <IP_ADDRESS> and <IP_ADDRESS>", "ip", 2),
        ("v6 2a00:1450::1, fe80::1 and ::1", "v6 <IP_ADDRESS>, <IP_ADDRESS> and <IP_ADDRESS>", "ip", 3),
        ("full 2a00:1450:85a3:0000:0000:8a2e:0370:7334 end", "full <IP_ADDRESS> end", "ip", 1),
        ("mapped ::ffff:81.2.69.160 here", "mapped <IP_ADDRESS> here", "ip", 1),
        ("Card 4111 1111 1111 1111 and 5500-0000-0000-0004", "Card <CREDIT_CARD> and <CREDIT_CARD>", "credit_card", 2),
        ("Amex 378282246310005.", "Amex <CREDIT_CARD>.", "credit_card", 1),
        ("IBAN DE89 3704 0044 0532 0130 00 and GB82WEST12345698765432", "IBAN <IBAN> and <IBAN>", "iban", 2),
        ("SSN 123-45-6789.", "SSN <SSN>.", "us_ssn", 1),
        ("Call (555) 123-4567 or 555.123.4567", "Call <PHONE> or <PHONE>", "phone", 2),
        ("Dial +1 555 123 4567, +44 20 7946 0958 or +33 1 23 45 67 89.",
         "Dial <PHONE>, <PHONE> or <PHONE>.", "phone", 3),
        ("US 1-800-555-0199 toll free", "US <PHONE> toll free", "phone", 1),
    ],
)
def test_each_kind_is_replaced_by_its_placeholder(text, expected, kind, n):
    out, counts = redact(text, ALL)
    assert out == expected
    assert counts == {k: (n if k == kind else 0) for k in KINDS}
    staged = PiiRedactor().run(docs([text]))  # the column path, with its prefilters
    assert staged.documents["text"][0] == expected
    assert staged.documents["pii_counts"][0] == counts


@pytest.mark.parametrize(
    "text",
    [
        "Python 3.11.4 was released; see version 1.2.3.4, release 2.0.0.1 and v10.0.0.1",
        "ISBN 555-123-4567 is a book number, Nr. 202-555-0143 a part number",
        "a five-part number 1.2.3.4.5 and 999.1.1.1 are not addresses",
        "Years 2019-2020, dates 2023-10-05 and 05/10/2023, at 12:30:45, in 1999",
        "Order id 5551234567, ISBN 978-3-16-148410-0, page 12-34",
        "std::vector<int> and dead::beef and a::b are code, not IPv6",
        "card-like 4111-1111-1111-1112 fails Luhn; 1234567890123 has no card prefix",
        "SSN-shaped 000-12-3456, 666-12-3456 and 123-00-4567 are invalid",
        "DE00 1234 5678 9012 3456 78 fails the IBAN checksum",
        "no at sign here, just user at example dot com",
        "ratio 3:2:1 and score 10:4",
        # Passes a Luhn sum taken over code points, but cards use ASCII digits only.
        "mixed digits 4" + "\u0661" * 14 + "\u0666 are no card",
    ],
)
def test_false_positives_are_left_alone(text):
    out, counts = redact(text, ALL)
    assert out == text
    assert sum(counts.values()) == 0
    assert PiiRedactor().run(docs([text])).documents["text"][0] == text


@pytest.mark.parametrize(
    "text",
    [
        # section headings, with or without a closing dot, in any script (the page, verbatim)
        "4.2.13.1. Pemartisian terpandu",
        "Contents\n4.2.13.1 Guided partitioning\n4.2.13.2 Manual partitioning",
        "## 4.2.13.1 Разметка дисков\n* 1.2.3.4) Εγκατάσταση\n  10.1.2.3 التثبيت",
        # versions: after a version word, attached to a package name, with a suffix, a Debian epoch
        "the kernel version 2.6.32.1 boots; Linux 2.6.32.1 too",
        "upgrade linux-2.6.32.1 and gcc_4.8.5.1; 2.6.32.1-rc1, 1.2.3.4+dfsg, 1.2.3.4~b1 and 1:2.6.32.1",
        "Versión 2.6.32.1, Version 2.6.32.1, версии 2.6.32.1, έκδοση 2.6.32.1, sürüm 2.6.32.1",
        # figure, table and section references in many languages, CJK ones touching the number
        "see Figure 1.2.3.4, Abbildung 1.2.3.4, Рис. 1.2.3.4, figura 2.3.4.5 and Tabelle 3.4.5.6",
        "siehe Abschnitt 4.2.1.3, section 4.2.1.3, раздел 4.2.1.3, § 4.2.1.3, No. 4.2.1.3 and #4.2.1.3",
        "见第4.2.1.3节, 図1.2.3.4, 表2.3.4.5, 그림 1.2.3.4, الشكل 1.2.3.4, شکل 1.2.3.4",
        # documentation ranges (RFC 5737, RFC 3849) are kept by default
        "configure 192.0.2.17, 198.51.100.4, 203.0.113.77/24 and 2001:db8::7 as in the example",
    ],
)
def test_section_version_and_figure_numbers_and_documentation_addresses_survive(text):
    out, counts = redact(text, ALL)
    assert out == text, out
    assert counts["ip"] == 0
    assert PiiRedactor().run(docs([text])).documents["text"][0] == text


@pytest.mark.parametrize(
    "text,expected",
    [
        ("The attacker logged in from 81.2.69.160 last night.", "The attacker logged in from <IP_ADDRESS> last night."),
        ("My address is 81.2.69.160. Please do not share it.", "My address is <IP_ADDRESS>. Please do not share it."),
        ("127.0.0.1 localhost\n10.0.0.2 fileserver", "<IP_ADDRESS> localhost\n<IP_ADDRESS> fileserver"),
        ("Der Server 10.20.30.40 antwortet nicht", "Der Server <IP_ADDRESS> antwortet nicht"),
        ("服务器192.168.1.1上 and the section 4.2.1.3 of it", "服务器<IP_ADDRESS>上 and the section 4.2.1.3 of it"),
    ],
)
def test_an_address_in_a_sentence_is_redacted_beside_numbers_that_are_kept(text, expected):
    out, counts = redact(text, ALL)
    assert out == expected
    assert counts["ip"] == expected.count("<IP_ADDRESS>")


def test_documentation_ranges_are_redacted_when_the_config_says_so():
    from refinery.config.stages import PiiConfig

    text = "configure 192.0.2.17, 203.0.113.77/24 and 2001:db8::7, not 81.2.69.160"
    assert redact(text, ALL)[0] == "configure 192.0.2.17, 203.0.113.77/24 and 2001:db8::7, not <IP_ADDRESS>"
    everything = PiiRedactor.from_config(PiiConfig(redact_documentation_ips=True)).run(docs([text]))
    assert everything.documents["text"][0] == "configure <IP_ADDRESS>, <IP_ADDRESS>/24 and <IP_ADDRESS>, not <IP_ADDRESS>"
    assert everything.documents["pii_counts"][0]["ip"] == 4
    assert PiiRedactor.from_config(PiiConfig()).run(docs([text])).documents["pii_counts"][0]["ip"] == 1


def test_email_wins_over_the_address_inside_it_and_placeholders_are_not_rematched():
    out, counts = redact("write to ops@mail.example.org from 10.1.2.3", ALL)
    assert out == "write to <EMAIL> from <IP_ADDRESS>"
    assert counts["email"] == 1 and counts["ip"] == 1


def test_disabled_kinds_are_kept():
    out, counts = redact("a@b.com 10.0.0.1", frozenset({"ip"}))
    assert out == "a@b.com <IP_ADDRESS>"
    assert counts["email"] == 0


def test_checksums():
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert iban_valid("GB82 WEST 1234 5698 7654 32") and not iban_valid("GB82 WEST 1234 5698 7654 33")


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown PII kinds"):
        PiiRedactor(frozenset({"email", "passport"}))


def test_stage_counts_replacements_per_document_and_in_stats():
    out = PiiRedactor().run(docs(["a@b.com and c@d.org", "no pii at all", None, "ip 10.0.0.1, call +1 202 555 0143"]))
    assert out.documents["text"].to_list() == ["<EMAIL> and <EMAIL>", "no pii at all", None,
                                               "ip <IP_ADDRESS>, call <PHONE>"]
    counts = out.documents["pii_counts"].to_list()
    assert counts[0]["email"] == 2 and counts[3] == {**dict.fromkeys(KINDS, 0), "ip": 1, "phone": 1}
    assert counts[1] == counts[2] == dict.fromkeys(KINDS, 0)
    assert out.stats.counters == {"pii/email": 2, "pii/ip": 1, "pii/phone": 1,
                                  "pii_docs/email": 1, "pii_docs/ip": 1, "pii_docs/phone": 1}
    assert out.stats.docs_out == 4 and out.rejects.height == 0
    assert out.stats.bytes_out < out.stats.bytes_in


def test_huge_single_line_document_is_redacted():
    filler = "lorem ipsum dolor sit amet " * 200_000  # 2 x 5.4 MB on one line
    out = PiiRedactor().run(docs([f"{filler} reach me at x@y.com {filler} or 172.16.0.5"]))
    text = out.documents["text"][0]
    assert text.endswith("or <IP_ADDRESS>") and "x@y.com" not in text
    assert out.stats.counters["pii/email"] == 1 and out.stats.counters["pii/ip"] == 1


def test_pii_redacted_runs_safety_first_and_labels_its_rejects():
    stage = SafetyThenRedact(SafetyFilter(["badword"], ["blocked.example"]), PiiRedactor())
    frame = docs(
        ["contact a@b.com", "badword here, mail c@d.com", "fine text 10.0.0.9"],
        urls=["https://ok.example/1", "https://ok.example/2", "http://www.blocked.example/x"],
    )
    out = stage.run(frame)
    assert out.documents["text"].to_list() == ["contact <EMAIL>"]
    assert sorted(out.rejects["rule"].to_list()) == ["safety/blocked_domain", "safety/blocked_words"]
    assert set(out.rejects["stage"]) == {"pii_redacted"}
    # A rejected document's excerpt is the text as it arrived: redaction never ran on it.
    assert "c@d.com" in out.rejects.filter(pl.col("rule") == "safety/blocked_words")["excerpt"][0]
    assert out.stats.stage == "pii_redacted"
    assert (out.stats.docs_in, out.stats.docs_out) == (3, 1)
    assert out.stats.dropped == {"safety/blocked_domain": 1, "safety/blocked_words": 1}
    assert out.stats.counters == {"pii/email": 1, "pii_docs/email": 1}


def test_stage_output_is_identical_on_rerun():
    frame = docs(["a@b.com 10.0.0.1 +44 20 7946 0958", "plain"])
    a, b = PiiRedactor().run(frame), PiiRedactor().run(frame)
    assert a.documents.equals(b.documents)


def test_empty_table_passes_through_with_the_pii_counts_column():
    out = SafetyThenRedact(SafetyFilter(["x"], ["y.example"]), PiiRedactor()).run(docs([]))
    assert out.documents.height == 0 and out.documents.schema["pii_counts"] == pl.Struct({k: pl.Int32 for k in KINDS})
    assert (out.stats.docs_in, out.stats.docs_out, out.rejects.height) == (0, 0, 0)
