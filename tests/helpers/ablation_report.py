"""Stored proxy-run results made by hand, for the report's tests: each (domain, language) cell is two
evaluation documents of 500 bytes scoring a given bits per byte; English and German are the
languages the config keeps."""

from __future__ import annotations

import math

KEPT = ("en", "de")


def result(variant: str, seed: int, bpb: dict[tuple[str, str], float], kept: tuple[str, ...] = KEPT) -> dict:
    """A stored run's results whose cell (domain, language) scores `bpb` over two documents."""
    documents: dict[str, list] = {k: [] for k in ("doc_id", "domain", "language", "kept", "bytes", "nats")}
    for (domain, lang), value in bpb.items():
        for k in range(2):
            for column, v in zip(documents, (f"{domain}-{lang}-{k}", domain, lang, lang in kept, 500,
                                             value * 500 * math.log(2))):
                documents[column].append(v)
    return {"variant": variant, "seed": seed, "documents": documents}


COUNTS = {"funnel": {"documents": 1200, "tokens": 50000, "raw_byte_share": 0.41, "budget_tokens": 40960,
                     "weights": {"docs": 0.4, "web": 0.6}, "eval_overlap": {"docs": 0, "demo_eval": 0}},
          "raw": {"documents": 3000, "tokens": 50000, "raw_byte_share": 1.0, "weights": {"docs": 0.4, "web": 0.6},
                  "eval_overlap": {"docs": 2, "demo_eval": 1}},
          "no_dedup": {"documents": 1500, "tokens": 50000, "raw_byte_share": 0.52},
          "top_half": {"documents": 600, "tokens": 50000, "raw_byte_share": 0.2}}
