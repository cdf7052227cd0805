"""What kind of line a documentation page's line is: prose, code, or an entry of an option list.

Documentation mixes prose with code samples, shell commands, paths and tables of options. Rules
calibrated on web prose misread those lines: language ID scores `ls -la /etc` as a language, and
FineWeb's line-punctuation ratio counts an option's description (`-a, --all` then `do not hide
entries starting with .`) as a line that should end a sentence. Language ID
(refinery/stages/language.py) reads only the prose words of a page, and FineWeb's rule
(refinery/stages/heuristic/fineweb.py) leaves code lines and option entries out of its ratio.
bench/heuristic_docs.py measures both on real documentation and real junk pages;
docs/languages.md names the departures.
"""

from __future__ import annotations

import re

# Sentence-final marks across scripts (from Unicode's Sentence_Terminal property, the common ones),
# which FineWeb's line-punctuation rule counts as a line ending in punctuation.
TERMINAL_PUNCTUATION = frozenset(
    ".!?‼‽⁇⁈⁉⸮։؟؞؝۔܀܁܂।॥၊။።፧፨᙮។៕᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟。．！？｡︒﹒﹖﹗꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫"
)

_FENCES = ("```", "~~~")
# A sentence ends at a terminal mark, closed by quotes or brackets or not, before a space or the
# line's end: a line holding one is prose whatever else it holds.
_SENTENCE_END = re.compile(
    "[" + re.escape("".join(sorted(TERMINAL_PUNCTUATION))) + r"][\"'”’»」』)\]]*(?:\s|$)"
)
# Code inside a line: a call or an index glued to a name, an assignment or comparison, a brace, a
# statement's `;`, or a line opening as a prompt, an import or a definition does.
_CODE = re.compile(
    r"\w\(|\w\[|\s[-+*/|&]?=\s|==|;$|[{}]|^(?:>>>|\$ |import |from \S+ import |def |class |return )"
)
# An option list's term: `-a`, `--all`, `--block-size=SIZE`, `-?`, or a format directive (`%a`).
_OPTION_TERM = re.compile(r"(?:--?[^\W_][\w-]*|-[?#]|%[^\W_]{1,2})(?:[=\[,]|\s|$)")
# Characters that make a token a name, path or option rather than a word of prose; a token with
# more digits than letters is a number. A digit alone does not: a line of Chinese or Japanese is
# one token, `1 度だけ` or `按 Alt` and all.
_NOT_PROSE = frozenset("/\\_=<>$@{}[]()|#*~^%`+&")
# Scripts written without spaces between words (Han, kana, Thai, Lao, Khmer, Burmese, Tibetan): a
# token holding their letters is a phrase or a sentence, prose whatever it quotes (`オン/オフ`).
_UNSPACED = re.compile(
    "[\u0e00-\u0fff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
)
_TOKEN_EDGES = "\"'“”„‘’«»「」『』()[],.;:!?"
# A prose line holds at least this many letters in its words (MIN_LINE_UNSPACED in Han, kana or
# Thai-like script), and its words are at least half of its tokens. With fewer than
# MIN_PROSE_CHARS characters in all a page's prose lines, language ID reads the whole text
# instead (a short sample is scored unreliably).
MIN_LINE_LETTERS = 12
# In a script written without spaces a letter carries about a word: four of them make a line.
MIN_LINE_UNSPACED = 4
MIN_PROSE_CHARS = 100


def holds_sentence_end(line: str) -> bool:
    """Whether a stripped line ends a sentence somewhere: at its end or inside it."""
    return _SENTENCE_END.search(line) is not None


def is_code(line: str) -> bool:
    """Whether a stripped line outside a fence reads as code: it ends no sentence and holds code
    syntax, or opens, closes or continues a block."""
    if line.endswith(("{", "}", ";", "\\")) or line.startswith(("$ ", ">>> ")):
        return True
    return not holds_sentence_end(line) and _CODE.search(line) is not None


def is_option_term(line: str) -> bool:
    """Whether a stripped line opens with an option or a format directive (an option list's term)."""
    return _OPTION_TERM.match(line) is not None


def option_entries(lines: list[str]) -> frozenset[str]:
    """The stripped lines of an option list's entries: every line that opens with an option, and
    the description under a term that stands alone on its line (`-a, --all`, then what it does).
    C4's line rules cut the bare term (too few words) and leave the description, which a man page
    writes without a full stop."""
    entries: set[str] = set()
    term_alone = False
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if is_option_term(line):
            entries.add(line)
            term_alone = len(line.split()) < 3
        elif term_alone:
            entries.add(line)
            term_alone = False
    return frozenset(entries)


def _prose_word(token: str) -> str | None:
    word = token.strip(_TOKEN_EDGES)
    if _UNSPACED.search(word):
        return word
    if not word or word[0] == "-" or any(c in _NOT_PROSE for c in word):
        return None
    letters = sum(map(str.isalpha, word))
    return word if 2 * letters >= len(word) and letters > sum(map(str.isdigit, word)) else None


def prose_text(text: str) -> str:
    """The words of a page's prose lines, one line of them per prose line: no fenced block, no code
    line, and in the other lines no option, path, name or number. Empty when the page holds
    fewer than MIN_PROSE_CHARS characters of prose."""
    out: list[str] = []
    fenced = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(_FENCES):
            fenced = not fenced
            continue
        if fenced or not line or is_code(line):
            continue
        tokens = line.split()
        # Most tokens are letters only, a word as they stand; only the others are inspected.
        words = [t if t.isalpha() else _prose_word(t) for t in tokens]
        words = [w for w in words if w is not None]
        joined = "".join(words)
        if 2 * len(words) >= len(tokens) and (sum(map(str.isalpha, joined)) >= MIN_LINE_LETTERS
                                              or len(_UNSPACED.findall(joined)) >= MIN_LINE_UNSPACED):
            out.append(" ".join(words))
    prose = "\n".join(out)
    return prose if len(prose) >= MIN_PROSE_CHARS else ""
