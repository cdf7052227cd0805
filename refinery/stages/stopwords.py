"""Stop-word lists per language for Gopher's stop-word rule.

English keeps the paper's eight words (Rae et al. 2021, A.1). Every other language takes its list
from stopwords-iso (the `stopwordsiso` package, which ships the lists as JSON, so nothing is
downloaded), keyed by the ISO 639-1 code lid.176 reports. A language stopwords-iso does not cover
gets no list, and the caller switches the rule off for it.
"""

from __future__ import annotations

from functools import lru_cache

GOPHER_STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})


@lru_cache(maxsize=None)
def iso_stop_words(language: str) -> frozenset[str] | None:
    """stopwords-iso's list for `language`, or None when it has none."""
    try:
        import stopwordsiso
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("per-language stop words need stopwordsiso: pip install stopwordsiso") from err
    if not stopwordsiso.has_lang(language):
        return None
    return frozenset(stopwordsiso.stopwords(language))


def stop_words(language: str, source: str) -> frozenset[str] | None:
    """The list `source` (LanguageHeuristics.stop_words) gives for `language`; None: no rule."""
    if source == "gopher":
        return GOPHER_STOP_WORDS
    if source == "none":
        return None
    return iso_stop_words(language)
