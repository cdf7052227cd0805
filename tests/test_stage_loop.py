"""The one stage loop (`RecordStage`): counting, reject rows, written columns, `skip:`, and
per-record isolation (a record that raises or overruns is one reject; the rest goes on)."""

import os
import time

import polars as pl

from refinery.stages.base import Chain, Drop, Filter, RecordStage
from refinery.stages.stats import StageStats
from refinery.stages.isolation import IsolatedWorker
from refinery.documents import REJECTS_SCHEMA

from helpers.processes import imported_here


def docs(texts: list[str | None]) -> pl.DataFrame:
    n = len(texts)
    return pl.DataFrame({
        "doc_id": [f"s/{i}" for i in range(n)], "url": [f"https://x.example/{i}" for i in range(n)],
        "source": ["s"] * n, "bucket": ["b"] * n, "text": texts,
    }, schema_overrides={"text": pl.String})


class Shouting(RecordStage):
    name = "shout_filtered"
    family = "shout"
    skip_key = "shout"
    writes = {"text": pl.String(), "loudness": pl.Int64()}
    batch_size = 2

    def process(self, record, counters):
        text = record["text"]
        if text == "boom":
            raise ValueError("boom went the record")
        if text == "slow":
            deadline = time.perf_counter() + 30
            while time.perf_counter() < deadline:  # pure Python: the alarm interrupts it
                pass
        if text.isupper():
            return Drop("shout/too_loud", len(text), "all capitals")
        counters["shout/seen"] += 1
        return {"text": text.lower(), "loudness": text.count("!")}


def test_outcomes_become_columns_rejects_and_counts():
    out = Shouting().run(docs(["Hello!", "QUIET", "Bye!!", "plain"]))
    assert out.documents["text"].to_list() == ["hello!", "bye!!", "plain"]
    assert out.documents["loudness"].to_list() == [1, 2, 0]
    assert dict(out.rejects.schema) == REJECTS_SCHEMA
    assert out.rejects.select("doc_id", "stage", "rule", "value", "detail").rows() == [
        ("s/1", "shout_filtered", "shout/too_loud", 5.0, "all capitals")
    ]
    s = out.stats
    assert (s.stage, s.docs_in, s.docs_out) == ("shout_filtered", 4, 3)
    assert s.dropped == {"shout/too_loud": 1}
    assert s.counters == {"shout/seen": 3}
    assert s.by_bucket["b"].docs_out == 3


def test_a_record_that_raises_is_one_error_reject_and_the_rest_goes_on():
    out = Shouting().run(docs(["one", "boom", "two", "three"]))
    assert out.documents["doc_id"].to_list() == ["s/0", "s/2", "s/3"]
    assert out.rejects.select("doc_id", "rule", "detail").rows() == [
        ("s/1", "shout/error", "ValueError: boom went the record")
    ]
    assert out.stats.dropped == {"shout/error": 1}


def test_a_record_past_its_budget_is_one_timeout_reject():
    stage = Shouting()
    stage.record_timeout_s = 0.2
    start = time.perf_counter()
    out = stage.run(docs(["one", "slow", "two"]))
    assert time.perf_counter() - start < 5
    assert out.documents["doc_id"].to_list() == ["s/0", "s/2"]
    assert out.rejects["rule"].to_list() == ["shout/timeout"]
    assert 0.2 <= out.rejects["value"][0] < 5  # interrupted, not left to run its 30 s


class BatchedShouting(Shouting):
    """A stage whose batch path fails on one record: the batch is redone record by record."""

    def process_batch(self, batch, counters):
        texts = batch["text"].to_list()
        return [{"text": t.lower(), "loudness": len(t)} for t in texts if t.encode()]  # None raises


def test_a_failing_batch_is_redone_record_by_record():
    out = BatchedShouting().run(docs(["Ab", "cd", None, "Ef!"]))
    # Records 0-1 took the batch path (loudness = length); 2-3 were redone one by one.
    assert out.documents.select("doc_id", "text", "loudness").rows() == [
        ("s/0", "ab", 2), ("s/1", "cd", 2), ("s/3", "ef!", 1)
    ]
    assert out.rejects["rule"].to_list() == ["shout/error"]
    assert out.rejects["detail"][0].startswith("AttributeError")


def test_skip_passes_everything_with_written_columns_null():
    out = Shouting().run_for_source(docs(["LOUD", "boom"]), ["shout"])
    assert out.documents["text"].to_list() == ["LOUD", "boom"]
    assert out.documents["loudness"].null_count() == 2
    assert out.stats.counters == {"skipped_by_source": 2}
    assert out.rejects.height == 0
    assert Shouting().run_for_source(docs(["LOUD"]), ["other"]).rejects["rule"].to_list() == ["shout/too_loud"]


class NoTextFilter(Filter):
    name = "no_text_filtered"
    family = "no_text"

    def check(self, record):
        return None if record["text"] else Drop("no_text/empty")


def test_filter_keeps_or_drops_and_never_changes_kept_documents():
    frame = docs(["a", None, "c"])
    out = NoTextFilter().run(frame)
    assert out.documents.equals(frame.filter(pl.col("text").is_not_null()))
    assert out.stats.dropped == {"no_text/empty": 1}


def test_empty_table_keeps_its_schema_and_the_written_columns():
    out = Shouting().run(docs([]))
    assert out.documents.height == 0
    assert out.documents.schema["loudness"] == pl.Int64
    assert {**out.stats.to_dict(), "wall_s": 0} == StageStats(stage="shout_filtered").to_dict()


# --------------------------------------------------------------------------------------------------
# The isolated worker (functions at module level so the spawned child can import them)
# --------------------------------------------------------------------------------------------------


def behave(item: str) -> str:
    if item == "hang":
        time.sleep(60)
    if item == "crash":
        os._exit(3)
    if item == "raise":
        raise KeyError("no such thing")
    return item.upper()


def test_worker_kills_an_overrun_survives_a_crash_and_finishes_the_batch():
    worker = IsolatedWorker(behave, budget_s=1.0)
    try:
        start = time.perf_counter()
        results = worker.map(["a", "hang", "b", "crash", "raise", "c"])
        assert time.perf_counter() - start < 45  # the hung item sleeps 60 s: it was killed
        assert [r[0] for r in results] == ["ok", "timeout", "ok", "error", "error", "ok"]
        assert [results[i][1] for i in (0, 2, 5)] == ["A", "B", "C"]
        assert results[1][1] >= 1.0
        assert results[3][1] == "WorkerDied: the worker process exited with code 3"
        assert results[4][1] == "KeyError: 'no such thing'"
        assert worker.restarts == 2
        assert worker.map(["d"]) == [("ok", "D")]  # the same worker serves the next batch
    finally:
        worker.close()


def test_worker_sends_large_items_in_bounded_chunks(monkeypatch):
    import refinery.stages.isolation as isolation

    monkeypatch.setattr(isolation, "MAX_SEND_CHARS", 10)
    assert isolation._chunks(["aaaa", "bbbb", "cc", "d" * 30, "e"], 10) == [["aaaa", "bbbb", "cc"], ["d" * 30], ["e"]]
    worker = IsolatedWorker(behave, budget_s=5.0)
    try:
        assert worker.map(["aaaa", "bbbb", "cc", "d" * 30, "e"]) == [
            ("ok", "AAAA"), ("ok", "BBBB"), ("ok", "CC"), ("ok", "D" * 30), ("ok", "E")
        ]
    finally:
        worker.close()


def test_the_worker_imports_its_function_and_not_the_parents_modules():
    # The parent (this test process) has polars, pydantic (the config) and the isolation module
    # loaded; a child that imported the isolation module would have them all.
    worker = IsolatedWorker(imported_here, budget_s=60.0)
    try:
        names = ["helpers.processes", "refinery.stages.isolated_child", "refinery.stages.isolation", "polars",
                 "pydantic", "pytest"]
        assert dict(zip(names, (value for _, value in worker.map(names)))) == {
            "helpers.processes": True, "refinery.stages.isolated_child": True, "refinery.stages.isolation": False,
            "polars": False, "pydantic": False, "pytest": False,
        }
    finally:
        worker.close()


class NoShortText(Filter):
    name = "short"
    family = "short"
    reads = ("text",)

    def check(self, record):
        return Drop("short/too_short", len(record["text"])) if len(record["text"]) < 4 else None


def test_chain_runs_its_parts_in_order_and_reports_one_stage():
    chain = Chain("checked", [Shouting(), NoShortText()], {"parts": 2}, skip_key="check")
    chain.record_timeout_s = 1.5
    out = chain.run(docs(["Hello!", "QUIET", "Hi", "slow", "plain"]))
    assert out.documents["text"].to_list() == ["hello!", "plain"]
    assert out.rejects.select("doc_id", "stage", "rule").rows() == [
        ("s/1", "checked", "shout/too_loud"), ("s/3", "checked", "shout/timeout"), ("s/2", "checked", "short/too_short"),
    ]
    s = out.stats
    assert (s.stage, s.docs_in, s.docs_out) == ("checked", 5, 2)
    assert s.dropped == {"shout/too_loud": 1, "shout/timeout": 1, "short/too_short": 1}
    assert s.counters == {"shout/seen": 3}
    assert (s.bytes_in, s.bytes_out) == (len("Hello!QUIETHislowplain"), len("hello!plain"))
    assert all(part.record_timeout_s == 1.5 for part in chain.parts)
    assert chain.config_summary() == {"parts": 2}


def test_a_skipped_chain_keeps_everything_with_every_column_its_parts_write():
    chain = Chain("checked", [NoShortText(), Shouting()], {}, skip_key="check")
    out = chain.run_for_source(docs(["Hi", "QUIET"]), ["check"])
    assert out.documents.select("text", "loudness").rows() == [("Hi", None), ("QUIET", None)]
    assert out.rejects.height == 0
    assert (out.stats.stage, out.stats.docs_in, out.stats.docs_out) == ("checked", 2, 2)
    assert out.stats.counters == {"skipped_by_source": 2}
