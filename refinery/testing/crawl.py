"""The seeded generator of the bundled sample crawl and of benchmark corpora.

Everything is built from real, redistributable text in `data/source/` (see data/README.md for its
origin and licences): Debian Reference sections become web pages in seven languages, Python's
documentation becomes the wiki, the Debian Administrator's Handbook the books, mpmath's reference
(with its LaTeX formulas) the math, and CPython's standard library the code. Into that the
generator plants the cases the funnel must handle (exact and near duplicates at a computed Jaccard,
SEO spam, PII, binary records, bad UTF-8, truncated files, an empty file, a 50 MB line, a URL-less
record) and writes `ground_truth.json`, which the tests read.

    python -m refinery.testing.crawl --out data/sample --seed 1234

regenerates the checked-in sample byte for byte: every random choice comes from a
`random.Random` seeded by (seed, purpose), gzip members carry no timestamp, and JSON is written
with sorted keys.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import json
import random
import re
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

from refinery.storage import atomic_path

SOURCE_DIR = Path(__file__).resolve().parents[2] / "data" / "source"
SHINGLE_SIZE = 5
BLOCKLISTED_DOMAINS = ("spam-casino.example", "cheap-pills.example")
HUGE_LINE_BYTES = 50 * 1024 * 1024
CRAWL_START = datetime(2024, 3, 1, tzinfo=timezone.utc)

_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


# --------------------------------------------------------------------------------------------------
# Shared helpers: randomness, shingles, source text
# --------------------------------------------------------------------------------------------------


def rng_for(seed: int, purpose: str) -> random.Random:
    """One independent, reproducible stream per purpose, so adding a planted case does not shift
    every other choice."""
    return random.Random(f"{seed}:{purpose}")


def shingles(text: str, n: int = SHINGLE_SIZE) -> set[tuple[str, ...]]:
    """Word n-gram shingles over lowercased `\\w+` tokens: the definition ground-truth Jaccard uses."""
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def jaccard(a: str, b: str, n: int = SHINGLE_SIZE) -> float:
    sa, sb = shingles(a, n), shingles(b, n)
    return len(sa & sb) / len(sa | sb) if sa or sb else 1.0


def load_source(name: str, source_dir: Path = SOURCE_DIR) -> list[dict]:
    with gzip.open(source_dir / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def slug(title: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return s[:60] or "page"


def english_sentences(source_dir: Path = SOURCE_DIR) -> list[str]:
    """Sentences of the English prose sources, the raw material of benchmark corpora."""
    out = []
    for name in ("web", "books", "wiki"):
        for rec in load_source(name, source_dir):
            if rec["lang"] != "en":
                continue
            for para in rec["paragraphs"]:
                out += [s for s in _SENTENCE_END.split(para) if len(s.split()) >= 5]
    return out


# --------------------------------------------------------------------------------------------------
# Documents and their planted variants
# --------------------------------------------------------------------------------------------------


@dataclass
class Doc:
    url: str | None
    title: str
    paragraphs: list[str]
    bucket: str
    lang: str | None = None
    kind: str = "clean"  # clean | exact_dup | near_dup | spam | pii | ...
    extra: dict = field(default_factory=dict)  # fields written beside text in JSONL

    @property
    def text(self) -> str:
        return "\n\n".join([self.title, *self.paragraphs] if self.title else self.paragraphs)


def mutate_to_jaccard(base: Doc, url: str, lo: float, hi: float, rng: random.Random, vocab: list[str]) -> tuple[Doc, float]:
    """A copy of `base` whose 5-gram Jaccard with it lies in [lo, hi]: replace words at random
    positions, a few at a time, until the Jaccard falls into the band."""
    paragraphs = [p.split(" ") for p in base.paragraphs]
    positions = [(i, j) for i, p in enumerate(paragraphs) for j in range(len(p))]
    rng.shuffle(positions)
    step = max(1, len(positions) // 200)
    current = 1.0
    for k in range(0, len(positions), step):
        for i, j in positions[k : k + step]:
            paragraphs[i][j] = rng.choice(vocab)
        candidate = Doc(url, base.title, [" ".join(p) for p in paragraphs], base.bucket, base.lang, "near_dup")
        current = jaccard(base.text, candidate.text)
        if current <= hi:
            if current < lo:
                raise ValueError(f"overshot the Jaccard band [{lo}, {hi}] for {url}: {current:.3f}")
            return candidate, current
    raise ValueError(f"could not reach Jaccard {hi} for {url} (at {current:.3f})")


def luhn_complete(digits: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return digits + str((10 - total % 10) % 10)


_FIRST = ["maria", "jonas", "aiko", "pedro", "lena", "samir", "olga", "tom", "chen", "fatima", "lucas", "nora"]
_LAST = ["keller", "silva", "tanaka", "novak", "haddad", "berg", "moreau", "okafor", "lindqvist", "rossi"]


def make_pii(rng: random.Random) -> list[tuple[str, str]]:
    """One of each PII type: (type, exact string as it appears in the text)."""
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    email = f"{first}.{last}{rng.randint(1, 99)}@{rng.choice(['example.org', 'example.com', 'mail.example.net'])}"
    phone = rng.choice(
        [
            f"(415) 555-{rng.randint(100, 9999):04d}",
            f"+44 20 7946 {rng.randint(0, 9999):04d}",
            f"+49 30 {rng.randint(100, 999)} {rng.randint(1000, 9999)}",
            f"212-555-{rng.randint(100, 9999):04d}",
        ]
    )
    ipv4 = f"{rng.choice(['192.0.2', '198.51.100', '203.0.113'])}.{rng.randint(1, 254)}"
    ipv6 = f"2001:db8:{rng.randint(1, 0xFFFF):x}::{rng.randint(1, 0xFFFF):x}"
    card = luhn_complete("4" + "".join(str(rng.randint(0, 9)) for _ in range(14)))
    card = " ".join(card[i : i + 4] for i in range(0, 16, 4))
    return [("email", email), ("phone", phone), ("ipv4", ipv4), ("ipv6", ipv6), ("credit_card", card)]


_PII_SENTENCES = [
    "If anything in this section is unclear, write to {email} or call {phone} during office hours.",
    "Our test machine answered at {ipv4} over IPv4, while its IPv6 address {ipv6} timed out.",
    "The donation for the mirror was paid with the card {credit_card}, as the receipt shows.",
]


def plant_pii(doc: Doc, rng: random.Random) -> list[dict]:
    """Insert one sentence per PII pair into `doc`'s paragraphs; return the planted instances."""
    values = dict(make_pii(rng))
    planted = []
    for template in _PII_SENTENCES:
        sentence = template.format(**values)
        i = rng.randrange(len(doc.paragraphs))
        doc.paragraphs[i] = f"{doc.paragraphs[i]} {sentence}"
        for kind in re.findall(r"\{(\w+)\}", template):
            planted.append({"url": doc.url, "type": kind, "value": values[kind]})
    doc.kind = "pii"
    return planted


# --------------------------------------------------------------------------------------------------
# SEO spam
# --------------------------------------------------------------------------------------------------

_SPAM_KEYWORDS = {
    "casino": ["online casino", "casino bonus", "free spins", "best slots", "jackpot casino", "poker bonus"],
    "pills": ["cheap pills", "buy pills online", "discount pharmacy", "no prescription pills", "generic pills"],
    "loans": ["payday loans", "fast cash loans", "instant loan approval", "bad credit loans", "cash advance"],
    "watches": ["replica watches", "cheap luxury watches", "designer watches sale", "swiss replica"],
}
_LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore "
    "magna aliqua ut enim ad minim veniam quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo "
    "consequat duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla pariatur"
).split()
SPAM_KINDS = ("keyword_stuffing", "repeated_lines", "link_farm", "lorem_ipsum", "click_here")
_SPAM_HOSTS = ("best-deals-online.example", "top10-reviews.example", "free-prize-now.example")


def spam_doc(kind: str, k: int, rng: random.Random) -> tuple[Doc, list[str]]:
    """A spam page of the given kind; also the <a> anchors of a link farm."""
    topic = rng.choice(sorted(_SPAM_KEYWORDS))
    words = _SPAM_KEYWORDS[topic]
    domain = BLOCKLISTED_DOMAINS[(k // 2) % 2] if k % 2 == 0 else _SPAM_HOSTS[k % len(_SPAM_HOSTS)]
    host = rng.choice(["www.", "", "go.", "promo."]) + domain
    url = f"https://{host}/{topic}/{slug(rng.choice(words))}-{k}.html"
    title = f"{rng.choice(words).title()} {rng.choice(['2024', 'Best Price', 'Top Offers', 'Official Site'])}"
    links: list[str] = []
    if kind == "keyword_stuffing":
        paragraphs = []
        for _ in range(rng.randint(5, 8)):
            paragraphs.append(" ".join(f"{rng.choice(words)} {rng.choice(words)}" for _ in range(rng.randint(12, 20))) + ".")
    elif kind == "repeated_lines":
        lines = [f"Get the best {rng.choice(words)} deals here today!", f"Limited offer on {rng.choice(words)}, act now!"]
        paragraphs = [rng.choice(lines) for _ in range(rng.randint(25, 40))]
    elif kind == "link_farm":
        paragraphs = [f"Top {rng.choice(words)} links"]
        links = [f"{rng.choice(words)} {rng.choice(['review', 'site', 'deal', 'guide'])} {i}" for i in range(rng.randint(60, 90))]
    elif kind == "lorem_ipsum":
        paragraphs = [" ".join(rng.choice(_LOREM) for _ in range(rng.randint(40, 70))).capitalize() + "." for _ in range(rng.randint(4, 7))]
    else:  # click_here
        offers = ["claim your prize", "download now", "see the offer", "get your bonus", "unlock free access"]
        paragraphs = [f"Click here to {rng.choice(offers)}!" for _ in range(rng.randint(12, 20))]
        paragraphs.insert(rng.randrange(len(paragraphs)), f"Best {rng.choice(words)} click here click here click here.")
    doc = Doc(url, title, paragraphs, "web", lang=None, kind="spam", extra={"spam_kind": kind})
    return doc, links


# --------------------------------------------------------------------------------------------------
# HTML pages and WARC records
# --------------------------------------------------------------------------------------------------

_SITES = ("sysadmin-notes.example", "debian-tips.example", "linux-handbook.example", "shell-corner.example")
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


# --------------------------------------------------------------------------------------------------
# The sample
# --------------------------------------------------------------------------------------------------


class GroundTruth:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.files: dict[str, dict] = {}
        self.documents: dict[str, dict] = {}
        self.exact_duplicates: list[list[str]] = []
        self.near_duplicates: list[dict] = []
        self.spam: list[dict] = []
        self.pii: list[dict] = []
        self.bad_records: list[dict] = []
        self.url_less: list[dict] = []

    def add_doc(self, doc: Doc, file: str, record_index: int) -> None:
        entry = {"file": file, "record_index": record_index, "bucket": doc.bucket, "kind": doc.kind, "lang": doc.lang}
        if doc.kind == "borderline":
            entry["reason"] = doc.extra["reason"]
        if doc.url is None:
            self.url_less.append(entry)
        else:
            if doc.url in self.documents:
                raise ValueError(f"URL planted twice: {doc.url}")
            self.documents[doc.url] = entry

    def to_json(self) -> dict:
        docs = self.documents
        return {
            "seed": self.seed,
            "shingles": {"size": SHINGLE_SIZE, "tokens": "regex \\w+ over the lowercased text (title + paragraphs)"},
            "blocklisted_domains": list(BLOCKLISTED_DOMAINS),
            "files": dict(sorted(self.files.items())),
            "documents": dict(sorted(docs.items())),
            "languages": {u: d["lang"] for u, d in sorted(docs.items()) if d["lang"] is not None},
            "exact_duplicates": self.exact_duplicates,
            "near_duplicates": self.near_duplicates,
            "spam": self.spam,
            "pii": self.pii,
            "bad_records": self.bad_records,
            "url_less": self.url_less,
            "clean": sorted(u for u, d in docs.items() if d["kind"] in ("clean", "pii", "exact_dup", "near_dup") and d["lang"] == "en" and d["bucket"] in ("web", "wiki", "books")),
        }


def _vocab(docs: list[Doc]) -> list[str]:
    return sorted({w for d in docs for p in d.paragraphs for w in p.split(" ") if w.isalpha() and len(w) > 3})


# Real sections that read as step lists or repeat one phrase pattern line after line. The published
# thresholds rightly flag them (Gopher duplicate n-grams, FineWeb's terminal-punctuation ratio), so
# they stay in the sample as realistic borderline pages but are never listed as clean.
BORDERLINE_SECTIONS = {
    "debian-reference-en 2.100 ch01.en.html section 19": "one sentence pattern repeated (atime rules)",
    "debian-reference-en 2.100 ch01.en.html section 23": "one sentence pattern repeated (device numbers)",
    "debian-reference-en 2.100 ch02.en.html section 7": "a step list without terminal punctuation",
    "debian-reference-en 2.100 ch02.en.html section 21": "a keystroke list repeating one command phrase",
}


def variant_url(url: str, tag: str) -> str:
    """Another URL for a copy of the page at `url` (`/a.html` -> `/a-<tag>.html`, else `?v=<tag>`)."""
    return f"{url[:-5]}-{tag}.html" if url.endswith(".html") else f"{url}?v={tag}"


def _web_docs(seed: int, source_dir: Path) -> list[Doc]:
    rng = rng_for(seed, "web-urls")
    docs = []
    for rec in load_source("web", source_dir):
        site = rng.choice(_SITES)
        url = f"https://{site}/{rec['lang']}/{slug(rec['title'])}.html"
        doc = Doc(url, rec["title"], list(rec["paragraphs"]), "web", rec["lang"])
        if rec["origin"] in BORDERLINE_SECTIONS:
            doc.kind = "borderline"
            doc.extra["reason"] = BORDERLINE_SECTIONS[rec["origin"]]
        docs.append(doc)
    return docs


class SampleBuilder:
    """Builds data/sample: one method per bucket, each writing its files and ground truth."""

    def __init__(self, out: Path, seed: int, source_dir: Path = SOURCE_DIR) -> None:
        self.out = out
        self.seed = seed
        self.source_dir = source_dir
        self.truth = GroundTruth(seed)

    def rng(self, purpose: str) -> random.Random:
        return rng_for(self.seed, purpose)

    # ---- shared planting ------------------------------------------------------------------------

    def plant_duplicates(self, docs: list[Doc], bucket: str, exact: int, near: list[tuple[float, float]],
                         languages: tuple[str, ...] = ("en",)) -> list[tuple[Doc, Doc]]:
        """Exact copies (new URL, same text) and near copies at a Jaccard band, from clean docs in
        `languages` (whose words are separated by spaces: a near copy replaces whole words)."""
        rng = self.rng(f"{bucket}-dups")
        pool = [d for d in docs if d.kind == "clean" and d.lang in languages and len(d.paragraphs) >= 3]
        chosen = rng.sample(pool, exact + len(near))
        vocab = _vocab(docs)
        planted = []
        for i, base in enumerate(chosen[:exact]):
            base.kind = "exact_dup"
            copy = Doc(variant_url(base.url, f"mirror{i}"), base.title, list(base.paragraphs), base.bucket, base.lang, "exact_dup", dict(base.extra))
            planted.append((base, copy))
            self.truth.exact_duplicates.append([base.url, copy.url])
        for (lo, hi), base in zip(near, chosen[exact:]):
            base.kind = "near_dup"
            variant, j = mutate_to_jaccard(base, variant_url(base.url, "rev2"), lo, hi, rng, vocab)
            variant.extra = dict(base.extra)
            planted.append((base, variant))
            self.truth.near_duplicates.append({"a": base.url, "b": variant.url, "jaccard": round(j, 6), "band": [lo, hi]})
        return planted

    def plant_pii(self, docs: list[Doc], bucket: str, n: int) -> None:
        rng = self.rng(f"{bucket}-pii")
        pool = [d for d in docs if d.kind == "clean" and d.lang == "en"]
        for doc in rng.sample(pool, n):
            self.truth.pii += plant_pii(doc, rng)

    def split_files(self, docs: list[Doc], copies: list[tuple[Doc, Doc]], n_files: int, purpose: str) -> list[list[Doc]]:
        """Shuffle, deal into files, then put each planted copy in the file after its original's,
        so duplicates always cross files."""
        rng = self.rng(purpose)
        order = list(docs)
        rng.shuffle(order)
        files = [order[i::n_files] for i in range(n_files)]
        for base, copy in copies:
            home = next(i for i, f in enumerate(files) if any(d is base for d in f))
            files[(home + 1) % n_files].append(copy)
        return files

    # ---- web ------------------------------------------------------------------------------------

    def build_web(self) -> None:
        docs = _web_docs(self.seed, self.source_dir)
        rng = self.rng("web")
        en = [d for d in docs if d.lang == "en"]
        # sections kept out of the main files so that no page repeats another's text unplanned
        truncated_docs = en[-7:]
        reserved = {"damaged": en[-8], "latin1": [d for d in docs if d.lang == "de"][-1]}
        main = [d for d in docs if d not in truncated_docs and d not in reserved.values()]
        self.plant_pii(main, "web", 6)
        copies = self.plant_duplicates(main, "web", exact=3, near=[(0.8, 0.9), (0.85, 0.95), (0.5, 0.6), (0.6, 0.7)])
        spam_rng = self.rng("web-spam")
        links: dict[str, list[str]] = {}
        spam = []
        for k in range(30):
            doc, links[doc.url] = spam_doc(SPAM_KINDS[k % len(SPAM_KINDS)], k, spam_rng)
            spam.append(doc)
            host = doc.url.split("/")[2]
            self.truth.spam.append({"url": doc.url, "kind": doc.extra["spam_kind"], "blocklisted_domain": host.endswith(BLOCKLISTED_DOMAINS)})
        files = self.split_files(main + spam, copies, 3, "web-files")
        for i, file_docs in enumerate(files):
            entries = web_entries(file_docs, links, rng)
            odd = self.web_odd_entries(i, reserved, rng)
            entries[len(entries) // 2 : len(entries) // 2] = [e for e, _, _ in odd]
            name = f"web/web-{i:02d}.warc.gz"
            records, index = warc_bytes(entries, rng, name)
            write_bytes(self.out / name, b"".join(gzip_member(r) for r in records))
            kept = 0
            for d in file_docs:
                self.truth.add_doc(d, name, index[d.url])
                kept += 1
            for entry, rule, doc in odd:
                if doc is not None:
                    self.truth.add_doc(doc, name, index[entry.url])
                    kept += 1
                else:
                    self.truth.bad_records.append({"file": name, "record_index": index[entry.url], "url": entry.url, "rule": rule})
            self.truth.files[name] = {"bucket": "web", "records": len(records), "responses": len(entries), "documents": kept}
        self.build_truncated_web(truncated_docs, rng)

    def web_odd_entries(self, file_index: int, reserved: dict[str, Doc], rng: random.Random) -> list[tuple[WarcEntry, str | None, Doc | None]]:
        """Per web file, (entry, expected reject rule, kept doc): binary payloads and bad UTF-8
        (rejected), and a Latin-1 page and a page with two stray bytes (kept)."""
        host = "https://media.sysadmin-notes.example"
        filler = reserved["damaged"]
        out: list[tuple[WarcEntry, str | None, Doc | None]] = []
        if file_index == 0:
            png = b"\x89PNG\r\n\x1a\n" + bytes(rng.getrandbits(8) for _ in range(2048))
            out.append((WarcEntry(f"{host}/img/logo.png", png, "image/png"), "ingest/binary_payload", None))
            blob = bytes(rng.getrandbits(8) for _ in range(4096))
            out.append((WarcEntry(f"{host}/files/blob.bin", blob, "application/octet-stream"), "ingest/binary_payload", None))
        elif file_index == 1:
            nul_page = render_page(filler).encode().replace(b"<p>", b"<p>\x00\x00", 3)
            out.append((WarcEntry(f"{host}/broken/nul-page.html", nul_page, "text/html; charset=utf-8"), "ingest/binary_payload", None))
            garbage = bytearray(render_page(filler).encode())
            for k in range(0, len(garbage), 7):
                garbage[k] = 0xFF
            out.append((WarcEntry(f"{host}/broken/garbled.html", bytes(garbage), "text/html; charset=utf-8"), "ingest/bad_utf8", None))
        else:
            german = reserved["latin1"]
            latin = Doc(variant_url(german.url, "latin1"), german.title, german.paragraphs, "web", "de", "latin1")
            body = render_page(latin, charset_in_meta=False, lang="de").encode("iso-8859-1", errors="xmlcharrefreplace")
            out.append((WarcEntry(latin.url, body, "text/html; charset=iso-8859-1"), None, latin))
            light = Doc(filler.url, filler.title, filler.paragraphs, "web", "en", "utf8_replaced")
            body = render_page(light).encode().replace(b"</h1>", b"\xff\xfe</h1>", 1)
            out.append((WarcEntry(light.url, body, "text/html; charset=utf-8"), None, light))
        return out

    def build_truncated_web(self, docs: list[Doc], rng: random.Random) -> None:
        """A gzip WARC cut inside its last member, and a plain WARC cut inside its last payload."""
        for name, part, compressed in (("web/web-90-truncated.warc.gz", docs[:4], True), ("web/web-91-truncated.warc", docs[4:], False)):
            entries = [WarcEntry(d.url, render_page(d).encode(), "text/html; charset=utf-8") for d in part]
            records, index = warc_bytes(entries, rng, name)
            blobs = [gzip_member(r) for r in records] if compressed else records
            cut = len(blobs[-1]) // 2
            data = b"".join(blobs)[: -cut]
            write_bytes(self.out / name, data)
            for d in part[:-1]:
                self.truth.add_doc(d, name, index[d.url])
            offset = len(b"".join(blobs[:-1]))
            self.truth.bad_records.append({"file": name, "record_index": index[part[-1].url], "url": None, "rule": "ingest/truncated_file", "offset": offset})
            self.truth.files[name] = {"bucket": "web", "records": len(records), "responses": len(entries), "documents": len(part) - 1}

    # ---- JSONL buckets --------------------------------------------------------------------------

    def write_jsonl_file(self, name: str, docs: list[Doc], bad_lines: list[tuple[bytes, str]] = (), compress: bool = True) -> None:
        """One JSONL file: documents in order, with the bad lines spread through it."""
        rng = self.rng(f"lines:{name}")
        lines: list[tuple[bytes, Doc | None, str | None]] = []
        for d in docs:
            row = {"text": d.text, **d.extra}
            if d.url is not None:
                row["url"] = d.url
            lines.append((json.dumps(row, ensure_ascii=False, sort_keys=True).encode() + b"\n", d, None))
        for raw, rule in bad_lines:
            lines.insert(rng.randrange(len(lines) + 1), (raw, None, rule))
        for index, (raw, doc, rule) in enumerate(lines):
            if doc is not None:
                self.truth.add_doc(doc, name, index)
            else:
                self.truth.bad_records.append({"file": name, "record_index": index, "url": None, "rule": rule})
        data = b"".join(raw for raw, _, _ in lines)
        write_bytes(self.out / name, gzip_member(data) if compress else data)
        self.truth.files[name] = {"bucket": docs[0].bucket if docs else None, "records": len(lines), "documents": len(docs)}

    def build_wiki(self) -> None:
        rng = self.rng("wiki")
        docs = [Doc(f"https://wiki.pydocs.example/{slug(r['title'])}", r["title"], list(r["paragraphs"]), "wiki", r["lang"]) for r in load_source("wiki", self.source_dir)]
        self.plant_pii(docs, "wiki", 3)
        copies = self.plant_duplicates(docs, "wiki", exact=1, near=[(0.8, 0.9), (0.5, 0.7)])
        files = self.split_files(docs, copies, 2, "wiki-files")
        bad = [
            [(b'{"url": "https://wiki.pydocs.example/broken", "text": "unterminated\n', "ingest/bad_json"),
             (json.dumps({"url": "https://wiki.pydocs.example/numeric", "text": 12345}).encode() + b"\n", "ingest/missing_text")],
            [(b'{"url": "https://wiki.pydocs.example/latin1", "text": "' + "Gr\u00fc\u00dfe aus K\u00f6ln, ".encode("latin-1") * 20 + b'"}\n', "ingest/bad_utf8"),
             (json.dumps({"url": "https://wiki.pydocs.example/nul", "text": "binary\u0000payload" * 10}).encode() + b"\n", "ingest/binary_payload")],
        ]
        for i, file_docs in enumerate(files):
            rng.shuffle(file_docs)
            self.write_jsonl_file(f"wiki/wiki-{i:02d}.jsonl.gz", file_docs, bad[i])

    def build_books(self) -> None:
        rng = self.rng("books")
        docs = []
        for r in load_source("books", self.source_dir):
            parts = _split_paragraphs(r["paragraphs"], 30_000)
            for k, part in enumerate(parts):
                title = r["title"] if len(parts) == 1 else f"{r['title']} (part {k + 1})"
                docs.append(Doc(f"https://books.handbook.example/{r['lang']}/{slug(r['title'])}-part-{k + 1}", title, part, "books", r["lang"], extra={"title": title}))
        truncated = [d for d in docs if d.lang == "en"][-3:]
        main = [d for d in docs if d not in truncated]
        self.plant_pii(main, "books", 2)
        copies = self.plant_duplicates(main, "books", exact=1, near=[(0.8, 0.9)])
        files = self.split_files(main, copies, 2, "books-files")
        for i, file_docs in enumerate(files):
            rng.shuffle(file_docs)
            self.write_jsonl_file(f"books/books-{i:02d}.jsonl.gz", file_docs)
        self.build_truncated_jsonl("books/books-90-truncated.jsonl.gz", truncated)
        self.build_huge_line("books/books-91-huge.jsonl.gz", main[0])

    def build_truncated_jsonl(self, name: str, docs: list[Doc]) -> None:
        lines = [json.dumps({"text": d.text, "url": d.url, **d.extra}, ensure_ascii=False, sort_keys=True).encode() + b"\n" for d in docs]
        full = gzip_member(b"".join(lines))
        # cut into the compressed stream so that the last line cannot be decompressed whole
        data = full[: len(full) - len(gzip_member(lines[-1])) // 2 - 8]
        write_bytes(self.out / name, data)
        kept = _whole_lines_before_damage(data)
        for index, d in enumerate(docs[:kept]):
            self.truth.add_doc(d, name, index)
        offset = sum(len(line) for line in lines[:kept])
        self.truth.bad_records.append({"file": name, "record_index": kept, "url": None, "rule": "ingest/truncated_file", "offset": offset})
        self.truth.files[name] = {"bucket": docs[0].bucket, "records": len(lines), "documents": kept}

    def build_huge_line(self, name: str, doc: Doc) -> None:
        """One 50 MB single-line document, which ingest must reject without holding it in memory."""
        unit = (doc.text.replace("\n", " ") + " ").encode()
        body = (unit * (HUGE_LINE_BYTES // len(unit) + 1))[:HUGE_LINE_BYTES].decode("utf-8", errors="ignore")
        url = "https://books.handbook.example/en/the-whole-handbook-on-one-line"
        line = json.dumps({"url": url, "text": body}, ensure_ascii=False).encode() + b"\n"
        write_bytes(self.out / name, gzip_member(line))
        self.truth.bad_records.append({"file": name, "record_index": 0, "url": url, "rule": "ingest/too_large", "bytes": len(line)})
        self.truth.files[name] = {"bucket": "books", "records": 1, "documents": 0}

    def build_code(self) -> None:
        rng = self.rng("code")
        repos = ["python/cpython", "example-org/pyutils-vendored", "acme/legacy-stdlib-backports"]
        docs = []
        for r in load_source("code", self.source_dir):
            url = f"https://github.example/{repos[0]}/blob/v3.11.7/{r['path']}"
            docs.append(Doc(url, "", [r["text"]], "code", None, extra={"repo": repos[0], "path": r["path"], "license": "PSF-2.0"}))
        vendored = rng.sample(docs, 2)
        copies = []
        for k, base in enumerate(vendored):
            base.kind = "exact_dup"
            copy = Doc(base.url.replace(repos[0], repos[k + 1]).replace("v3.11.7", "main"), base.title, list(base.paragraphs), "code", None, "exact_dup", {**base.extra, "repo": repos[k + 1]})
            copies.append((base, copy))
            self.truth.exact_duplicates.append([base.url, copy.url])
        url_less = rng.choice([d for d in docs if d.kind == "clean"])
        url_less.url = None
        url_less.kind = "url_less"
        files = self.split_files(docs, copies, 2, "code-files")
        bad = [[(b"[1, 2, 3]\n", "ingest/bad_json")], [(b'{"url": "https://github.example/x/y/blob/main/z.py", "content": "no text field"}\n', "ingest/missing_text")]]
        for i, file_docs in enumerate(files):
            rng.shuffle(file_docs)
            self.write_jsonl_file(f"code/code-{i:02d}.jsonl.gz", file_docs, bad[i])

    def build_math(self) -> None:
        docs = []
        for r in load_source("math", self.source_dir):
            parts = _split_paragraphs(r["paragraphs"], 8_000)
            for k, part in enumerate(parts):
                title = r["title"] if len(parts) == 1 else f"{r['title']} ({k + 1})"
                docs.append(Doc(f"https://math.mpmath-docs.example/{slug(r['title'])}-{k + 1}", title, part, "math", None))
        files = self.split_files(docs, [], 2, "math-files")
        for i, file_docs in enumerate(files):
            self.write_jsonl_file(f"math/math-{i:02d}.jsonl", file_docs, compress=False)
        write_bytes(self.out / "math/math-90-empty.jsonl", b"")
        self.truth.files["math/math-90-empty.jsonl"] = {"bucket": "math", "records": 0, "documents": 0}

    def build(self) -> dict:
        self.build_web()
        self.build_wiki()
        self.build_books()
        self.build_code()
        self.build_math()
        truth = self.truth.to_json()
        write_bytes(self.out / "ground_truth.json", (json.dumps(truth, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode())
        return truth


def _split_paragraphs(paragraphs: list[str], max_chars: int) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    size = 0
    for p in paragraphs:
        if size + len(p) > max_chars and parts[-1]:
            parts.append([])
            size = 0
        parts[-1].append(p)
        size += len(p)
    return parts


def _whole_lines_before_damage(data: bytes) -> int:
    return zlib.decompressobj(wbits=31).decompress(data).count(b"\n")


def build_sample(out: Path, seed: int, source_dir: Path = SOURCE_DIR) -> dict:
    """Write the whole sample crawl under `out`; return the ground truth."""
    return SampleBuilder(out, seed, source_dir).build()


# --------------------------------------------------------------------------------------------------
# Benchmark corpora
# --------------------------------------------------------------------------------------------------


def generate_corpus(
    n_docs: int,
    seed: int,
    words_per_doc: int = 550,
    dup_fraction: float = 0.05,
    near_dup_fraction: float = 0.05,
    near_dup_replace: float = 0.05,
    source_dir: Path = SOURCE_DIR,
) -> Iterator[tuple[str, str]]:
    """`n_docs` (url, text) documents of real English sentences, about `words_per_doc` words
    (550 words is about 3.6 KB, datatrove's measured document size), in paragraphs. A
    `dup_fraction` of them repeat an earlier document exactly under a new URL, and a
    `near_dup_fraction` repeat one with `near_dup_replace` of its sentences swapped."""
    sentences = english_sentences(source_dir)
    rng = rng_for(seed, "corpus")
    recent: list[list[list[str]]] = []  # paragraphs of sentences of the last documents, to copy from
    for i in range(n_docs):
        url = f"https://corpus.example/{seed}/{i:08d}"
        roll = rng.random()
        if recent and roll < dup_fraction:
            paragraphs = rng.choice(recent)
        elif recent and roll < dup_fraction + near_dup_fraction:
            paragraphs = [[rng.choice(sentences) if rng.random() < near_dup_replace else s for s in p] for p in rng.choice(recent)]
        else:
            paragraphs, words = [], 0
            while words < words_per_doc:
                para = [rng.choice(sentences) for _ in range(rng.randint(3, 6))]
                words += sum(len(s.split()) for s in para)
                paragraphs.append(para)
            recent.append(paragraphs)
            if len(recent) > 256:
                recent.pop(rng.randrange(len(recent)))
        yield url, "\n\n".join(" ".join(p) for p in paragraphs)


def write_corpus(path: Path, n_docs: int, seed: int, fmt: str = "jsonl", **kwargs) -> int:
    """Write `generate_corpus` as JSONL ({"url", "text"}; gzip when the name ends in .gz) or as a
    per-record-gzip WARC of HTML pages. Returns the number of documents written."""
    rng = rng_for(seed, "corpus-html")
    n = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        sink = gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6, mtime=0) if fmt == "jsonl" and path.name.endswith(".gz") else f
        if fmt == "warc":
            f.write(gzip_member(warc_record("warcinfo", None, b"software: refinery.synth\r\n", rng, "application/warc-fields")))
        for url, text in generate_corpus(n_docs, seed, **kwargs):
            if fmt == "warc":
                title, *paragraphs = text.split("\n\n")
                body = render_page(Doc(url, title[:80], paragraphs, "web")).encode()
                f.write(gzip_member(warc_record("response", url, http_response(body, "text/html; charset=utf-8", rng), rng, "application/http; msgtype=response")))
            else:
                sink.write(json.dumps({"url": url, "text": text}, ensure_ascii=False).encode() + b"\n")
            n += 1
        if sink is not f:
            sink.close()
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m refinery.testing.crawl", description="Regenerate the sample crawl, or write a benchmark corpus.")
    ap.add_argument("--out", type=Path, required=True, help="the sample folder (data/sample), or a corpus file with --corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--source", type=Path, default=SOURCE_DIR, help="the real source text (data/source)")
    ap.add_argument("--corpus", type=int, metavar="N", help="write a benchmark corpus of N documents instead of the sample")
    ap.add_argument("--format", choices=["jsonl", "warc"], default="jsonl")
    args = ap.parse_args(argv)
    if args.corpus:
        n = write_corpus(args.out, args.corpus, args.seed, args.format, source_dir=args.source)
        print(f"wrote {n} documents to {args.out}")
        return 0
    truth = build_sample(args.out, args.seed, args.source)
    print(f"wrote {len(truth['files'])} files and {len(truth['documents'])} documents to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
