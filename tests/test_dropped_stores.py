"""Stores the data root drops once read (issue 49): a file's token series once its bucket's shuffle
published, the bottom-k sketches once near_dup_clusters ran, raw_documents' payload (re-read from the
input by extracted_text). Every answer of `refinery why`, `refinery lineage` and `funnel --explain`
is the same bytes whether the stores are there or not; a query or a step that needs a dropped one
refuses in one line naming what to materialize (exit 2 for a command); Dagster shows the drop; an
edited or moved input behind a dropped payload is caught by its hash; and `--changed` plans the
stores back before a step that reads them."""

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow.parquet as pq
import pytest

from orchestration.changed import DROPPED_NEEDED, stale_plan
from orchestration.cli import main
from orchestration.definitions import build_definitions
from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph, run_changed, until_selection
from refinery import layout
from refinery.config import load_config
from refinery.documents import input_batches, input_shards
from refinery.global_steps import dedup_compute as dc
from refinery.global_steps import near_dedup as nd
from refinery.stages import ingest
from refinery.run_context import WorkerRun
from refinery.stage_file_tasks import ingest_file, stage_file_task
from refinery.storage import LocalDataRoot
from training.trainer import RunOptions, Trainer

from helpers.materialize import in_memory_instance
from helpers.tiny_graph import SEQ_LEN, tiny_graph_config, write_pages, write_records

pytestmark = pytest.mark.slow

WARMUP_STEPS = 4  # tiny_graph_config's default steps of its first phase


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """The tiny graph materialized up to its lineage index and phase manifests, a training run of its warmup phase on
    it, and its Dagster instance, open."""
    tmp = tmp_path_factory.mktemp("dropped")
    pages = write_pages(tmp / "in", files=3)
    config = tiny_graph_config(tmp, tmp / "in", tmp / "out")
    defs = build_definitions(str(config))
    with in_memory_instance(tmp / "dagster") as instance:
        selection = sorted(set(until_selection(defs, "lineage_index")) | set(until_selection(defs, "phase_manifests")),
                           key=lambda k: k.to_user_string())
        materialize_graph(defs, instance, selection, log=lambda line: None, run_config=QUIET_RUN_CONFIG)
        cfg = load_config(config)
        assert Trainer(cfg, RunOptions(run_dir=str(tmp / "run"), stop_after_phase="warmup")).train()["state"] == "completed"
        yield {"config": str(config), "cfg": cfg, "root": LocalDataRoot(cfg.resolve(cfg.data_root)),
               "defs": defs, "instance": instance, "pages": pages, "inputs": tmp / "in", "run": tmp / "run"}


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def answers(g, capsys) -> list[tuple[int, str, str]]:
    """Every query's exit code and output: `why` on every page (text and JSON), `lineage` on the
    first token of every final shard and on one in the middle, and on the first and last token of
    both rows of the training run's first and last warmup step (table and JSON), `funnel --explain`
    on every page."""
    config = g["config"]
    out = []
    urls = [r["url"] for records in g["pages"] for r in records]
    for url in urls:
        out.append(run_cli(capsys, ["why", url, "--config", config]))
        out.append(run_cli(capsys, ["why", url, "--config", config, "--json"]))
        out.append(run_cli(capsys, ["funnel", "--config", config, "--explain", url]))
    index = g["root"].read_json(layout.final_index_key("web"))
    for ref in index["shards"]:
        for offset in (0, ref["tokens"] // 2):
            out.append(run_cli(capsys, ["lineage", "--config", config, "--shard", ref["prefix"], "--offset", str(offset)]))
            out.append(run_cli(capsys, ["lineage", "--config", config, "--shard", ref["prefix"], "--offset", str(offset),
                                        "--json"]))
    for step in (1, WARMUP_STEPS):
        for row, pos in ((0, 0), (1, SEQ_LEN - 1)):
            query = ["lineage", "--config", config, "--run", str(g["run"]), "--step", str(step), "--row", str(row),
                     "--pos", str(pos)]
            out.append(run_cli(capsys, query))
            out.append(run_cli(capsys, [*query, "--json"]))
    return out


def tokenized_shard(g) -> tuple[str, str]:
    """(the first tokenized shard's prefix, its input file's key)."""
    part = input_shards(g["cfg"])[0].key
    return layout.shard_key("tokenized", "web", 0, part), part


def test_the_stores_are_dropped_and_dagster_says_so(graph):
    root, cfg, instance = graph["root"], graph["cfg"], graph["instance"]
    for shard in input_shards(cfg):
        series = root.list(layout.bucket_shards_prefix("tokenized", "web", shard.key))
        assert series == sorted([layout.shard_index_key("tokenized", "web", shard.key),
                                 layout.series_dropped_key("tokenized", "web", shard.key)])
        assert not root.exists(layout.sketches_key(shard.key)) and root.exists(layout.sketches_dropped_key(shard.key))
        assert "bottom" not in pq.read_schema(root.local_path(layout.signatures_key(shard.key))).names
        stored = pq.read_schema(root.local_path(layout.documents_key("raw_documents", shard.key))).names
        assert "raw" not in stored and {"raw_bytes", "raw_hash", "record_offset", "file"} <= set(stored)
    shuffled = instance.fetch_materializations(dg.AssetKey("shuffled_shards"), limit=1).records[0]
    assert shuffled.asset_materialization.metadata["dropped_bytes"].value > 0
    for batch in input_batches(cfg):
        seen = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("tokenized_shards"),
                                                                 asset_partitions=[batch.key]), limit=1).records
        assert "dropped once shuffled_shards[web] published" in seen[0].asset_observation.metadata["dropped"].value


def test_funnel_prints_the_data_root_per_store_over_the_compressed_input(graph, capsys):
    code, out, _ = run_cli(capsys, ["funnel", "--config", graph["config"], "--json"])
    storage = json.loads(out)["storage"]
    files = [p for p in graph["root"].root.rglob("*") if p.is_file() and not p.relative_to(graph["root"].root).parts[0].startswith(".")]
    assert code == 0 and storage["data_root_bytes"] == sum(p.stat().st_size for p in files)
    assert storage["input_bytes"] == sum(Path(s.path).stat().st_size for s in input_shards(graph["cfg"]))
    stores = {s["store"]: s for s in storage["stores"]}
    assert stores["shards/final"]["growth"] == "per input byte" and stores["lineage/final"]["growth"] == "per entry"
    assert stores["documents/raw_documents"]["bytes"] < stores["documents/extracted_text"]["bytes"]
    assert stores["shards/final"]["over_input"] == round(stores["shards/final"]["bytes"] / storage["input_bytes"], 4)
    code, out, _ = run_cli(capsys, ["funnel", "--config", graph["config"]])
    assert f"Data root: {storage['data_root_bytes']:,} bytes" in out and "shards/final" in out


def test_a_query_or_step_that_needs_a_dropped_store_refuses_in_one_line(graph, capsys):
    prefix, part = tokenized_shard(graph)
    batch = next(b.key for b in input_batches(graph["cfg"]) if part in {s.key for s in b.shards})
    code, out, err = run_cli(capsys, ["lineage", "--config", graph["config"], "--shard", prefix, "--offset", "0"])
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert "dropped by shuffled_shards[web]" in err and f"materialize tokenized_shards[{batch}] again" in err
    with pytest.raises(FileNotFoundError, match=r"dropped by near_dup_clusters .* materialize dedup_signatures\["):
        dc.compute_band_edges(graph["cfg"], graph["root"], nd.band_keys(nd.DedupSettings.from_config(graph["cfg"]).bands)[0])


def test_answers_are_the_same_bytes_with_the_stores_back(graph, capsys):
    without = answers(graph, capsys)
    assert len(without) > 20 and all(code == 0 for code, _, _ in without)
    # The dropped stores back: their assets materialized again, which removes the markers.
    defs, instance = graph["defs"], graph["instance"]
    job = defs.resolve_implicit_global_asset_job_def()
    for batch in input_batches(graph["cfg"]):
        job.execute_in_process(instance=instance, partition_key=batch.key, run_config=QUIET_RUN_CONFIG,
                               asset_selection=[dg.AssetKey("tokenized_shards"), dg.AssetKey("dedup_signatures")])
    prefix, part = tokenized_shard(graph)
    assert graph["root"].exists(prefix + ".bin") and graph["root"].exists(layout.sketches_key(part))
    assert not graph["root"].exists(layout.series_dropped_key("tokenized", "web", part))
    assert answers(graph, capsys) == without
    code, out, _ = run_cli(capsys, ["lineage", "--config", graph["config"], "--shard", prefix, "--offset", "0"])
    assert code == 0 and "document" in out


def test_changed_plans_the_dropped_stores_back_before_their_readers(graph):
    """An edited input reruns dedup over every file, and the bands read every file's sketches: the
    other batches' sketches are planned back first. A shuffle to run again (here its materializations
    wiped) reads every file's token series: each batch's is planned back first. Either plan runs
    through, and the shards come out the same."""
    defs, instance, cfg, root = graph["defs"], graph["instance"], graph["cfg"], graph["root"]
    selection = until_selection(defs, "lineage_index")
    materialize_graph(defs, instance, selection, log=lambda line: None, run_config=QUIET_RUN_CONFIG)
    first = input_shards(cfg)[0]
    records = [json.loads(line) for line in open(first.path)]
    records[0]["text"] += " An added closing sentence changes this page's text and its tokens."
    write_records(Path(first.path), records)
    plan = {p.key.to_user_string(): p for p in stale_plan(defs, instance, selection)}
    edited = next(b.key for b in input_batches(cfg) if first.key in {s.key for s in b.shards})
    others = sorted(b.key for b in input_batches(cfg) if b.key != edited)
    assert plan["dedup_signatures"].reasons.get(DROPPED_NEEDED) == others, plan["dedup_signatures"].line()
    assert plan["tokenized_shards"].partitions == sorted(b.key for b in input_batches(cfg))  # after dedup, every batch
    run_changed(defs, instance, log=lambda line: None, run_config=QUIET_RUN_CONFIG, selection=selection)
    assert not stale_plan(defs, instance, selection)
    final = root.read_json(layout.final_index_key("web"))

    instance.wipe_assets([dg.AssetKey("shuffled_shards")])
    plan = {p.key.to_user_string(): p for p in stale_plan(defs, instance, selection)}
    assert plan["tokenized_shards"].reasons == {DROPPED_NEEDED: sorted(b.key for b in input_batches(cfg))}
    assert "dedup_signatures" not in plan
    run_changed(defs, instance, log=lambda line: None, run_config=QUIET_RUN_CONFIG, selection=selection)
    assert not stale_plan(defs, instance, selection)
    assert root.read_json(layout.final_index_key("web")) == final
    assert root.exists(layout.series_dropped_key("tokenized", "web", first.key))


def test_an_edited_or_moved_input_behind_the_dropped_payload_is_caught_by_its_hash(tmp_path):
    pages = write_pages(tmp_path / "in", files=1)
    config = tiny_graph_config(tmp_path, tmp_path / "in", tmp_path / "out")
    run = WorkerRun(str(config))
    [shard] = input_shards(run.config)
    extract = stage_file_task("extracted_text", ingest.STAGE)
    ingest_file(run, shard, {})
    extract(run, shard, {})
    kept = run.root.read_parquet(layout.documents_key("extracted_text", shard.key))
    assert kept["text"].to_list() == [r["text"] for r in pages[0]]  # text passes through, re-read from the file

    edited = [dict(r) for r in pages[0]]
    edited[2]["text"] = edited[2]["text"].replace(" ", "  ", 1)
    write_records(tmp_path / "in" / "f0.jsonl", edited)
    with pytest.raises(ingest.InputChanged) as caught:
        extract(run, shard, {})
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and "line record 2" in message and "hash differs" in message
    assert f"materialize raw_documents for input file {shard.key!r} again" in message
    assert run.root.read_parquet(layout.documents_key("extracted_text", shard.key)).equals(kept)  # nothing replaced

    (tmp_path / "in" / "f0.jsonl").unlink()
    with pytest.raises(ingest.InputChanged, match="gone since raw_documents read it"):
        extract(run, shard, {})

    write_records(tmp_path / "in" / "f0.jsonl", pages[0][:-1])
    with pytest.raises(ingest.InputChanged, match="1 document.s. raw_documents read are no longer in it"):
        extract(run, shard, {})
    assert pl.read_parquet(run.root.local_path(layout.documents_key("extracted_text", shard.key))).equals(kept)
