"""`heuristic_filtered`: URL blocklist, Gopher quality, Gopher repetition, C4 line rules and FineWeb
quality rules, with the published thresholds as defaults (see the sections of refinery/config/).

One module per rule family: urls.py, gopher_quality.py, gopher_repetition.py, c4.py, fineweb.py,
each a function that records its failures into a `Verdict` (verdict.py). Each document is split
into words, lines and paragraphs once (`refinery.stages.text.DocumentText`) and every family reads
those splits. filter.py composes them into the stage, `HeuristicFilter`. Rules run
cheapest-to-reject first: URL, Gopher quality (which also bounds document length before the
n-gram work), Gopher repetition, C4, FineWeb. A document failing several rules is reported under
the first; explain mode (`HeuristicFilter.explain`, and explain.py for `refinery funnel
--explain`) lists every rule it fails.

Each document is read with the settings of its language (the `language` column of
language_filtered; none reads as English): its word segmenter (refinery/stages/segment.py), its
stop words (refinery/stages/stopwords.py), its thresholds, and the rules switched off for it, for
its source, or stage-wide (`LanguageRules`, resolved once per language by language_rules.py; the
table and the reasons are in docs/languages.md). English keeps the published values. Gopher rules
see the text as extracted; FineWeb rules see the text after C4's line removal, as in the FineWeb
pipeline.

Reasons are `<family>/<rule>` with the measured value in the reject row and the threshold in its
detail: url/blocklisted_domain, url/malformed, url/banned_word, gopher_quality/{min_words, max_words,
min_avg_word_length, max_avg_word_length, hash_ratio, ellipsis_ratio, bullet_lines_ratio,
ellipsis_lines_ratio, alpha_words_ratio, stop_words}, gopher_rep/{dup_para_frac,
dup_para_char_frac, dup_line_frac, dup_line_char_frac, top_<n>_gram, dup_<n>_gram},
c4/{lorem_ipsum, curly_bracket, too_few_sentences}, fineweb/{empty, line_punct_ratio,
short_line_ratio, char_dup_ratio, list_ratio}. Each family's module says where it differs from
datatrove's code.

C4's line rules rewrite the documents the stage keeps instead of dropping them: c4_lines/{too_long_word,
no_terminal_punct, too_few_words, javascript, policy} remove lines, c4_lines/citation cuts citation
marks, c4_lines/whitespace strips lines and rejoins them (c4.py). They are switched off by name as
the document rules are, and with all of them off a kept text is unchanged byte for byte; what they
take out is the stage's `bytes_rewritten`, apart from the bytes of the documents it drops.
"""

from refinery.stages.heuristic.c4 import c4_lines
from refinery.stages.heuristic.filter import STAGE, HeuristicFilter
from refinery.stages.heuristic.fineweb import fineweb_quality
from refinery.stages.heuristic.gopher_quality import gopher_quality
from refinery.stages.heuristic.gopher_repetition import NGrams, duplicate_ngram_chars, gopher_repetition, top_ngram_chars
from refinery.stages.heuristic.language_rules import LanguageRules, resolve_rules
from refinery.stages.heuristic.urls import url_rules
from refinery.stages.heuristic.verdict import Verdict

__all__ = [
    "STAGE", "HeuristicFilter", "LanguageRules", "NGrams", "Verdict", "c4_lines", "duplicate_ngram_chars",
    "fineweb_quality", "gopher_quality", "gopher_repetition", "resolve_rules", "top_ngram_chars", "url_rules",
]
