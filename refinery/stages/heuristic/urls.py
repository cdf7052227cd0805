"""The URL family: blocklisted domains, then banned words in the URL (`url/blocklisted_domain`,
`url/malformed`, `url/banned_word`). It needs no text, so it runs first."""

from __future__ import annotations

import re

from refinery.stages.stats import Drop
from refinery.stages.urls import blocked_suffix, url_host

_URL_WORD = re.compile(r"[a-z0-9]+")


def url_rules(url: str | None, domains: frozenset[str], whole_words: frozenset[str] = frozenset(), *,
              substrings: frozenset[str] = frozenset()) -> Drop | None:
    """Blocklisted domains (and their subdomains), then banned words: `substrings` anywhere in the
    lower-cased URL (`casino` in `bestcasinoguide.example`), `whole_words` only as a whole run of
    letters and digits (`casino` in `/casino-guide`, not in `/casinoguide`). Every set is lower-case.
    A document without a URL has nothing to match; one whose host cannot be parsed
    (`http://[bad/x`) is `url/malformed` when there is a blocklist to check it against."""
    if not url:
        return None
    if domains:
        try:
            host = url_host(url)
        except ValueError as err:
            # Without its host the URL cannot be checked against the blocklist, so it is not let
            # through unchecked.
            return Drop("url/malformed", None, f"{err}: {url[:200]}")
        suffix = blocked_suffix(host, domains)
        if suffix is not None:
            return Drop("url/blocklisted_domain", None, suffix)
    if whole_words or substrings:
        lowered = url.lower()
        hit = set(whole_words.intersection(_URL_WORD.findall(lowered))) if whole_words else set()
        hit.update(w for w in substrings if w and w in lowered)  # an empty entry is no word
        if hit:
            return Drop("url/banned_word", float(len(hit)), min(hit))
    return None
