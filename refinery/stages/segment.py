"""Word segmentation for scripts written without spaces, loaded once per process.

- `jieba` (Chinese): jieba's algorithm and dictionary as jieba-rs implements them, through its
  `rjieba` binding (the dictionary is compiled into the wheel, so nothing is downloaded). With HMM
  off it gives the segments of the `jieba` package itself (tests/test_multilingual.py compares them
  on the corpus), loads in about 0.1 s instead of 0.6 s and cuts about ten times faster.
  Punctuation comes out as separate tokens and whitespace tokens are dropped.
- `script_runs` (Japanese, Thai, and other scripts without spaces): no offline segmenter installs
  here as a wheel (PyICU's BreakIterator needs ICU built from source), so words are approximated
  by runs of one character class: Han ideographs, hiragana, katakana (with the prolonged sound
  mark), Thai-like scripts, other letters and digits, and punctuation. For Japanese this splits at most word
  boundaries that change script (kanji stems, kana endings and particles, katakana loanwords);
  runs of Thai letters are phrases, not words, which is why the Thai-script languages switch the
  word-length and stop-word rules off (refinery/config/languages.py, docs/languages.md).
- `whitespace`: `str.split()`, the published rules' unit.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable

Segmenter = Callable[[str], list[str]]

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3005\u3006\u3007"
_HIRAGANA = "\u3040-\u309f"
_KATAKANA = "\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f"
# Thai, Lao, Tibetan, Myanmar and Khmer blocks whole: their vowel signs and tone marks are
# combining marks, which `\w` does not match.
_SOUTHEAST_ASIAN = "\u0e00-\u0fff\u1000-\u109f\u1780-\u17ff"
_SCRIPT_RUN = re.compile(
    rf"[{_HAN}]+|[{_HIRAGANA}]+|[{_KATAKANA}]+|[{_SOUTHEAST_ASIAN}]+"
    rf"|[^\W{_HAN}{_HIRAGANA}{_KATAKANA}{_SOUTHEAST_ASIAN}]+|[^\w\s{_SOUTHEAST_ASIAN}]+"
)


def split_script_runs(text: str) -> list[str]:
    """Runs of one character class (see the module docstring), whitespace dropped."""
    return _SCRIPT_RUN.findall(text)


@lru_cache(maxsize=1)
def _jieba() -> Segmenter:
    try:
        import rjieba
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("Chinese word segmentation needs rjieba: pip install rjieba") from err
    cut = rjieba.cut

    def split_jieba(text: str) -> list[str]:
        # HMM off: new-word discovery guesses on unseen character pairs, and costs a third more.
        return [w for w in cut(text, False) if not w.isspace()]

    return split_jieba


def segmenter(name: str) -> Segmenter:
    """The word splitter a language's settings name (LanguageHeuristics.segmenter)."""
    if name == "whitespace":
        return str.split
    if name == "jieba":
        return _jieba()
    if name == "script_runs":
        return split_script_runs
    raise ValueError(f"unknown segmenter {name!r}; use whitespace, jieba or script_runs")
