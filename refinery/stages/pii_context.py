"""When a dotted or dashed number that has the shape of PII is not PII: section, version and figure
numbers, package versions, and documentation addresses (used by refinery/stages/pii.py).

Documentation is full of four-part dotted numbers that are valid IPv4 addresses by shape alone:
"4.2.13.1. Pemartisian terpandu" (a section heading), "linux-2.6.32.1", "version 2.6.32.1",
"Рис. 1.2.3.4". A match is kept when its context says it is a number, by structure first, since
structure holds in every language, and by the word before it in the languages the funnel keeps:

- heading: the number opens its line (after any list or heading markup) and is followed by
  `.`/`)` and a space, or by a space and a word that is capitalized or in a script without case
  (`4.2.13.1 Guided partitioning`, `1.2.3.4 مقدمة`); a hosts-file line (`127.0.0.1 localhost`,
  lower-case ASCII after it) stays an address;
- attached: a letter and `-`/`_` right before it (`linux-2.6.32.1`, `gcc_4.8.5.1`), a Debian epoch
  (`1:2.6.32.1`), or a version suffix right after it (`2.6.32.1-rc1`, `1.2.3.4+dfsg`, `1.2.3.4~b1`);
- a reference mark or number word before it: `§`, `#`, `№`, `No.`, `Nr.`, `v`, or a word for
  version, section, chapter, figure, table, step, appendix, page or paragraph (NUMBER_WORDS,
  25 languages; CJK ones may touch the number: `第4.2.1.3节`, `図1.2.3.4`).

A dotted number in running text with none of these is an address: "the attacker came from
81.2.69.160." is redacted.

Documentation ranges (RFC 5737 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24; RFC 3849
2001:db8::/32) are examples that no one's machine holds: `stages.pii.redact_documentation_ips`
says whether they are redacted (default false: kept, they are not personal data).
"""

from __future__ import annotations

import ipaddress
import re

DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))


def is_documentation_address(text: str) -> bool:
    """True for an address (or network, `a/len`) inside a documentation range."""
    address = text.partition("/")[0]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip.version == net.version and ip in net for net in DOCUMENTATION_NETWORKS)


# Words that put a number after them, lower-cased, per language: version / release / build,
# section / paragraph, chapter, figure / picture, table, appendix, part, step, item, page.
NUMBER_WORDS = frozenset("""
isbn issn doi version ver vers release rel build kernel linux revision rev section sect sec chapter chap ch figure fig
table tab appendix part step item page pp paragraph para clause article art listing eq equation
abschnitt kapitel abbildung abb tabelle tab anhang teil schritt seite absatz
chapitre figure tableau annexe partie étape paragraphe
versión sección capítulo figura tabla apéndice anexo parte paso apartado página
versão seção secção capítulo figura tabela apêndice passo
versione sezione capitolo figura tabella appendice paragrafo passo pagina
versie sectie hoofdstuk figuur tabel bijlage paragraaf stap pagina
wersja wersji sekcja sekcji rozdział rozdziale rysunek rys tabela tabeli punkt krok strona
verze sekce kapitola obrázek obr tabulka krok
version avsnitt kapitel figur tabell bilaga steg afsnit
versio osio luku kuva taulukko vaihe
verzió fejezet szakasz ábra táblázat lépés
versiune secțiunea secțiune capitolul capitol figura tabelul pasul
версия версии версію версія раздел разделе розділ глава главе рисунок рис таблица табл пункт п шаг
έκδοση έκδοσης ενότητα κεφάλαιο σχήμα εικόνα πίνακας βήμα
sürüm sürümü bölüm bölümü şekil tablo adım
versi bagian bab gambar tabel langkah seksyen rajah jadual
mục chương hình bảng bước
الإصدار إصدار الاصدار اصدار نسخة النسخة الفصل فصل القسم قسم الشكل شكل الجدول جدول الخطوة
نسخه نسخهٔ بخش فصل شکل جدول مرحله
גרסה גרסת פרק סעיף איור טבלה
संस्करण अनुभाग अध्याय चित्र तालिका खंड
버전 절 장 그림 표 섹션 단계
""".split())
# Scripts without spaces write the word against the number: `第4.2.1.3节`, `図1.2.3.4`, `バージョン1.2.3.4`.
_CJK_BEFORE = re.compile(r"(?:第|版本|版|节|節|章|图|圖|図|表|项|項|条|條|バージョン|セクション|图表)\s*$")
_WORD_BEFORE = re.compile(r"(\w+)\.?\s*$")
_MARK_BEFORE = re.compile(r"(?:[§#№]|\b[Nn][or]\.|\bv)\s*$")
# A letter and a joiner right before (`linux-2.6.32.1`), or a Debian epoch (`1:2.6.32.1`).
_ATTACHED_BEFORE = re.compile(r"(?:[^\W\d_][-_]|(?<![\d:])\d:)$")
_SUFFIX_AFTER = re.compile(r"[-+~][0-9A-Za-z]")
# What may open a heading line before its number: spaces, list bullets, Markdown heading marks.
_LINE_OPENING = re.compile(r"(?:^|\n)(?:[^\S\n]|[*#>•·|\-–—])*$")
# After a heading number: `.` or `)` and a space, or a space and a capitalized word or one of a
# script without case.
_HEADING_AFTER = re.compile(r"[.)][^\S\n]|[^\S\n]+[^\W\d_a-z]")  # `[^\S\n]`: a space, no-break too
_LOOK = 40  # characters either side a context rule reads


def dotted_number_in_context(text: str, start: int, end: int) -> bool:
    """True when the dotted number `text[start:end]` reads as a section, version or figure number
    (see the module docstring) rather than an address."""
    before = text[max(0, start - _LOOK):start]
    after = text[end:end + _LOOK]
    if _LINE_OPENING.search(before) and (_HEADING_AFTER.match(after) is not None):
        return True
    if _ATTACHED_BEFORE.search(before) or _SUFFIX_AFTER.match(after):
        return True
    return number_word_before(before)


def number_word_before(before: str) -> bool:
    """True when `before` (the text right before a number) ends in a reference mark or a word that
    puts a number after it."""
    if _MARK_BEFORE.search(before) or _CJK_BEFORE.search(before):
        return True
    word = _WORD_BEFORE.search(before)
    return word is not None and word.group(1).lower() in NUMBER_WORDS
