"""The safety filter: configurable blocked words and blocked domains.

- `safety/blocked_domain`: the URL's host is a blocked domain or a subdomain of one
  (`ads.example.com` matches `example.com`; `notexample.com` does not). The host is read as a
  browser reads it (refinery/stages/urls.py: scheme-less URLs, user-info, ports, IP forms, IDN
  names in punycode or Unicode). Value: none; detail: host.
- `safety/blocked_words`: whole-word, case-insensitive hits of the blocked words (or phrases) in
  the text; the document is dropped when hits exceed `max_blocked_word_hits` (default 0: any hit
  drops). Value: the number of hits; detail: the words that hit, most frequent first.

It runs before PII redaction inside `pii_redacted` (see refinery/stages/pii.py), so it sees the URL
and the text as they were fetched.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from refinery.stages import urls
from refinery.stages.base import Filter
from refinery.stages.stats import Drop


def url_host(url: str | None) -> str | None:
    """The URL's host, or None when it has none or cannot be parsed (then no domain can match)."""
    if not url:
        return None
    try:
        return urls.url_host(url) or None
    except ValueError:
        return None


def blocked_words_regex(words: list[str]) -> re.Pattern | None:
    """One case-insensitive alternation; longest words first so a phrase wins over its prefix."""
    cleaned = sorted({w.strip().lower() for w in words if w.strip()}, key=lambda w: (-len(w), w))
    if not cleaned:
        return None
    body = "|".join(r"\s+".join(map(re.escape, w.split())) for w in cleaned)
    return re.compile(rf"(?<!\w)(?:{body})(?!\w)", re.IGNORECASE)


class SafetyFilter(Filter):
    name = "safety"
    family = "safety"

    def __init__(self, blocked_words: list[str], blocked_domains: list[str], max_blocked_word_hits: int = 0):
        self.blocked_words = sorted({w.strip().lower() for w in blocked_words if w.strip()})
        self.words_regex = blocked_words_regex(blocked_words)
        self.blocked_domains = frozenset(d.strip().lower().lstrip(".").rstrip(".") for d in blocked_domains if d.strip())
        self.max_blocked_word_hits = max_blocked_word_hits

    @classmethod
    def from_config(cls, safety_cfg: Any) -> "SafetyFilter":
        return cls(safety_cfg.blocked_words, safety_cfg.blocked_domains, safety_cfg.max_blocked_word_hits)

    def config_summary(self) -> dict[str, Any]:
        return {
            "blocked_words": len(self.blocked_words),
            "blocked_domains": sorted(self.blocked_domains),
            "max_blocked_word_hits": self.max_blocked_word_hits,
        }

    def check(self, row: dict[str, Any]) -> Drop | None:
        if self.blocked_domains:
            host = url_host(row.get("url"))
            domain = urls.blocked_suffix(host, self.blocked_domains)
            if domain is not None:
                return Drop("safety/blocked_domain", None, f"{host} (blocked: {domain})")
        text = row.get("text")
        if self.words_regex is not None and text:
            hits = Counter(m.group(0).lower() for m in self.words_regex.finditer(text))
            total = sum(hits.values())
            if total > self.max_blocked_word_hits:
                detail = ", ".join(f"{w}x{n}" for w, n in hits.most_common(5))
                return Drop("safety/blocked_words", float(total), detail)
        return None
