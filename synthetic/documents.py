"""The sample crawl's documents: seeded randomness, shingles and Jaccard similarity, the real source
text of data/source/, and the planted variants (near copies at a computed Jaccard, PII, SEO spam)."""

from __future__ import annotations

import gzip
import json
import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parents[1] / "data" / "source"
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
