"""The data root on a real S3 server (SeaweedFS `weed mini` on 127.0.0.1, see conftest.py).

Round trips and atomicity run fast; the whole graph on S3 and the outage test are slow.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from refinery.shard_format import SHARD_SUFFIXES, ShardReader, ShardWriter
from refinery.shard_cache import ShardCache
from refinery.storage.s3 import S3DataRoot, S3StorageError

from helpers.configs import read_demo, with_quarter_curriculum, write_beside_sample
from helpers.digests import digests, dropped_by

REPO = Path(__file__).resolve().parents[1]


def test_round_trips_and_atomicity(s3_env, tmp_path):
    root = S3DataRoot("s3://refinery/unit", cache_dir=tmp_path / "writer")
    frame = pl.DataFrame({"doc_id": ["x", "y"], "text": ["hello", "world"]})
    digest = root.write_parquet("documents/s/p0.parquet", frame)
    root.write_json("manifests/main.json", {"phase": "main"})

    shard = tmp_path / "build" / "s0"
    shard.parent.mkdir()
    w = ShardWriter(shard, np.uint16)
    w.add(np.arange(10, dtype=np.uint16), "x")
    w.add(np.arange(5, dtype=np.uint16), "y")
    w.close()
    for suffix in SHARD_SUFFIXES:
        with root.writer("shards/final/web/s0" + suffix) as tmp:
            shutil.copyfile(str(shard) + suffix, tmp)

    with pytest.raises(RuntimeError, match="crashed"):
        with root.writer("documents/s/p1.parquet") as tmp:
            tmp.write_bytes(b"PAR1 half a file")
            raise RuntimeError("crashed mid-write")

    reader = S3DataRoot("s3://refinery/unit", cache_dir=tmp_path / "reader")
    assert reader.list("documents") == ["documents/s/p0.parquet"]
    assert reader.read_parquet("documents/s/p0.parquet").equals(frame)
    assert reader.sha256("documents/s/p0.parquet") == digest
    assert reader.read_json("manifests/main.json") == {"phase": "main"}
    with ShardCache(reader, max_bytes=1 << 20) as cache:
        r = ShardReader(cache.local_prefix("shards/final/web/s0"))
        assert len(r) == 2 and r.entry(1).tolist() == list(range(5))
    reader.delete("shards")
    assert reader.list("shards") == [] and reader.exists("documents/s/p0.parquet")


def test_bad_credentials_fail_clearly_without_the_secret(s3_env, monkeypatch, tmp_path):
    wrong = "not-the-secret-" + s3_env.secret_key[::-1]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    root = S3DataRoot("s3://refinery/unit", cache_dir=tmp_path / "c")
    with pytest.raises(S3StorageError) as info:
        root.write_json("a.json", {})
    text = str(info.value)
    assert "SignatureDoesNotMatch" in text and "s3://refinery/unit/a.json" in text
    assert wrong not in text and s3_env.secret_key not in text and wrong not in repr(root)


# ---- the graph on S3 -------------------------------------------------------------------------------


def s3_config(tmp_path: Path, prefix: str) -> str:
    """configs/demo.yaml with the data root moved to `s3://refinery/<prefix>`, reading the first
    file of each source (5 partitions instead of 16: every object goes through the S3 server)."""
    data = read_demo()
    data["data_root"] = f"s3://refinery/{prefix}"
    for source in data["sources"]:
        folder = Path(source["path"]).parent
        source["path"] = str(folder / sorted(p.name for p in (REPO / "configs" / folder).iterdir())[0])
    # One web file holds a third of the sample's web tokens; let the demo curriculum read it more often.
    data["curriculum"]["buckets"]["web"]["max_epochs"] = 12
    return write_beside_sample(tmp_path, prefix, with_quarter_curriculum(data))


def content_digests(root: S3DataRoot) -> dict[str, str]:
    """key -> sha256 of every object, JSON compared with its timing fields removed."""
    return digests((key, root.read_bytes(key)) for key in root.list(""))


def run_graph(config_path: str, instance, log=lambda line: None, through: str | None = None) -> None:
    """Materialize the whole graph, or only `through` and what it depends on."""
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import materialize_graph

    defs = build_definitions(config_path)
    selection = None
    if through is not None:
        selection = list(dg.AssetSelection.assets(through).upstream().resolve(defs.resolve_asset_graph()))
    materialize_graph(defs, instance, selection, log=log)


def all_event_text(instance) -> str:
    """Every event of every run (logs, materialization metadata, failures) as text."""
    return "\n".join(repr(entry) for run in instance.get_runs() for entry in instance.all_logs(run.run_id))


@pytest.mark.slow
def test_graph_runs_on_s3_through_manifests_and_training(s3_env, tmp_path, caplog, capfd):
    from refinery.curriculum import read_manifest
    from refinery.config import load_config

    from helpers.materialize import in_memory_instance

    config_path = s3_config(tmp_path, "e2e")
    cfg = load_config(config_path)
    with in_memory_instance(tmp_path / "dagster_home") as instance:
        with caplog.at_level(logging.DEBUG):
            run_graph(config_path, instance)
        events = all_event_text(instance)

    root = S3DataRoot("s3://refinery/e2e", cache_dir=tmp_path / "check")
    keys = root.list("")
    assert any(k.startswith("documents/") for k in keys)
    assert any(k.endswith(".idx") for k in keys)
    for phase in cfg.curriculum.phases:
        manifest = read_manifest(root, phase.name)
        assert manifest.phase == phase.name
    assert any(k.startswith(cfg.training.run_dir.strip("/") + "/") for k in keys), "no training output on S3"

    captured = capfd.readouterr()
    for text in (events, caplog.text, captured.out, captured.err):
        assert s3_env.secret_key not in text
    assert "s3://refinery/e2e" in events


# The outage test runs the funnel through PII: every kind of object write (Parquet, JSON, a model
# file) without the training run, whose logs carry timings.
OUTAGE_GRAPH_END = "pii_redacted"


@pytest.mark.slow
def test_outage_mid_materialization_fails_cleanly_and_retry_matches_a_clean_run(s3_env, tmp_path):
    from helpers.materialize import in_memory_instance

    clean_cfg = s3_config(tmp_path, "clean")
    fault_cfg = s3_config(tmp_path, "fault")
    with in_memory_instance(tmp_path / "home_clean") as instance:
        run_graph(clean_cfg, instance, through=OUTAGE_GRAPH_END)
    clean = content_digests(S3DataRoot("s3://refinery/clean", cache_dir=tmp_path / "c1"))

    groups_done = []

    def stop_after_first_group(line: str) -> None:
        groups_done.append(line)
        if len(groups_done) == 1:
            s3_env.stop()

    with in_memory_instance(tmp_path / "home_fault") as instance:
        with pytest.raises(Exception) as info:
            run_graph(fault_cfg, instance, log=stop_after_first_group, through=OUTAGE_GRAPH_END)
        message = "".join(str(e) for e in _exception_chain(info.value))
        assert "S3" in message and s3_env.endpoint in message
        assert s3_env.secret_key not in message + all_event_text(instance)

        s3_env.start()
        fault_root = S3DataRoot("s3://refinery/fault", cache_dir=tmp_path / "c2")
        after_outage = content_digests(fault_root)
        # Everything on S3 after the outage is a complete object that a clean run also wrote (and,
        # for the bottom-k sketches the fault run wrote before near_dup_clusters, dropped since).
        assert after_outage and all(clean.get(k) == v or dropped_by(clean, k) for k, v in after_outage.items())

        run_graph(fault_cfg, instance, through=OUTAGE_GRAPH_END)
    assert content_digests(S3DataRoot("s3://refinery/fault", cache_dir=tmp_path / "c3")) == clean


def _exception_chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        if hasattr(error, "user_exception") and error.user_exception is not None:
            yield error.user_exception
        error = error.__cause__ or error.__context__
