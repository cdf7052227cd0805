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

and, last, `new_user`: the configuration a new user gets (`refinery init`'s, or any config naming no
labelled set), on text neither the buckets nor the shipped pages hold. The user's curated bucket is
the demo sample's books and wiki (data/sample, English), their web bucket one half of
data/heuristic_docs by url hash (real documentation and real low-value pages of Debian packages
neither data/labelled nor data/multilingual uses), and the shipped labelled pages
(refinery.config.paths.SHIPPED_LABELLED_SETS) join training as `stages.quality.shipped_labelled_pages`
has them do. Scored: the other half of data/heuristic_docs (the English pages of the two packages the
sample's curated bucket is cut from left out), as pages of one web bucket: the within-bucket AUC of
real documentation against real low-value pages, overall and per language, and of those clean
pages against planted spam made from them by data/multilingual's spam generator (seed 5).
`new_user_buckets_only` is the same without the shipped pages (the buckets alone, the default
before issue 47), measured in the same run.

    python bench/quality.py [--folds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from refinery.config import QualityConfig  # noqa: E402
from refinery.config.paths import SHIPPED_LABELLED_SETS  # noqa: E402
from refinery.curriculum.quality_cut import stratified_cutoffs, top_fraction_cutoff  # noqa: E402
from refinery.models import quality as q  # noqa: E402
from refinery.models import quality_fit as qfit  # noqa: E402
from refinery.models.quality_training import labelled_batches  # noqa: E402
from refinery.models import quality_metrics as qm  # noqa: E402

CURATED_LANGUAGES = ("de", "en", "es", "fr", "ja", "zh")
CURATED_PER_LANGUAGE = 8
FOLDS = 5
MIN_LANGUAGE_PAGES = 50
ANNEAL_TOP = 0.25
SEED = 1234
# new_user: the half of data/heuristic_docs that is the user's web bucket (url hash below), the
# packages of the sample's curated bucket (English), and the smallest per-language figure reported.
WEB_HALF = 0.5
CURATED_PACKAGES = ("debian-handbook", "python3.11-doc")
MIN_CLEAN_PAGES, MIN_LOW_PAGES = 4, 2
SPAM_SEED = 5


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
    """Each language's share of the top-ANNEAL_TOP selection's bytes over its share of the bucket's,
    and the share of the bucket's bytes the selection holds."""
    langs = web["language"].to_numpy().astype(object)
    sizes = web["text"].str.len_bytes().to_numpy()
    out = {}
    for name, kept in (("per_language", stratified_keep(langs, scores, sizes)),
                       ("global", scores >= top_fraction_cutoff(scores, ANNEAL_TOP, sizes))):
        ratio = {}
        for lang in sorted(set(langs)):
            bucket_share = sizes[langs == lang].sum() / sizes.sum()
            ratio[lang] = round(float(sizes[kept & (langs == lang)].sum() / sizes[kept].sum() / bucket_share), 3) if kept.any() else 0.0
        out[name] = {"ratio_by_language": ratio, "min": min(ratio.values()), "max": max(ratio.values()),
                     "kept": int(kept.sum()), "kept_bytes_share": round(float(sizes[kept].sum() / sizes.sum()), 4),
                     "spam_kept": int((web["doc_id"].str.starts_with("https://spam-").to_numpy() & kept).sum())}
    return out


def stratified_keep(langs: np.ndarray, scores: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The per-language cut of the curriculum: each language's best pages holding ANNEAL_TOP of its
    size (UTF-8 bytes here, for tokens)."""
    cutoffs = stratified_cutoffs({lang: scores[langs == lang] for lang in set(langs)}, ANNEAL_TOP,
                                 {lang: sizes[langs == lang] for lang in set(langs)})
    return np.array([s >= cutoffs[lang] for lang, s in zip(langs, scores)])


def sample_curated() -> pl.DataFrame:
    """The demo sample's books and wiki (data/sample), the readable records with text: a new user's
    curated bucket (the sample holds broken records on purpose; the funnel counts those, here they
    are skipped)."""
    rows = []
    for path in sorted(glob.glob(str(ROOT / "data/sample/books/books-0*.jsonl.gz")) + glob.glob(str(ROOT / "data/sample/wiki/*.jsonl.gz"))):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f):
                try:
                    text = json.loads(line).get("text")
                except json.JSONDecodeError:
                    continue
                if isinstance(text, str) and text:
                    rows.append({"doc_id": f"{Path(path).name}/{i}", "bucket": "books", "language": "en", "text": text})
    return pl.DataFrame(rows)


def planted_spam(clean: pl.DataFrame) -> pl.DataFrame:
    """data/multilingual's spam generator over each language's clean pages (a language whose pages
    hold too few lines to make spam from is left out)."""
    spec = importlib.util.spec_from_file_location("build_corpus", ROOT / "data/multilingual/build_corpus.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    rows = []
    for (_,), part in sorted(clean.partition_by("lang", as_dict=True).items()):
        try:
            rows += builder.spam_pages(part.to_dicts(), seed=SPAM_SEED)
        except ValueError:  # random.sample of more lines than the language has
            continue
    return pl.DataFrame(rows).select("lang", "text")


def auc_of(good: np.ndarray, bad: np.ndarray) -> float | None:
    auc = qm.roc_auc(np.r_[good, bad], np.r_[np.ones(len(good)), np.zeros(len(bad))])
    return None if auc is None else round(auc, 4)


def new_user(shipped: bool = True) -> dict:
    """The `new_user` figures (module docstring); without `shipped`, the same corpus trained on the
    buckets alone (`shipped_labelled_pages: false`, the default before issue 47)."""
    pages = pl.DataFrame(read_jsonl(ROOT / "data/heuristic_docs/docs.jsonl.gz"))
    web_half = pl.Series(qfit.doc_hash_fraction(pages["url"], SEED) < WEB_HALF)
    web = pages.filter(web_half).select(doc_id="url", bucket=pl.lit("web"), language="lang", text="text")
    test = pages.filter(~web_half & ~((pl.col("lang") == "en") & pl.col("package").is_in(CURATED_PACKAGES)))
    pages_shipped = [batch for path, label in SHIPPED_LABELLED_SETS if shipped
                     for batch in labelled_batches(str(ROOT / path), label)]
    start = time.perf_counter()
    model, report = train(pl.concat([sample_curated(), web, *pages_shipped]),
                          ["books", *([qm.LABELLED_BUCKETS["high"]] if shipped else [])],
                          ["web", *([qm.LABELLED_BUCKETS["low"], qm.LABELLED_BUCKETS["spam"]] if shipped else [])])
    train_s = time.perf_counter() - start
    scores = model.score(test["text"])
    clean = (test["label"] == "clean").to_numpy()
    spam = planted_spam(test.filter(pl.Series(clean)))
    spam_scores = model.score(spam["text"])
    langs, spam_langs = test["lang"].to_numpy(), spam["lang"].to_numpy()
    low_by_language, spam_by_language = {}, {}
    for lang in sorted(set(langs.tolist())):
        good, bad = scores[clean & (langs == lang)], scores[~clean & (langs == lang)]
        if len(good) >= MIN_CLEAN_PAGES and len(bad) >= MIN_LOW_PAGES:
            low_by_language[lang] = {"auc": auc_of(good, bad), "clean": len(good), "low": len(bad)}
        if len(good) >= MIN_CLEAN_PAGES and (spam_langs == lang).any():
            spam_by_language[lang] = {"auc": auc_of(good, spam_scores[spam_langs == lang]), "clean": len(good),
                                      "spam": int((spam_langs == lang).sum())}
    kinds = test.with_columns(score=pl.Series(scores)).group_by("kind").agg(pl.col("score").median(), pl.len())
    return {
        "train_s": round(train_s, 2),
        "trained_on": report.train_by_bucket,
        "scored": {"clean": int(clean.sum()), "low": int((~clean).sum()), "spam": spam.height},
        "within_bucket_clean_vs_low": auc_of(scores[clean], scores[~clean]),
        "within_bucket_clean_vs_low_by_language": low_by_language,
        "clean_vs_planted_spam": auc_of(scores[clean], spam_scores),
        "clean_vs_planted_spam_by_language": spam_by_language,
        "median_score_by_kind": {k: round(v, 4) for k, v, _ in kinds.sort("kind").iter_rows()},
        "quality_model_within_bucket": report.metrics["within_bucket"],
        "flags": report.metrics["flags"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folds", type=int, default=FOLDS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--new-user-only", action="store_true", help="measure the new_user configuration alone")
    args = parser.parse_args()
    if args.new_user_only:
        return write_result({"new_user": new_user(), "new_user_buckets_only": new_user(shipped=False)}, args.json)
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
    result["new_user"] = new_user()
    result["new_user_buckets_only"] = new_user(shipped=False)
    return write_result(result, args.json)


def write_result(result: dict, path: Path | None) -> int:
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
