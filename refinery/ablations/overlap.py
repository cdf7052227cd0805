"""No variant trains on an evaluation domain's text: every document of a variant that shares a word
n-gram (`contamination.ngram`, 13 by default, on normalized words: refinery/contamination.py) with
any document of any evaluation domain is left out, whatever the variant's base. The domains are
those of the evaluation set (refinery/ablations/eval_set.py): each bucket's held-out documents (so
a copy or near copy of a held-out page, which the hold-out's hash does not catch, is out too), the
contamination eval sets and `ablations.eval_sets`. This is the drop policy applied to every variant
at its selection, where the main graph applies it to a phase's manifest: a variant is drawn from
pii_redacted, before any manifest.

Each domain has its own index, so a document is counted against every domain it overlaps: the
report prints those counts per variant (`eval_overlap`), the documents each domain kept out.
Memory: every evaluation document's n-gram hashes (12 bytes each) and text, and one batch.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from refinery.ablations.eval_set import eval_documents
from refinery.config import RefineryConfig
from refinery.contamination import EvalIndex, scan_documents
from refinery.storage import DataRoot


def domain_indexes(root: DataRoot, cfg: RefineryConfig) -> dict[str, EvalIndex]:
    """domain -> the index of its evaluation documents' n-grams (the evaluation set must be written)."""
    records: dict[str, list[tuple[str, str, str]]] = {}
    for batch in eval_documents(root):
        for doc_id, text, domain in zip(batch["doc_id"].to_list(), batch["text"].to_list(), batch["domain"].to_list()):
            records.setdefault(domain, []).append((domain, doc_id, text or ""))
    return {domain: EvalIndex.from_records(cfg.contamination.ngram, rows, {})
            for domain, rows in sorted(records.items())}


class OverlapFilter:
    """Drops the documents of a batch that share an n-gram with an evaluation domain, counting them
    per domain (`counts`: documents, each counted once per domain it overlaps)."""

    def __init__(self, indexes: dict[str, EvalIndex]):
        self.indexes = indexes
        self.counts = {domain: 0 for domain in indexes}

    def __call__(self, batch: pl.DataFrame) -> pl.DataFrame:
        if not batch.height:
            return batch
        docs = list(zip(batch["doc_id"].to_list(), [None] * batch.height, batch["bucket"].to_list(),
                        batch["text"].to_list()))
        out = np.zeros(batch.height, dtype=bool)
        position = {doc_id: i for i, doc_id in enumerate(batch["doc_id"].to_list())}
        for domain, index in self.indexes.items():
            hits = {hit.doc_id for hit in scan_documents(index, docs)}
            self.counts[domain] += len(hits)
            out[[position[d] for d in hits]] = True
        return batch.filter(pl.Series(~out))
