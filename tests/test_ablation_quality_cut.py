"""An ablation variant's `quality_top` cut (refinery/ablations/selection.py) keeps what a phase's
`top N%` keeps: the best-scored documents holding N% of each bucket's and language's tokens, not N%
of their documents (issue 47: by documents, the longer well-scored pages held 47.5% of a bucket's
tokens under a top 25%)."""

from __future__ import annotations

import polars as pl

from refinery.ablations.selection import quality_cut, quality_cutoffs

# (doc_id, bucket, language, quality_score, tokens)
DOCS = [
    ("en-a", "web", "en", 0.9, 100), ("en-b", "web", "en", 0.8, 10), ("en-c", "web", "en", 0.7, 10),
    ("en-d", "web", "en", 0.6, 10), ("en-e", "web", "en", 0.5, 270), ("en-unscored", "web", "en", None, 100),
    ("zh-a", "web", "zh", 0.4, 30), ("zh-b", "web", "zh", 0.95, 50), ("zh-c", "web", "zh", 0.3, 20),
    ("ja-a", "web", None, 0.2, 40),  # no language recorded: its own group, "unknown"
    ("code-a", "code", "en", 0.1, 10), ("code-b", "code", "en", 0.05, 30),
]


def frame(rows) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"doc_id": pl.String, "bucket": pl.String, "language": pl.String,
                                      "quality_score": pl.Float64, "tokens": pl.Int64}, orient="row")


def test_quality_top_keeps_a_quarter_of_each_languages_tokens_within_one_document():
    docs = frame(DOCS)
    # two frames, as the build streams record batches: the cut does not depend on the batching
    cutoffs = quality_cutoffs(iter([docs.head(5), docs.tail(len(DOCS) - 5)]), 0.25)
    # web/en: 500 tokens (the unscored page's counted, never kept), a quarter is 125: a, b, c, d hold
    # 130 (a cut of a quarter of the 6 documents would keep a and b, 110 tokens of 500)
    assert cutoffs == {"code": {"en": 0.1}, "web": {"en": 0.6, "unknown": 0.2, "zh": 0.95}}
    kept = quality_cut(docs, cutoffs)
    assert kept["doc_id"].to_list() == ["en-a", "en-b", "en-c", "en-d", "zh-b", "ja-a", "code-a"]
    tokens = {name: (held, total) for name, held, total in
              docs.with_columns(kept=pl.col("doc_id").is_in(kept["doc_id"].implode()))
              .group_by("bucket", "language", maintain_order=True)
              .agg(pl.col("tokens").filter(pl.col("kept")).sum().alias("held"), pl.col("tokens").sum().alias("total"))
              .select(pl.concat_str("bucket", pl.col("language").fill_null("unknown"), separator="/"), "held", "total")
              .iter_rows()}
    assert tokens == {"web/en": (130, 500), "web/zh": (50, 100), "web/unknown": (40, 40), "code/en": (10, 40)}
    # each keeps a quarter of its tokens and overshoots by less than the document at the cutoff
    at_cutoff = {"web/en": 10, "web/zh": 50, "web/unknown": 40, "code/en": 10}
    for name, (held, total) in tokens.items():
        assert total / 4 <= held < total / 4 + at_cutoff[name], name


def test_a_tie_at_the_cutoff_is_kept_whole_and_an_unscored_bucket_keeps_nothing():
    docs = frame([("a", "web", "en", 0.5, 10), ("b", "web", "en", 0.5, 10), ("c", "web", "en", 0.1, 20),
                  ("d", "books", "en", None, 10)])
    cutoffs = quality_cutoffs(iter([docs]), 0.25)
    assert quality_cut(docs, cutoffs)["doc_id"].to_list() == ["a", "b"]
