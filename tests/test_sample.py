"""The bundled sample crawl: reproducible from its seed, and consistent with ground_truth.json."""

import html
import json
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest
from helpers.generated_pages import article_text

from refinery.stages.ingest import read_input_shard
from refinery.config import ExtractConfig, SourceConfig, load_config
from refinery.documents import InputShard, input_shards
from synthetic.documents import BLOCKLISTED_DOMAINS, SPAM_KINDS, jaccard
from synthetic.sample import build_sample
from synthetic.crawl import generate_corpus, write_corpus

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"
DEMO = REPO / "configs" / "demo.yaml"


def sample_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@lru_cache(maxsize=1)
def ground_truth() -> dict:
    return json.loads((SAMPLE / "ground_truth.json").read_text())


@lru_cache(maxsize=1)
def ingested() -> dict[str, object]:
    """Every sample file read through the demo config, keyed by its path under data/sample."""
    cfg = load_config(DEMO)
    out = {}
    for shard in input_shards(cfg):
        rel = str(Path(shard.path).relative_to(SAMPLE))
        out[rel] = read_input_shard(shard, cfg.source(shard.source), cfg.stages.extract)
    return out


def documents_by_url() -> dict[str, dict]:
    docs = {}
    for file, out in ingested().items():
        for row in out.documents.iter_rows(named=True):
            if row["url"] is not None:
                assert row["url"] not in docs, f"URL twice in the sample: {row['url']}"
                docs[row["url"]] = {**row, "sample_file": file}
    return docs


def test_generator_reproduces_the_checked_in_sample(tmp_path):
    build_sample(tmp_path, seed=ground_truth()["seed"])
    assert sample_files(tmp_path) == sample_files(SAMPLE)
    for rel in sample_files(SAMPLE):
        assert (tmp_path / rel).read_bytes() == (SAMPLE / rel).read_bytes(), rel


def test_sample_is_small():
    assert sum((SAMPLE / rel).stat().st_size for rel in sample_files(SAMPLE)) < 8 * 1024 * 1024


def test_demo_config_reads_every_sample_file():
    assert sorted(ingested()) == sorted(ground_truth()["files"])
    assert len([f for f in ingested() if f.startswith("web/")]) >= 2


def test_document_counts_and_positions_match_ground_truth():
    truth = ground_truth()
    for file, info in truth["files"].items():
        assert ingested()[file].documents.height == info["documents"], file
    docs = documents_by_url()
    assert sorted(docs) == sorted(truth["documents"])
    for url, entry in truth["documents"].items():
        assert (docs[url]["sample_file"], docs[url]["record_index"], docs[url]["bucket"]) == (
            entry["file"],
            entry["record_index"],
            entry["bucket"],
        ), url
    for entry in truth["url_less"]:
        rows = ingested()[entry["file"]].documents.filter(record_index=entry["record_index"])
        assert rows.height == 1 and rows["url"][0] is None


def test_every_bad_record_is_rejected_with_its_rule():
    expected = Counter((r["file"], r["record_index"], r["rule"]) for r in ground_truth()["bad_records"])
    got = Counter()
    for file, out in ingested().items():
        for row in out.rejects.iter_rows(named=True):
            got[(file, int(row["doc_id"].rsplit("/", 1)[1]), row["rule"])] += 1
    assert got == expected
    rules = {r["rule"] for r in ground_truth()["bad_records"]}
    assert rules == {
        "ingest/binary_payload",
        "ingest/bad_utf8",
        "ingest/bad_json",
        "ingest/missing_text",
        "ingest/truncated_file",
        "ingest/too_large",
    }
    for r in ground_truth()["bad_records"]:
        if r["rule"] == "ingest/truncated_file":
            assert ingested()[r["file"]].rejects["value"][0] == r["offset"]
    assert ingested()["math/math-90-empty.jsonl"].stats.counters["empty_file"] == 1


def test_labels_point_at_sample_documents():
    truth = ground_truth()
    urls = set(documents_by_url())
    labelled = (
        set(truth["languages"])
        | set(truth["clean"])
        | {s["url"] for s in truth["spam"]}
        | {p["url"] for p in truth["pii"]}
        | {u for group in truth["exact_duplicates"] for u in group}
        | {u for pair in truth["near_duplicates"] for u in (pair["a"], pair["b"])}
    )
    assert labelled <= urls
    assert set(Counter(truth["languages"].values())) >= {"en", "de", "fr", "es", "it", "pt", "ja"}
    assert not set(truth["clean"]) & {s["url"] for s in truth["spam"]}


def test_spam_is_varied_and_partly_on_blocklisted_domains():
    spam = ground_truth()["spam"]
    assert {s["kind"] for s in spam} == set(SPAM_KINDS)
    hosts = [s["url"].split("/")[2] for s in spam]
    for domain in BLOCKLISTED_DOMAINS:
        assert any(h.endswith(domain) for h in hosts)
    assert sum(s["blocklisted_domain"] for s in spam) == sum(h.endswith(BLOCKLISTED_DOMAINS) for h in hosts)
    assert 0 < sum(s["blocklisted_domain"] for s in spam) < len(spam)


def test_pii_strings_are_in_their_documents():
    docs = documents_by_url()
    pii = ground_truth()["pii"]
    assert {p["type"] for p in pii} == {"email", "phone", "ipv4", "ipv6", "credit_card"}
    for p in pii:
        assert p["value"] in html.unescape(docs[p["url"]]["raw"]), p


def test_exact_duplicates_have_identical_text_across_files():
    docs = documents_by_url()
    for group in ground_truth()["exact_duplicates"]:
        assert len({docs[u]["raw"] for u in group}) == 1, group
        assert len({docs[u]["sample_file"] for u in group}) == len(group), group


def test_near_duplicates_have_the_recorded_jaccard():
    docs = documents_by_url()
    pairs = ground_truth()["near_duplicates"]
    for pair in pairs:
        a, b = docs[pair["a"]], docs[pair["b"]]
        texts = [article_text(d["raw"]) if d["bucket"] == "web" else d["raw"] for d in (a, b)]
        assert jaccard(*texts) == pytest.approx(pair["jaccard"], abs=1e-6)
        assert pair["band"][0] <= pair["jaccard"] <= pair["band"][1]
        assert a["sample_file"] != b["sample_file"]
    assert any(p["jaccard"] >= 0.8 for p in pairs) and any(0.5 <= p["jaccard"] <= 0.7 for p in pairs)


def test_benchmark_corpus_is_deterministic_real_prose():
    a = list(generate_corpus(300, seed=7))
    assert a == list(generate_corpus(300, seed=7))
    assert a != list(generate_corpus(300, seed=8))
    sizes = [len(text.encode()) for _, text in a]
    assert 3000 < sum(sizes) / len(sizes) < 4500
    texts = Counter(text for _, text in a)
    assert 1 < sum(n - 1 for n in texts.values()) < 40  # about 5% exact copies
    assert len({url for url, _ in a}) == 300


def test_benchmark_corpus_files_read_back(tmp_path):
    warc = tmp_path / "bench.warc.gz"
    jsonl = tmp_path / "bench.jsonl.gz"
    assert write_corpus(warc, 50, seed=3, fmt="warc") == 50
    assert write_corpus(jsonl, 50, seed=3, fmt="jsonl") == 50
    for path, fmt in ((warc, "warc"), (jsonl, "jsonl")):
        src = SourceConfig(name="bench", path=str(path), format=fmt, bucket="web")
        out = read_input_shard(InputShard("bench-x", "bench", "web", str(path)), src, ExtractConfig())
        assert out.documents.height == 50 and out.rejects.height == 0
        assert out.documents["url"].to_list() == [u for u, _ in generate_corpus(50, seed=3)]
