"""The contamination scan as tasks over clean tables and a reduction per phase, on a crafted corpus
(tests/helpers/contamination_corpus.py): the reduction reproduces the one-process scan, a table is
scanned once for every phase, the partials do not depend on the worker count, a changed table or
eval set never reuses a partial, and a damaged partial is scanned again, never combined."""

import json

import polars as pl
import pytest

from refinery.fanout import map_tasks
from assets.resource import RefineryResource
from helpers.contamination_corpus import EVAL_ITEMS, FILES, one_process_scan, planted, write_corpus
from refinery import contamination as cont
from refinery import contamination_tasks as ctasks
from refinery.contamination_tasks import scan_table_task
from refinery.config import load_config
from refinery.curriculum import read_manifest
from refinery.documents import CLEAN_STAGE
from refinery.drop_policy import HITS_SCHEMA
from refinery.layout import documents_key
from refinery.storage import LocalDataRoot
from refinery.storage.base import dumps_json

TIMING = ("wall_s", "docs_per_s")


def report_bytes(report: cont.ScanReport) -> bytes:
    """The stored report's bytes without its timing, which no two runs share."""
    return dumps_json({k: v for k, v in report.to_json().items() if k not in TIMING})


def hits_bytes(report: cont.ScanReport) -> bytes:
    import io

    buf = io.BytesIO()
    pl.DataFrame([vars(h) for h in report.hits], schema=HITS_SCHEMA).write_parquet(buf)
    return buf.getvalue()


def open_corpus(tmp_path, workers: int = 1):
    config = write_corpus(tmp_path, workers)
    cfg = load_config(config)
    return config, cfg, LocalDataRoot(cfg.resolve(cfg.data_root))


def run_tasks(config, cfg, root, phase: str) -> list[ctasks.PartialRun]:
    """What the asset's step fans out before its reduction: one task per table of the phase."""
    partitions = ctasks.phase_partitions(root, read_manifest(root, phase))
    return map_tasks(RefineryResource(config_path=str(config)), partitions, scan_table_task)


def partial_files(root: LocalDataRoot) -> dict[str, bytes]:
    return {key: root.read_bytes(key) for key in root.list(ctasks.PARTIALS_PREFIX)}


def test_the_reduction_is_the_one_process_scan_and_phases_share_each_tables_scan(tmp_path):
    config, cfg, root = open_corpus(tmp_path)
    main_runs = run_tasks(config, cfg, root, "main")
    assert [(r.partition, r.scanned) for r in main_runs] == [(p, True) for p in sorted(FILES)]
    # anneal draws documents of every table main drew: nothing is scanned again.
    assert [(r.partition, r.scanned) for r in run_tasks(config, cfg, root, "anneal")] == [(p, False) for p in sorted(FILES)]
    assert len(partial_files(root)) == len(FILES)
    for phase in ["main", "anneal"]:
        reduced, reference = ctasks.scan_phase(cfg, root, phase), one_process_scan(config, phase)
        assert report_bytes(reduced) == report_bytes(reference), phase
        assert hits_bytes(reduced) == hits_bytes(reference), phase
    main, anneal = ctasks.scan_phase(cfg, root, "main"), ctasks.scan_phase(cfg, root, "anneal")
    assert (main.docs_scanned, anneal.docs_scanned) == (90, 30)
    assert [(h.doc_id, h.eval_id) for h in main.hits] == sorted(planted().items())
    assert [h.doc_id for h in anneal.hits] == ["web-0/0000003", "web-1/0000010"]
    assert {h.bucket for h in main.hits if h.doc_id.startswith("math")} == {"math"}
    # A partial holds every document of its table, in doc_id order, hits beside them.
    partial = ctasks.read_partial(root, ctasks.scan_task(root, cont.EvalIndex.build(cfg), "web-0"))
    assert partial["doc_id"].to_list() == [f"web-0/{d:07d}" for d in range(30)]
    assert partial.filter(pl.col("eval_set").is_not_null())["doc_id"].to_list() == ["web-0/0000003"]


def test_partials_and_reports_are_the_same_bytes_for_one_and_two_workers(tmp_path):
    results = []
    for workers in (1, 2):
        config, cfg, root = open_corpus(tmp_path / f"w{workers}", workers)
        assert cfg.partitions.workers == workers
        run_tasks(config, cfg, root, "main")
        results.append((partial_files(root), report_bytes(ctasks.scan_phase(cfg, root, "main"))))
    (one, one_report), (two, two_report) = results
    assert one.keys() == two.keys() and len(one) == len(FILES)
    assert one == two and one_report == two_report


def test_a_changed_eval_set_or_table_never_reuses_a_partial(tmp_path):
    config, cfg, root = open_corpus(tmp_path)
    run_tasks(config, cfg, root, "main")
    before = partial_files(root)

    # One table changes: a clean document now carries an eval item. Only that table is scanned again.
    key = documents_key(CLEAN_STAGE, "web-1")
    table = root.read_parquet(key)
    leaked = "web-1/0000020"
    root.write_parquet(key, table.with_columns(
        pl.when(pl.col("doc_id") == leaked).then(pl.col("text") + " " + EVAL_ITEMS[0]["text"]).otherwise(pl.col("text"))
        .alias("text")))
    # The reduction, without the tasks having run again, does not combine the old partial either.
    assert leaked in {h.doc_id for h in ctasks.scan_phase(cfg, root, "main").hits}
    runs = run_tasks(config, cfg, root, "main")
    assert [(r.partition, r.scanned) for r in runs] == [("math-0", False), ("web-0", False), ("web-1", True)]
    after = partial_files(root)
    assert len(after) == len(FILES), "the table's older partial is deleted"
    assert {k for k in after if k.startswith(ctasks.partials_prefix("web-1") + "/")}.isdisjoint(before)
    assert report_bytes(ctasks.scan_phase(cfg, root, "main")) == report_bytes(one_process_scan(config, "main"))

    # The eval set changes: every table is scanned again, against the new items.
    eval_path = tmp_path / "eval.jsonl"
    math = root.read_parquet(documents_key(CLEAN_STAGE, "math-0"))
    item = {"id": "q3", "text": " ".join(math.filter(pl.col("doc_id") == "math-0/0000005")["text"].item().split()[:20])}
    eval_path.write_text(eval_path.read_text() + json.dumps(item) + "\n")
    assert "math-0/0000005" in {h.doc_id for h in ctasks.scan_phase(cfg, root, "main").hits}
    assert all(r.scanned for r in run_tasks(config, cfg, root, "main"))
    assert set(partial_files(root)).isdisjoint(after) and len(partial_files(root)) == len(FILES)
    reduced = ctasks.scan_phase(cfg, root, "main")
    assert report_bytes(reduced) == report_bytes(one_process_scan(config, "main"))
    assert "math-0/0000005" in {h.doc_id for h in reduced.hits}


def test_a_damaged_partial_is_refused_by_name_and_scanned_again(tmp_path):
    config, cfg, root = open_corpus(tmp_path)
    run_tasks(config, cfg, root, "main")
    task = ctasks.scan_task(root, cont.EvalIndex.build(cfg), "web-0")
    path = root.local_path(task.key)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ctasks.DamagedPartial, match=rf"{task.key}: damaged scan partial \(not a readable table"):
        ctasks.read_partial(root, task)

    # `refinery scan`'s path (read-only): it says which partial it refused and scans the table itself.
    said: list[str] = []
    reduced = ctasks.scan_phase(cfg, root, "main", log=said.append)
    assert report_bytes(reduced) == report_bytes(one_process_scan(config, "main"))
    refused = [line for line in said if "damaged" in line]
    assert len(refused) == 1 and refused[0].startswith(f"{root.display(task.key)}: damaged scan partial (not a readable table")
    assert refused[0].endswith("; scanning web-0 again")
    assert path.read_bytes() == whole[: len(whole) // 2], "the read-only scan writes nothing"

    # The asset's tasks scan it again and store it whole.
    runs = {r.partition: r for r in run_tasks(config, cfg, root, "main")}
    assert runs["web-0"].scanned and runs["web-0"].damaged.startswith(f"{root.display(task.key)}: damaged scan partial")
    assert not runs["web-1"].scanned and runs["web-1"].damaged is None
    assert path.read_bytes() == whole

    # A readable file of another schema is refused as well.
    root.write_parquet(task.key, pl.DataFrame({"doc_id": ["web-0/0000000"]}))
    with pytest.raises(ctasks.DamagedPartial, match=r"damaged scan partial \(columns"):
        ctasks.read_partial(root, task)
