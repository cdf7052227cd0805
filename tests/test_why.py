"""`refinery why`: a document's path through the funnel on a crafted data root (helpers/funnel_trail.py),
for a document removed by language ID, by a heuristic rule, by exact and near dedup, and one kept."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers.funnel_trail import write_trail_corpus
from orchestration.cli import main
from refinery.config import load_config
from refinery.reports.trail import DocumentTrail

KEPT_PATH = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "exact_deduped",
             "near_deduped", "quality_scored", "pii_redacted"]


@pytest.fixture(scope="module")
def trail(tmp_path_factory):
    return write_trail_corpus(tmp_path_factory.mktemp("why"))


def why_json(trail, key: str, capsys) -> list[dict]:
    assert main(["why", key, "--config", str(trail.config), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def statuses(t: dict) -> list[tuple[str, str]]:
    return [(s["stage"], s["status"]) for s in t["stages"]]


def test_a_language_dropped_url_names_the_language_score_and_threshold(trail, capsys):
    [t] = why_json(trail, trail.urls["a/1"], capsys)
    assert statuses(t) == [("raw_documents", "kept"), ("extracted_text", "kept"), ("language_filtered", "removed")]
    assert t["removed"] == {"stage": "language_filtered", "rule": "language/unwanted_language", "value": 0.93,
                            "detail": "fr", "language": "fr", "threshold": "languages: en, de",
                            "excerpt": "text starts: 'Le port se réveille lentement quand les bateaux de pêche "
                                       "reviennent avec la marée.'"}
    [t] = why_json(trail, trail.doc_ids["b/2"], capsys)
    assert (t["removed"]["rule"], t["removed"]["value"], t["removed"]["threshold"]) == ("language/low_score", 0.4, "score >= 0.65")
    assert main(["why", trail.urls["a/1"], "--config", str(trail.config)]) == 0
    out = capsys.readouterr().out
    assert "language_filtered    REMOVED  language/unwanted_language: language fr (score 0.93), threshold languages: en, de" in out


def test_a_heuristic_dropped_url_names_the_rule_value_and_threshold(trail, capsys):
    [t] = why_json(trail, trail.urls["a/2"], capsys)
    assert statuses(t)[-1] == ("heuristic_filtered", "removed") and len(t["stages"]) == 4
    assert t["stages"][2] == {"stage": "language_filtered", "status": "kept", "language": "en", "language_score": 0.9}
    assert t["removed"] == {"stage": "heuristic_filtered", "rule": "gopher_quality/min_words", "value": 3.0,
                            "detail": "< 50", "threshold": "< 50", "excerpt": "text starts: 'Buy now cheap'"}
    assert main(["why", trail.urls["a/2"], "--config", str(trail.config)]) == 0
    out = capsys.readouterr().out
    assert "gopher_quality/min_words: value 3, threshold < 50\n" + " " * 32 + "text starts: 'Buy now cheap'" in out
    assert f"refinery funnel --config {trail.config} --explain {trail.doc_ids['a/2']}" in out


def man_page_with(line: str, at: int) -> str:
    """coreutils' cmp(1) from data/multilingual (a page every heuristic rule keeps) with `line`
    inserted as line `at` (from 1)."""
    path = Path(__file__).resolve().parents[1] / "data" / "multilingual" / "clean.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = next(p for p in map(json.loads, f) if p["url"] == "man://en/cmp.1")["text"].split("\n")
    return "\n".join(lines[:at - 1] + [line] + lines[at - 1:])


def test_why_on_a_curly_bracket_removal_shows_the_line(tmp_path, capsys):
    line = "A template may say cmp {first} {second} where the two file names go, as the examples do."
    trail = write_trail_corpus(tmp_path, heuristic_text=man_page_with(line, 30))
    [t] = why_json(trail, trail.urls["a/2"], capsys)
    assert (t["removed"]["rule"], t["removed"]["value"]) == ("c4/curly_bracket", 30.0)  # the line's number
    assert t["removed"]["threshold"] == f"'{{' in a line that is not code: {line!r}"
    assert main(["why", trail.urls["a/2"], "--config", str(trail.config)]) == 0
    assert f"REMOVED  c4/curly_bracket: value 30, threshold '{{' in a line that is not code: {line!r}" in capsys.readouterr().out


def test_why_on_a_line_rule_removal_shows_the_first_offending_line(tmp_path, capsys):
    """Gopher's bullet-line ratio is measured over every line; `why` names the first bullet line."""
    options = ["Options of the harbour tool, each given before the file name:"]
    options += [f"--tide-{i} NAME   the boat that leaves on tide {i}, by its registered name" for i in range(1, 30)]
    trail = write_trail_corpus(tmp_path, heuristic_text="\n".join(options))
    [t] = why_json(trail, trail.urls["a/2"], capsys)
    assert (t["removed"]["rule"], t["removed"]["value"]) == ("gopher_quality/bullet_lines_ratio", 29 / 30)
    assert t["removed"]["excerpt"] == f"first bullet line (line 2): {options[1]!r}"
    assert main(["why", trail.urls["a/2"], "--config", str(trail.config)]) == 0
    assert f"first bullet line (line 2): {options[1]!r}" in capsys.readouterr().out


def test_dedup_dropped_documents_name_the_document_kept_instead(trail, capsys):
    # a/0 and its exact copy b/0 share a url: the answer covers both
    kept, copy = why_json(trail, trail.urls["b/0"], capsys)
    assert (kept["doc_id"], copy["doc_id"]) == (trail.doc_ids["a/0"], trail.doc_ids["b/0"])
    assert kept["removed"] is None and statuses(copy)[-1] == ("exact_deduped", "removed")
    exact = copy["removed"]
    assert (exact["rule"], exact["group_size"]) == ("exact_dedup/duplicate", 2)
    assert exact["kept_instead"] == {"doc_id": trail.doc_ids["a/0"], "url": trail.urls["a/0"]}

    [t] = why_json(trail, trail.urls["b/1"], capsys)
    near = t["removed"]
    assert statuses(t)[-2:] == [("exact_deduped", "kept"), ("near_deduped", "removed")]
    assert (near["rule"], near["cluster_size"], near["threshold"]) == ("near_dedup/duplicate", 2, "Jaccard similarity >= 0.8")
    assert 0.8 <= near["value"] < 1.0 and near["nearest"] == trail.doc_ids["a/4"]
    assert near["kept_instead"] == {"doc_id": trail.doc_ids["a/4"], "url": trail.urls["a/4"]}
    assert main(["why", trail.urls["b/1"], "--config", str(trail.config)]) == 0
    assert f"kept instead: {trail.doc_ids['a/4']} ({trail.urls['a/4']}), one of 2 copies" in capsys.readouterr().out


def test_a_kept_url_shows_every_stage_and_where_its_tokens_are(trail, capsys):
    [t] = why_json(trail, trail.urls["a/4"], capsys)
    assert statuses(t) == [(s, "kept") for s in KEPT_PATH] and t["removed"] is None
    assert t["stages"][5] == {"stage": "near_deduped", "status": "kept", "dup_cluster": trail.doc_ids["a/4"],
                              "dup_cluster_size": 2}
    assert t["final_shards"] == [{"bucket": "web", "shard": "web/shard-00001", "offset": 0, "tokens": 16, "window": 0,
                                  "n_windows": 1}]
    [t] = why_json(trail, trail.doc_ids["a/0"], capsys)
    assert [(w["shard"], w["offset"], w["tokens"]) for w in t["final_shards"]] == [("web/shard-00000", 0, 40),
                                                                                 ("web/shard-00001", 16, 24)]
    assert main(["why", trail.doc_ids["a/0"], "--config", str(trail.config)]) == 0
    out = capsys.readouterr().out
    assert "web/shard-00001 offset 16 (24 tokens, window 2 of 2)" in out
    assert f"refinery lineage --config {trail.config} --shard web/shard-00000 --offset 0" in out


def test_a_document_removed_before_language_id_and_an_unknown_one(trail, capsys):
    [t] = why_json(trail, trail.doc_ids["a/5"], capsys)
    assert t["removed"] == {"stage": "extracted_text", "rule": "extract/empty_text", "value": None,
                            "detail": "no text after extraction"}
    assert main(["why", "https://nowhere.example/", "--config", str(trail.config)]) == 1
    assert "no document with doc_id or url 'https://nowhere.example/'" in capsys.readouterr().err


def test_queries_after_the_first_read_no_table_again(trail, monkeypatch):
    """What makes a repeated query take milliseconds: a document's rows, once found, are kept, so a
    repeated query reads no table again."""
    lookups = DocumentTrail(load_config(trail.config), trail.root)
    keys = [trail.urls[d] for d in ("a/1", "a/2", "b/1", "a/4")] + [trail.doc_ids["b/0"]]
    first = [[lookups.trace(d) for d in lookups.doc_ids(key)] for key in keys]

    def no_reads(*args, **kwargs):
        raise AssertionError(f"read again: {args}")

    monkeypatch.setattr(type(trail.root), "read_parquet", no_reads)
    monkeypatch.setattr(type(trail.root), "read_json", no_reads)
    monkeypatch.setattr("refinery.reports.trail.matching_rows", no_reads)
    monkeypatch.setattr("refinery.reports.trail.pq.ParquetFile", no_reads)
    assert [[lookups.trace(d) for d in lookups.doc_ids(key)] for key in keys] == first


def one_line_refusal(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_a_truncated_attribute_table_is_one_line_naming_it(tmp_path, capsys):
    """Issue 38: a truncated attribute table gave a pyarrow traceback with no file path, in `why`
    and `funnel` alike."""
    from refinery.layout import attributes_key

    t = write_trail_corpus(tmp_path)
    partition = t.doc_ids["a/0"].rsplit("/", 1)[0]
    table = t.root.local_path(attributes_key("language_filtered", partition))
    table.write_bytes(table.read_bytes()[:-40])
    for argv in (["why", t.doc_ids["a/0"], "--config", str(t.config)],
                 ["funnel", "--config", str(t.config), "--explain", t.doc_ids["a/0"]]):
        err = one_line_refusal(capsys, argv)
        assert err.startswith(f"refinery {argv[0]}: {table}: not a readable table (") and \
            err.endswith("; it changed after it was written: materialize the asset that writes it again\n"), err


def test_a_row_removed_from_an_upstream_table_is_blamed_on_that_table(tmp_path, capsys):
    """Issue 38: a row removed from a language_filtered table was blamed on heuristic_filtered (the
    attribute table that narrows it). Each table's rows are checked against what its stage recorded
    writing (stats docs_out)."""
    import polars as pl

    from refinery.layout import attributes_key, stats_key

    t = write_trail_corpus(tmp_path)
    partition = t.doc_ids["a/0"].rsplit("/", 1)[0]
    key = attributes_key("language_filtered", partition)
    table = pl.read_parquet(t.root.local_path(key))
    for stage in ("language_filtered", "heuristic_filtered"):  # what the funnel's steps record
        rows = pl.read_parquet(t.root.local_path(attributes_key(stage, partition))).height
        t.root.write_json(stats_key(stage, partition), {"stage": stage, "docs_out": rows})
    t.root.write_parquet(key, table.filter(pl.col("doc_id") != t.doc_ids["a/3"]))
    err = one_line_refusal(capsys, ["why", t.doc_ids["a/0"], "--config", str(t.config)])
    assert err == (f"refinery why: {t.root.local_path(key)}: {table.height - 1} rows, but language_filtered wrote "
                   f"{table.height} ({t.root.display(stats_key('language_filtered', partition))}); the table changed "
                   f"after it was written: materialize language_filtered again\n")


def test_final_shard_locations_from_a_changed_entry_table_are_refused(tmp_path, capsys):
    """Issue 38: a `why` answer is checked against the hashes the index records: the bucket's
    entry table (where a kept document's windows are) against its index.json."""
    from refinery.layout import bucket_entries_key

    t = write_trail_corpus(tmp_path)
    table = t.root.local_path(bucket_entries_key("final", "web"))
    raw = bytearray(table.read_bytes())
    raw[len(raw) // 2] ^= 1
    table.write_bytes(bytes(raw))
    err = one_line_refusal(capsys, ["why", t.doc_ids["a/0"], "--config", str(t.config)])
    assert err == (f"refinery why: {table}: content hash does not match {t.root.display('shards/final/web/index.json')}; "
                   f"the file changed after it was written; materialize shuffled_shards again\n")


def test_a_query_reads_only_the_row_groups_that_can_hold_its_documents(tmp_path, monkeypatch, capsys):
    """Scale: at 15 billion documents a query about one must not read a stage's table, a file's
    rejects or signatures, a bucket's entry table or the dedup decisions into memory. Every table
    here has one row per row group: no whole-table reader may run, every read is one row group, and
    of the tables in record order (doc ids sorted) only the row groups holding a document the answer
    names are read. The answers are those of the same rows in one row group each."""
    import polars as pl
    import pyarrow.parquet as pq

    from helpers.funnel_trail import one_row_per_row_group
    from refinery.stages import attributes
    from refinery.storage.base import DataRoot

    t = write_trail_corpus(tmp_path)
    queries = [[*cmd, key, "--config", str(t.config)] for key in [*t.doc_ids.values(), t.urls["a/0"], t.urls["b/1"]]
               for cmd in (["why"], ["why", "--json"], ["funnel", "--explain"])]

    def answers() -> list[tuple[int, str, str]]:
        return [(main(argv), *capsys.readouterr()) for argv in queries]

    expected = answers()
    one_row_per_row_group(t)

    def whole_table(*args, **kwargs):
        raise AssertionError(f"a whole table read for one document: {args}")

    for owner, name in ((pl, "read_parquet"), (pq, "read_table"), (DataRoot, "read_parquet"),
                        (attributes, "read_stage_documents")):
        monkeypatch.setattr(owner, name, whole_table)
    reads: list[tuple[str, tuple[int, ...]]] = []

    class RecordedFile(pq.ParquetFile):
        def __init__(self, source, **kwargs):
            super().__init__(source, **kwargs)
            self.source_path = str(source)

        def iter_batches(self, *args, row_groups=None, **kwargs):
            reads.append((self.source_path, tuple(row_groups or range(self.num_row_groups))))
            return super().iter_batches(*args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", RecordedFile)
    assert answers() == expected
    assert reads and all(len(groups) == 1 for _, groups in reads)

    in_record_order = ("documents/", "attributes/", "rejects/", "dedup/signatures/")
    for doc_id in t.doc_ids.values():
        reads.clear()
        assert main(["why", doc_id, "--config", str(t.config), "--json"]) == 0
        [answer] = json.loads(capsys.readouterr().out)
        removed = answer["removed"] or {}
        named = {doc_id, removed.get("nearest"), (removed.get("kept_instead") or {}).get("doc_id")}
        ordered = [(path, group) for path, [group] in reads
                   if any(f"/{folder}" in path.removeprefix(str(t.root.root)) for folder in in_record_order)]
        assert ordered
        for path, group in ordered:
            ids = set(pq.ParquetFile(path).read_row_group(group, columns=["doc_id"]).column("doc_id").to_pylist())
            assert ids & named, (doc_id, path, group, ids)


def test_the_same_answers_from_an_s3_data_root(trail, tmp_path, moto_s3):
    """The per-document reads go through the root's local copies (`local_path`), so an S3 data root
    answers every query as the local one does."""
    from refinery.storage.s3 import S3DataRoot

    s3 = S3DataRoot("s3://bkt/why", cache_dir=tmp_path / "cache")
    for path in sorted(p for p in trail.root.root.rglob("*") if p.is_file()):
        s3.write_bytes(str(path.relative_to(trail.root.root)), path.read_bytes())
    cfg = load_config(trail.config)
    local, remote = DocumentTrail(cfg, trail.root), DocumentTrail(cfg, s3)
    keys = [*trail.doc_ids.values(), trail.urls["a/0"]]
    assert [[remote.trace(d) for d in remote.doc_ids(k)] for k in keys] == \
        [[local.trace(d) for d in local.doc_ids(k)] for k in keys]


def test_the_input_record_is_labelled_by_what_its_number_is(trail, capsys):
    [t] = why_json(trail, trail.urls["a/2"], capsys)
    assert t["record"] == "a.jsonl line record 2, at byte 0 of the decompressed text"
    assert main(["why", trail.urls["a/2"], "--config", str(trail.config)]) == 0
    assert "input  a.jsonl line record 2, at byte 0 of the decompressed text" in capsys.readouterr().out
