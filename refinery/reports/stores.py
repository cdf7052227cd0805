"""What the data root keeps, store by store, over the compressed input it was made from: the budget
`refinery funnel` prints, and each store's growth law, by which docs/scale-out.md extrapolates it.

A store is a folder of the data root's layout (refinery/layout.py): a stage's documents or attributes,
`dedup/signatures`, `shards/final`, `lineage/final`, ... (the first two levels of a key under
documents/, dedup/, shards/ and lineage/, the top folder elsewhere). The input
is every file the config's sources name, as stored (gzip included). A training run's checkpoints
(`<run_dir>/**/checkpoints/`) are counted apart: their size is the model's, not the corpus's.
"""

from __future__ import annotations

import os
from typing import Any

from refinery.config import RefineryConfig
from refinery.documents import input_shards
from refinery.layout import CHECKPOINTS_DIR
from refinery.storage import DataRoot

# Folders whose stores are one level deeper (a stage, a kind of file): those where the bytes are.
NESTED = ("documents", "dedup", "shards", "lineage")

# How each store grows with the corpus: what it holds per input byte (text or tokens), per document
# (a row of small columns), per entry of the final shards, per input file, or a fixed size. Read by
# the table below and by docs/scale-out.md's extrapolation to 15B documents.
GROWTH = {
    "documents/raw_documents": "per document",
    "documents/extracted_text": "per input byte",
    "documents/pii_redacted": "per input byte",
    "attributes": "per document",
    "rejects": "per document",
    "stats": "per input file",
    "dedup/signatures": "per document",
    "dedup/sketches": "per document",
    "dedup/exact": "per document",
    "dedup/near": "per document",
    "shards/tokenized": "per input byte",
    "shards/final": "per input byte",
    "lineage/documents": "per document",
    "lineage/final": "per entry",
    "manifests": "per entry",
    "contamination": "per document",
}
FIXED = "fixed"


def store_of(key: str) -> str:
    parts = key.split("/")
    return "/".join(parts[:2]) if parts[0] in NESTED and len(parts) > 2 else parts[0]


def growth_of(store: str) -> str:
    return GROWTH.get(store) or GROWTH.get(store.split("/")[0]) or FIXED


def input_bytes(cfg: RefineryConfig) -> int:
    """The config's input files as stored (a Hugging Face dataset folder: its files)."""
    total = 0
    for shard in input_shards(cfg):
        if os.path.isdir(shard.path):
            total += sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(shard.path) for f in files)
        elif os.path.exists(shard.path):
            total += os.path.getsize(shard.path)
    return total


def store_budget(root: DataRoot, cfg: RefineryConfig) -> dict[str, Any]:
    """Bytes per store, each over the input's bytes, with its growth law; the total with and
    without training checkpoints."""
    stores: dict[str, int] = {}
    checkpoints = 0
    for key, size in root.sizes("").items():
        if key.split("/")[0].startswith("."):  # a writer's staging folder
            continue
        if f"/{CHECKPOINTS_DIR}/" in f"/{key}":
            checkpoints += size
            continue
        store = store_of(key)
        stores[store] = stores.get(store, 0) + size
    given = input_bytes(cfg)
    ratio = (lambda n: round(n / given, 4)) if given else (lambda n: None)
    total = sum(stores.values())
    return {
        "input_bytes": given,
        "data_root_bytes": total + checkpoints,
        "checkpoint_bytes": checkpoints,
        "over_input": ratio(total + checkpoints),
        "over_input_without_checkpoints": ratio(total),
        "stores": [{"store": s, "bytes": n, "over_input": ratio(n), "growth": growth_of(s)}
                   for s, n in sorted(stores.items(), key=lambda item: (-item[1], item[0]))],
    }


def format_budget(budget: dict[str, Any]) -> str:
    from refinery.reports.funnel import format_table

    def times(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    head = (f"Data root: {budget['data_root_bytes']:,} bytes, {times(budget['over_input'])} the compressed input "
            f"({budget['input_bytes']:,} bytes); {times(budget['over_input_without_checkpoints'])} without the "
            f"{budget['checkpoint_bytes']:,} bytes of training checkpoints")
    rows = [[s["store"], f"{s['bytes']:,}", times(s["over_input"]), s["growth"]] for s in budget["stores"]]
    return head + "\n" + format_table(["store", "bytes", "x input", "grows"], rows)
