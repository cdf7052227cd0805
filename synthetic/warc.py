"""HTML pages and WARC records of the sample crawl and the benchmark corpora, written byte for byte
the same from a seed (gzip members carry no timestamp)."""

from __future__ import annotations

import gzip
import hashlib
import html
import random
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from refinery.storage import atomic_path
from synthetic.documents import CRAWL_START, Doc, slug

# --------------------------------------------------------------------------------------------------
# HTML pages and WARC records
# --------------------------------------------------------------------------------------------------

SITES = ("sysadmin-notes.example", "debian-tips.example", "linux-handbook.example", "shell-corner.example")
_NAV = ("Home", "Documentation", "Download", "Community", "About")


def text_rng(doc: Doc) -> random.Random:
    """Choices that depend only on a page's text, so pages with the same text get the same HTML."""
    return random.Random(hashlib.sha256(doc.text.encode()).hexdigest())


def render_page(doc: Doc, links: list[str] = (), charset_in_meta: bool = True, lang: str = "en") -> str:
    """A plausible HTML page: head, navigation, the article, related links and a footer."""
    rng = text_rng(doc)
    site = doc.url.split("/")[2] if doc.url else "localhost"
    esc = html.escape
    head_meta = '<meta charset="utf-8">' if charset_in_meta else ""
    body_paras = "\n".join(f"    <p>{esc(p)}</p>" for p in doc.paragraphs)
    link_list = "\n".join(f'    <li><a href="/go/{slug(a)}">{esc(a)}</a></li>' for a in links)
    related = rng.sample(["Getting started", "FAQ", "Release notes", "Mailing lists", "Bug reports", "Mirrors"], 3)
    return f"""<!DOCTYPE html>
<html lang="{lang}">
<head>
  {head_meta}
  <title>{esc(doc.title)} | {site}</title>
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <link rel="stylesheet" href="/static/site.css">
  <script>window.dataLayer = window.dataLayer || []; function track(e) {{ dataLayer.push(e); }}</script>
</head>
<body>
  <header><nav><ul>{"".join(f'<li><a href="/{n.lower()}">{n}</a></li>' for n in _NAV)}</ul></nav></header>
  <main>
  <article>
    <h1>{esc(doc.title)}</h1>
{body_paras}
  </article>
  <ul class="links">
{link_list}
  </ul>
  </main>
  <aside><h2>Related</h2><ul>{"".join(f'<li><a href="/{slug(r)}">{r}</a></li>' for r in related)}</ul></aside>
  <footer><p>&copy; 2024 {site}. Content licensed under the GNU GPL v2 or later.</p><p><a href="/privacy">Privacy</a> &middot; <a href="/terms">Terms</a></p></footer>
</body>
</html>
"""


def _warc_date(rng: random.Random) -> str:
    return (CRAWL_START + timedelta(seconds=rng.randrange(30 * 86400))).strftime("%Y-%m-%dT%H:%M:%SZ")


def warc_record(rtype: str, url: str | None, block: bytes, rng: random.Random, content_type: str) -> bytes:
    headers = [
        "WARC/1.1",
        f"WARC-Type: {rtype}",
        f"WARC-Record-ID: <urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>",
        f"WARC-Date: {_warc_date(rng)}",
    ]
    if url is not None:
        headers.append(f"WARC-Target-URI: {url}")
    headers += [f"Content-Type: {content_type}", f"Content-Length: {len(block)}"]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + block + b"\r\n\r\n"


def http_response(body: bytes, content_type: str, rng: random.Random) -> bytes:
    date = (CRAWL_START + timedelta(seconds=rng.randrange(30 * 86400))).strftime("%a, %d %b %Y %H:%M:%S GMT")
    server = rng.choice(["nginx/1.22.1", "Apache/2.4.57 (Debian)", "lighttpd/1.4.69"])
    head = (
        f"HTTP/1.1 200 OK\r\nDate: {date}\r\nServer: {server}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def http_request(url: str) -> bytes:
    host = url.split("/")[2]
    path = "/" + "/".join(url.split("/")[3:])
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: refinery-sample-crawler/1.0\r\n"
        "Accept: text/html,application/xhtml+xml\r\nAccept-Encoding: identity\r\n\r\n"
    ).encode()


@dataclass
class WarcEntry:
    """One response to write, with an optional request record before it."""

    url: str
    body: bytes
    content_type: str
    with_request: bool = False


def warc_bytes(entries: list[WarcEntry], rng: random.Random, filename: str) -> tuple[list[bytes], dict[str, int]]:
    """The records of one WARC file (warcinfo first), and each response's record index by URL."""
    # The generator's name when the bundled sample was made; kept so regenerating gives the same bytes.
    info = f"software: refinery.synth\r\nformat: WARC File Format 1.1\r\nisPartOf: refinery-sample\r\nfilename: {filename}\r\n"
    records = [warc_record("warcinfo", None, info.encode(), rng, "application/warc-fields")]
    index: dict[str, int] = {}
    for e in entries:
        if e.with_request:
            records.append(warc_record("request", e.url, http_request(e.url), rng, "application/http; msgtype=request"))
        index[e.url] = len(records)
        records.append(warc_record("response", e.url, http_response(e.body, e.content_type, rng), rng, "application/http; msgtype=response"))
    return records, index


def web_entries(docs: list[Doc], links: dict[str, list[str]], rng: random.Random) -> list[WarcEntry]:
    """Each doc as an HTML page response (a link farm's anchors from `links`), its charset in a
    meta tag or in the Content-Type header, a third of them after a request record."""
    entries = []
    for d in docs:
        meta = text_rng(d).random() < 0.5
        body = render_page(d, links=links.get(d.url, []), charset_in_meta=meta, lang=d.lang or "en").encode()
        charset = rng.choice(["", "; charset=UTF-8"]) if meta else "; charset=utf-8"
        entries.append(WarcEntry(d.url, body, f"text/html{charset}", with_request=rng.random() < 0.3))
    return entries


def gzip_member(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=6, mtime=0)


def write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
