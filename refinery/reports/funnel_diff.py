"""What a config change did to the funnel: two data roots' funnels side by side, with the difference
(the summary `refinery compare` prints before its file list).

Per stage, per bucket and per language: documents and bytes kept (the funnel report's figures,
refinery/reports/funnel.py). Per rule: the documents it removed as their first failing rule (the
stats' `dropped`, what `refinery funnel` counts) and the documents failing it at all (the rejects'
`failures`, every rule a dropped document fails), so a rule that takes over from another when a
threshold moves shows. Then the tokens of the final shards per bucket, and per phase and bucket
when there are phase manifests. Memory: one rejects file's rule columns at a time.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from refinery.layout import final_index_key, manifest_key, manifest_phase
from refinery.reports.funnel import format_table, language_retention, load_stage_totals, stage_order
from refinery.storage import DataRoot

RULE_COLUMNS = ("stage", "doc_id", "rule", "failures")  # what a rejects table is read for here


def rule_failures(root: DataRoot) -> dict[tuple[str, str], int]:
    """(stage, rule) -> documents failing the rule, over every rejects table; a table written before
    rejects listed every failure counts its first rule."""
    import polars as pl
    import pyarrow.parquet as pq

    counts: Counter = Counter()
    for key in root.list("rejects"):
        if not key.endswith(".parquet"):
            continue
        names = set(pq.read_schema(root.local_path(key)).names)
        table = root.read_parquet(key, columns=[c for c in RULE_COLUMNS if c in names])
        if "failures" in table.columns:
            # A document counts once per rule it fails.
            rules = (table.select("stage", "doc_id", "failures").explode("failures").drop_nulls("failures")
                     .select("stage", "doc_id", pl.col("failures").struct.field("rule").alias("rule")).unique())
        else:
            rules = table.select("stage", "doc_id", "rule")
        for stage, rule, n in rules.group_by("stage", "rule").len().iter_rows():
            counts[(stage, rule)] += n
    return dict(counts)


def shard_tokens(root: DataRoot) -> dict[str, Any]:
    """Tokens in the final shards per bucket, and per phase and bucket from the phase manifests."""
    buckets = {}
    for key in root.list("shards/final"):
        parts = key.split("/")
        if len(parts) == 4 and key == final_index_key(parts[2]):
            buckets[parts[2]] = sum(int(s["tokens"]) for s in root.read_json(key)["shards"])
    phases = {}
    for key in root.list("manifests"):
        phase = manifest_phase(key)
        if phase is not None and key == manifest_key(phase):
            phases[phase] = {b: int(s["tokens"]) for b, s in sorted(root.read_json(key)["buckets"].items())}
    return {"buckets": dict(sorted(buckets.items())), "phases": phases}


def funnel_side(root: DataRoot) -> dict[str, Any]:
    """One root's figures: kept documents and bytes per stage and per (bucket, stage), per
    (language, stage), removals per rule (first and failing) and shard tokens."""
    totals = load_stage_totals(root)
    stages = {name: {"docs": t.stats.docs_out, "bytes": t.stats.bytes_out} for name, t in totals.items()}
    buckets = {f"{bucket} {name}": {"docs": c.docs_out, "bytes": c.bytes_out}
               for name, t in totals.items() for bucket, c in sorted(t.stats.by_bucket.items())}
    languages = {f"{lang} {name}": {"docs": s["docs_out"], "bytes": s["bytes_out"]}
                 for lang, v in language_retention(root).items() for name, s in v["stages"].items()}
    first = {(name, rule): n for name, t in totals.items() for rule, n in t.stats.dropped.items()}
    failing = rule_failures(root)
    rules = {f"{stage} {rule}": {"first": first.get((stage, rule), 0), "failing": failing.get((stage, rule), 0)}
             for stage, rule in set(first) | set(failing)}
    return {"stages": stages, "buckets": buckets, "languages": languages, "rules": rules, "shards": shard_tokens(root)}


def _pair(a: dict[str, Any], b: dict[str, Any], fields: tuple[str, ...], order: list[str]) -> list[dict[str, Any]]:
    zero = {f: 0 for f in fields}
    return [{"name": name, **{f"{side}_{f}": cell.get(name, zero)[f] for side, cell in (("a", a), ("b", b))
                              for f in fields}} for name in order]


def _ordered(names: set[str]) -> list[str]:
    """`<group> <stage>` names by group, then in funnel order."""
    groups: dict[str, list[str]] = {}
    for name in names:
        group, _, stage = name.rpartition(" ")
        groups.setdefault(group, []).append(stage)
    return [f"{g} {s}" if g else s for g in sorted(groups) for s in stage_order(groups[g])]


def funnel_difference(root_a: DataRoot, root_b: DataRoot) -> dict[str, Any]:
    """Both roots' funnels side by side: per stage, bucket and language (docs and bytes kept), per
    rule (removed first, failing at all), shard tokens per bucket and phase; JSON-ready."""
    a, b = funnel_side(root_a), funnel_side(root_b)
    out: dict[str, Any] = {}
    for part in ("stages", "buckets", "languages"):
        names = set(a[part]) | set(b[part])
        order = stage_order(list(names)) if part == "stages" else _ordered(names)
        out[part] = _pair(a[part], b[part], ("docs", "bytes"), order)
    rules = set(a["rules"]) | set(b["rules"])
    stages = stage_order(list({name.split(" ")[0] for name in rules}))
    out["rules"] = _pair(a["rules"], b["rules"], ("first", "failing"),
                         sorted(rules, key=lambda n: (stages.index(n.split(" ")[0]), n)))
    buckets = sorted(set(a["shards"]["buckets"]) | set(b["shards"]["buckets"]))
    out["shard_tokens"] = [{"name": bucket, "a_tokens": a["shards"]["buckets"].get(bucket, 0),
                            "b_tokens": b["shards"]["buckets"].get(bucket, 0)} for bucket in buckets]
    phases = list(a["shards"]["phases"]) + [p for p in b["shards"]["phases"] if p not in a["shards"]["phases"]]
    out["phase_tokens"] = [
        {"name": f"{phase} {bucket}", "a_tokens": a["shards"]["phases"].get(phase, {}).get(bucket, 0),
         "b_tokens": b["shards"]["phases"].get(phase, {}).get(bucket, 0)}
        for phase in phases
        for bucket in sorted(set(a["shards"]["phases"].get(phase, {})) | set(b["shards"]["phases"].get(phase, {})))]
    return out


def _change(a: int, b: int) -> str:
    return "=" if a == b else f"{b - a:+,}"


def _table(title: str, rows: list[dict[str, Any]], fields: tuple[str, ...], changed_only: bool) -> list[str]:
    """A titled table of `rows`, each field as A, B and the change (with `changed_only`, the rows that moved)."""
    if not rows:
        return []
    shown = [r for r in rows if not changed_only or any(r[f"a_{f}"] != r[f"b_{f}"] for f in fields)]
    header = ["", *(f"{f} {side}" for f in fields for side in ("A", "B", "change"))]
    body = [[r["name"], *(cell for f in fields for cell in (f"{r[f'a_{f}']:,}", f"{r[f'b_{f}']:,}",
                                                           _change(r[f"a_{f}"], r[f"b_{f}"])))] for r in shown]
    out = ["", title]
    out += [format_table(header, body)] if body else ["  no difference"]
    if changed_only and len(shown) < len(rows):
        out.append(f"  ({len(rows) - len(shown):,} unchanged row(s) left out)")
    return out


def format_difference(diff: dict[str, Any]) -> list[str]:
    """The summary as text: every stage; the buckets, languages, rules and tokens that moved."""
    out = ["Funnel, A -> B (documents and bytes kept after each stage)"]
    kept = ("docs", "bytes")
    out += _table("Per stage", diff["stages"], kept, False)[1:]
    out += _table("Per bucket and stage (changed rows)", diff["buckets"], kept, True)
    out += _table("Per language and stage, from language ID on (changed rows)", diff["languages"], kept, True)
    out += _table("Removals per stage and rule (first: documents it removed as their first failing rule, as "
                  "`refinery funnel` counts; failing: documents failing it at all)", diff["rules"],
                  ("first", "failing"), True)
    out += _table("Tokens in the final shards per bucket", diff["shard_tokens"], ("tokens",), False)
    out += _table("Tokens per phase and bucket (phase manifests)", diff["phase_tokens"], ("tokens",), False)
    return out
