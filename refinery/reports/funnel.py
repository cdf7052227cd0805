"""The funnel report (what `refinery funnel` prints and the funnel report asset draws): retention of
every materialized funnel stage, overall and per bucket, and the raw-input budget that retention
implies.

Stages are whatever folders exist under `stats/` in the data root, in funnel order (FUNNEL_ORDER;
stages it does not name come last, alphabetically), each the merge of its partitions' stats files.
The budget is `B0 = N * b_t / prod(r_j)`: N target tokens, b_t bytes of clean text per token, and
r_j each stage's byte retention (bytes out / bytes in), so B0 is the raw input bytes to collect for N
tokens. b_t is measured once the corpus is tokenized (text bytes tokenized over the tokens in the
final shards); before that it is `refinery init`'s estimate, the demo tokenizer's figure; the report
says which (`bytes_per_token_source`).

The bytes a stage loses are shown two ways: `bytes_dropped`, the text of the documents it removed,
and `bytes_rewritten`, what it took out of the documents it kept (HTML markup at extraction, C4's
line rules in heuristic_filtered, placeholders in pii_redacted), so a low byte retention says
which it was.

Per language, from language ID on: the documents and bytes each language keeps after every stage,
joined from the documents and rejects tables (stats files count by bucket only; a language is known
once language_filtered has run: its kept rows carry it, its rejects name it in `detail`). A document
with no language (its source skips language ID, or the model failed on it) counts as `unknown`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from refinery.stages import registry
from refinery.stages.stats import StageStats
from refinery.config import RefineryConfig
from refinery.layout import kept_documents_key, kept_documents_prefix, rejects_key, stats_key
from refinery.progress import Progress
from refinery.storage import DataRoot

# The funnel's stats folders in the order documents flow (refinery/stages/registry.py).
FUNNEL_ORDER = registry.funnel_order()
DEFAULT_TARGET_TOKENS = 1_000_000_000
TOP_REASONS = 5
LANGUAGE_STAGE = "language_filtered"
LANGUAGE_INPUT = "extracted_text"
UNKNOWN_LANGUAGE = "unknown"


class UnreadableStats(ValueError):
    """A stats file that is not a stage's stats (hand-edited, or written by another tool)."""


@dataclass
class StageTotals:
    """A stage's stats merged over its materialized partitions."""

    stats: StageStats
    partitions: int


def stage_order(names: list[str]) -> list[str]:
    known = [n for n in FUNNEL_ORDER if n in names]
    return known + sorted(n for n in names if n not in FUNNEL_ORDER)


def load_stage_totals(root: DataRoot) -> dict[str, StageTotals]:
    """Every stage under stats/, merged over partitions, in funnel order."""
    by_stage: dict[str, list[str]] = {}
    for key in root.list("stats"):
        parts = key.split("/")
        if len(parts) == 3 and parts[2].endswith(".json"):
            by_stage.setdefault(parts[1], []).append(key)
    totals: dict[str, StageTotals] = {}
    bar = Progress(sum(map(len, by_stage.values())), desc="funnel: read stage stats", unit="file")
    for stage in stage_order(list(by_stage)):
        merged = StageStats(stage=stage)
        for key in by_stage[stage]:
            bar.update()
            try:
                merged = merged + StageStats.from_dict(root.read_json(key))
            except (ValueError, KeyError, TypeError) as err:
                raise UnreadableStats(
                    f"{root.display(key)} is not a stage stats file ({type(err).__name__}: {err}); "
                    f"re-materialize that partition, or delete the file"
                ) from None
        totals[stage] = StageTotals(merged, len(by_stage[stage]))
    bar.close()
    return totals


def files_stage_stats(root: DataRoot, files: list[str]) -> list[StageStats]:
    """The named input files' stats merged per funnel stage, for the stages materialized for any of
    them, in funnel order: what one funnel chart over a run's files draws."""
    merged = []
    for stage in FUNNEL_ORDER:
        keys = [stats_key(stage, f) for f in files if root.exists(stats_key(stage, f))]
        if keys:
            merged.append(sum((StageStats.from_dict(root.read_json(k)) for k in keys), StageStats(stage=stage)))
    return merged


def funnel_chart_png(stats: list[StageStats], title: str, languages: dict[str, Any] | None = None) -> bytes:
    """Documents left after each stage as bars, labelled with the stage's retention (PNG bytes);
    with `languages` (`language_retention`), a second panel of documents kept per language."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [st.stage for st in stats]
    kept = [st.docs_out for st in stats]
    start = stats[0].docs_in if stats else 0
    if languages:
        fig, (ax, lang_ax) = plt.subplots(
            2, 1, figsize=(8, 0.45 * (len(stats) + len(languages)) + 2.4),
            height_ratios=[len(stats) + 1, len(languages) + 1],
        )
        _language_panel(lang_ax, languages)
    else:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(stats) + 1.2))
    ax.barh(range(len(stats)), kept, color="#4c72b0")
    ax.set_yticks(range(len(stats)), names)
    ax.invert_yaxis()
    for i, st in enumerate(stats):
        ax.text(kept[i], i, f" {st.docs_out:,} ({_ratio(st.docs_out, st.docs_in):.1%} of {st.docs_in:,})", va="center", fontsize=8)
    ax.set_xlim(0, max([start, *kept, 1]) * 1.35)
    ax.set_xlabel("documents")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    # No "Software" tag: the same stats give the same PNG bytes across matplotlib builds.
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _language_panel(ax: Any, languages: dict[str, Any]) -> None:
    """Per language: documents entering language ID, and those left after the last stage."""
    names = list(languages)
    entered = [languages[n]["docs_in"] for n in names]
    left = [languages[n]["docs_out"] for n in names]
    ax.barh(range(len(names)), entered, color="#c8d3e6", label="entered language ID")
    ax.barh(range(len(names)), left, color="#4c72b0", label="kept after the last stage")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    for i, n in enumerate(names):
        ax.text(entered[i], i, f" {left[i]:,} of {entered[i]:,} ({languages[n]['retention']:.1%})", va="center", fontsize=8)
    ax.set_xlim(0, max([*entered, 1]) * 1.35)
    ax.set_xlabel("documents per language")
    ax.legend(fontsize=7, loc="lower right")


def language_retention(root: DataRoot) -> dict[str, dict[str, Any]]:
    """Documents and bytes per language entering language ID and left after each later stage, summed
    over the input files language_filtered has run on; a stage counts the files it has run on. Keyed
    by language, most documents first; {} before language_filtered has run. `refinery init`'s summary
    can print it with `format_language_retention`."""
    import polars as pl

    from refinery.reports.trail import LANGUAGE_RULES_WITH_LANGUAGE, STEPS

    from refinery.stages.attributes import READ_BYTES, READ_ROWS, read_stage_documents, stage_batches

    steps = STEPS[[s.stage for s in STEPS].index(LANGUAGE_STAGE):]
    partitions = stage_partitions(root, LANGUAGE_STAGE)

    def sizes(folder: str, partition: str) -> pl.DataFrame:
        """Each document's text bytes, the text read a record batch at a time."""
        return pl.concat([
            batch.select("doc_id", pl.col("text").str.len_bytes().fill_null(0).cast(pl.Int64).alias("bytes"))
            for batch in stage_batches(root, folder, partition, READ_ROWS, ["doc_id", "text"], READ_BYTES)
        ])

    def removed(folder: str, stage: str, partition: str) -> pl.DataFrame:
        key = rejects_key(folder, partition)
        if not root.exists(key):
            return pl.DataFrame(schema={"doc_id": pl.String, "rule": pl.String, "detail": pl.String})
        return root.read_parquet(key, columns=["doc_id", "stage", "rule", "detail"]).filter(pl.col("stage") == stage)

    counts = []  # (stage, language, docs, bytes) per partition
    for partition in partitions:
        languages = pl.concat([
            read_stage_documents(root, LANGUAGE_STAGE, partition, columns=["doc_id", "language"]),
            removed(LANGUAGE_STAGE, LANGUAGE_STAGE, partition)
            .filter(pl.col("rule").is_in(LANGUAGE_RULES_WITH_LANGUAGE)).select("doc_id", language="detail"),
        ])
        alive = (sizes(LANGUAGE_INPUT, partition).join(languages, on="doc_id", how="left")
                 .with_columns(pl.col("language").fill_null(UNKNOWN_LANGUAGE)))
        counts.append(alive.group_by("language").agg(docs=pl.len(), bytes=pl.col("bytes").sum()).with_columns(stage=pl.lit("in")))
        for step in steps:
            if not root.exists(kept_documents_key(step.documents, partition)):
                break
            alive = alive.join(removed(step.rejects, step.stage, partition), on="doc_id", how="anti")
            # Bytes as the stage's own table has them (C4 drops lines, PII redacts); exact dedup's
            # survivors that near dedup then drops are in no table, and keep their earlier size.
            alive = (alive.join(sizes(step.documents, partition).rename({"bytes": "now"}), on="doc_id", how="left")
                     .with_columns(pl.coalesce("now", "bytes").alias("bytes")).drop("now"))
            counts.append(alive.group_by("language").agg(docs=pl.len(), bytes=pl.col("bytes").sum())
                          .with_columns(stage=pl.lit(step.stage)))
    if not counts:
        return {}
    totals = (pl.concat(counts).group_by("stage", "language").agg(pl.col("docs").sum(), pl.col("bytes").sum()))
    cell = {(st, lang): (d, b) for st, lang, d, b in totals.select("stage", "language", "docs", "bytes").iter_rows()}
    reached = [s.stage for s in steps if any(st == s.stage for st, _ in cell)]
    out = {}
    for lang in sorted({lang for _, lang in cell}, key=lambda x: (-cell.get(("in", x), (0, 0))[0], x)):
        docs_in, bytes_in = cell.get(("in", lang), (0, 0))
        stages = {st: dict(zip(("docs_out", "bytes_out"), cell.get((st, lang), (0, 0)))) for st in reached}
        last = stages[reached[-1]] if reached else {"docs_out": docs_in, "bytes_out": bytes_in}
        out[lang] = {"docs_in": docs_in, "bytes_in": bytes_in, "stages": stages,
                     "docs_out": last["docs_out"], "bytes_out": last["bytes_out"],
                     "retention": round(_ratio(last["docs_out"], docs_in), 6),
                     "byte_retention": round(_ratio(last["bytes_out"], bytes_in), 6)}
    return out


def format_language_retention(languages: dict[str, dict[str, Any]]) -> str:
    """Two tables, documents then bytes, per language: entering language ID and after each stage."""
    stages = list(next(iter(languages.values()))["stages"])
    docs = [[lang, f"{v['docs_in']:,}", *(f"{v['stages'][s]['docs_out']:,}" for s in stages), f"{v['retention']:.1%}"]
            for lang, v in languages.items()]
    sizes = [[lang, _human_bytes(v["bytes_in"]), *(_human_bytes(v["stages"][s]["bytes_out"]) for s in stages),
              f"{v['byte_retention']:.1%}"] for lang, v in languages.items()]
    return "\n".join([
        "Per language, documents (entering language ID, then left after each stage)",
        format_table(["language", "in", *stages, "kept"], docs),
        "",
        "Per language, bytes of text",
        format_table(["language", "in", *stages, "kept"], sizes),
    ])


def _ratio(out: int, inp: int) -> float:
    return out / inp if inp else 1.0


def bytes_per_token(root: DataRoot | None, buckets: list[str], given: float | None = None) -> tuple[float, str]:
    """b_t for the budget, and which figure it is: the one given, the corpus's measured one under
    `root`, or the estimate (always, with no root: the `funnel_report` asset runs before tokenization,
    and its report must not change with what ran after it)."""
    from refinery.throughput import DEMO_BYTES_PER_TOKEN, measured_bytes_per_token

    if given is not None:
        return given, "as given (--bytes-per-token)"
    measured = measured_bytes_per_token(root, buckets) if root is not None else None
    if measured is not None:
        return measured, "measured: text bytes tokenized per token in the final shards"
    return DEMO_BYTES_PER_TOKEN, ("estimate: the demo tokenizer's, as `refinery init` plans with (no token shards "
                                  "to measure yet)")


def build_report(totals: dict[str, StageTotals], target_tokens: int, b_t: tuple[float, str]) -> dict[str, Any]:
    """The funnel as a plain dict: per-stage rows, per-bucket rows, overall retention and budget at
    `b_t` (bytes per token, and which figure that is: `bytes_per_token`)."""
    bytes_per_token, bytes_per_token_source = b_t
    stages = []
    doc_product = byte_product = 1.0
    buckets: dict[str, dict[str, Any]] = {}
    for name, t in totals.items():
        s = t.stats
        doc_product *= s.retention
        byte_product *= s.byte_retention
        stages.append(
            {
                "stage": name,
                "partitions": t.partitions,
                "docs_in": s.docs_in,
                "docs_out": s.docs_out,
                "retention": round(s.retention, 6),
                "bytes_in": s.bytes_in,
                "bytes_out": s.bytes_out,
                "bytes_dropped": s.bytes_dropped,
                "bytes_rewritten": s.bytes_rewritten,
                "byte_retention": round(s.byte_retention, 6),
                "wall_s": round(s.wall_s, 3),
                "top_reasons": dict(s.dropped.most_common(TOP_REASONS)),
            }
        )
        for bucket, c in sorted(s.by_bucket.items()):
            b = buckets.setdefault(bucket, {"stages": {}, "retention": 1.0, "byte_retention": 1.0})
            r, br = _ratio(c.docs_out, c.docs_in), _ratio(c.bytes_out, c.bytes_in)
            b["stages"][name] = {
                "docs_in": c.docs_in,
                "docs_out": c.docs_out,
                "retention": round(r, 6),
                "bytes_dropped": c.bytes_dropped,
                "bytes_rewritten": c.bytes_rewritten,
                "byte_retention": round(br, 6),
            }
            b["retention"] *= r
            b["byte_retention"] *= br
    for b in buckets.values():
        b["raw_bytes_per_token"] = _budget(1, bytes_per_token, b["byte_retention"])
        b["retention"] = round(b["retention"], 6)
        b["byte_retention"] = round(b["byte_retention"], 6)
    return {
        "stages": stages,
        "buckets": buckets,
        "overall": {"retention": round(doc_product, 6), "byte_retention": round(byte_product, 6)},
        "budget": {
            "target_tokens": target_tokens,
            "bytes_per_token": bytes_per_token,
            "bytes_per_token_source": bytes_per_token_source,
            "byte_retention": round(byte_product, 6),
            "raw_input_bytes": _budget(target_tokens, bytes_per_token, byte_product),
            "formula": "B0 = N * b_t / prod(r_j)",
        },
    }


def target_tokens(cfg: RefineryConfig, override: int | None = None) -> int:
    """N in the budget: the override, else the curriculum's total tokens, else the default."""
    if override is not None:
        return override
    return cfg.curriculum.total_tokens if cfg.curriculum is not None else DEFAULT_TARGET_TOKENS


def _budget(tokens: int, bytes_per_token: float, retention: float) -> float | None:
    """None when nothing survives: no finite amount of raw input would do."""
    return tokens * bytes_per_token / retention if retention > 0 else None


def _human_bytes(n: float | None) -> str:
    if n is None:
        return "unbounded (nothing survives)"
    units = ["B", "KB", "MB", "GB", "TB", "PB", "EB"]
    i = min(len(units) - 1, int(math.log(max(abs(n), 1), 1000)))  # negative: a rewrite that added bytes
    return f"{n / 1000**i:,.2f} {units[i]}"


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        # first column (a name) left-aligned, numbers right-aligned
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_report(report: dict[str, Any]) -> str:
    rows = [
        [
            s["stage"],
            str(s["partitions"]),
            f"{s['docs_in']:,}",
            f"{s['docs_out']:,}",
            f"{s['retention']:.1%}",
            _human_bytes(s["bytes_in"]),
            _human_bytes(s["bytes_dropped"]),
            _human_bytes(s["bytes_rewritten"]),
            _human_bytes(s["bytes_out"]),
            f"{s['byte_retention']:.1%}",
        ]
        for s in report["stages"]
    ]
    header = ["stage", "parts", "docs in", "docs out", "kept", "bytes in", "dropped", "rewritten", "bytes out",
              "bytes kept"]
    out = ["Funnel", format_table(header, rows),
           "dropped: bytes of the documents a stage removed; rewritten: bytes it cut from the documents it kept "
           "(negative where it added some)",
           "parts: the partitions the stage wrote (input files; hash ranges for exact_deduped, LSH bands for "
           "near_deduped); kept: docs out / docs in; bytes kept: bytes out / bytes in"]
    reasons = [
        f"  {s['stage']}: " + ", ".join(f"{r} {n:,}" for r, n in s["top_reasons"].items())
        for s in report["stages"]
        if s["top_reasons"]
    ]
    if reasons:
        out += ["", "Top removal reasons", *reasons]
    stage_names = [s["stage"] for s in report["stages"]]
    bucket_rows = [
        [bucket]
        + [f"{b['stages'][n]['retention']:.1%}" if n in b["stages"] else "-" for n in stage_names]
        + [f"{b['retention']:.1%}", f"{b['byte_retention']:.2%}", _human_bytes(b["raw_bytes_per_token"])]
        for bucket, b in report["buckets"].items()
    ]
    if bucket_rows:
        out += ["", "Per bucket"]
        out.append(format_table(["bucket", *stage_names, "docs kept", "bytes kept", "raw bytes/token"], bucket_rows))
        out.append("a stage's column: the share of the bucket's documents it kept; docs kept, bytes kept: the "
                   "share through every stage; raw bytes/token: raw input to collect per clean token (b_t / bytes kept)")
    o, bud = report["overall"], report["budget"]
    if report.get("languages"):
        out += ["", format_language_retention(report["languages"])]
    out += [
        "",
        f"Overall: {o['retention']:.2%} of documents and {o['byte_retention']:.3%} of bytes survive.",
        f"Budget: {bud['formula']} with N = {bud['target_tokens']:,} tokens, b_t = {bud['bytes_per_token']:.3g} "
        f"bytes/token, prod(r_j) = {bud['byte_retention']:.4g} -> collect {_human_bytes(bud['raw_input_bytes'])} of raw input.",
        "  B0: the raw input bytes to collect; N: the tokens to train on (the curriculum's total_tokens); b_t: bytes "
        f"of clean text per token ({bud['bytes_per_token_source']}); prod(r_j): the product of every stage's bytes "
        "kept, the share of raw bytes that survives the funnel",
    ]
    return "\n".join(out)


def stage_partitions(root: DataRoot, stage: str) -> list[str]:
    """The input files a per-document stage has written its kept documents for, in key order."""
    prefix = kept_documents_prefix(stage) + "/"
    return [k.removeprefix(prefix).removesuffix(".parquet") for k in root.list(kept_documents_prefix(stage))
            if k.endswith(".parquet")]


def quality_classifier_report(root: DataRoot, totals: dict[str, StageTotals]) -> dict[str, Any] | None:
    """The published quality model's figures against labels (`quality_model`'s latest.json:
    held-out AUC, precision/recall/F1 at the decision threshold, per language, the labelled check,
    source-separation flags) and, once quality_scored ran, each language's share of the scored
    documents above the threshold. None before a model is published."""
    from refinery.models import quality as q

    if not root.exists(q.LATEST_KEY):
        return None
    pointer = root.read_json(q.LATEST_KEY)
    metrics = pointer.get("metrics") or {}
    scored = totals.get(q.QualityScorer.name)
    return {"model_hash": pointer.get("model_hash"), **metrics,
            "corpus_share_above_threshold": None if scored is None else q.shares_above_threshold(scored.stats.counters)}


def _figure(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def format_quality(report: dict[str, Any]) -> str:
    """The quality classifier's figures as text: one row per language (held out and labelled check)."""
    threshold = report.get("decision_threshold")
    check = report.get("check") or {}
    lines = [f"Quality classifier {report['model_hash']} at threshold {threshold} (AUC, then precision/recall/F1)"]
    rows = [["held out (corpus)", *(_figure(report.get("holdout", {}).get(k)) for k in ("auc", "precision", "recall", "f1"))]]
    rows += [[f"  {lang}", *(_figure(m.get(k)) for k in ("auc", "precision", "recall", "f1"))]
             for lang, m in report.get("holdout_by_language", {}).items()]
    for name in ("high_vs_low", "high_vs_spam"):
        if name in check:
            m = check[name]
            rows.append([f"within bucket (labelled, held out) {name.replace('_', ' ')}", *(_figure(m.get(k)) for k in ("auc", "precision", "recall", "f1"))])
            rows += [[f"  {lang}", *(_figure(v.get(k)) for k in ("auc", "precision", "recall", "f1"))]
                     for lang, v in m.get("by_language", {}).items()]
    lines.append(format_table(["set", "AUC", "precision", "recall", "F1"], rows))
    shares = report.get("corpus_share_above_threshold") or report.get("share_above_threshold") or {}
    if shares:
        lines.append("share above the threshold, per language: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    lines += [f"warning: {flag}" for flag in report.get("flags", [])]
    return "\n".join(lines)
