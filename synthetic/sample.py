"""The bundled sample crawl (data/sample): web pages in seven languages, the wiki, books, math and
code from the real text of data/source/, with the planted cases the funnel must handle, and its
`ground_truth.json` (`build_sample`; synthetic/crawl.py has the command line)."""

from __future__ import annotations

import gzip
import html
import json
import random
import zlib
from pathlib import Path

from synthetic.documents import (BLOCKLISTED_DOMAINS, HUGE_LINE_BYTES, SHINGLE_SIZE, SOURCE_DIR, SPAM_KINDS, Doc, load_source,
                                 mutate_to_jaccard, plant_pii, rng_for, slug, spam_doc)
from synthetic.warc import SITES, WarcEntry, gzip_member, render_page, warc_bytes, web_entries, write_bytes


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
        site = rng.choice(SITES)
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
