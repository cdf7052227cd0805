"""PII redaction with typed placeholders, and the `pii_redacted` stage (safety filter, then redaction).

Each kind of PII is found by a regex and, where a checksum or structure exists, confirmed by it,
then replaced by a fixed placeholder (the datatrove / Dolma convention of a typed marker instead of
a fake value, so a model never learns a fake address as real):

| kind          | placeholder      | found by                                                        |
| ------------- | ---------------- | --------------------------------------------------------------- |
| `email`       | `<EMAIL>`        | local@domain.tld                                                |
| `iban`        | `<IBAN>`         | 2 letters, 2 check digits, 11-30 alphanumerics; ISO 7064 mod 97 |
| `credit_card` | `<CREDIT_CARD>`  | 13-19 digits (spaces or dashes between), card-network prefix, Luhn |
| `us_ssn`      | `<SSN>`          | AAA-GG-SSSS with dashes; SSA-invalid areas/groups/serials skipped |
| `ip` (v6)     | `<IP_ADDRESS>`   | colon-hex groups that `ipaddress` accepts, with a digit, and `::` or 3+ colons; with a `/0`-`/128` network prefix |
| `ip` (v4)     | `<IP_ADDRESS>`   | four dotted octets 0-255 without leading zeros, not inside a longer dotted number, not a section, version or figure number by its context (refinery/stages/pii_context.py) |
| `phone`       | `<PHONE>`        | `+` and 8-15 digits (E.164), or NANP `(AAA) EEE-NNNN` shapes not after a number word ("ISBN", "version", "Abschnitt") |

Kinds run in that order, so an address inside an email is one `<EMAIL>`, and a placeholder is
never matched again. A match ends where ASCII letters, `_` and digits end, whatever script is next
to it: `张伟zhangwei@example.com或者` is `张伟<EMAIL>或者` (and an address with other letters in its
local part loses its ASCII tail: `müller@example.com` is `mü<EMAIL>`). Choices that keep false
positives down:
- Private (10.x, 192.168.x, 172.16-31.x) and loopback IPv4 addresses are redacted like any
  other: they still describe someone's network, and in crawl text they are as often a real host
  as an example. Documentation ranges (RFC 5737 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24;
  RFC 3849 2001:db8::/32) are no one's machine: kept unless `stages.pii.redact_documentation_ips`.
- A dotted quad is an address only in the context of one: a section heading ("4.2.13.1. Guided
  partitioning" at a line's start), a package version ("linux-2.6.32.1", "1.2.3.4-rc1"), or a
  number after a number word in any of 25 languages ("version 2.6.32.1", "Abbildung 1.2.3.4",
  "Рис. 1.2.3.4", "第4.2.1.3节") is kept (refinery/stages/pii_context.py); so are 3- and 5-part
  dotted numbers.
- Phone numbers need a leading `+`, or the NANP shape with a separator before the last four
  digits: years (2019-2020), ISO dates (2023-10-05), times (12:30:45) and bare 10-digit ids are
  kept. An SSN needs its dashes, a card number a network prefix and the Luhn check.
- "Foo::Bar" and "dead::beef" (no digit) are not IPv6 addresses; "fe80::1" and "::1" are, and so
  is the network "::/0" (a bare "::" is not). IPv4 networks keep their prefix: `<IP_ADDRESS>/8`.

Speed: each kind's regex runs only on the documents its prefilter (a looser Rust regex that polars
evaluates over the whole column) says could hold a match.

Counts go to `stats.counters` as `pii/<kind>` (replacements) and `pii_docs/<kind>` (documents with
one or more), and per document to the struct column `pii_counts` ({email, phone, ip, credit_card,
iban, us_ssn}, Int32 each).

Score of the kept text: quality_scored scores the text before redaction. Given the published
model's scorer (`rescore`), the redactor scores again every document whose text it changed and
that quality_scored scored, so `quality_score` in pii_redacted (and everything read from it:
tokenized shards, the curriculum's quality cut) is the model's score of the text kept; the score
before redaction stays in quality_scored's table. Counted as `pii/rescored`. Redaction drops
nothing: a document whose new score falls under the quality threshold is kept.

Order of `pii_redacted`: the safety filter runs first, on the raw text and URL, so a blocked word
or domain is seen before redaction rewrites anything; redaction then runs on the survivors.
Documents with null text pass through with zero counts.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import polars as pl

from refinery.stages.base import Chain, Outcome, RecordStage
from refinery.stages.isolation import guarded, record_alarm
from refinery.stages.pii_context import dotted_number_in_context, is_documentation_address, number_word_before
from refinery.stages.safety import SafetyFilter

PLACEHOLDERS = {
    "email": "<EMAIL>",
    "iban": "<IBAN>",
    "credit_card": "<CREDIT_CARD>",
    "us_ssn": "<SSN>",
    "ip": "<IP_ADDRESS>",
    "phone": "<PHONE>",
}
KINDS = ("email", "phone", "ip", "credit_card", "iban", "us_ssn")  # the pii_counts struct's field order
PII_COUNTS_DTYPE = pl.Struct({k: pl.Int32 for k in KINDS})

# --------------------------------------------------------------------------------------------------
# Validators: each takes the matched text and returns True to redact it
# --------------------------------------------------------------------------------------------------


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


# Visa 4; Mastercard 51-55 and 2221-2720; Amex 34/37; Discover 6011/64/65; JCB 35; Diners 30/36/38.
_CARD_PREFIX = re.compile(r"^(?:4|5[1-5]|2(?:2[2-9]|[3-6]\d|7[01]|720)|3[47]|6(?:011|4[4-9]|5)|35|3[068])")


def _card(text: str) -> bool:
    digits = re.sub(r"[ -]", "", text)
    if not digits.isascii():  # `\d` also matches other scripts' digits, which no card number uses
        return False
    return 13 <= len(digits) <= 19 and bool(_CARD_PREFIX.match(digits)) and luhn_valid(digits)


def iban_valid(text: str) -> bool:
    compact = text.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def _ssn(text: str) -> bool:
    area, group, serial = text.split("-")
    return area not in ("000", "666") and not area.startswith("9") and group != "00" and serial != "0000"


def _ipv6(text: str) -> bool:
    address, network, _ = text.partition("/")
    # A digit keeps code (`dead::beef`) out; `::` alone is an address only as a network (`::/0`).
    if not (any(c.isdigit() for c in address) or (address == "::" and network)):
        return False
    if "::" not in address and address.count(":") < 3:
        return False
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return True


def _ipv4(text: str) -> bool:
    return all(int(octet) <= 255 and (octet == "0" or not octet.startswith("0")) for octet in text.split("."))


def _after_number_word(text: str, start: int, end: int) -> bool:
    return number_word_before(text[max(0, start - 40):start])


def _phone(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    return 8 <= digits <= 15 if text.startswith("+") else digits in (10, 11)


# --------------------------------------------------------------------------------------------------
# Patterns
# --------------------------------------------------------------------------------------------------

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"  # IPv4 inside IPv6 only; bare IPv4 is checked by _ipv4
# What continues a word around PII: ASCII letters, `_` and digits. Letters of other scripts do not,
# since no address, number or email here is written with them: `张伟zhangwei@example.com或者` and
# `メールはtaro.yamada@example.jpまで` hold an email between two CJK words (`\w` would join them).
_WORD = r"A-Za-z_\d"
# Patterns that can open with a character class put their look-behind after that first character,
# so the regex engine scans for the class instead of trying the look-behind at every position
# (3x faster on long documents).


@dataclass(frozen=True)
class PiiPattern:
    kind: str
    regex: re.Pattern
    # A looser pattern in Rust regex syntax (no look-arounds) that matches every text the regex
    # could match; polars runs it over the whole column so the Python regex only sees candidates.
    prefilter: str
    validate: Callable[[str], bool] | None = None
    # Reads the match's context, (text, start, end); True keeps the match (e.g. "version 1.2.3.4").
    keep: Callable[[str, int, int], bool] | None = None


PATTERNS: tuple[PiiPattern, ...] = (
    PiiPattern(
        "email",
        re.compile(
            rf"[A-Za-z0-9](?<![{_WORD}.%+-][A-Za-z0-9])[A-Za-z0-9._%+-]*@"
            rf"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{{2,24}}(?![{_WORD}])"
        ),
        prefilter=r"[A-Za-z0-9]@[A-Za-z0-9]",
    ),
    PiiPattern(
        "iban",
        re.compile(rf"[A-Z](?<![{_WORD}][A-Z])[A-Z]\d{{2}}(?: ?[A-Z0-9]{{4}}){{2,7}}(?: ?[A-Z0-9]{{1,3}})?"
                   rf"(?![{_WORD}])"),
        prefilter=r"[A-Z]{2}\d{2} ?[A-Z0-9]{4}",
        validate=iban_valid,
    ),
    PiiPattern(
        "credit_card",
        re.compile(r"\d(?<![\d-]\d)(?:[ -]?\d){12,18}(?![\d-]?\d)"),
        prefilter=r"\d(?:[ -]?\d){12}",
        validate=_card,
    ),
    PiiPattern(
        "us_ssn",
        re.compile(r"\d(?<![\d-]\d)\d{2}-\d{2}-\d{4}(?![\d-]?\d)"),
        prefilter=r"\d{3}-\d{2}-\d{4}",
        validate=_ssn,
    ),
    PiiPattern(
        "ip",
        re.compile(
            rf"(?=[0-9A-Fa-f:])(?<![{_WORD}:.])(?:[0-9A-Fa-f]{{0,4}}:){{2,7}}"
            rf"(?:{_OCTET}(?:\.{_OCTET}){{3}}|[0-9A-Fa-f]{{1,4}})?"
            # A network's prefix length (0-128) belongs to it: `::1/128` is one address, not `::1` and `/128`.
            rf"(?:/(?:12[0-8]|1[01]\d|[1-9]?\d))?(?![{_WORD}:]|\.\d)"
        ),
        prefilter=r":[0-9A-Fa-f]{0,4}:",
        validate=_ipv6,
    ),
    PiiPattern(
        "ip",
        re.compile(rf"\d(?<![{_WORD}.]\d)\d{{0,2}}(?:\.\d{{1,3}}){{3}}(?!\.?\d|[{_WORD}])"),
        prefilter=r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}",
        validate=_ipv4,
        keep=dotted_number_in_context,
    ),
    PiiPattern(
        "phone",
        re.compile(rf"\+(?<![{_WORD}+]\+)\d{{1,3}}(?:[ .-]?(?:\(\d{{1,4}}\)|\d{{1,5}})){{1,6}}(?![{_WORD}])"),
        prefilter=r"\+\d",
        validate=_phone,
    ),
    PiiPattern(
        "phone",
        re.compile(rf"(?=[\d(])(?<![{_WORD}(+.-])(?:1[ .-]?)?(?:\(\d{{3}}\)[ .-]?|\d{{3}}[ .-]?)\d{{3}}[ .-]\d{{4}}"
                   rf"(?![{_WORD}]|[.-]\d)"),
        prefilter=r"\d{3}[ .-]\d{4}",
        validate=_phone,
        keep=_after_number_word,
    ),
)


def redact_one(pat: PiiPattern, text: str, counts: dict[str, int], documentation_ips: bool = False) -> str:
    """`text` with `pat`'s matches replaced; adds the replacements to `counts[pat.kind]`. Addresses
    in documentation ranges are replaced only when `documentation_ips`."""

    def replace(m: re.Match) -> str:
        found = m.group(0)
        if pat.validate is not None and not pat.validate(found):
            return found
        if pat.keep is not None and pat.keep(m.string, m.start(), m.end()):
            return found
        if pat.kind == "ip" and not documentation_ips and is_documentation_address(found):
            return found
        counts[pat.kind] += 1
        return PLACEHOLDERS[pat.kind]

    return pat.regex.sub(replace, text)


def redact(text: str, kinds: frozenset[str], documentation_ips: bool = False) -> tuple[str, dict[str, int]]:
    """`text` with every enabled kind of PII replaced by its placeholder, and counts by kind."""
    counts = dict.fromkeys(KINDS, 0)
    for pat in PATTERNS:
        if pat.kind in kinds:
            text = redact_one(pat, text, counts, documentation_ips)
    return text, counts


# The published quality model's scorer of a column of texts (`QualityModel.score`).
Rescore = Callable[[pl.Series], np.ndarray]


class PiiRedactor(RecordStage):
    """Redacts the enabled kinds of PII in `text`; drops nothing (a document whose redaction fails
    is rejected `pii/error`, since its text cannot be passed on unredacted). With `rescore`, a
    scored document whose text changed gets the score of its new text as `quality_score`."""

    name = "pii"
    family = "pii"
    optional_reads = ("quality_score",)
    writes = {"text": pl.String(), "pii_counts": PII_COUNTS_DTYPE}

    def __init__(self, kinds: frozenset[str] | None = None, documentation_ips: bool = False,
                 rescore: Rescore | None = None):
        self.kinds = frozenset(KINDS) if kinds is None else kinds
        unknown = self.kinds - set(KINDS)
        if unknown:
            raise ValueError(f"unknown PII kinds {sorted(unknown)}; known: {list(KINDS)}")
        self.patterns = tuple(p for p in PATTERNS if p.kind in self.kinds)
        self.documentation_ips = documentation_ips
        self.rescore = rescore
        if rescore is not None:
            self.writes = {**PiiRedactor.writes, "quality_score": pl.Float64()}

    @classmethod
    def from_config(cls, pii_cfg: Any, rescore: Rescore | None = None) -> "PiiRedactor":
        return cls(frozenset(k for k in KINDS if getattr(pii_cfg, k)), pii_cfg.redact_documentation_ips, rescore)

    def config_summary(self) -> dict[str, Any]:
        return {"kinds": sorted(self.kinds), "placeholders": {k: PLACEHOLDERS[k] for k in sorted(self.kinds)},
                "redact_documentation_ips": self.documentation_ips, "rescored": self.rescore is not None}

    def redact_with(self, text: str | None, patterns: tuple[PiiPattern, ...], counters: Counter) -> dict[str, Any]:
        counts = dict.fromkeys(KINDS, 0)
        for pat in patterns:
            text = redact_one(pat, text, counts, self.documentation_ips)
        for kind, n in counts.items():
            if n:
                counters[f"pii/{kind}"] += n
                counters[f"pii_docs/{kind}"] += 1
        return {"text": text, "pii_counts": counts}

    def process(self, record: dict[str, Any], counters: Counter) -> Outcome:
        outcome = self.redact_with(record["text"], self.patterns if record["text"] is not None else (), counters)
        self.rescore_changed([outcome], [record["quality_score"]], counters)
        return outcome

    def process_batch(self, batch: pl.DataFrame, counters: Counter) -> list[Outcome]:
        # Each pattern's prefilter runs over the whole column, so a document's regexes are only the
        # ones that could match it. Prefilters read the original text, which is safe because a
        # placeholder never creates a match, it only removes one.
        texts = batch["text"]
        candidates: list[list[PiiPattern]] = [[] for _ in range(batch.height)]
        for pat in self.patterns:
            for i in texts.str.contains(pat.prefilter).fill_null(False).arg_true().to_list():
                candidates[i].append(pat)
        with record_alarm(self.record_timeout_s) as armed:
            outcomes = [
                guarded(self.family, self.record_timeout_s, armed, self.redact_with, text, tuple(pats), counters)
                for text, pats in zip(texts.to_list(), candidates)
            ]
        scores = batch["quality_score"].to_list() if "quality_score" in batch.columns else [None] * batch.height
        self.rescore_changed(outcomes, scores, counters)
        return outcomes

    def rescore_changed(self, outcomes: list[Outcome], scores: list[float | None], counters: Counter) -> None:
        """Puts the score of its redacted text into each outcome whose text redaction changed and
        whose document was scored (`scores`, quality_scored's), in one call of the scorer."""
        if self.rescore is None:
            return
        changed = [i for i, (o, score) in enumerate(zip(outcomes, scores))
                   if isinstance(o, dict) and score is not None and any(o["pii_counts"].values())]
        if not changed:
            return
        new = self.rescore(pl.Series([outcomes[i]["text"] for i in changed], dtype=pl.String)).tolist()
        for i, score in zip(changed, new):
            outcomes[i]["quality_score"] = score
        counters["pii/rescored"] += len(changed)


class SafetyThenRedact(Chain):
    """The `pii_redacted` stage: the safety filter on raw text and URL, then PII redaction."""

    def __init__(self, safety: SafetyFilter, redactor: PiiRedactor):
        summary = {"order": ["safety", "pii"], "safety": safety.config_summary(), "pii": redactor.config_summary()}
        super().__init__("pii_redacted", [safety, redactor], summary)

    @classmethod
    def from_config(cls, stages_cfg: Any, rescore: Rescore | None = None) -> "SafetyThenRedact":
        return cls(SafetyFilter.from_config(stages_cfg.safety), PiiRedactor.from_config(stages_cfg.pii, rescore))
