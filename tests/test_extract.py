"""extracted_text: HTML becomes main-content text, text passes, everything else is a counted reject."""

import polars as pl
import pytest
from pydantic import ValidationError

from refinery.stages.extract import Extractor
from refinery.config import ExtractConfig
from refinery.documents import PROVENANCE_COLUMNS, PROVENANCE_SCHEMA, REJECTS_SCHEMA

ARTICLE = "<p>The harbour town wakes slowly when the fishing boats return with the morning tide.</p>"
PAGE = (
    "<html><head><title>Harbour</title><script>var tracking = 1;</script></head><body>"
    "<nav><a href='/'>Home</a> <a href='/about'>About</a></nav>"
    f"<article><h1>Morning</h1>{ARTICLE}<p>Traders set out their stalls along the quay.</p></article>"
    "<footer>Copyright footer links</footer></body></html>"
)


def raw_table(rows):
    n = len(rows)
    return pl.DataFrame(
        {
            "doc_id": [f"web-a/{i:07d}" for i in range(n)],
            "url": [f"https://harbour.example/{i}" for i in range(n)],
            "source": ["web"] * n,
            "bucket": ["web"] * n,
            "file": ["a.warc.gz"] * n,
            "record_index": list(range(n)),
            "record_offset": [i * 100 for i in range(n)],
            "fetch_time": ["2024-03-01T00:00:00Z"] * n,
            "content_type": [ct for ct, _ in rows],
            "raw": [raw for _, raw in rows],
        },
        schema={**PROVENANCE_SCHEMA, "raw": pl.String},
    )


def test_html_is_extracted_to_main_content_and_raw_is_dropped():
    out = Extractor(ExtractConfig()).run(raw_table([("text/html", PAGE)]))
    text = out.documents["text"][0]
    assert "The harbour town wakes slowly" in text
    assert "Traders set out their stalls" in text
    assert "tracking" not in text and "<p>" not in text
    assert "Copyright footer" not in text  # main content only
    assert out.documents.columns == PROVENANCE_COLUMNS + ["text"]


def test_full_text_method_keeps_the_boilerplate():
    out = Extractor(ExtractConfig(method="resiliparse_full")).run(raw_table([("text/html", PAGE)]))
    assert "Copyright footer" in out.documents["text"][0]


# A news page as sites build them: a nav bar of links, a cookie notice in a plain <div>, the article,
# a share bar and a list of related stories, a footer. In German and in Russian, since the boilerplate
# pass must not rest on one language's words.
NEWS_PAGES = {
    "de": {
        "nav": ["Startseite", "Politik", "Wirtschaft", "Kultur", "Sport"],
        "cookie": "Wir verwenden Cookies. Akzeptieren",
        "paragraphs": [
            "Der Stadtrat hat am Dienstagabend beschlossen, die alte Hafenbrücke bis zum Herbst zu sanieren.",
            "Die Kosten von rund vier Millionen Euro tragen Stadt und Land zu gleichen Teilen, hieß es.",
            "Anwohner hatten seit Jahren über Risse im Beton und gesperrte Fußwege geklagt.",
        ],
        "share": ["Teilen", "Drucken"],
        "footer": "© 2024 Hafenblatt · Impressum · Datenschutz",
    },
    "ru": {
        "nav": ["Главная", "Политика", "Экономика", "Культура", "Спорт"],
        "cookie": "Мы используем файлы cookie. Принять",
        "paragraphs": [
            "Городской совет во вторник вечером решил отремонтировать старый портовый мост до осени.",
            "Расходы около четырёх миллионов евро город и область разделят поровну, сообщили в мэрии.",
            "Жители много лет жаловались на трещины в бетоне и закрытые пешеходные дорожки.",
        ],
        "share": ["Поделиться", "Печать"],
        "footer": "© 2024 Портовый листок · Контакты · Конфиденциальность",
    },
}


def news_page(parts: dict) -> str:
    nav = "".join(f"<li><a href='/{i}'>{name}</a></li>" for i, name in enumerate(parts["nav"]))
    body = "".join(f"<p>{p}</p>" for p in parts["paragraphs"])
    share = "".join(f"<a href='#'>{s}</a> " for s in parts["share"])
    return (
        "<html><body>"
        f"<div class='cookie-notice'><span>{parts['cookie']}</span><button>OK</button></div>"
        f"<header><ul class='menu'>{nav}</ul></header>"
        f"<div class='content'><h1>{parts['paragraphs'][0][:30]}</h1><div>12.03.2024</div>{body}"
        f"<div class='share'>{share}</div></div>"
        f"<footer><p>{parts['footer']}</p></footer></body></html>"
    )


@pytest.mark.parametrize("language", sorted(NEWS_PAGES))
def test_article_method_keeps_the_article_and_no_nav_footer_or_cookie_notice(language):
    parts = NEWS_PAGES[language]
    out = Extractor(ExtractConfig()).run(raw_table([("text/html", news_page(parts))]))
    lines = out.documents["text"][0].split("\n")
    assert lines[-3:] == parts["paragraphs"]
    # Nothing else but the headline: no menu item, cookie notice, date, share bar or footer line.
    assert set(lines) <= {*parts["paragraphs"], parts["paragraphs"][0][:30]}
    # resiliparse's own main content, the method before issue 46, keeps some of them.
    old = Extractor(ExtractConfig(method="resiliparse_main")).run(raw_table([("text/html", news_page(parts))]))
    assert not set(old.documents["text"][0].split("\n")) <= {*parts["paragraphs"], parts["paragraphs"][0][:30]}


def test_an_unknown_method_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="method"):
        ExtractConfig(method="readability")


def test_text_passes_through_and_other_types_are_rejected_with_a_reason():
    docs = raw_table(
        [
            ("text/html", PAGE),
            ("text/plain", "Plain text stays exactly as it is.\n"),
            ("text/x-python", "print('code is text')\n"),
            ("application/xhtml+xml", PAGE),
            ("application/json", '{"a": 1}'),
            ("text/css", "body { color: red }"),
            (None, "no content type at all"),
            ("text/html", "<html><body><script>only();</script></body></html>"),
            ("text/plain", "   \n\t "),
            ("text/html", "\x00\x01<<<</ broken <p unclosed <div>Survives broken markup.</p"),
        ]
    )
    out = Extractor(ExtractConfig()).run(docs)
    assert out.documents["doc_id"].to_list() == [f"web-a/{i:07d}" for i in (0, 1, 2, 3, 9)]
    assert out.documents["text"][1] == "Plain text stays exactly as it is.\n"
    assert "Survives broken markup." in out.documents["text"][4]
    assert dict(out.rejects.schema) == REJECTS_SCHEMA
    rejected = {r["doc_id"]: (r["rule"], r["detail"]) for r in out.rejects.iter_rows(named=True)}
    assert rejected == {
        "web-a/0000004": ("extract/unsupported_content_type", "application/json"),
        "web-a/0000005": ("extract/unsupported_content_type", "text/css"),
        "web-a/0000006": ("extract/unsupported_content_type", "missing"),
        "web-a/0000007": ("extract/empty", "< 1 characters of text"),
        "web-a/0000008": ("extract/empty", "< 1 characters of text"),
    }
    assert out.rejects["excerpt"][0] == '{"a": 1}'  # rejects show the raw payload
    s = out.stats
    assert (s.docs_in, s.docs_out) == (10, 5)
    assert s.dropped == {"extract/unsupported_content_type": 3, "extract/empty": 2}
    assert s.bytes_in == sum(len((r or "").encode()) for r in docs["raw"])
    assert s.bytes_out == sum(len(t.encode()) for t in out.documents["text"])
    assert s.by_bucket["web"].docs_out == 5


def test_min_text_chars_rejects_short_extractions():
    out = Extractor(ExtractConfig(min_text_chars=200)).run(raw_table([("text/html", PAGE)]))
    assert out.documents.height == 0
    assert out.rejects["rule"].to_list() == ["extract/empty"]
    assert out.rejects["value"][0] < 200


def test_empty_table():
    out = Extractor(ExtractConfig()).run(raw_table([]))
    assert out.documents.height == 0 and out.documents.columns == PROVENANCE_COLUMNS + ["text"]
    assert out.stats.docs_in == 0


def test_tag_depth_counts_only_elements_that_must_be_closed():
    from refinery.stages.html import tag_depth

    assert tag_depth("<html><body>" + "<DIV>" * 5000 + "x" + "</div>" * 5000 + "</body></html>", 10) == 5000
    # Void elements, optional end tags and self-closed tags are no level; names are whole words.
    flat = "<p>" + "<br><img src=x><input/><li>x<b>x</b><Optgroup><colgroup x>" * 500 + "</p>"
    assert tag_depth(flat + "<div>" * 3 + "<divx>", 10) == 4
    # Stray closing tags never take the depth below zero, so a deep nest after them still counts.
    assert tag_depth("</div>" * 50 + "<span>" * 20, 10) == 20
    # `a<b` in a script has no ">" before the next "<": not a tag.
    assert tag_depth("<script>" + "for(i=0;i<n;i++){}" * 200 + "</script>", 10) == 1
    # A page with no more "<" than the limit is not scanned at all.
    assert tag_depth("<div>" * 10, 10) == 0


def test_pages_fall_back_to_this_process_when_the_worker_cannot_start(monkeypatch):
    import refinery.stages.extract as extract

    def no_worker(fn, budget):
        raise RuntimeError("the isolated worker did not start")

    monkeypatch.setattr(extract, "shared_worker", no_worker)
    out = Extractor(ExtractConfig()).run(raw_table([("text/html", PAGE), ("text/plain", "plain text")]))
    assert "The harbour town wakes slowly" in out.documents["text"][0]
    assert out.documents["text"][1] == "plain text"
    assert out.rejects.height == 0
