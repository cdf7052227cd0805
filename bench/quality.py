"""The quality classifier against labels (docs/quality.md, issue 36).

Trains the pipeline's classifier (`refinery.models.quality.train_quality_model`, the default
settings) on the issue's setting, built from data/multilingual: a curated bucket of
CURATED_PER_LANGUAGE clean pages in each of six languages (de en es fr ja zh) against a web bucket
of every other clean page in all ten languages. Two trainings:

- `buckets`: curated against web alone (language-balanced; what a config without a labelled set
  trains);
- `labelled`: the same plus the labelled set (data/labelled/labelled.jsonl.gz) as the labelled
  buckets, in FOLDS folds by doc_id hash: each fold's pages are scored by the model trained
  without them, so every labelled page gets an out-of-fold score.

and measures, on the labelled set (the `buckets` model never saw it): ROC AUC of high-value pages
against real low-value pages, overall and per language with >= 50 labelled pages, and against the
synthetic spam; on data/multilingual: clean web pages against its planted spam, the curated bucket
against web (1.0 would be source separation), each kind of low-value text left out of training
in turn (AUC against held-out high-value pages: a kind the model never saw), and the anneal's top-25% cut of the web bucket
(clean and spam) per language, stratified (the default) and global, as each language's share of
the selection over its share of the bucket.

    python bench/quality.py [--folds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from refinery.config import QualityConfig  # noqa: E402
from refinery.curriculum.quality_cut import stratified_cutoffs, top_fraction_cutoff  # noqa: E402
from refinery.models import quality as q  # noqa: E402
from refinery.models import quality_fit as qfit
from refinery.models import quality_metrics as qm  # noqa: E402

CURATED_LANGUAGES = ("de", "en", "es", "fr", "ja", "zh")
CURATED_PER_LANGUAGE = 8
FOLDS = 5
MIN_LANGUAGE_PAGES = 50
ANNEAL_TOP = 0.25
SEED = 1234


def read_jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def corpus() -> tuple[pl.DataFrame, pl.DataFrame]:
    """(training buckets: doc_id, bucket, language, text; the multilingual spam pages)."""
    clean = read_jsonl(ROOT / "data/multilingual/clean.jsonl.gz")
    taken: dict[str, int] = {}
    rows = []
    for page in clean:
        lang = page["lang"]
        curated = page["package"] == "gnome-user-docs" and lang in CURATED_LANGUAGES and taken.get(lang, 0) < CURATED_PER_LANGUAGE
        taken[lang] = taken.get(lang, 0) + curated
        rows.append({"doc_id": page["url"], "bucket": "books" if curated else "web", "language": lang, "text": page["text"]})
    spam = read_jsonl(ROOT / "data/multilingual/spam.jsonl.gz")
    spam_rows = [{"doc_id": p["url"], "bucket": "web", "language": p["lang"], "text": p["text"]} for p in spam]
    return pl.DataFrame(rows), pl.DataFrame(spam_rows)


def labelled() -> pl.DataFrame:
    pages = read_jsonl(ROOT / "data/labelled/labelled.jsonl.gz")
    return pl.DataFrame([{"doc_id": f"labelled:{p['url']}", "bucket": qm.LABELLED_BUCKETS[p["label"]],
                          "language": p["lang"], "text": p["text"], "label": p["label"], "kind": p["kind"]}
                         for p in pages])


def train(docs: pl.DataFrame, positive: list[str], negative: list[str]) -> tuple[q.QualityModel, qfit.TrainingReport]:
    d = QualityConfig()
    return qfit.train_quality_model(docs.select("doc_id", "bucket", "language", "text"), positive, negative,
                                 num_features=d.num_features, ngram=d.ngram, epochs=d.epochs,
                                 learning_rate=d.learning_rate, holdout_fraction=d.holdout_fraction,
                                 max_chars=d.max_chars, max_docs_per_class=d.max_train_docs_per_class, seed=SEED)


def labelled_figures(pages: pl.DataFrame, scores: np.ndarray) -> dict:
    scored = pages.with_columns(score=pl.Series(scores))

    def auc(negative: str, frame: pl.DataFrame) -> float | None:
        part = frame.filter(pl.col("label").is_in(["high", negative]))
        return qm.roc_auc(part["score"].to_numpy(), (part["label"] == "high").to_numpy().astype(int))

    per_language = {}
    for (lang,), part in scored.partition_by("language", as_dict=True, maintain_order=True).items():
        if part.height >= MIN_LANGUAGE_PAGES:
            per_language[lang] = round(auc("low", part), 4)
    by_kind = {}
    for (kind,), part in scored.filter(pl.col("label") == "low").partition_by("kind", as_dict=True).items():
        by_kind[kind] = round(auc("low", pl.concat([scored.filter(pl.col("label") == "high"), part])), 4)
    return {"high_vs_low": round(auc("low", scored), 4), "high_vs_low_by_language": dict(sorted(per_language.items())),
            "high_vs_low_by_kind": dict(sorted(by_kind.items())), "high_vs_spam": round(auc("spam", scored), 4)}


def anneal_shares(web: pl.DataFrame, scores: np.ndarray) -> dict:
    """Each language's share of the top-ANNEAL_TOP selection over its share of the bucket."""
    langs = web["language"].to_numpy().astype(object)
    out = {}
    for name, kept in (("per_language", stratified_keep(langs, scores)), ("global", scores >= top_fraction_cutoff(scores, ANNEAL_TOP))):
        ratio = {}
        for lang in sorted(set(langs)):
            bucket_share = float(np.mean(langs == lang))
            ratio[lang] = round(float(np.mean(langs[kept] == lang)) / bucket_share, 3) if kept.any() else 0.0
        out[name] = {"ratio_by_language": ratio, "min": min(ratio.values()), "max": max(ratio.values()),
                     "kept": int(kept.sum()), "spam_kept": int((web["doc_id"].str.starts_with("https://spam-").to_numpy() & kept).sum())}
    return out


def stratified_keep(langs: np.ndarray, scores: np.ndarray) -> np.ndarray:
    cutoffs = stratified_cutoffs({lang: scores[langs == lang] for lang in set(langs)}, ANNEAL_TOP)
    return np.array([s >= cutoffs[lang] for lang, s in zip(langs, scores)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folds", type=int, default=FOLDS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    docs, spam = corpus()
    pages = labelled()
    result: dict = {}
    start = time.perf_counter()
    model, report = train(docs, ["books"], ["web"])
    web = pl.concat([docs.filter(pl.col("bucket") == "web"), spam])
    web_scores = model.score(web["text"])
    is_spam = web["doc_id"].str.starts_with("https://spam-").to_numpy()
    books = model.score(docs.filter(pl.col("bucket") == "books")["text"])
    clean_web = web_scores[~is_spam]
    result["buckets"] = {
        "train_s": round(time.perf_counter() - start, 2),
        "holdout_auc_curated_vs_web": report.auc, "flags": report.metrics["flags"],
        "untrained_languages": report.untrained_languages,
        "curated_vs_web_auc_all": round(qm.roc_auc(np.concatenate([books, clean_web]),
                                                   np.r_[np.ones(len(books)), np.zeros(len(clean_web))]), 4),
        "multilingual_clean_vs_spam": round(qm.roc_auc(web_scores, (~is_spam).astype(int)), 4),
        "labelled": labelled_figures(pages, model.score(pages["text"])),
        "anneal": anneal_shares(web, web_scores),
    }
    fold = (qfit.doc_hash_fraction(pages["doc_id"], SEED) * args.folds).astype(int)
    out_of_fold = np.zeros(pages.height)
    spam_scores = []
    start = time.perf_counter()
    for k in range(args.folds):
        held = fold == k
        model, report = train(pl.concat([docs, pages.filter(~pl.Series(held)).select(docs.columns)]),
                              ["books", qm.LABELLED_BUCKETS["high"]],
                              ["web", qm.LABELLED_BUCKETS["low"], qm.LABELLED_BUCKETS["spam"]])
        out_of_fold[held] = model.score(pages.filter(pl.Series(held))["text"])
        spam_scores.append(model.score(web["text"]))
    web_scores = np.mean(spam_scores, axis=0)
    result["labelled"] = {
        "train_s_per_fold": round((time.perf_counter() - start) / args.folds, 2),
        "labelled": labelled_figures(pages, out_of_fold),
        "multilingual_clean_vs_spam": round(qm.roc_auc(web_scores, (~is_spam).astype(int)), 4),
        "anneal": anneal_shares(web, web_scores),
    }
    # Each kind of low-value text left out of training in turn: how the model ranks a kind it has
    # never seen against the out-of-fold high-value pages.
    unseen = {}
    high = pages["label"].to_numpy() == "high"
    for kind in sorted(set(pages.filter(pl.col("label") == "low")["kind"].to_list())):
        mine = (pages["kind"] == kind).to_numpy()
        model, _ = train(pl.concat([docs, pages.filter(~pl.Series(mine) & ~pl.Series(high & (fold == 0)))
                                    .select(docs.columns)]),
                         ["books", qm.LABELLED_BUCKETS["high"]],
                         ["web", qm.LABELLED_BUCKETS["low"], qm.LABELLED_BUCKETS["spam"]])
        held = high & (fold == 0)
        scores = model.score(pl.concat([pages.filter(pl.Series(held)), pages.filter(pl.Series(mine))])["text"])
        unseen[kind] = round(qm.roc_auc(scores, np.r_[np.ones(held.sum()), np.zeros(mine.sum())]), 4)
    result["labelled"]["high_vs_unseen_low_kind"] = unseen
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
