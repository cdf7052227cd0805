"""Lineage from a token in a final (or tokenized) shard back to its document: round trips on 200
random positions, exactly-once at rest, the per-input-file and per-shard files of the index,
byte-identical rebuilds, and clear errors for bad queries and changed shards."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from refinery import layout
from refinery.global_steps import tokenize as tk
from refinery import lineage as lin
from refinery import lineage_index as lindex
from orchestration.cli import COMMAND_MODULES, main
from refinery.documents import CLEAN_STAGE, input_shards
from refinery.layout import documents_key
from refinery.shard_format import ShardFormatError, ShardReader
from helpers.corpus import make_corpus, series_indexes, shuffle, token_bytes, tokenize_all

CONTEXT_TOKENS = 12


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    c = make_corpus(tmp_path_factory.mktemp("lineage"), docs_per_shard={"web/a": 120, "web/b": 80, "math/m": 50},
                    empty_docs=2)
    tokenize_all(c)
    for bucket in c.cfg.buckets:
        shuffle(c, bucket, c.cfg.seed, c.cfg.shards.shard_tokens, c.cfg.shards.shuffle_buffer_mb)
    lindex.build_lineage_index(c.root, c.cfg)
    return c


def shard_refs(c, stage: str) -> list[dict]:
    return [ref for b in c.cfg.buckets for index in series_indexes(c, stage, b) for ref in index["shards"]]


def bucket_entry_doc_ids(c, stage: str, bucket: str) -> list[str]:
    """The doc_id of each entry of a bucket, numbered as a lineage query numbers them: its final shards'
    entries, or its files' tokenized series one after another in input order."""
    return [doc_id for index in series_indexes(c, stage, bucket)
            for doc_id in c.root.read_parquet(index["entries_table"]["key"])["doc_id"].to_list()]


def read_arrow(c, key: str) -> pl.DataFrame:
    import pyarrow as pa

    return pl.from_arrow(pa.ipc.open_file(str(c.root.local_path(key))).read_all())


def read_rows(c, key: str, entries: int) -> pl.DataFrame:
    """Every row of a lineage rows file, read one at a time as a query reads it."""
    path = c.root.local_path(key)
    rows = [lindex.read_row(path, i) for i in range(entries)]
    with pytest.raises(lindex.LineageError, match=f"row {entries} asked of {entries}"):
        lindex.read_row(path, entries)
    return pl.DataFrame(rows)


def reader_of(c, prefix: str) -> ShardReader:
    return ShardReader(c.root.local_path(prefix + ".idx").with_suffix(""))


@pytest.mark.parametrize("stage", [tk.FINAL, tk.TOKENIZED])
def test_200_random_tokens_trace_back_to_text_of_their_document(built, stage):
    c = built
    table = token_bytes(tk.read_tokenizer(c.root, c.cfg.tokenizer.eod_token))
    refs = shard_refs(c, stage)
    total = sum(r["tokens"] for r in refs)
    starts = np.cumsum([0] + [r["tokens"] for r in refs])
    entry_doc_ids = {b: bucket_entry_doc_ids(c, stage, b) for b in c.cfg.buckets}
    rng = random.Random(11)
    checked_bytes = 0
    for _ in range(200):
        g = rng.randrange(total)
        s = int(np.searchsorted(starts, g, side="right") - 1)
        ref, offset = refs[s], g - int(starts[s])
        name = ref["prefix"].removeprefix("shards/final/") if stage == tk.FINAL else ref["prefix"]
        r = lin.resolve_token(c.root, c.cfg, name, offset)
        assert r["shard"] == ref["prefix"] and r["entry_start"] <= offset < r["entry_end"]
        tokens = reader_of(c, ref["prefix"]).tokens
        lo = max(r["entry_start"], offset - CONTEXT_TOKENS)  # never across the entry's edges
        hi = min(r["entry_end"], offset + CONTEXT_TOKENS + 1)
        window_bytes = b"".join(table[t] for t in tokens[lo:hi])
        text = c.texts[r["doc_id"]]
        assert window_bytes in text.encode(), (r["doc_id"], window_bytes)
        if window_bytes.decode("utf-8", errors="ignore").strip():
            checked_bytes += len(window_bytes)
        assert r["bucket"] == c.buckets[r["doc_id"]]
        assert r["url"] == f"https://{r['source']}.example/{int(r['doc_id'].rsplit('/', 1)[1]) // 3}"
        assert r["record_offset"] == int(r["doc_id"].rsplit("/", 1)[1]) // 3 * 1000
        assert r["token_id"] == int(tokens[offset])
        assert entry_doc_ids[r["bucket"]][r["bucket_entry"]] == r["doc_id"]
    assert checked_bytes > 200 * 10


def test_every_surviving_document_is_at_rest_exactly_once(built):
    c = built
    seen: dict[str, list[int]] = {}
    n_windows: dict[str, int] = {}
    entries = 0
    for ref in shard_refs(c, tk.FINAL):
        for row in reader_of(c, ref["prefix"]).entries.iter_rows(named=True):
            seen.setdefault(row["doc_id"], []).append(row["window"])
            n_windows[row["doc_id"]] = row["n_windows"]
            entries += 1
    surviving = {d for d, t in c.texts.items() if t}
    assert set(seen) == surviving
    assert len(seen) == 250 - 3 * 2  # two empty texts per input shard are rejected
    for doc, windows in seen.items():
        assert sorted(windows) == list(range(n_windows[doc])), doc
    assert entries == sum(n_windows.values()) > len(seen)
    assert entries == sum(c.root.read_json(layout.shard_index_key(tk.FINAL, b))["entries"] for b in c.cfg.buckets)


def test_lineage_reports_each_funnel_stage(built):
    c = built
    ref = c.root.read_json(layout.shard_index_key(tk.FINAL, "math"))["shards"][0]
    r = lin.resolve_token(c.root, c.cfg, "math/shard-00000", 0)
    doc_index = int(r["doc_id"].rsplit("/", 1)[1]) // 3
    funnel = r["funnel"]
    assert list(funnel)[:3] == ["raw_documents", "extracted_text", "language_filtered"]
    assert funnel["heuristic_filtered"]["outcome"] == "skipped by source"  # math skips heuristics
    assert funnel["language_filtered"] == {"outcome": "kept", "language": "en",
                                           "language_score": pytest.approx(0.9 + (doc_index % 10) / 100)}
    assert funnel["near_deduped"] == {"outcome": "kept", "dup_cluster": None, "dup_cluster_size": 1}
    assert 0.0 <= funnel["quality_scored"]["quality_score"] <= 1.0
    assert funnel["pii_redacted"]["pii_counts"] == {"email": doc_index % 3, "phone": 0}
    assert r["position_in_entry"] == 0 and r["entry"] == 0 and ref["prefix"] == r["shard"]


def test_overlap_prefix_is_flagged(built):
    c = built
    for ref in shard_refs(c, tk.FINAL):
        reader = reader_of(c, ref["prefix"])
        hits = np.flatnonzero(reader.overlaps > 0)
        if len(hits):
            i = int(hits[0])
            first = lin.resolve_token(c.root, c.cfg, ref["prefix"], int(reader.offsets[i]))
            after = lin.resolve_token(c.root, c.cfg, ref["prefix"], int(reader.offsets[i]) + int(reader.overlaps[i]))
            assert first["in_overlap_prefix"] and not after["in_overlap_prefix"] and first["window"] > 0
            return
    pytest.fail("no windowed entry in the corpus")


@pytest.mark.parametrize(
    "shard, offset, message",
    [
        ("web/shard-00000", 10**9, "outside shard shards/final/web/shard-00000"),
        ("web/shard-00000", -1, "outside shard"),
        ("web/shard-00999", 0, "unknown shard; bucket 'web' has"),
        ("books/shard-00000", 0, "unknown bucket 'books'"),
        ("web/shard-0", 0, "not a shard name"),
        ("shards/raw/web/shard-00000", 0, "unknown shard stage 'raw'"),
        ("shards/tokenized/web/shard-00000", 0, "shards/tokenized/<bucket>/<file>/shard-NNNNN"),
        ("shards/final/web/web-a/shard-00000", 0, "shards/final/<bucket>/shard-NNNNN"),
        ("shards/tokenized/web/web-z/shard-00000", 0, "no tokenized shards for bucket 'web' and input file 'web-z'"),
        ("shards/tokenized/web/web-a/shard-00999", 0, "unknown shard; bucket 'web' input file 'web-a' has"),
    ],
)
def test_queries_outside_the_shards_are_clear_errors(built, shard, offset, message):
    with pytest.raises(lindex.LineageError, match=message):
        lin.resolve_token(built.root, built.cfg, shard, offset)


def test_changed_shard_index_is_detected(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 30, "web/b": 10, "math/m": 5})
    tokenize_all(c)
    for bucket in c.cfg.buckets:
        shuffle(c, bucket, c.cfg.seed, 1024, 1)
    lindex.build_lineage_index(c.root, c.cfg)
    idx = c.root.local_path("shards/final/web/shard-00000.idx")
    raw = bytearray(idx.read_bytes())
    raw[-4] ^= 1  # the low byte of the last overlap length: still a well-formed index
    idx.write_bytes(bytes(raw))
    with pytest.raises(ShardFormatError, match="content hash does not match"):
        lin.resolve_token(c.root, c.cfg, "web/shard-00000", 0)
    with pytest.raises(ShardFormatError, match="does not match the manifest"):
        lindex.build_lineage_index(c.root, c.cfg)


def test_missing_lineage_index_says_what_to_materialize(tmp_path):
    c = make_corpus(tmp_path)
    with pytest.raises(lindex.LineageError, match="materialize the `lineage_index` asset"):
        lin.resolve_token(c.root, c.cfg, "web/shard-00000", 0)


def test_documents_parts_are_per_input_file_sorted_and_text_free(built):
    c = built
    index = c.root.read_json(layout.LINEAGE_INDEX_KEY)
    doc_ids = []
    for shard in input_shards(c.cfg):
        part = read_arrow(c, lin.documents_part_key(shard.key))
        assert "text" not in part.columns and "text_bytes" in part.columns
        assert part["record_index"].to_list() == sorted(part["record_index"])
        assert all(d.startswith(shard.key + "/") for d in part["doc_id"])
        doc_ids += part["doc_id"].to_list()
    assert sorted(doc_ids) == sorted(c.texts)  # every clean document, rejected-at-tokenize included
    assert index["documents"] == len(doc_ids) == 250 and index["documents_parts"] == 3
    assert "text" not in index["columns"] and "text_bytes" in index["columns"]


def test_each_final_shard_has_a_lineage_file_of_its_own_entries(built):
    c = built
    index = c.root.read_json(layout.LINEAGE_INDEX_KEY)
    windowed = 0
    for bucket in c.cfg.buckets:
        refs = c.root.read_json(layout.shard_index_key(tk.FINAL, bucket))["shards"]
        listing = c.root.read_json(lin.bucket_lineage_key(bucket))
        assert [s["shard"] for s in listing["shards"]] == [r["prefix"] for r in refs]
        assert index["buckets"][bucket]["shards"] == len(refs)
        for ref, listed in zip(refs, listing["shards"]):
            rows = read_rows(c, lin.shard_lineage_key(ref["prefix"]), ref["entries"])
            side = reader_of(c, ref["prefix"]).entries
            assert listed["entries"] == rows.height == ref["entries"] == side.height
            assert rows.select("doc_id", "window", "n_windows").equals(side.select("doc_id", "window", "n_windows"))
            assert rows.columns == lindex.ENTRY_COLUMNS + index["columns"]
            assert [c.buckets[d] for d in rows["doc_id"]] == [bucket] * rows.height
            assert rows["text_bytes"].to_list() == [len(c.texts[d].encode()) for d in rows["doc_id"]]
            assert listed["bytes"] == c.root.local_path(listed["key"]).stat().st_size
            # A document's columns are stored once, however many of the shard's entries are its windows.
            assert listed["documents"] == rows["doc_id"].n_unique()
            raw = c.root.local_path(listed["key"]).read_bytes()
            _, _, documents, entries, _ = lindex.ROWS_TRAILER.unpack(raw[-lindex.ROWS_TRAILER.size:])
            assert (documents, entries) == (listed["documents"], ref["entries"])
            windowed += listed["entries"] - listed["documents"]
    assert windowed > 0  # the corpus has documents of several windows, so the saving is tested


def test_rebuild_is_byte_identical_and_drops_stale_files(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 30, "web/b": 10, "math/m": 5})
    tokenize_all(c)
    for bucket in c.cfg.buckets:
        shuffle(c, bucket, c.cfg.seed, 1024, 1)
    first = lindex.build_lineage_index(c.root, c.cfg)
    files = {key: c.root.read_bytes(key) for key in c.root.list("lineage")}
    c.root.write_bytes("lineage/documents.arrow", b"an earlier layout")
    c.root.write_bytes(lin.shard_lineage_key("shards/final/web/shard-00099"), b"a shard of a larger run")
    second = lindex.build_lineage_index(c.root, c.cfg)
    assert {key: c.root.read_bytes(key) for key in c.root.list("lineage")} == files
    assert first["sha256"] == second["sha256"] == hashlib.sha256(files[layout.LINEAGE_INDEX_KEY]).hexdigest()
    assert len(files) == 1 + 1 + 3 + sum(1 + b["shards"] for b in first["buckets"].values())


def test_shards_holding_a_document_no_clean_table_has_are_refused(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 30, "web/b": 10, "math/m": 5})
    tokenize_all(c)
    for bucket in c.cfg.buckets:
        shuffle(c, bucket, c.cfg.seed, 1024, 1)
    key = documents_key(CLEAN_STAGE, "web-a")
    clean = c.root.read_parquet(key)
    c.root.write_parquet(key, clean.filter(pl.col("doc_id") != "web-a/0000006"))
    with pytest.raises(lindex.LineageError, match="doc_id 'web-a/0000006' is in the shards but no clean table has it"):
        lindex.build_lineage_index(c.root, c.cfg)
    assert not c.root.exists(layout.LINEAGE_INDEX_KEY)


def test_cli_prints_json_and_a_table(built, capsys):
    args = ["lineage", "--config", str(built.config_path), "--shard", "web/shard-00001", "--offset", "5"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shard"] == "shards/final/web/shard-00001" and out["offset"] == 5 and out["url"].startswith("https://")
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"document  {out['doc_id']}" in text and f"url       {out['url']}" in text
    # The decoded window: the token's own text between [[ ]], CONTEXT_TOKENS on each side inside its entry.
    window = out["text"]
    assert (window["start"], window["end"]) == (max(out["entry_start"], 5 - lin.CONTEXT_TOKENS),
                                                min(out["entry_end"], 5 + lin.CONTEXT_TOKENS + 1))
    tokenizer = tk.read_tokenizer(built.root, built.cfg.tokenizer.eod_token)
    ids = [int(t) for t in reader_of(built, out["shard"]).tokens[window["start"]:window["end"]]]
    assert window["token"] == tokenizer.decode([out["token_id"]]) and window["token"]
    assert window["before"] + window["token"] + window["after"] == tokenizer.decode(ids)
    assert window["before"] + window["token"] + window["after"] in built.texts[out["doc_id"]]
    shown = window["before"].replace("\n", "\\n") + "[[" + window["token"].replace("\n", "\\n") + "]]"
    assert f"text      tokens {window['start']}..{window['end'] - 1}: ...{shown}" in text
    assert main(args + ["--context", "0", "--json"]) == 0
    narrow = json.loads(capsys.readouterr().out)["text"]
    assert (narrow["before"], narrow["token"], narrow["after"]) == ("", window["token"], "")


# A fresh process that counts the config's YAML parses, runs `refinery <argv>`, then prints a last line:
# the exit code, the parse count and every module it imported.
QUERY_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    from refinery.config import loader
    parses = []
    parse_yaml = loader.parse_yaml
    loader.parse_yaml = lambda text: parses.append(text) or parse_yaml(text)
    from orchestration.cli import main
    code = main(sys.argv[1:])
    print()
    print(json.dumps({"exit": code, "yaml_parses": len(parses), "modules": sorted(sys.modules)}))
""")


def test_a_cli_query_imports_only_the_lineage_command_and_parses_the_config_once(built):
    """What keeps one `refinery lineage` query fast: no other command's module, no dagster or torch,
    no polars, numpy or pyarrow (a final-shard query reads JSON, a rows file and the shard's files
    with the standard library; the tokenizer decodes without building its model), and the
    preflight's config reused by the command."""
    argv = ["lineage", "--config", str(built.config_path), "--shard", "web/shard-00001", "--offset", "5", "--json"]
    child = subprocess.run([sys.executable, "-c", QUERY_IN_A_FRESH_PROCESS, *argv], cwd=Path(__file__).resolve().parents[1],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    *answer, probe = child.stdout.splitlines()
    probe = json.loads(probe)
    assert probe["exit"] == 0 and probe["yaml_parses"] == 1
    out = json.loads("\n".join(answer))
    expected = lin.resolve_token(built.root, built.cfg, "web/shard-00001", 5)
    assert (out["doc_id"], out["token_id"], out["text"]) == (expected["doc_id"], expected["token_id"], expected["text"])
    others = [module for name, module in COMMAND_MODULES.items() if name != "lineage"]
    imported = set(probe["modules"])
    assert "orchestration.lineage" in imported
    # The preflight builds no custom filter and checks no curriculum for a config without them.
    assert [m for m in ["dagster", "torch", "polars", "numpy", "pyarrow", "refinery.stages.custom",
                        "refinery.curriculum", *others] if m in imported] == []


def test_the_byte_level_decoder_equals_the_tokenizers_own_decode_and_other_tokenizers_fall_back(built, tmp_path):
    """Random windows of ids, special tokens and ids the vocabulary lacks included, decode to what
    `Tokenizer.decode(ids, skip_special_tokens=False)` gives; a tokenizer that is not byte-level BPE
    decodes through the library's parsed tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from refinery.storage import LocalDataRoot
    from refinery.tokenizer_file import ByteLevelDecoder, read_decoder

    eod = built.cfg.tokenizer.eod_token
    tokenizer = tk.read_tokenizer(built.root, eod)
    decode = read_decoder(built.root, eod)
    assert getattr(decode, "__self__", None).__class__ is ByteLevelDecoder  # the fast path was taken
    rng = random.Random(5)
    vocab = tokenizer.get_vocab_size()
    for _ in range(300):
        ids = [rng.randrange(vocab + 3) for _ in range(rng.randrange(0, 40))] + [tokenizer.token_to_id(eod)] * rng.randrange(2)
        rng.shuffle(ids)
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=False), ids
    words = Tokenizer(models.WordLevel({"[EOD]": 0, "hello": 1, "world": 2}, unk_token="[EOD]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    other = LocalDataRoot(tmp_path / "root")
    other.write_bytes(layout.TOKENIZER_KEY, words.to_str().encode())
    assert read_decoder(other, "[EOD]")([1, 2, 0]) == words.decode([1, 2, 0], skip_special_tokens=False)


def test_a_damaged_lineage_rows_file_is_refused_by_name(built, tmp_path):
    source = built.root.local_path(lin.shard_lineage_key("shards/final/web/shard-00001"))
    damaged = tmp_path / "damaged.rows"
    damaged.write_bytes(source.read_bytes()[:-3])
    with pytest.raises(lindex.LineageError, match=r"damaged.rows: not a lineage rows file .*materialize lineage_index again"):
        lindex.read_row(damaged, 0)
    damaged.write_bytes(b"rows")
    with pytest.raises(lindex.LineageError, match=r"damaged.rows: 4 bytes, too short"):
        lindex.read_row(damaged, 0)


def test_lineage_without_a_tokenizer_still_traces_and_says_why_there_is_no_text(tmp_path, capsys):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 20, "web/b": 10, "math/m": 5})
    tokenize_all(c)
    for bucket in c.cfg.buckets:
        shuffle(c, bucket, c.cfg.seed, 1024, 1)
    lindex.build_lineage_index(c.root, c.cfg)
    c.root.delete(layout.TOKENIZER_KEY)
    r = lin.resolve_token(c.root, c.cfg, "web/shard-00000", 3)
    assert r["doc_id"] in c.texts and r["text"]["token"] is None
    assert "no tokenizer; materialize the `tokenizer` asset first" in r["text"]["error"]
    assert "text      unavailable: " in lin.format_lineage(r)


def test_cli_errors_exit_nonzero_with_the_reason(built, capsys):
    base = ["lineage", "--config", str(built.config_path), "--shard", "web/shard-00000"]
    assert main(base + ["--offset", "99999999"]) == 2
    assert "outside shard" in capsys.readouterr().err
    assert main(base) == 2
    assert "needs --offset" in capsys.readouterr().err
    assert main(base + ["--offset", "0", "--context", "-1"]) == 2
    assert "--context -1: give 0 or more tokens" in capsys.readouterr().err


def test_lineage_index_older_than_the_shards_is_refused(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 20, "web/b": 10, "math/m": 5})
    tokenize_all(c)
    for bucket in c.cfg.buckets:
        shuffle(c, bucket, c.cfg.seed, 1024, 1)
    lindex.build_lineage_index(c.root, c.cfg)
    shuffle(c, "web", c.cfg.seed + 1, 1024, 1)
    with pytest.raises(lindex.LineageError, match="materialize lineage_index again"):
        lin.resolve_token(c.root, c.cfg, "web/shard-00000", 0)
    assert lin.resolve_token(c.root, c.cfg, "math/shard-00000", 0)["bucket"] == "math"
    lindex.build_lineage_index(c.root, c.cfg)
    assert lin.resolve_token(c.root, c.cfg, "web/shard-00000", 0)["bucket"] == "web"


def test_answers_from_damaged_files_are_refused_naming_the_file(tmp_path, capsys):
    """Issue 38: a same-length edit in a final shard's lineage rows or a URL's in an input file's documents
    part was printed as fact, and a bit flip in a final shard's .bin gave another token, exit 0.
    Each file is now checked against the hash the index records: one line naming it, exit 2."""
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 20, "web/b": 10, "math/m": 5})
    tokenize_all(c)
    for bucket in c.cfg.buckets:
        shuffle(c, bucket, c.cfg.seed, 1024, 1)
    lindex.build_lineage_index(c.root, c.cfg)
    final = lin.resolve_token(c.root, c.cfg, "web/shard-00000", 3)
    tokenized_shard = shard_refs(c, tk.TOKENIZED)[0]["prefix"]
    tokenized = lin.resolve_token(c.root, c.cfg, tokenized_shard, 3)

    def refused(path: Path, edit, shard: str) -> str:
        good = path.read_bytes()
        damaged = edit(bytearray(good))
        assert len(damaged) == len(good) and damaged != good
        path.write_bytes(bytes(damaged))
        try:
            assert main(["lineage", "--config", str(c.config_path), "--shard", shard, "--offset", "3"]) == 2
        finally:
            path.write_bytes(good)
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, err
        return err

    def url_edited(url: str):
        return lambda raw: raw.replace(url.encode(), url[:-1].encode() + b"X", 1)

    def byte_flipped(raw: bytearray) -> bytearray:  # the rows file's lines are deflated: no URL to find in them
        raw[len(raw) // 2] ^= 0x01
        return raw

    rows = c.root.local_path(lin.shard_lineage_key("shards/final/web/shard-00000"))
    err = refused(rows, byte_flipped, "web/shard-00000")
    assert err == (f"refinery lineage: {rows}: content hash does not match {c.root.display('lineage/final/web/index.json')}; "
                   f"the file changed after it was written; materialize lineage_index again\n")

    def flip(raw: bytearray) -> bytearray:
        raw[2 * 3] ^= 0x10  # token 3 of a uint16 shard
        return raw

    shard_bin = c.root.local_path("shards/final/web/shard-00000.bin")
    err = refused(shard_bin, flip, "web/shard-00000")
    assert err.startswith(f"refinery lineage: {shard_bin}: content hash does not match the bucket's index.json")

    part = c.root.local_path(layout.documents_part_key(tokenized["doc_id"].rsplit("/", 1)[0]))
    err = refused(part, url_edited(tokenized["url"]), tokenized_shard)
    assert err.startswith(f"refinery lineage: {part}: content hash does not match "
                          f"{c.root.display('lineage/documents/index.json')}")
    # The same files, restored, answer again (the verdict is per version of a file, not sticky).
    assert lin.resolve_token(c.root, c.cfg, "web/shard-00000", 3)["url"] == final["url"]
    assert lin.resolve_token(c.root, c.cfg, tokenized_shard, 3)["url"] == tokenized["url"]
