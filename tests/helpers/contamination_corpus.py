"""A crafted data root for the contamination scan: clean tables of a few input files, final-shard
entry tables, and phase manifests that draw overlapping documents (one phase a selection of
another), with eval text planted in some documents; and the one-process scan of a phase that the
tasks and their reduction must reproduce."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from helpers.configs import write_config
from refinery import contamination as cont
from refinery import contamination_tasks as ctasks
from refinery.config import load_config
from refinery.curriculum import BucketSlice, PhaseManifest, read_manifest, selection_npy, write_manifest
from refinery.curriculum.inventory import ShardRef
from refinery.documents import CLEAN_STAGE
from refinery.layout import documents_key, selection_key
from refinery.storage import LocalDataRoot

EVAL_ITEMS = [
    {"id": "q1", "text": "Natalia sold clips to forty eight of her friends in April and then she sold half as many "
                         "clips in May how many clips did Natalia sell altogether in April and May"},
    {"id": "q2", "text": "A lighthouse keeper winds the lamp clock every four hours and logs each passing ship so "
                         "how many entries does she write if eleven ships pass between two windings"},
]
# input file -> its bucket; each holds DOCS_PER_FILE documents
FILES = {"web-0": "web", "web-1": "web", "math-0": "math"}
DOCS_PER_FILE = 30
WORDS = ("river delta birds spring migration volunteers count every year estimate populations change over "
         "decades forest canopy rain soil roots valley stone bridge market harbour lantern orchard").split()


def clean_text(file_index: int, doc: int) -> str:
    """Forty words, a different rotation per document: no 13-gram of an eval item."""
    start = (7 * doc + 3 * file_index) % len(WORDS)
    return " ".join(WORDS[(start + k) % len(WORDS)] for k in range(40))


def planted() -> dict[str, str]:
    """doc_id -> the eval item planted in it (upper-cased in one, cut to 13 words in another)."""
    return {"web-0/0000003": "q1", "web-1/0000010": "q2", "math-0/0000000": "q1", "math-0/0000021": "q2"}


def document_text(partition: str, doc: int) -> str:
    doc_id = f"{partition}/{doc:07d}"
    text = clean_text(list(FILES).index(partition), doc)
    item = planted().get(doc_id)
    if item is None:
        return text
    leak = next(i["text"] for i in EVAL_ITEMS if i["id"] == item)
    if doc_id.startswith("math-0/0000021"):
        leak = " ".join(leak.split()[4:17])  # exactly one 13-gram
    return f"{text} {leak.upper() if doc % 2 else leak}."


def write_clean_table(root: LocalDataRoot, partition: str) -> None:
    docs = [(f"{partition}/{d:07d}", None if d % 4 == 0 else f"https://{partition}.example/{d}",
             document_text(partition, d)) for d in range(DOCS_PER_FILE)]
    # The rows in shuffled order: a task sorts by doc_id, whatever order the funnel wrote.
    docs = docs[1::2] + docs[0::2]
    root.write_parquet(documents_key(CLEAN_STAGE, partition),
                       pl.DataFrame(docs, schema={"doc_id": pl.String, "url": pl.String, "text": pl.String}, orient="row"))


def write_shards(root: LocalDataRoot, bucket: str, doc_ids: list[str], per_shard: int = 16) -> list[ShardRef]:
    refs = []
    for number, start in enumerate(range(0, len(doc_ids), per_shard)):
        prefix = f"shards/final/{bucket}/shard-{number:05d}"
        chunk = doc_ids[start:start + per_shard]
        digest = root.write_parquet(prefix + ".entries.parquet", pl.DataFrame({"doc_id": chunk}))
        refs.append(ShardRef(prefix=prefix, tokens=100 * len(chunk), entries=len(chunk), sha256={".entries.parquet": digest}))
    return refs


def write_phase(root: LocalDataRoot, phase: str, index: int, shards: dict[str, list[ShardRef]],
                keep: dict[str, list[int]] | None = None) -> None:
    """A manifest of `phase` over the buckets' shards; `keep`: the global entry ids a bucket keeps."""
    buckets = {}
    for bucket, refs in shards.items():
        entries = sum(r.entries for r in refs)
        sl = BucketSlice(bucket=bucket, shards=refs, tokens=100 * entries, entries=entries)
        if keep and bucket in keep:
            key = selection_key(phase, bucket)
            digest = root.write_bytes(key, selection_npy(np.array(keep[bucket], dtype=np.int64)))
            sl = BucketSlice(bucket=bucket, shards=refs, tokens=100 * len(keep[bucket]), entries=len(keep[bucket]),
                             selection=key, selection_sha256=digest)
        buckets[bucket] = sl
    write_manifest(root, PhaseManifest(phase=phase, index=index, token_budget=1000, seq_len=64, lr_scale=1.0,
                                       weights={b: 1 / len(shards) for b in shards}, interpolation=0.0, buckets=buckets))


def write_corpus(tmp: Path, workers: int = 1) -> Path:
    """The crafted root under `tmp/root` and its config (eval set `tmp/eval.jsonl`); returns the
    config's path. Phases: `main` draws every document, `anneal` every third entry of each bucket
    (the web leaks among them, the math leaks not)."""
    tmp.mkdir(parents=True, exist_ok=True)
    eval_path = tmp / "eval.jsonl"
    eval_path.write_text("".join(json.dumps(i) + "\n" for i in EVAL_ITEMS))
    config = write_config(tmp, {
        "data_root": str(tmp / "root"), "buckets": ["web", "math"],
        "sources": [{"name": "web", "path": str(tmp / "in" / "*.jsonl"), "format": "jsonl", "bucket": "web"}],
        "partitions": {"workers": workers},
        "contamination": {"eval_sets": [{"name": "evals", "path": str(eval_path)}], "ngram": 13,
                          "max_contaminated_docs": 0},
    })
    root = LocalDataRoot(str(tmp / "root"))
    by_bucket: dict[str, list[str]] = {}
    for partition, bucket in FILES.items():
        write_clean_table(root, partition)
        by_bucket.setdefault(bucket, []).extend(f"{partition}/{d:07d}" for d in range(DOCS_PER_FILE))
    # Shards interleave the files, as the shuffle does.
    shards = {b: write_shards(root, b, sorted(ids, key=lambda d: (d[-2:], d))) for b, ids in by_bucket.items()}
    write_phase(root, "main", 0, shards)
    write_phase(root, "anneal", 1, shards, keep={"web": list(range(0, len(by_bucket["web"]), 3)),
                                                 "math": list(range(1, len(by_bucket["math"]), 3))})
    return config


def one_process_scan(config: Path, phase: str) -> cont.ScanReport:
    """The scan as it ran before tasks: every document of the phase read and scanned in one stream,
    bucket by bucket and table by table, then the hits sorted by doc_id."""
    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    index = cont.EvalIndex.build(cfg)
    manifest = read_manifest(root, phase)
    wanted = ctasks.phase_doc_ids(root, manifest)

    def documents():
        for bucket in sorted(wanted):
            for partition in sorted({d.rsplit("/", 1)[0] for d in wanted[bucket]}):
                table = root.read_parquet(documents_key(CLEAN_STAGE, partition), columns=["doc_id", "url", "text"])
                rows = table.filter(pl.col("doc_id").is_in(sorted(wanted[bucket]))).sort("doc_id")
                for doc_id, url, text in rows.iter_rows():
                    yield doc_id, url, bucket, text

    return cont.scan(phase, cfg.contamination, index, documents(), ctasks.current_fingerprint(root, phase, index))
