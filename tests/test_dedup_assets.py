"""The dedup assets under Dagster: the partitioned graph end to end on hand-made tables, byte
-identical re-runs, bad input, and the sample's planted duplicates through the real funnel."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import polars as pl
import pytest

from refinery.config import load_config
from refinery.documents import PROVENANCE_SCHEMA, input_shards, make_doc_id
from refinery.reports.funnel import stage_partitions
from refinery.stages.attributes import read_stage_documents, write_stage_documents
from refinery.storage import LocalDataRoot, sha256_file

from helpers.configs import demo_config, write_config

REPO = Path(__file__).resolve().parents[1]
WORDS = [f"lexeme{i}" for i in range(5000)]


def text_of(seed: int, n: int = 120) -> str:
    return " ".join(WORDS[(seed * 7919 + i * 104729) % len(WORDS)] for i in range(n))


def edited(text: str, positions: list[int]) -> str:
    words = text.split()
    for p in positions:
        words[p] = "edited"
    return " ".join(words)


# Shard contents by (source, file). wiki is declared first, so its copies survive.
BASE_A, BASE_B = text_of(1), text_of(2)
CORPUS = {
    ("wiki", "a"): [BASE_A, text_of(3), None, "too short"],
    ("wiki", "b"): [],
    ("web", "a"): [text_of(4), "  " + BASE_A.upper() + "\n", edited(BASE_B, [60]), text_of(5)],
    ("web", "b"): [BASE_B, edited(BASE_B, [30]), "Too   SHORT", text_of(6), BASE_A],
}


def write_corpus(tmp: Path, name: str = "run", extra: dict | None = None) -> Path:
    """A config whose input files exist (empty: only their names matter) and hand-made
    heuristic_filtered tables for them. Returns the config path."""
    base = tmp / name
    for source, file in CORPUS:
        (base / "in" / source).mkdir(parents=True, exist_ok=True)
        (base / "in" / source / f"{file}.jsonl").write_text("")
    config = {
        "data_root": "out",
        "buckets": ["web", "wiki"],
        "sources": [
            {"name": "wiki", "path": "in/wiki/*.jsonl", "format": "jsonl", "bucket": "wiki"},
            {"name": "web", "path": "in/web/*.jsonl", "format": "jsonl", "bucket": "web"},
        ],
        "stages": {"exact_dedup": {"hash_ranges": 2}, "near_dedup": {"bands": 4, "rows": 8}, **(extra or {})},
    }
    path = write_config(base, config)
    cfg = load_config(path)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    for shard in input_shards(cfg):
        texts = CORPUS[(shard.source, Path(shard.path).stem)]
        n = len(texts)
        table = pl.DataFrame(
            {
                "doc_id": [make_doc_id(shard.key, i) for i in range(n)], "url": [f"https://{shard.key}.example/{i}" for i in range(n)],
                "source": [shard.source] * n, "bucket": [shard.bucket] * n, "file": [shard.path] * n,
                "record_index": list(range(n)), "record_offset": [100 * i for i in range(n)],
                "fetch_time": ["2026-01-01T00:00:00Z"] * n, "content_type": ["text/plain"] * n, "text": texts,
                "language": ["en"] * n, "language_score": [0.99] * n,
            },
            schema={**PROVENANCE_SCHEMA, "text": pl.String, "language": pl.String, "language_score": pl.Float64},
        )
        write_stage_documents(root, "heuristic_filtered", shard.key, table)
    return path


def materialize_dedup(config_path: Path) -> None:
    import dagster as dg

    from assets import dedup
    from assets.partitions import Partitions
    from orchestration.demo import materialize_graph
    from orchestration.resources import build_resources

    cfg = load_config(config_path)
    defs = dg.Definitions.merge(
        dedup.build_definitions(cfg, Partitions.from_config(cfg)),
        dg.Definitions(resources=build_resources(str(config_path))),
    )
    materialize_graph(defs, dg.DagsterInstance.ephemeral(), log=lambda _: None)


# What `write_corpus` seeds: heuristic_filtered's documents, as its text table and attribute tables.
SEEDED = ("documents/extracted_text", "attributes/language_filtered", "attributes/heuristic_filtered")


def outputs(root: Path) -> dict[str, str]:
    """sha256 of every file the dedup graph wrote; stats files without their wall time."""
    hashes = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if not path.is_file() or rel.startswith(SEEDED):
            continue
        if rel.startswith("stats/"):
            stats = json.loads(path.read_text())
            stats.pop("wall_s")
            hashes[rel] = json.dumps(stats, sort_keys=True)
        else:
            hashes[rel] = sha256_file(path)
    return hashes


@pytest.fixture(scope="module")
def dedup_run(tmp_path_factory) -> tuple[Path, dict[str, str], dict[str, str]]:
    """Materialize the graph, record every output's hash, delete the outputs, run it again."""
    config = write_corpus(tmp_path_factory.mktemp("dedup"))
    root = config.parent / "out"
    materialize_dedup(config)
    first = outputs(root)
    for folder in ("dedup", "attributes/deduped", "rejects", "stats"):
        shutil.rmtree(root / folder)
    materialize_dedup(config)
    return root, first, outputs(root)


def read(root: Path, key: str) -> pl.DataFrame:
    return pl.read_parquet(root / key)


def test_graph_removes_exact_and_near_duplicates_keeping_the_first_in_config_order(dedup_run):
    root = dedup_run[0]
    kept = {shard: read_stage_documents(LocalDataRoot(root), "deduped", shard) for shard in ("wiki-a", "wiki-b", "web-a", "web-b")}
    assert kept["wiki-a"]["doc_id"].to_list() == ["wiki-a/0000000", "wiki-a/0000001", "wiki-a/0000003"]
    assert kept["wiki-b"].height == 0
    assert kept["web-a"]["doc_id"].to_list() == ["web-a/0000000", "web-a/0000002", "web-a/0000003"]
    assert kept["web-b"]["doc_id"].to_list() == ["web-b/0000003"]
    # The BASE_B cluster (web-b/0, its edit web-b/1, its edit web-a/2) keeps web-a/2: web-a sorts first.
    assert kept["web-a"]["dup_cluster"].to_list() == [None, "web-a/0000002", None]
    assert kept["web-a"]["dup_cluster_size"].to_list() == [1, 3, 1]
    assert kept["wiki-a"]["dup_cluster"].to_list() == [None, None, None]
    assert kept["wiki-a"]["dup_cluster_size"].to_list() == [1, 1, 1]
    assert kept["web-a"].columns[-2:] == ["dup_cluster", "dup_cluster_size"]


def test_rejects_say_why_and_of_what(dedup_run):
    root = dedup_run[0]
    rows = {}
    for shard in ("wiki-a", "web-a", "web-b"):
        rows.update({r[0]: r[1:] for r in read(root, f"rejects/deduped/{shard}.parquet")
                     .select("doc_id", "stage", "rule", "detail").iter_rows()})
    cluster = "web-a/0000002"  # the smallest doc_key of the BASE_B cluster: web-a comes before web-b
    assert rows == {
        "wiki-a/0000002": ("exact_deduped", "exact_dedup/null_text", "text is null"),
        "web-a/0000001": ("exact_deduped", "exact_dedup/duplicate", "duplicate of wiki-a/0000000"),
        "web-b/0000004": ("exact_deduped", "exact_dedup/duplicate", "duplicate of wiki-a/0000000"),
        "web-b/0000002": ("exact_deduped", "exact_dedup/duplicate", "duplicate of wiki-a/0000003"),
        "web-b/0000000": ("near_deduped", "near_dedup/duplicate", f"duplicate of {cluster}; cluster {cluster} of 3 documents"),
        "web-b/0000001": ("near_deduped", "near_dedup/duplicate", f"duplicate of {cluster}; cluster {cluster} of 3 documents"),
    }


def test_two_funnel_stages_of_stats(dedup_run):
    root = dedup_run[0]
    exact = json.loads((root / "stats/exact_deduped/web-b.json").read_text())
    near = json.loads((root / "stats/near_deduped/web-b.json").read_text())
    assert (exact["docs_in"], exact["docs_out"], exact["dropped"]) == (5, 3, {"exact_dedup/duplicate": 2})
    assert (near["docs_in"], near["docs_out"], near["dropped"]) == (3, 1, {"near_dedup/duplicate": 2})
    empty = json.loads((root / "stats/near_deduped/wiki-b.json").read_text())
    assert (empty["docs_in"], empty["docs_out"]) == (0, 0)


def test_rerun_gives_identical_bytes(dedup_run):
    _, a, b = dedup_run
    assert set(a) == set(b)
    assert len([k for k in a if k.startswith("dedup/near/edges/")]) == 4
    assert len([k for k in a if k.startswith("dedup/exact/")]) == 2
    assert len([k for k in a if k.startswith("attributes/deduped/")]) == 4
    assert a == b


def test_metadata_of_the_dedup_assets(dedup_run):
    from assets import dedup
    from helpers.materialize import materialize, module_assets

    config = dedup_run[0].parent / "refinery.yaml"
    by_name = module_assets(dedup, config)
    result = materialize([by_name["deduped"]], config, partition_key="web-b")
    md = result.asset_materializations_for_node("deduped")[0].metadata
    assert {"docs_in", "docs_out", "retention", "removed_by_rule", "config", "code_version", "content_hashes"} <= set(md)
    assert md["docs_out"].value == 1
    result = materialize([by_name["near_dup_clusters"]], config)
    md = result.asset_materializations_for_node("near_dup_clusters")[0].metadata
    assert md["clusters"].value == 1 and md["to_remove"].value == 2


def test_global_steps_before_signatures_say_what_to_run(tmp_path):
    from refinery.global_steps import dedup_compute as dedup

    cfg = load_config(write_corpus(tmp_path))
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    with pytest.raises(FileNotFoundError, match="dedup_signatures"):
        dedup.compute_exact_range(cfg, root, "r00-of-02")


def test_no_input_files_gives_empty_decisions(tmp_path):
    from refinery.global_steps import dedup_compute as dedup
    from refinery.global_steps import near_dedup as nd

    cfg = load_config(write_config(tmp_path, {
        "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "missing/*.jsonl", "format": "jsonl", "bucket": "web"}],
    }))
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    drops, docs, _ = dedup.compute_exact_range(cfg, root, "r00-of-04")
    assert (drops.height, docs) == (0, 0)
    for r in ("r01-of-04", "r02-of-04", "r03-of-04"):
        dedup.compute_exact_range(cfg, root, r)
    for band in nd.band_keys(nd.DedupSettings.from_config(cfg).bands):
        edges, counts, _ = dedup.compute_band_edges(cfg, root, band)
        assert edges.height == 0 and counts["docs"] == 0
    table, _ = dedup.compute_clusters(cfg, root)
    assert table.height == 0 and table.columns == ["doc_key", "keeper_key", "keeper_doc_id", "cluster_size"]


def shingle_sets(texts: list[str]) -> list[set[int]]:
    """Each text's set of word 5-gram shingles (as near dedup shingles), every distinct shingle
    numbered once so set operations hash ints instead of re-hashing tuples."""
    from refinery.global_steps import minhash as mh

    ids: dict[tuple, int] = {}
    return [{ids.setdefault(s, len(ids)) for s in mh.shingles(mh.shingle_words(t), 5)} for t in texts]


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def similar_pairs(sets: list[set], threshold: float) -> list[tuple[int, int]]:
    """Every pair with exact Jaccard >= threshold, by prefix filtering: in one global order of
    elements, two sets that similar share an element among the first |A| - ceil(t |A|) + 1 of
    each, so only pairs sharing a prefix element are compared (exact, not an approximation)."""
    index: dict = {}
    candidates = set()
    for i, members in enumerate(sets):
        ordered = sorted(members)
        for element in ordered[: len(ordered) - math.ceil(threshold * len(ordered)) + 1]:
            for j in index.setdefault(element, []):
                candidates.add((j, i))
            index[element].append(i)
    return sorted(
        (i, j) for i, j in candidates
        if min(len(sets[i]), len(sets[j])) >= threshold * max(len(sets[i]), len(sets[j]))
        and jaccard(sets[i], sets[j]) >= threshold
    )


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory) -> Path:
    """The bundled sample through the real funnel to `deduped`, in a temporary data root."""
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import materialize_graph

    tmp = tmp_path_factory.mktemp("sample")
    config = write_config(tmp, demo_config(tmp / "out"), "demo.yaml")
    defs = build_definitions(str(config))
    upstream = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered"]
    mine = ["dedup_signatures", "exact_deduped", "near_deduped", "near_dup_clusters", "deduped"]
    materialize_graph(defs, dg.DagsterInstance.ephemeral(), [dg.AssetKey(k) for k in upstream + mine], log=lambda _: None)
    return tmp / "out"


def stage_tables(root: Path, folder: str) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(p) for p in sorted((root / folder).glob("*.parquet"))], how="diagonal_relaxed")


def kept_tables(root: Path, stage: str) -> pl.DataFrame:
    """A stage's kept documents of every input file, read through its attribute tables."""
    data = LocalDataRoot(root)
    return pl.concat([read_stage_documents(data, stage, p) for p in stage_partitions(data, stage)], how="diagonal_relaxed")


@pytest.mark.slow
def test_sample_planted_exact_duplicates_are_all_removed(sample_run):
    truth = json.loads((REPO / "data" / "sample" / "ground_truth.json").read_text())
    before = kept_tables(sample_run, "heuristic_filtered")
    after = set(kept_tables(sample_run, "deduped")["url"].to_list())
    rejects = stage_tables(sample_run, "rejects/deduped")
    exact_removed = set(rejects.filter(pl.col("rule") == "exact_dedup/duplicate")["url"].to_list())
    present = set(before["url"].to_list())
    checked = 0
    for group in truth["exact_duplicates"]:
        reached = [u for u in group if u in present]
        if len(reached) < 2:
            continue
        checked += 1
        assert len([u for u in reached if u in after]) == 1, group
        assert len([u for u in reached if u in exact_removed]) == len(reached) - 1, group
    assert checked >= 5  # the planted groups must reach dedup for this test to mean anything


@pytest.mark.slow
def test_sample_near_duplicates_recall_and_precision_against_exact_jaccard(sample_run):
    """Over every pair of documents that survive exact dedup (shingled as near dedup does):
    recall = pairs with exact Jaccard >= 0.8 that end in one cluster / all such pairs;
    precision = near-dedup removals whose exact Jaccard with some other member of their cluster
    is >= 0.8 / all near-dedup removals. Planted pairs below 0.8 must not be clustered."""
    truth = json.loads((REPO / "data" / "sample" / "ground_truth.json").read_text())
    before = kept_tables(sample_run, "heuristic_filtered")
    rejects = stage_tables(sample_run, "rejects/deduped")
    exact_removed = set(rejects.filter(pl.col("stage") == "exact_deduped")["doc_id"].to_list())
    docs = before.filter(~pl.col("doc_id").is_in(list(exact_removed)))
    ids, urls = docs["doc_id"].to_list(), docs["url"].to_list()
    sets = shingle_sets(docs["text"].to_list())

    kept = kept_tables(sample_run, "deduped")
    near = rejects.filter(pl.col("stage") == "near_deduped")
    cluster_of = dict(zip(kept["doc_id"].to_list(), kept["dup_cluster"].to_list()))
    cluster_of.update({d: detail.split()[2].rstrip(";") for d, detail in near.select("doc_id", "detail").iter_rows()})

    true_pairs = similar_pairs(sets, 0.8)
    assert len(true_pairs) >= 3
    together = [cluster_of.get(ids[i]) is not None and cluster_of.get(ids[i]) == cluster_of.get(ids[j]) for i, j in true_pairs]
    assert sum(together) / len(true_pairs) >= 0.95

    position = {d: i for i, d in enumerate(ids)}
    removed = near["doc_id"].to_list()
    assert removed
    backed = 0
    for d in removed:
        mates = [position[o] for o, c in cluster_of.items() if c == cluster_of[d] and o != d]
        backed += any(jaccard(sets[position[d]], sets[m]) >= 0.8 for m in mates)
    assert backed / len(removed) >= 0.95

    by_url = dict(zip(urls, ids))
    for pair in truth["near_duplicates"]:
        a, b = by_url.get(pair["a"]), by_url.get(pair["b"])
        if a is None or b is None:
            continue
        similar = jaccard(sets[position[a]], sets[position[b]]) >= 0.8
        same = cluster_of.get(a) is not None and cluster_of.get(a) == cluster_of.get(b)
        assert same == similar, pair
