"""A small multilingual corpus (English, German, Japanese) whose pages heuristic_filtered keeps but
rewrites: navigation crumbs, a JavaScript notice, indentation, a citation mark and `\\r\\n` breaks
around prose every rule passes, plus two pages it drops. Each page says the text C4's line rules
leave and the pieces they cut, so the bytes rewritten are known without running the rules."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from helpers.texts import PROSE
from refinery.documents import PROVENANCE_SCHEMA

EN_BODY = PROSE.replace(". ", ".\n").split("\n")
DE_BODY = [
    "Der Befehl kopiert die Dateien aus dem aktuellen Verzeichnis in das Zielverzeichnis und behält ihre Rechte.",
    "Wenn die Datei schon vorhanden ist, wird sie ohne eine Rückfrage überschrieben, und das ist gewollt.",
    "Deshalb sollten Sie zuerst den Inhalt des Verzeichnisses prüfen, bevor Sie den Befehl ausführen.",
    "Mit der folgenden Option wird der Name jeder Datei angezeigt, sobald sie kopiert worden ist.",
    "Am Ende zeigt das Programm die Zahl der kopierten Dateien und die Zeit, die es dafür gebraucht hat.",
    "Systemverwalter schreiben diese Schritte oft in ein Skript, damit sie später wieder genutzt werden.",
]
JA_BODY = [
    "このコマンドは現在のディレクトリにあるファイルを目的のディレクトリにコピーし、それらの権限を保持します。",
    "ファイルがすでに存在する場合は、確認なしに上書きされるので、最初に内容を確認することをお勧めします。",
    "下のオプションを使うと、コピーされるファイルの名前が一つずつ表示されます。",
    "最後にファイルの総数とコピーにかかった時間が表示されます。",
    "システム管理者はこれらの手順をスクリプトに書いておき、あとで何度も使います。",
    "初めて使う前に、この説明をよく読んでください。",
]
JS_NOTICE = "Please enable JavaScript to view the comments on this page."


@dataclass(frozen=True)
class Page:
    url: str
    language: str
    text: str
    kept: str | None  # the text C4's line rules leave; None: the stage drops the page
    cut: tuple[str, ...] = ()  # every piece of `text` the line rules take out

    @property
    def cut_bytes(self) -> int:
        return sum(len(piece.encode()) for piece in self.cut)


EN = Page(
    "https://harbour.example/town", "en",
    "\n".join(["Home", "  " + EN_BODY[0] + "[1]", "Menu Login", *EN_BODY[1:3], JS_NOTICE, *EN_BODY[3:]]) + "\n",
    "\n".join(EN_BODY),
    # too_few_words: two crumbs; whitespace: the indent and the last line break; citation; javascript
    ("Home\n", "Menu Login\n", "  ", "\n", "[1]", JS_NOTICE + "\n"),
)
DE = Page(
    "https://handbuch.example/cp", "de",
    "\r\n".join(["Startseite", *DE_BODY[:3], "\tImpressum Kontakt", *DE_BODY[3:]]) + "  \r\n",
    "\n".join(DE_BODY),
    # too_few_words: two crumbs; whitespace: the \r of five line breaks and the trailing spaces and break
    ("Startseite\r\n", "\tImpressum Kontakt\r\n", "\r" * 5, "  \r\n"),
)
JA = Page(
    "https://tebiki.example/cp", "ja",
    "\n".join(["ホーム", *JA_BODY[:2], "メニュー ログイン", *JA_BODY[2:]]),
    "\n".join(JA_BODY),
    ("ホーム\n", "メニュー ログイン\n"),  # too_few_words: fewer than three script runs each
)
LOREM = Page("https://harbour.example/draft", "en",
             "\n".join(EN_BODY) + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.", None)
SHORT_JA = Page("https://tebiki.example/top", "ja", "ホームページへようこそ。", None)
PAGES = (EN, DE, JA, LOREM, SHORT_JA)
KEPT = tuple(p for p in PAGES if p.kept is not None)
DROPPED = tuple(p for p in PAGES if p.kept is None)


def pages_frame(pages: tuple[Page, ...] = PAGES) -> pl.DataFrame:
    """language_filtered rows of `pages` (source docs, bucket web)."""
    n = len(pages)
    return pl.DataFrame(
        {
            "doc_id": [f"docs-0/{i:07d}" for i in range(n)],
            "url": [p.url for p in pages],
            "source": ["docs"] * n,
            "bucket": ["web"] * n,
            "file": ["pages.jsonl"] * n,
            "record_index": list(range(n)),
            "record_offset": list(range(n)),
            "fetch_time": [None] * n,
            "content_type": ["text/plain"] * n,
            "text": [p.text for p in pages],
            "language": [p.language for p in pages],
        },
        schema_overrides={**PROVENANCE_SCHEMA, "text": pl.String, "language": pl.String},
    )
