"""Line kinds on documentation pages: the prose words language ID reads, the option-list entries and
code lines FineWeb's line-punctuation ratio leaves out, and the published readings kept by name."""

from collections import Counter

from helpers.doc_pages import MANPAGE_RU, TABLE_OF_CONTENTS
from refinery.config import FineWebQualityConfig, HeuristicConfig
from refinery.stages.heuristic import HeuristicFilter, fineweb_quality
from refinery.stages.line_kinds import is_code, option_entries, prose_text

MIXED = """Install the package and start the service:
$ sudo apt-get install nginx
```
server { listen 8080; }
```
print(config.path, os.environ["HOME"])
The configuration lives in /etc/nginx/nginx.conf and the --port option overrides it for one run.
-v, --verbose"""


def test_prose_text_keeps_the_words_of_prose_lines_only():
    # the command, the fenced block and the code line go; in the prose lines the path and the
    # option go; the bare option term holds too few letters to be a prose line
    assert prose_text(MIXED) == "\n".join([
        "Install the package and start the service",
        "The configuration lives in and the option overrides it for one run",
    ])


def test_prose_text_is_empty_under_a_hundred_characters_of_prose():
    short = MIXED.replace(" and the --port option overrides it for one run", ".")
    assert len(prose_text(MIXED)) == 108 and prose_text(short) == ""


def test_code_lines_and_prose_lines():
    assert is_code("start += 16") and is_code("print(filename, hex(crc32))") and is_code("server {")
    assert is_code("$ ls -la") and is_code("x = compute(); y = 2;")
    # a line that ends a sentence is prose, whatever code it quotes
    assert not is_code("Call print(x) to see the value. It returns None.")
    assert not is_code("Copyright (C) 2001 Jane Doe <jane@example.org>")


def test_option_entries_are_the_terms_and_the_descriptions_under_bare_terms():
    entries = option_entries(MANPAGE_RU.split("\n"))
    lines = MANPAGE_RU.split("\n")
    terms = [line for line in lines if line.startswith("-")]
    descriptions = [lines[lines.index(t) + 1] for t in terms if len(t.split()) < 3]
    assert entries == frozenset(terms + descriptions)
    assert len(terms) == 16 and len(descriptions) == 14
    # a term with its description on the same line takes nothing under it
    assert "АВТОР" not in entries and "--help показать эту справку и выйти из программы" in entries


def test_option_list_descriptions_do_not_count_against_line_punctuation():
    published = HeuristicFilter(HeuristicConfig(fineweb=FineWebQualityConfig(line_punct_prose_only=False)))
    drop = published.apply(MANPAGE_RU, None, Counter(), "ru")[1]
    # C4 cuts the 14 bare terms and the headings (too few words); of the 20 lines left 2 end in
    # a full stop, under FineWeb's 0.12
    assert (drop.rule, drop.value) == ("fineweb/line_punct_ratio", 2 / 20)
    text, drop = HeuristicFilter(HeuristicConfig()).apply(MANPAGE_RU, None, Counter(), "ru")
    assert drop is None and "печатать указанное число копий каждого файла в очереди" in text


def test_a_table_of_contents_still_fails_line_punctuation():
    for prose_only in (True, False):
        cfg = FineWebQualityConfig(line_punct_prose_only=prose_only)
        drop = fineweb_quality(TABLE_OF_CONTENTS, cfg)
        assert (drop.rule, drop.value) == ("fineweb/line_punct_ratio", 0.0)


def test_code_lines_do_not_count_against_line_punctuation():
    prose = ["The loop below adds the values up.", "Each value is read once.", "The total is printed at the end."]
    code = [f"total += values[{i}]" for i in range(8)]
    text = "\n".join(prose[:2] + code + prose[2:])
    cfg = FineWebQualityConfig(line_punct_thr=0.3, short_line_thr=1.0)
    assert fineweb_quality(text, cfg) is None  # 3 of the 3 prose lines end a sentence
    drop = fineweb_quality(text, cfg.model_copy(update={"line_punct_prose_only": False}))
    assert (drop.rule, drop.value) == ("fineweb/line_punct_ratio", 3 / 11)
