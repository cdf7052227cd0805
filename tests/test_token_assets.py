"""tokenizer, tokenized_shards, shuffled_shards and lineage_index materialized with Dagster on
hand-made clean tables: success, metadata keys, files, and byte-identical reruns."""

from __future__ import annotations

import dagster as dg
import pytest

from refinery import layout
from refinery.global_steps import tokenize as tk
from assets import tokens
from refinery.documents import input_batches
from refinery import lineage as lin

from helpers.corpus import make_corpus
from helpers.materialize import materialize, module_assets


def materialize_tokens(c) -> dict[str, dg.ExecuteInProcessResult]:
    assets = module_assets(tokens, c.config_path)
    results = {"tokenizer": materialize([assets["tokenizer"]], c.config_path)}
    for batch in input_batches(c.cfg):  # tokenized per input batch, shuffled per bucket
        results[f"tokenized_shards[{batch.key}]"] = materialize([assets["tokenized_shards"]], c.config_path,
                                                                partition_key=batch.key)
    for bucket in c.cfg.buckets:
        results[f"shuffled_shards[{bucket}]"] = materialize([assets["shuffled_shards"]], c.config_path,
                                                            partition_key=bucket)
    results["lineage_index"] = materialize([assets["lineage_index"]], c.config_path)
    return results


def metadata(result, name: str) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node(name)[0].metadata.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    c = make_corpus(tmp_path_factory.mktemp("token_assets"), empty_docs=1)
    return c, materialize_tokens(c)


def test_every_partition_succeeds_with_provenance_metadata(run):
    c, results = run
    assert all(r.success for r in results.values())
    tok = metadata(results["tokenizer"], "tokenizer")
    assert tok["vocab_size"] == 400 and tok["train_docs"] == 127 and tok["eod_id"] == 0
    assert tok["content_hashes"] == {layout.TOKENIZER_KEY: c.root.sha256(layout.TOKENIZER_KEY)}
    web = [metadata(results[f"tokenized_shards[{part}]"], "tokenized_shards") for part in ("web-a", "web-b")]
    for key in ("docs_in", "docs_out", "retention", "removed_by_rule", "wall_s", "config", "code_version",
                "content_hashes", "tokens", "entries", "shards", "tokens_per_s", "input_files"):
        assert key in web[0], key
    assert [(m["docs_in"], m["docs_out"], m["input_files"]) for m in web] == [(60, 59, 1), (40, 39, 1)]
    assert all(m["removed_by_rule"] == {"tokenize/empty_text": 1} for m in web)
    series = c.root.read_json(layout.shard_index_key(tk.TOKENIZED, "web", "web-a"))
    for ref in series["shards"]:
        for suffix, digest in ref["sha256"].items():
            assert web[0]["content_hashes"][ref["prefix"] + suffix] == digest
    final = metadata(results["shuffled_shards[web]"], "shuffled_shards")
    assert (final["tokens"], final["entries"], final["documents"]) == (
        web[0]["tokens"] + web[1]["tokens"], web[0]["entries"] + web[1]["entries"], 98)
    index = c.root.read_json(layout.shard_index_key(tk.FINAL, "web"))
    for ref in index["shards"]:
        for suffix, digest in ref["sha256"].items():
            assert final["content_hashes"][ref["prefix"] + suffix] == digest == c.root.sha256(ref["prefix"] + suffix)
    lineage = metadata(results["lineage_index"], "lineage_index")
    assert lineage["documents"] == 130 and lineage["final_shards_verified"] == sum(
        len(c.root.read_json(layout.shard_index_key(tk.FINAL, b))["shards"]) for b in c.cfg.buckets)
    assert lin.resolve_token(c.root, c.cfg, "web/shard-00000", 0)["bucket"] == "web"


def test_rematerializing_gives_byte_identical_shards(run, tmp_path):
    c, _ = run
    first = {p.relative_to(c.root.root): p.read_bytes() for p in (c.root.root / "shards").rglob("*") if p.is_file()}
    again = make_corpus(tmp_path, empty_docs=1)
    assert all(r.success for r in materialize_tokens(again).values())
    second = {p.relative_to(again.root.root): p.read_bytes() for p in (again.root.root / "shards").rglob("*") if p.is_file()}
    assert first == second and len(first) > 10


def test_shuffle_before_tokenizing_fails_with_the_fix(tmp_path):
    c = make_corpus(tmp_path)
    assets = module_assets(tokens, c.config_path)
    materialize([assets["tokenizer"]], c.config_path)
    with pytest.raises(Exception, match=r"materialize tokenized_shards for input file 'web-a' first"):
        materialize([assets["shuffled_shards"]], c.config_path, partition_key="web")
