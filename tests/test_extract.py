"""extracted_text: HTML becomes main-content text, text passes, everything else is a counted reject."""

import polars as pl

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


def test_main_content_off_keeps_the_boilerplate():
    out = Extractor(ExtractConfig(main_content=False)).run(raw_table([("text/html", PAGE)]))
    assert "Copyright footer" in out.documents["text"][0]


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
