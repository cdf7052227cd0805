"""`refinery funnel`: the funnel report (refinery/reports/funnel.py) for a data root: retention per
stage, bucket and language, the raw-input budget it implies, the quality classifier's figures, and
the data root's bytes per store over the compressed input (refinery/reports/stores.py).

`--explain URL_OR_DOC_ID` instead finds that document in `language_filtered` (the heuristic
stage's input), runs every heuristic rule on it with its source's and language's settings, then
the config's custom filters (on the text the rules keep, as the stage does), and lists each rule
it fails with the measured value and the threshold, not only the first one the stage reports, so
a user sees what a threshold change would buy. It streams each file's doc ids and urls to find the
document, then the file that holds it up to its row: memory is a record batch's (`READ_ROWS` rows,
`READ_BYTES` of text), never a file's.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from refinery.config import ConfigError, RefineryConfig, load_config
from refinery.layout import kept_documents_key
from refinery.preflight import READ_ONLY
from refinery.reports.funnel import (DEFAULT_TARGET_TOKENS, UnreadableStats, build_report, bytes_per_token, format_quality,
                                     format_report, format_table, language_retention, load_stage_totals,
                                     quality_classifier_report, stage_partitions, target_tokens)
from refinery.reports.stores import format_budget, store_budget
from refinery.storage import DataRoot, open_data_root

if TYPE_CHECKING:
    import polars as pl


def find_heuristic_input(root: DataRoot, key: str) -> tuple["pl.DataFrame", str] | None:
    """The first `language_filtered` document whose doc_id or url is `key`, as a one-row table with
    every column (a custom filter may read any), and the table it came from (its attribute table).
    Each file's doc ids and urls are streamed a batch at a time to find it, then the file that holds
    it is streamed again with every column up to its row: memory is a batch's, never a file's."""
    import polars as pl

    from refinery.stages.attributes import READ_ROWS, stage_batches
    from refinery.stages.language import STAGE as LANGUAGE_STAGE

    for partition in stage_partitions(root, LANGUAGE_STAGE):
        position = 0
        for ids in stage_batches(root, LANGUAGE_STAGE, partition, READ_ROWS, columns=["doc_id", "url"]):
            hit = ids.with_row_index().filter((pl.col("doc_id") == key) | (pl.col("url") == key))
            if hit.height:
                return (_row_at(root, LANGUAGE_STAGE, partition, position + int(hit["index"][0])),
                        root.display(kept_documents_key(LANGUAGE_STAGE, partition)))
            position += ids.height
    return None


def _row_at(root: DataRoot, stage: str, partition: str, position: int) -> "pl.DataFrame":
    """Row `position` of `stage`'s kept documents of one file, with every column, as a one-row table."""
    from refinery.stages.attributes import READ_BYTES, READ_ROWS, stage_batches

    for batch in stage_batches(root, stage, partition, READ_ROWS, max_bytes=READ_BYTES):
        if position < batch.height:
            return batch.slice(position, 1)
        position -= batch.height
    raise IndexError(f"{root.display(kept_documents_key(stage, partition))} holds no row {position}")


def explain_document(cfg: RefineryConfig, root: DataRoot, key: str) -> dict[str, Any] | None:
    """Every heuristic rule and custom filter the document fails ({rule, value, threshold, excerpt:
    the line or part of the text the value comes from}), or None when no document of the heuristic
    stage's input has that doc_id or url."""
    from refinery.stages.heuristic.explain import explain_record

    found = find_heuristic_input(root, key)
    if found is None:
        return None
    frame, table = found
    row = frame.row(0, named=True)
    try:
        source = cfg.source(row["source"])
    except KeyError:
        raise ConfigError(
            f"{key} comes from source {row['source']!r}, which the config does not declare; pass the "
            f"config the data root was materialized with"
        ) from None
    explanation = explain_record(cfg, frame, source)
    return {
        "doc_id": row["doc_id"],
        "url": row["url"],
        "source": row["source"],
        "language": row["language"],
        "language_score": row["language_score"],
        "table": table,
        "heuristic_skipped_by_source": "heuristic" in source.skip,
        "rules_off": explanation.rules_off,
        "custom_filters": [spec.name for spec in cfg.stages.custom_filters],
        "failures": [{"rule": rule, "value": value, "threshold": detail, "excerpt": shown}
                     for rule, value, detail, shown in explanation.failures],
    }


def format_explanation(exp: dict[str, Any]) -> str:
    score = f" ({exp['language_score']:.2f})" if exp["language_score"] is not None else ""
    out = [
        f"doc_id {exp['doc_id']}  url {exp['url']}",
        f"source {exp['source']}  language {exp['language'] or 'none (read as en)'}{score}  from {exp['table']}",
    ]
    if exp["rules_off"]:
        out.append(f"rules off for it: {', '.join(exp['rules_off'])}")
    if exp["custom_filters"]:
        out.append(f"custom filters, after the rules: {', '.join(exp['custom_filters'])}")
    if exp["heuristic_skipped_by_source"]:
        out.append("its source skips heuristic_filtered, so no rule removes it; had it run:")
    failures = exp["failures"]
    if not failures:
        out.append("passes every heuristic rule")
        return "\n".join(out)
    out.append(f"fails {len(failures)} heuristic rule(s); the stage reports the first:")
    rows = [[f["rule"], "-" if f["value"] is None else f"{f['value']:.4g}", f["threshold"]] for f in failures]
    out.append(format_table(["rule", "value", "threshold"], rows))
    shown = [f"  {f['rule']}: {f['excerpt']}" for f in failures if f["excerpt"]]
    out += ["where to look:", *shown] if shown else []
    return "\n".join(out)


def run_explain(cfg: RefineryConfig, root: DataRoot, key: str, as_json: bool) -> int:
    exp = explain_document(cfg, root, key)
    if exp is None:
        print(
            f"refinery funnel: no document with doc_id or url {key!r} in language_filtered (the input of "
            f"heuristic_filtered) under {root.display('documents')}; materialize language_filtered first, "
            f"or look the document up with `refinery lineage` to see which stage removed it",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(exp, indent=2, sort_keys=True, ensure_ascii=False) if as_json else format_explanation(exp))
    return 0


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    if args.explain is not None:
        return run_explain(cfg, root, args.explain, args.json)
    try:
        totals = load_stage_totals(root)
    except UnreadableStats as err:
        print(f"refinery funnel: {err}", file=sys.stderr)
        return 1
    if not totals:
        # `refinery demo` trains too, so it needs a curriculum; the UI materializes the funnel alone.
        demo = f"`refinery demo --config {args.config}` (every asset), or " if cfg.curriculum is not None else ""
        print(
            f"refinery funnel: nothing materialized yet under {root.display('stats')}; materialize the graph on "
            f"this config first: {demo}`make ui CONFIG={args.config}` and materialize the funnel group from the UI",
            file=sys.stderr,
        )
        return 1
    report = build_report(totals, target_tokens(cfg, args.target_tokens),
                          bytes_per_token(root, list(cfg.buckets), args.bytes_per_token))
    report["languages"] = language_retention(root)
    report["quality"] = quality_classifier_report(root, totals)
    report["storage"] = store_budget(root, cfg)
    text = format_report(report) + ("" if report["quality"] is None else "\n\n" + format_quality(report["quality"]))
    text += "\n\n" + format_budget(report["storage"])
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else text)
    return 0

def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "funnel",
        help="retention per funnel stage, bucket and language, and the raw-input budget it implies",
        description="Retention of every materialized funnel stage (documents and bytes in and out), overall, per "
                    "bucket and per language (from language ID on), the top removal reasons, and the raw-input budget B0 = N * b_t / prod(r_j): the "
                    "raw bytes to collect for N clean tokens at this retention, at b_t bytes per token (measured from the "
                    "token shards, else the demo tokenizer's estimate); then the data root's bytes per store over the "
                    "compressed input, each with its growth law. With --explain, every heuristic rule "
                    "and custom filter one document fails, with the measured value and the threshold. It reads what "
                    "the graph wrote under the data root; materialize the funnel first (`refinery demo --config C`).",
        epilog="examples:\n  refinery funnel --config configs/demo.yaml\n"
               "  refinery funnel --config configs/demo.yaml --target-tokens 1000000000 --json\n"
               "  refinery funnel --config configs/demo.yaml --explain https://example.com/page",
    )
    p.add_argument("--config", required=True, help="the run's YAML config (e.g. configs/demo.yaml)")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of tables")
    p.add_argument(
        "--target-tokens",
        type=_positive(int),
        default=None,
        help=f"N in the budget (default: curriculum.total_tokens, else {DEFAULT_TARGET_TOKENS:,})",
    )
    p.add_argument("--bytes-per-token", type=_positive(float), default=None,
                   help="b_t in the budget (default: measured from the token shards, else the demo tokenizer's estimate)")
    p.add_argument("--explain", metavar="URL_OR_DOC_ID", default=None,
                   help="list every heuristic rule and custom filter that document fails, with its value and threshold")
    p.set_defaults(func=run, needs=READ_ONLY)
