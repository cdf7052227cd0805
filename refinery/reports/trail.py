"""One document's path through the funnel (what `refinery why URL_OR_DOC_ID` prints), read from what the
graph wrote.

For every stage the document reached, in funnel order (STEPS): kept, with what that stage added
(language and score, the near-duplicate cluster, the quality score, PII counts), or removed, with
the rule, the measured value and the threshold from the stage's rejects table. A dedup removal also
names the document kept instead, from the dedup decisions (exact drop lists, near-dup clusters and
their verified edges, keyed by the signature table's doc_key). A document that survives every stage
is located in the final shards (bucket, shard, token offset of each window, from the bucket's
`entries.parquet`), which is what `refinery lineage --shard S --offset N` takes, and any phase that
the contamination drop policy excluded it from is named.

A removal shows where to look in the text: for a heuristic rule the line its value comes from
(refinery/stages/heuristic/explain.py, `offending_excerpt`, on the document's text as the stage read
it), for any other stage the start of the text its reject row keeps.

Memory is bounded per query, never per file or corpus: every lookup reads only the rows that match
the document (`matching_rows`, refinery/stages/parquet_batches.py), one record batch (at most 10,000
rows of the columns read, never the text but a removed document's own) at a time, and row groups whose min/max statistics rule
the value out are not read at all. By doc_id: each stage table of its input file (the text table
and every attribute table of the chain), each rejects file, its signature table (doc ids are in
record order, so statistics prune to the row groups that can hold it); by doc_key: a signature
table, the exact drop lists (a streaming scan), the near-dup clusters and every band's edges (as src
or dst); by url: every `raw_documents` table and ingest's rejects, their url column streamed; a kept
document's windows: its bucket's final entry table, streamed (it is in shuffled order), after its
sha256 is checked against the index (once per bucket, hashed a chunk at a time). What a query holds
is then one batch plus the rows it names: the document's, and, for a url, those of every document
with that url. The one read that is not per document: the contamination drop policy's exclusion
lists (JSON, one per curriculum phase, read whole once), which hold the doc ids the policy removed,
a count set by how much of the corpus matches the eval sets, not by the corpus's size.

`DocumentTrail` keeps the rows it read, keyed by document, so a repeated query reads nothing again;
what it keeps grows with the queries asked, not with the tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from refinery.config import RefineryConfig
from refinery.documents import input_shards
from refinery.documents.tables import record_position
from refinery.layout import (ATTRIBUTE_STAGES, NEAR_CLUSTERS_KEY, bucket_entries_key, documents_key, exclusions_key,
                             final_index_key, kept_documents_key, near_edges_key, rejects_key, signatures_key)
from refinery.lineage import check_hash
from refinery.stages import registry
from refinery.stages.attributes import check_row_count
from refinery.stages.parquet_batches import matching_rows
from refinery.storage import DataRoot
from refinery.storage.damaged import DamagedTableError, reading_table

TOKENIZE_STAGE = "tokenized_shards"
EXACT_RULE_FAMILY = "exact_dedup/"
NEAR_RULE_FAMILY = "near_dedup/"
HEURISTIC_STAGE = "heuristic_filtered"
LANGUAGE_RULES_WITH_LANGUAGE = ("language/unwanted_language", "language/low_score")  # detail: the language


@dataclass(frozen=True)
class Step:
    """A funnel stage as `why` reads it: the kept documents of its survivors and its rejects table."""

    stage: str
    documents: str  # the stage whose kept documents are the survivors (for exact dedup: deduped's, after near too)
    rejects: str  # folder under rejects/ whose rows with `stage` == this stage are its removals


def funnel_steps() -> tuple[Step, ...]:
    """A step per verdict of the funnel (refinery/stages/registry.py), read from its stage's tables."""
    return tuple(Step(v.name, registry.stage_of(v.name).name, registry.stage_of(v.name).name)
                 for v in registry.verdicts())


STEPS = funnel_steps()
# What a kept document's row shows for a stage (the columns that stage adds).
STAGE_FACTS = registry.stage_facts()
IDENTITY_COLUMNS = ("doc_id", "url", "source", "bucket")
POSITION_COLUMNS = ("file", "record_index", "record_offset")  # where the record sits in its input file
REJECT_COLUMNS = ("doc_id", "url", "source", "bucket", "stage", "rule", "value", "detail", "excerpt")


def partition_of(doc_id: str) -> str:
    """The input file's partition key a doc_id starts with (`make_doc_id`: `<partition>/<record>`)."""
    return doc_id.rsplit("/", 1)[0]


def shard_name(bucket: str, number: int) -> str:
    """A final shard as `refinery lineage --shard` takes it."""
    return f"{bucket}/shard-{number:05d}"


class DocumentTrail:
    """`why` queries on one data root. It reads the rows of the documents asked about and keeps them,
    so a repeated query reads nothing again; what it keeps grows with the queries, not the tables."""

    def __init__(self, cfg: RefineryConfig, root: DataRoot):
        self.cfg, self.root = cfg, root
        self._written: dict[tuple[str, str], bool] = {}  # (stage, input file): its kept documents' table exists
        self._rows: dict[tuple[str, str, str], dict[str, Any] | None] = {}
        self._removals: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self._texts: dict[tuple[str, str, str], str | None] = {}  # a removed document's text, as a stage read it
        self._entries: dict[tuple[str, str], list[dict[str, Any]] | None] = {}
        self._checked_entries: set[str] = set()
        self._keys: dict[str, int] = {}
        self._ids_of_keys: dict[int, str] = {}
        self._dedup: dict[tuple[str, int], pl.DataFrame] = {}
        self._urls: dict[str, list[str]] = {}
        self._exclusions: dict[str, set[str]] | None = None
        self._shard_keys = [s.key for s in input_shards(cfg)]

    # ---- reads of one document's rows, kept ------------------------------------------------------

    def _matching(self, key: str, where: dict[str, Any], columns: list[str]) -> pl.DataFrame:
        """`matching_rows` of the table at `key`, a damaged table named."""
        path = self.root.local_path(key)
        with reading_table(path):
            return matching_rows(path, where, columns)

    def _materialized(self, folder: str, partition: str) -> bool:
        if (folder, partition) not in self._written:
            self._written[(folder, partition)] = self.root.exists(kept_documents_key(folder, partition))
        return self._written[(folder, partition)]

    def _row(self, folder: str, partition: str, doc_id: str) -> dict[str, Any] | None:
        """The identity and fact columns of `doc_id` among stage `folder`'s kept documents of
        `partition`, None when it kept no such document or the stage was not materialized. An
        attribute stage's row is its text table's row and that of every attribute table from there
        to `folder` (refinery/stages/attributes.py), each table's rows counted against its stats
        first, as `stage_batches` does; a document missing from one of them was not kept."""
        if (folder, partition, doc_id) not in self._rows:
            row: dict[str, Any] | None = None
            if self._materialized(folder, partition):
                chain = [folder]
                while chain[-1] in ATTRIBUTE_STAGES:
                    chain.append(ATTRIBUTE_STAGES[chain[-1]])
                tables = [(s, kept_documents_key(s, partition)) for s in reversed(chain)]
                if len(tables) > 1:
                    for stage, key in tables:
                        check_row_count(self.root, stage, partition, self.root.local_path(key))
                wanted = (*IDENTITY_COLUMNS, *POSITION_COLUMNS, *(c for cs in STAGE_FACTS.values() for c in cs))
                row = {}
                for _, key in tables:
                    path = self.root.local_path(key)
                    with reading_table(path):
                        names = set(pq.read_schema(path).names)
                    columns = ["doc_id", *(c for c in wanted if c in names and c not in row and c != "doc_id")]
                    found = self._matching(key, {"doc_id": doc_id}, columns)
                    if found.height == 0:
                        row = None
                        break
                    row.update(found.row(found.height - 1, named=True))
            self._rows[(folder, partition, doc_id)] = row
        return self._rows[(folder, partition, doc_id)]

    def _rejected(self, folder: str, partition: str, doc_id: str) -> list[dict[str, Any]]:
        """`doc_id`'s rows in rejects/<folder>/<partition> (none when the file does not exist)."""
        if (folder, partition, doc_id) not in self._removals:
            key = rejects_key(folder, partition)
            rows = (self._matching(key, {"doc_id": doc_id}, list(REJECT_COLUMNS)).to_dicts()
                    if self.root.exists(key) else [])
            self._removals[(folder, partition, doc_id)] = rows
        return self._removals[(folder, partition, doc_id)]

    def _final_entries(self, bucket: str, doc_id: str) -> list[dict[str, Any]] | None:
        """`doc_id`'s windows in the bucket's final shards, None before shuffled_shards ran. The
        table is checked against the sha256 its index records once per bucket (a streamed hash)."""
        if (bucket, doc_id) not in self._entries:
            key = bucket_entries_key("final", bucket)
            windows = None
            if self.root.exists(key):
                index_key = final_index_key(bucket)  # the table's sha256, recorded when the shards were written
                if bucket not in self._checked_entries and self.root.exists(index_key):
                    recorded = self.root.read_json(index_key).get("entries_table", {}).get("sha256", "")
                    check_hash(str(self.root.local_path(key)), recorded, self.root.display(index_key),
                               "materialize shuffled_shards again", DamagedTableError)
                self._checked_entries.add(bucket)
                windows = self._matching(key, {"doc_id": doc_id},
                                         ["shard", "start", "tokens", "window", "n_windows"]).to_dicts()
            self._entries[(bucket, doc_id)] = windows
        return self._entries[(bucket, doc_id)]

    def _doc_key(self, partition: str, doc_id: str) -> int:
        """Dedup's doc_key of `doc_id` (its input file's signature table)."""
        if doc_id not in self._keys:
            found = self._matching(signatures_key(partition), {"doc_id": doc_id}, ["doc_key"])
            self._keys[doc_id] = found["doc_key"][found.height - 1]
        return self._keys[doc_id]

    def _doc_id_of_key(self, doc_key: int) -> str:
        from refinery.global_steps.exact_dedup import ROW_BITS

        if doc_key not in self._ids_of_keys:
            partition = self._shard_keys[doc_key >> ROW_BITS]
            self._ids_of_keys[doc_key] = self._matching(signatures_key(partition), {"doc_key": doc_key},
                                                        ["doc_id"])["doc_id"][0]
        return self._ids_of_keys[doc_key]

    def _dedup_rows(self, name: str, doc_key: int) -> pl.DataFrame:
        """The document's rows of the exact drop lists, the near-dup clusters or their edges (as
        src or dst), every range and band read a batch at a time."""
        if (name, doc_key) not in self._dedup:
            from refinery.global_steps.dedup_compute import scan_exact_drops
            from refinery.global_steps.near_dedup import DedupSettings, band_keys

            if name == "exact":
                frame = (scan_exact_drops(self.cfg, self.root).filter(pl.col("doc_key") == doc_key)
                         .select("doc_key", "kept_doc_id", "group_size").collect(engine="streaming"))
            elif name == "clusters":
                frame = self._matching(NEAR_CLUSTERS_KEY, {"doc_key": doc_key},
                                       ["doc_key", "keeper_doc_id", "cluster_size"])
            else:
                bands = band_keys(DedupSettings.from_config(self.cfg).bands)
                frame = pl.concat([self._matching(near_edges_key(b), {"src": doc_key, "dst": doc_key},
                                                  ["src", "dst", "similarity"]) for b in bands])
            self._dedup[(name, doc_key)] = frame
        return self._dedup[(name, doc_key)]

    def _with_url(self, url: str) -> list[str]:
        """The doc_ids of every raw_documents table and ingest's rejects whose url is `url` (a
        rejected document's by its first reject row), each table streamed for that url alone."""
        if url not in self._urls:
            found: list[str] = []
            for partition in self._shard_keys:
                kept = (self._matching(documents_key("raw_documents", partition), {"url": url}, ["doc_id"])["doc_id"]
                        if self._materialized("raw_documents", partition) else pl.Series(dtype=pl.String))
                removed = (self._matching(rejects_key("raw_documents", partition), {"url": url}, ["doc_id"])["doc_id"]
                           if self.root.exists(rejects_key("raw_documents", partition)) else pl.Series(dtype=pl.String))
                for doc_id in dict.fromkeys([*kept.to_list(), *removed.to_list()]):
                    rejected = self._rejected("raw_documents", partition, doc_id)
                    if (rejected[0]["url"] if rejected else url) == url:
                        found.append(doc_id)
            self._urls[url] = found
        return self._urls[url]

    def _excluded_from(self, doc_id: str) -> list[str]:
        """The phases whose manifests the contamination drop policy took the document out of."""
        if self._exclusions is None:
            phases = [p.name for p in self.cfg.curriculum.phases] if self.cfg.curriculum is not None else []
            self._exclusions = {p: set(self.root.read_json(exclusions_key(p)))
                                for p in phases if self.root.exists(exclusions_key(p))}
        return [p for p, ids in self._exclusions.items() if doc_id in ids]

    # ---- queries ---------------------------------------------------------------------------------

    def doc_ids(self, key: str) -> list[str]:
        """The documents `key` names: itself when it is a doc_id, else every document with that url."""
        partition = partition_of(key)
        if partition in self._shard_keys and (
            self._row("raw_documents", partition, key) is not None or self._rejected("raw_documents", partition, key)
        ):
            return [key]
        return sorted(self._with_url(key))

    def trace(self, doc_id: str) -> dict[str, Any]:
        """The document's path: identity, one entry per stage it reached, and where it ended."""
        partition = partition_of(doc_id)
        identity = self._row("raw_documents", partition, doc_id) or \
            self._rejected("raw_documents", partition, doc_id)[0]
        out: dict[str, Any] = {k: identity[k] for k in IDENTITY_COLUMNS}
        if identity.get("file") is not None:  # a raw_documents row (an ingest reject has no position)
            out["record"] = f"{identity['file']} " + record_position(
                identity["file"], identity.get("record_index"), identity.get("record_offset"))
        out["stages"], out["removed"] = [], None
        for step in STEPS:
            if not self._materialized(step.documents, partition):
                out["stages"].append({"stage": step.stage, "status": "not materialized"})
                out["not_materialized"] = step.stage
                return out
            row = self._row(step.documents, partition, doc_id) or {}  # first, as a damaged table is refused first
            removals = [r for r in self._rejected(step.rejects, partition, doc_id) if r["stage"] == step.stage]
            if removals:
                removed = self._removal(removals[0], partition)
                out["stages"].append({"stage": step.stage, "status": "removed", **removed})
                out["removed"] = {"stage": step.stage, **removed}
                return out
            facts = {c: row[c] for c in STAGE_FACTS.get(step.stage, ()) if c in row}
            out["stages"].append({"stage": step.stage, "status": "kept", **facts})
        self._locate(out)
        return out

    def _locate(self, out: dict[str, Any]) -> None:
        """Tokenization's verdict and the final shard windows of a document every stage kept."""
        bucket, doc_id = out["bucket"], out["doc_id"]
        removals = self._rejected(TOKENIZE_STAGE, partition_of(doc_id), doc_id)  # tokenized per input file
        if removals:
            removed = self._removal(removals[0], partition_of(doc_id))
            out["stages"].append({"stage": TOKENIZE_STAGE, "status": "removed", **removed})
            out["removed"] = {"stage": TOKENIZE_STAGE, **removed}
            return
        entries = self._final_entries(bucket, doc_id)
        if entries is None:
            out["not_materialized"] = "shuffled_shards"
            return
        out["final_shards"] = [
            {"bucket": bucket, "shard": shard_name(bucket, e["shard"]), "offset": e["start"], "tokens": e["tokens"],
             "window": e["window"], "n_windows": e["n_windows"]}
            for e in entries
        ]
        out["excluded_from_phases"] = self._excluded_from(doc_id)

    def _text(self, folder: str, partition: str, doc_id: str) -> str | None:
        """The text of `doc_id` among stage `folder`'s kept documents (its text table's, for an
        attribute stage): one document's text, read when a removal is shown."""
        while folder in ATTRIBUTE_STAGES:
            folder = ATTRIBUTE_STAGES[folder]
        if (folder, partition, doc_id) not in self._texts:
            found = (self._matching(kept_documents_key(folder, partition), {"doc_id": doc_id}, ["doc_id", "text"])
                     if self._materialized(folder, partition) else pl.DataFrame())
            self._texts[(folder, partition, doc_id)] = found["text"][found.height - 1] if found.height else None
        return self._texts[(folder, partition, doc_id)]

    def _heuristic_excerpt(self, reject: dict[str, Any], partition: str) -> str | None:
        """Where a heuristic rule's value comes from in the text the stage read (the offending line,
        the most repeated one, or the text's start), by `offending_excerpt` with the rules of the
        document's language and source."""
        from refinery.stages.heuristic.explain import offending_excerpt
        from refinery.stages.heuristic.filter import HeuristicFilter

        upstream = registry.funnel_stage(HEURISTIC_STAGE).upstream
        text = self._text(upstream, partition, reject["doc_id"])
        if not text:
            return None
        rules_off = next((s.rules_off for s in self.cfg.sources if s.name == reject["source"]), [])
        language = (self._row(upstream, partition, reject["doc_id"]) or {}).get("language")
        return offending_excerpt(reject["rule"], text,
                                 HeuristicFilter(self.cfg.stages.heuristic, rules_off).rules_for(language))

    def _removal(self, reject: dict[str, Any], partition: str) -> dict[str, Any]:
        """A reject row as `why` shows it: rule, measured value, threshold, where in the text to look
        (the offending line for a heuristic rule, else the start of the text the stage read), and
        what was kept instead."""
        rule, value, detail = reject["rule"], reject["value"], reject["detail"]
        removed: dict[str, Any] = {"rule": rule, "value": value, "detail": detail}
        start = reject.get("excerpt")
        excerpt = f"text starts: {start!r}" if start else None
        if reject["stage"] == HEURISTIC_STAGE:  # its rules and custom filters put the threshold in detail
            removed["threshold"] = detail
            excerpt = self._heuristic_excerpt(reject, partition) or excerpt
        elif rule in LANGUAGE_RULES_WITH_LANGUAGE:
            lang = self.cfg.stages.language
            removed["language"] = detail
            removed["threshold"] = (
                f"score >= {lang.min_score:g}" if rule == "language/low_score"
                else f"languages: {', '.join(lang.languages) if lang.languages != 'all' else 'all'}"
            )
        elif rule.startswith(EXACT_RULE_FAMILY) and rule != "exact_dedup/null_text":
            removed.update(self._exact_duplicate(reject["doc_id"], partition))
        elif rule.startswith(NEAR_RULE_FAMILY):
            removed.update(self._near_duplicate(reject["doc_id"], partition))
        if excerpt:
            removed["excerpt"] = excerpt
        return removed

    def _kept_instead(self, doc_id: str | None) -> dict[str, Any]:
        if doc_id is None:
            return {"doc_id": None, "url": None}
        row = self._row("raw_documents", partition_of(doc_id), doc_id) or {}
        return {"doc_id": doc_id, "url": row.get("url")}

    def _exact_duplicate(self, doc_id: str, partition: str) -> dict[str, Any]:
        key = self._doc_key(partition, doc_id)
        [(_, kept, size)] = self._dedup_rows("exact", key).rows()
        return {"kept_instead": self._kept_instead(kept), "group_size": size,
                "threshold": "identical text after lowercasing and collapsing whitespace; the first copy in "
                             "source order is kept"}

    def _near_duplicate(self, doc_id: str, partition: str) -> dict[str, Any]:
        key = self._doc_key(partition, doc_id)
        [(_, keeper, size)] = self._dedup_rows("clusters", key).rows()
        # Clusters are unions of verified pairs: the keeper may be reached through other members, so
        # the measured value is the document's best verified similarity to any member.
        nearest = (self._dedup_rows("edges", key)
                   .select(pl.when(pl.col("src") == key).then("dst").otherwise("src").alias("other"), "similarity")
                   .sort("similarity", "other", descending=[True, False]).row(0, named=True))
        return {"kept_instead": self._kept_instead(keeper), "cluster_size": size,
                "value": float(nearest["similarity"]), "nearest": self._doc_id_of_key(nearest["other"]),
                "threshold": f"Jaccard similarity >= {self.cfg.stages.near_dedup.threshold:g}"}


def format_trail(t: dict[str, Any], config: str) -> str:
    """The trail for people; `config` is the path the follow-up commands it prints should name."""
    out = [f"doc_id {t['doc_id']}  url {t['url']}", f"source {t['source']}  bucket {t['bucket']}"]
    if t.get("record"):
        out.append(f"input  {t['record']}")
    for s in t["stages"]:
        if s["status"] == "kept":
            facts = "  ".join(f"{k} {_show(v)}" for k, v in s.items() if k not in ("stage", "status") and v is not None)
            out.append(f"  {s['stage']:<20} kept     {facts}".rstrip())
        elif s["status"] == "not materialized":
            out.append(f"  {s['stage']:<20} not materialized for this input file yet")
        else:
            value = "" if s["value"] is None else f"value {_show(s['value'])}, "
            if "language" in s:
                value = f"language {s['language']} (score {_show(s['value'])}), "
            why = f"threshold {s['threshold']}" if "threshold" in s else f"detail {s['detail']}"
            out.append(f"  {s['stage']:<20} REMOVED  {s['rule']}: {value}{why}")
            if s.get("excerpt"):
                out.append(f"  {'':<20}          {s['excerpt']}")
            if "kept_instead" in s:
                kept = s["kept_instead"]
                size = s.get("group_size") or s.get("cluster_size")
                nearest = f"; most similar member {s['nearest']}" if s.get("nearest") else ""
                out.append(f"  {'':<20}          kept instead: {kept['doc_id']} ({kept['url']}), "
                           f"one of {size} copies{nearest}")
    if t["removed"] is not None:
        if t["removed"]["stage"] == HEURISTIC_STAGE:
            out.append(f"every heuristic rule it fails: refinery funnel --config {config} --explain {t['doc_id']}")
    elif "not_materialized" in t:
        out.append(f"its path stops where the graph does: materialize {t['not_materialized']} to go on")
    else:
        shards = t["final_shards"]
        out.append(f"in the final shards of bucket {t['bucket']}: {len(shards)} window(s)")
        out += [f"  {w['shard']} offset {w['offset']} ({w['tokens']} tokens, window {w['window'] + 1} of "
                f"{w['n_windows']})" for w in shards]
        if shards:
            out.append(f"trace a token: refinery lineage --config {config} --shard {shards[0]['shard']} "
                       f"--offset {shards[0]['offset']}")
        if t["excluded_from_phases"]:
            out.append(f"excluded by the contamination drop policy from phase(s): {', '.join(t['excluded_from_phases'])}")
    return "\n".join(out)


def _show(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)
