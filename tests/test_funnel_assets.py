"""The four funnel assets materialized with Dagster, in-process: on a tiny hand-made corpus (fast),
and on every input shard of the bundled sample against its ground truth (slow)."""

import json
import random
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets import funnel
from refinery.config import load_config
from refinery.documents import input_batches, input_shards, make_doc_id
from refinery.reports.funnel import stage_partitions
from refinery.layout import kept_documents_key, rejects_key, stats_key
from refinery.stages.attributes import read_stage_documents
from refinery.storage import LocalDataRoot
from synthetic.warc import gzip_member, http_response, warc_record

from helpers.configs import demo_config, write_config
from helpers.materialize import materialize, module_assets
from helpers.texts import BRACED_DOC, PROSE

REPO = Path(__file__).resolve().parents[1]
FUNNEL = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered"]
PROVENANCE_KEYS = {
    "docs_in", "docs_out", "retention", "bytes_in", "bytes_out", "byte_retention", "removed_by_rule",
    "wall_s", "docs_per_s", "config", "code_version", "content_hashes", "sample_rows",
}

FRENCH = (
    "La ville portuaire se réveille lentement quand les bateaux de pêche rentrent avec la marée du matin. "
    "Les marchands installent leurs étals le long du quai et discutent du prix du maquereau frais. "
) * 3


def page(body: str) -> bytes:
    return (
        "<html><head><title>Harbour</title></head><body><nav><a href='/'>Home</a></nav>"
        f"<article><p>{body}</p></article><footer>Footer links</footer></body></html>"
    ).encode()


def write_corpus(tmp_path: Path) -> Path:
    rng = random.Random(0)
    responses = [
        ("https://harbour.example/a", page(PROSE), "text/html; charset=utf-8"),
        ("https://harbour.example/fr", page(FRENCH), "text/html; charset=utf-8"),
        ("https://spam.example/win", page(PROSE), "text/html"),
        ("https://harbour.example/short", page(PROSE[:160]), "text/html"),
        ("https://harbour.example/logo.png", b"\x89PNG\r\n\x1a\n\x00\x00binary", "image/png"),
        ("https://harbour.example/data.json", b'{"a": 1}', "application/json"),
    ]
    records = [
        warc_record("response", url, http_response(body, ct, rng), rng, "application/http; msgtype=response")
        for url, body, ct in responses
    ]
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "crawl-0.warc.gz").write_bytes(b"".join(gzip_member(r) for r in records))
    (tmp_path / "code").mkdir()
    lines = [json.dumps({"text": "def f(x):\n    return {x: x}\n", "url": "https://code.example/f.py"}),
             "{not json", json.dumps({"text": "print('hi')\n"})]
    (tmp_path / "code" / "lib-0.jsonl").write_text("\n".join(lines) + "\n")
    config = {
        "seed": 1,
        "data_root": "out",
        "buckets": ["web", "code"],
        "sources": [
            {"name": "web", "path": "web/*.warc.gz", "format": "warc", "bucket": "web"},
            {"name": "code", "path": "code/*.jsonl", "format": "jsonl", "bucket": "code",
             "skip": ["language", "heuristic"]},
        ],
        "stages": {"heuristic": {"url_blocklist": ["spam.example"]}},
    }
    return write_config(tmp_path, config)


def funnel_assets(config_path: Path) -> list[dg.AssetsDefinition]:
    return list(module_assets(funnel, config_path).values())


def metadata_by_asset(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    return {
        e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()
    }


def test_definitions_from_the_demo_config_have_the_funnel_assets():
    from orchestration.definitions import build_definitions

    defs = build_definitions(str(REPO / "configs" / "demo.yaml"))
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert set(FUNNEL) <= keys
    graph = defs.resolve_asset_graph()
    for upstream, name in zip(FUNNEL, FUNNEL[1:]):
        assert dg.AssetKey(upstream) in graph.get(dg.AssetKey(name)).parent_keys
        assert graph.get(dg.AssetKey(name)).group_name == "funnel"


def test_funnel_assets_on_a_tiny_corpus(tmp_path):
    config_path = write_corpus(tmp_path)
    cfg = load_config(config_path)
    root = LocalDataRoot(tmp_path / "out")
    assets = funnel_assets(config_path)
    keys = [s.key for s in input_shards(cfg)]
    assert keys == ["web-crawl-0", "code-lib-0"]
    metadata = {key: metadata_by_asset(materialize(assets, config_path, key)) for key in keys}

    for key in keys:
        assert set(metadata[key]) == set(FUNNEL)
        for name in FUNNEL:
            md = metadata[key][name]
            assert PROVENANCE_KEYS <= set(md), f"{name}[{key}] lacks {PROVENANCE_KEYS - set(md)}"
            hashes = md["content_hashes"].data
            assert hashes[kept_documents_key(name, key)] == root.sha256(kept_documents_key(name, key))
            assert root.exists(rejects_key(name, key)) and root.exists(stats_key(name, key))

    web = {name: read_stage_documents(root, name, "web-crawl-0") for name in FUNNEL}
    assert web["raw_documents"].height == 5  # the PNG is an ingest reject
    assert web["extracted_text"].height == 4  # application/json is not extracted
    assert "raw" not in web["extracted_text"].columns
    assert web["language_filtered"]["language"].to_list() == ["en", "en", "en"]
    assert web["heuristic_filtered"]["url"].to_list() == ["https://harbour.example/a"]
    assert "Footer links" not in web["heuristic_filtered"]["text"][0]

    rejects = pl.concat([root.read_parquet(rejects_key(name, "web-crawl-0")) for name in FUNNEL])
    assert dict(zip(rejects["url"], rejects["rule"])) == {
        "https://harbour.example/logo.png": "ingest/binary_payload",
        "https://harbour.example/data.json": "extract/unsupported_content_type",
        "https://harbour.example/fr": "language/unwanted_language",
        "https://spam.example/win": "url/blocklisted_domain",
        "https://harbour.example/short": "gopher_quality/min_words",
    }
    md = metadata["web-crawl-0"]["heuristic_filtered"]
    assert (md["docs_in"].value, md["docs_out"].value) == (3, 1)
    assert md["removed_by_rule"].data == {"url/blocklisted_domain": 1, "gopher_quality/min_words": 1}

    # The code source skips language and heuristics: everything extracted passes, columns stay the same.
    code = {name: read_stage_documents(root, name, "code-lib-0") for name in FUNNEL}
    assert code["raw_documents"].height == 2  # the bad JSON line is an ingest reject
    assert code["heuristic_filtered"].height == 2
    assert code["language_filtered"]["language"].null_count() == 2
    assert code["language_filtered"].columns == web["language_filtered"].columns
    assert metadata["code-lib-0"]["heuristic_filtered"]["counters"].data == {"skipped_by_source": 2}


def test_rematerializing_gives_byte_identical_outputs(tmp_path):
    config_path = write_corpus(tmp_path)
    root = LocalDataRoot(tmp_path / "out")
    assets = funnel_assets(config_path)
    materialize(assets, config_path, "web-crawl-0")

    def hashes() -> dict[str, str]:
        return {k: root.sha256(k) for kind in ("documents", "attributes", "rejects") for k in root.list(kind)}

    first = hashes()
    assert len(first) == 2 * len(FUNNEL)
    materialize(assets, config_path, "web-crawl-0")
    assert hashes() == first


def test_missing_upstream_fails_clearly_and_writes_nothing(tmp_path):
    config_path = write_corpus(tmp_path)
    assets = {a.key.to_user_string(): a for a in funnel_assets(config_path)}
    with pytest.raises(Exception, match="materialize the asset that writes it first"):
        materialize([assets["extracted_text"]], config_path, "web-crawl-0")
    assert not (tmp_path / "out" / "documents" / "extracted_text").exists()


# ---- the bundled sample ------------------------------------------------------------------------------


@pytest.mark.slow
def test_funnel_on_the_sample_meets_the_ground_truth(tmp_path):
    truth = json.loads((REPO / "data" / "sample" / "ground_truth.json").read_text())
    config_path = write_config(tmp_path, demo_config(tmp_path / "out"), "demo.yaml")
    cfg = load_config(config_path)
    root = LocalDataRoot(tmp_path / "out")
    assets = funnel_assets(config_path)
    for batch in input_batches(cfg):  # the demo's partitions: batches of files, outputs per file
        result = materialize(assets, config_path, batch.key)
        assert result.success
        for name, md in metadata_by_asset(result).items():
            assert PROVENANCE_KEYS <= set(md), f"{name}[{batch.key}]"
            assert md["input_files"].value == len(batch.shards)

    def table(kind: str, stage: str) -> pl.DataFrame:
        if kind == "documents":  # a stage's kept documents, through its attribute tables where it has them
            return pl.concat(read_stage_documents(root, stage, p) for p in stage_partitions(root, stage))
        return pl.concat(root.read_parquet(k) for k in root.list(f"{kind}/{stage}"))

    rejects = pl.concat(table("rejects", name) for name in FUNNEL)
    assert rejects["rule"].null_count() == 0 and rejects["stage"].null_count() == 0

    # every bad record is a rejection with its reason, counted in the stats
    sample_dir = REPO / "data" / "sample"
    partition = {str(Path(s.path).relative_to(sample_dir)): s.key for s in input_shards(cfg)}
    rejected = {(r["doc_id"], r["rule"]) for r in rejects.iter_rows(named=True)}
    for bad in truth["bad_records"]:
        assert (make_doc_id(partition[bad["file"]], bad["record_index"]), bad["rule"]) in rejected, bad
    for name in FUNNEL:
        counted = sum(sum(root.read_json(k)["dropped"].values()) for k in root.list(f"stats/{name}"))
        assert counted == table("rejects", name).height, name

    # language ID on documents of known language (predictions on every extracted document)
    extracted = table("documents", "extracted_text")
    from refinery.stages.language import load_language_model

    model = load_language_model(None)
    known = extracted.filter(pl.col("url").is_in(list(truth["languages"])))
    correct = sum(model.predict(t)[0] == truth["languages"][u] for u, t in zip(known["url"], known["text"]))
    assert known.height >= 0.9 * len(truth["languages"])
    assert correct / known.height >= 0.98

    # planted spam removed; no clean document removed by the heuristics
    survivors = set(table("documents", "heuristic_filtered")["url"].drop_nulls())
    spam = [s["url"] for s in truth["spam"]]
    assert sum(u not in survivors for u in spam) / len(spam) >= 0.95
    heuristic_rejects = table("rejects", "heuristic_filtered")
    clean_removed = heuristic_rejects.filter(pl.col("url").is_in(truth["clean"]))
    assert clean_removed.select("url", "rule", "value").to_dicts() == []


def test_a_sources_rules_off_from_the_config_reach_heuristic_filtered(tmp_path):
    """The same page in two sources: the one whose config switches C4's curly-bracket rule off keeps
    it through the heuristic_filtered asset, the other drops it for that rule."""
    for name in ("docs", "web"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "part-0.jsonl").write_text(json.dumps({"text": BRACED_DOC, "url": f"https://{name}.example/"}) + "\n")
    config = {
        "seed": 1, "data_root": "out", "buckets": ["web"],
        "sources": [
            {"name": "docs", "path": "docs/*.jsonl", "format": "jsonl", "bucket": "web", "rules_off": ["c4/curly_bracket"]},
            {"name": "web", "path": "web/*.jsonl", "format": "jsonl", "bucket": "web"},
        ],
    }
    config_path = write_config(tmp_path, config)
    assets = funnel_assets(config_path)
    md = {key: metadata_by_asset(materialize(assets, config_path, key))["heuristic_filtered"]
          for key in ("docs-part-0", "web-part-0")}
    assert (md["docs-part-0"]["docs_out"].value, md["docs-part-0"]["removed_by_rule"].data) == (1, {})
    assert (md["web-part-0"]["docs_out"].value, md["web-part-0"]["removed_by_rule"].data) == (0, {"c4/curly_bracket": 1})
    kept = read_stage_documents(LocalDataRoot(tmp_path / "out"), "heuristic_filtered", "docs-part-0")
    assert "server { port 8080; }" in kept["text"][0]
