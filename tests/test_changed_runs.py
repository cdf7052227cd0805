"""Per-partition truth and `refinery demo --changed` (issue 25, items 3 and 4): each batch of a run
over many has its own data version, the hash of what it wrote, so a batch re-run alone changes no
version and marks nothing stale; an edited custom filter reruns heuristic_filtered and what reads
it, not ingest, extraction or language ID, and a pinned tokenizer keeps its bytes; an edited config
value reruns the assets that read it."""

import json
import re
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.data_version import StaleStatus

from orchestration.changed import CODE_CHANGED, INPUTS_MOVED, INPUTS_REMOVED, MISSING, UPSTREAM_RERUNS, stale_plan
from orchestration.definitions import build_definitions
from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph, run_changed
from refinery.config import load_config
from refinery.documents import input_batches
from refinery.layout import TOKENIZER_KEY, documents_key, rejects_key
from refinery.storage import LocalDataRoot

from helpers import configs
from helpers.materialize import in_memory_instance, materialize_in_workspace
from helpers.staleness import data_version, metadata, stale_statuses
from helpers.texts import PROSE

FUNNEL = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered"]
FILTER = """
from refinery.stages.base import Drop, Filter

MIN_WORDS = {min_words}


class MinWords(Filter):
    reads = ("text",)

    def check(self, record):
        words = len(record["text"].split())
        return Drop("too_few_words", words) if words < MIN_WORDS else None
"""


def write_corpus(folder: Path, files: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        lines = [json.dumps({"text": f"Story {i}.{j}. {PROSE}", "url": f"https://f{i}.example/{j}"}) for j in range(3)]
        (folder / f"f{i}.jsonl").write_text("\n".join(lines) + "\n")


def write_config(tmp_path: Path, module: str, pin: bool = True) -> Path:
    return configs.write_config(tmp_path, {
        "seed": 1, "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "web/*.jsonl", "format": "jsonl", "bucket": "web"}],
        "partitions": {"by": "hash", "count": 3},
        "stages": {"quality": {"enabled": False},
                   "custom_filters": [{"name": "words", "path": f"{module}:MinWords"}]},
        "tokenizer": {"vocab_size": 300, "pin": pin},
    })


@pytest.fixture
def corpus(tmp_path):
    """A three-batch corpus and a config with a custom filter module beside it (a fresh module name,
    forgotten after the test)."""
    module = f"min_words_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(FILTER.format(min_words=5))
    write_corpus(tmp_path / "web", 6)
    yield tmp_path, module, write_config(tmp_path, module)
    sys.modules.pop(module, None)


def test_a_batch_rerun_alone_keeps_its_data_version_and_marks_nothing_stale(corpus):
    tmp_path, _, config = corpus
    batches = {b.key: [s.key for s in b.shards] for b in input_batches(load_config(config))}
    assert len(batches) == 3
    defs = build_definitions(str(config))
    with in_memory_instance(tmp_path / "dagster") as instance:
        assert materialize_graph(defs, instance, [dg.AssetKey(k) for k in FUNNEL], log=lambda _: None,
                                 run_config=QUIET_RUN_CONFIG) == 1, "every batch in one run"
        before = {(a, b): data_version(instance, a, b) for a in FUNNEL for b in batches}
        for name in FUNNEL:
            assert len({before[name, b] for b in batches}) == 3, f"{name}: each batch its own data version"
        for key, files in batches.items():
            md = metadata(instance, "extracted_text", key)
            assert md["input_files"] == len(files)
            assert set(md["content_hashes"]) == {k for f in files for k in (documents_key("extracted_text", f),
                                                                             rejects_key("extracted_text", f))}

        rerun = sorted(batches)[0]
        assert materialize_in_workspace(config, instance, "extracted_text", rerun, QUIET_RUN_CONFIG).success
        assert data_version(instance, "extracted_text", rerun) == before["extracted_text", rerun]
        assert metadata(instance, "extracted_text", rerun)["input_files"] == len(batches[rerun])
        statuses = stale_statuses(defs, instance, FUNNEL, sorted(batches))
        assert set(statuses.values()) == {StaleStatus.FRESH}, statuses
        assert stale_plan(defs, instance, [dg.AssetKey(k) for k in FUNNEL]) == []


def test_an_edited_custom_filter_reruns_what_reads_it_and_keeps_the_pinned_tokenizer(corpus):
    tmp_path, module, config = corpus
    root = LocalDataRoot(tmp_path / "out")
    with in_memory_instance(tmp_path / "dagster") as instance:
        lines: list[str] = []
        first = run_changed(build_definitions(str(config)), instance, lines.append, QUIET_RUN_CONFIG)
        assert {p.key.to_user_string() for p in first} >= {*FUNNEL, "tokenizer", "tokenized_shards"}
        assert all(list(p.reasons) == [MISSING] for p in first)
        tokenizer_json = root.read_bytes(TOKENIZER_KEY)
        assert run_changed(build_definitions(str(config)), instance, lines.append, QUIET_RUN_CONFIG) == []

        (tmp_path / f"{module}.py").write_text(FILTER.format(min_words=6))
        sys.modules.pop(module, None)
        lines.clear()
        defs = build_definitions(str(config))
        planned = run_changed(defs, instance, lines.append, QUIET_RUN_CONFIG)
        names = [p.key.to_user_string() for p in planned]
        graph = defs.resolve_asset_graph()
        after_filter = {k.to_user_string() for k in graph.materializable_asset_keys
                        if dg.AssetKey("heuristic_filtered") in graph.get_ancestor_asset_keys(k)}
        assert set(names) == {"heuristic_filtered"} | after_filter
        assert not {"raw_documents", "extracted_text", "language_filtered"} & set(names)
        assert planned[0].key == dg.AssetKey("heuristic_filtered")
        assert list(planned[0].reasons) == [CODE_CHANGED] and len(planned[0].partitions) == 3
        assert all(list(p.reasons) == [UPSTREAM_RERUNS] for p in planned[1:])
        assert lines[0].startswith(f"Will materialize {len(planned)} asset(s)")
        # The edited module is named: the plan knows which of the version's parts moved.
        assert lines[1] == f"  heuristic_filtered: code or config changed (3 partition(s)): code edited: {module}"

        assert root.read_bytes(TOKENIZER_KEY) == tokenizer_json, "the pinned tokenizer.json is kept byte for byte"
        assert metadata(instance, "tokenizer")["source"] == f"reused pinned {TOKENIZER_KEY}"

        # A value in the YAML, no code: only the assets that read it, and what follows them.
        data = yaml.safe_load(config.read_text())
        data["stages"]["pii"] = {"email": False}
        config.write_text(yaml.safe_dump(data))
        defs = build_definitions(str(config))
        planned = stale_plan(defs, instance)
        graph = defs.resolve_asset_graph()
        after_pii = {k.to_user_string() for k in graph.materializable_asset_keys
                     if dg.AssetKey("pii_redacted") in graph.get_ancestor_asset_keys(k)}
        assert {p.key.to_user_string() for p in planned} == {"pii_redacted"} | after_pii
        assert planned[0].key == dg.AssetKey("pii_redacted") and list(planned[0].reasons) == [CODE_CHANGED]

        # Every file of one batch deleted: its partition is gone, so the assets that read every batch
        # rerun, and once they have, the instance records the batch as gone and plans nothing.
        gone = input_batches(load_config(config))[0]
        for shard in gone.shards:
            Path(shard.path).unlink()
        defs = build_definitions(str(config))
        planned = {p.key.to_user_string(): p for p in stale_plan(defs, instance)}
        assert INPUTS_REMOVED in planned["exact_deduped"].reasons and f"{gone.key} gone" in planned["exact_deduped"].line()
        assert "raw_documents" not in planned
        # The files after the gone ones have new shard ordinals, which every doc_key holds.
        assert list(planned["dedup_signatures"].reasons) == [INPUTS_MOVED]
        assert re.search(r"web-f\d \d->\d", planned["dedup_signatures"].line())
        run_changed(defs, instance, lines.append, QUIET_RUN_CONFIG)
        assert stale_plan(build_definitions(str(config)), instance) == []
