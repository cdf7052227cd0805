"""quality_model, quality_scored and pii_redacted materialized with Dagster on hand-made `deduped`
tables: files, metadata, planted PII, source skips, byte-identical reruns and a failing input."""

import json
import random

import dagster as dg
import polars as pl
import pytest

from assets.provenance import PROVENANCE_KEYS
from assets import quality
from refinery.models.quality_training import load_published_model, training_batches
from refinery.models import quality_fit as qfit
from refinery.stages.pii import PLACEHOLDERS
from refinery.config import load_config
from refinery.documents import PROVENANCE_SCHEMA, input_shards, make_doc_id
from refinery.layout import documents_key, kept_documents_key, rejects_key, stats_key
from refinery.stages.attributes import read_stage_documents, write_stage_documents
from refinery.storage import LocalDataRoot

from helpers import configs
from helpers.configs import REPO, demo_config
from helpers.materialize import materialize, module_assets

CURATED = ("the council approved a history of the valley written from parish records and letters kept by "
           "families who farmed the river plain for generations").split()
SPAM = "click buy cheap deals free casino bonus win money online offer sale discount now".split()
PLANTED_EMAILS = ["alice.smith@example.org", "bob+news@mail.example.co.uk", "carol_99@uni.example.edu"]
PLANTED_IPS = ["10.0.0.1", "192.168.1.254", "81.2.69.160", "2a00:1450::7"]
SOURCES = {"web": ["a", "b"], "wiki": ["a"], "books": ["a"], "code": ["a"]}


def write_config(tmp_path, threshold=0.5, positive=("books", "wiki"), safety=None, **quality):
    for source, stems in SOURCES.items():
        (tmp_path / "in" / source).mkdir(parents=True, exist_ok=True)
        for stem in stems:
            (tmp_path / "in" / source / f"{stem}.jsonl").write_text("")
    cfg = {
        "seed": 5,
        "data_root": "out",
        "buckets": ["web", "wiki", "books", "code"],
        "sources": [
            {"name": s, "path": f"in/{s}/*.jsonl", "format": "jsonl", "bucket": s,
             **({"skip": ["quality"]} if s == "code" else {})}
            for s in SOURCES
        ],
        "stages": {
            # The buckets alone: these hand-made buckets' counts and scores are what is checked here
            # (the shipped labelled pages that join a config by default: test_quality_labels.py).
            "quality": {"positive_buckets": list(positive), "negative_buckets": ["web"], "threshold": threshold,
                        "num_features": 4096, "shipped_labelled_pages": False, **quality},
            "safety": safety or {"blocked_words": ["forbiddenword"], "blocked_domains": ["blocked.example"]},
        },
    }
    return str(configs.write_config(tmp_path, cfg))


def deduped_table(shard_key: str, bucket: str, n: int, rng: random.Random) -> pl.DataFrame:
    vocab = SPAM if bucket in ("web", "code") else CURATED
    texts = []
    for i in range(n):
        words = [rng.choice(vocab) for _ in range(50)]
        if bucket in ("wiki", "code") and i % 3 == 0:
            words.insert(10, f"mail {PLANTED_EMAILS[i % len(PLANTED_EMAILS)]} or host {PLANTED_IPS[i % len(PLANTED_IPS)]}")
        texts.append(" ".join(words))
    urls = [f"https://{'blocked.example' if bucket == 'web' and i == 1 else 'site.example'}/{shard_key}/{i}"
            for i in range(n)]
    if bucket == "web":
        # curated-looking, in words and in shape (50 words of the curated vocabulary, like the curated
        # documents), so it survives quality, then safety drops it
        curated = random.Random(len(shard_key))
        texts[2] = "forbiddenword " + " ".join(curated.choice(CURATED) for _ in range(50))
    cols = {
        "doc_id": [make_doc_id(shard_key, i) for i in range(n)],
        "url": urls,
        "source": [bucket] * n,
        "bucket": [bucket] * n,
        "file": [f"in/{shard_key}.jsonl"] * n,
        "record_index": list(range(n)),
        "record_offset": [i * 100 for i in range(n)],
        "fetch_time": [None] * n,
        "content_type": ["text/plain"] * n,
    }
    df = pl.DataFrame(cols, schema=PROVENANCE_SCHEMA)
    return df.with_columns(
        text=pl.Series(texts), language=pl.lit("en"), language_score=pl.lit(0.99),
        dup_cluster=pl.lit(None, pl.String), dup_cluster_size=pl.lit(1, pl.Int64),
    )


def seed_deduped(config_path: str) -> tuple:
    cfg = load_config(config_path)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    rng = random.Random(0)
    for shard in input_shards(cfg):
        write_stage_documents(root, "deduped", shard.key, deduped_table(shard.key, shard.bucket, 40, rng))
    return cfg, root


def materialize_all(config_path: str):
    cfg = load_config(config_path)
    assets = module_assets(quality, config_path)
    results = {"quality_model": materialize([assets["quality_model"]], config_path)}
    for name in ("quality_scored", "pii_redacted"):
        for shard in input_shards(cfg):
            results[f"{name}[{shard.key}]"] = materialize([assets[name]], config_path, partition_key=shard.key)
    return results


def metadata(result, name):
    mats = result.asset_materializations_for_node(name)
    return {k: v.value for k, v in mats[0].metadata.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quality_assets")
    config_path = write_config(tmp)
    cfg, root = seed_deduped(config_path)
    return cfg, root, materialize_all(config_path)


def test_quality_model_publishes_a_versioned_model_with_its_accuracy(run):
    cfg, root, results = run
    md = metadata(results["quality_model"], "quality_model")
    assert md["holdout_accuracy"] >= 0.9
    trained, held = md["train_by_bucket"], md["holdout_by_bucket"]
    assert (trained["books"] + trained["wiki"], trained["web"]) == (64, 64)
    assert (held["books"] + held["wiki"], held["web"]) == (16, 16)  # 20% of each class
    pointer = root.read_json("models/quality/latest.json")
    assert pointer["model_key"] == f"models/quality/quality-{md['model_hash']}.pt"
    assert root.sha256(pointer["model_key"]) == pointer["sha256"] == md["content_hashes"][pointer["model_key"]]
    assert pointer["features"]["num_features"] == 4096 and pointer["settings"]["seed"] == 5


def test_quality_scored_keeps_the_score_and_drops_web_below_threshold(run):
    cfg, root, results = run
    for shard in input_shards(cfg):
        docs = read_stage_documents(root, "quality_scored", shard.key)
        assert docs["quality_score"].is_between(0.0, 1.0).all()
        stats = root.read_json(stats_key("quality_scored", shard.key))
        md = metadata(results[f"quality_scored[{shard.key}]"], "quality_scored")
        assert md["docs_in"] == 40 and md["docs_out"] == docs.height == stats["docs_out"]
        if shard.bucket == "web":
            assert docs["doc_id"].to_list() == [make_doc_id(shard.key, 2)]  # only the curated-looking one
            rejects = root.read_parquet(rejects_key("quality_scored", shard.key))
            assert set(rejects["rule"]) == {"quality/below_threshold"} and rejects["value"].max() < 0.5
        elif shard.bucket == "code":  # spam-like, but its source skips quality
            assert docs.height == 40 and md["threshold_enforced"] is False and "never dropped" in md["note"]
            # every document below the threshold kept and counted (the spam-like ones without planted
            # emails and IPs, whose digits the curated wiki shares)
            below = int((docs["quality_score"] < 0.5).sum())
            assert below >= 20 and stats["counters"]["quality/below_threshold_kept_by_skip"] == below
        else:
            assert docs.height == 40 and md["threshold_enforced"] is True


def test_pii_redacted_removes_every_planted_email_and_ip_and_counts_them(run):
    cfg, root, results = run
    planted = {"email": 0, "ip": 0}
    for shard in input_shards(cfg):
        scored = read_stage_documents(root, "quality_scored", shard.key)
        planted["email"] += sum(scored["text"].str.count_matches(e, literal=True).sum() for e in PLANTED_EMAILS)
        planted["ip"] += sum(scored["text"].str.count_matches(ip, literal=True).sum() for ip in PLANTED_IPS)
        docs = root.read_parquet(documents_key("pii_redacted", shard.key))
        for value in PLANTED_EMAILS + PLANTED_IPS:
            assert not docs["text"].str.contains(value, literal=True).any(), value
        counts = docs["pii_counts"].struct.unnest()
        stats = root.read_json(stats_key("pii_redacted", shard.key))
        for kind in ("email", "ip"):
            assert counts[kind].sum() == stats["counters"].get(f"pii/{kind}", 0)
            assert docs["text"].str.count_matches(PLACEHOLDERS[kind], literal=True).sum() == counts[kind].sum()
        md = metadata(results[f"pii_redacted[{shard.key}]"], "pii_redacted")
        assert md["docs_out"] == docs.height
    assert planted == {"email": 28, "ip": 28}
    totals = [root.read_json(stats_key("pii_redacted", s.key))["counters"] for s in input_shards(cfg)]
    assert sum(c.get("pii/email", 0) for c in totals) == 28 and sum(c.get("pii/ip", 0) for c in totals) == 28


def test_a_kept_documents_quality_score_is_the_published_models_score_of_its_kept_text(run):
    cfg, root, _ = run
    model, _ = load_published_model(root)
    rescored = 0
    for shard in input_shards(cfg):
        docs = root.read_parquet(documents_key("pii_redacted", shard.key))
        # to float32 rounding: torch's sigmoid of a batch and of its tail differ in the last bit
        assert docs["quality_score"].to_numpy() == pytest.approx(model.score(docs["text"]), abs=1e-6)
        # the score before redaction stays in quality_scored's table, and differs where the text changed
        before = read_stage_documents(root, "quality_scored", shard.key).select("doc_id", unredacted="quality_score")
        both = docs.join(before, on="doc_id", how="left")
        redacted = both["pii_counts"].struct.unnest().sum_horizontal() > 0
        changed, unchanged = both.filter(redacted), both.filter(~redacted)
        assert ((changed["quality_score"] - changed["unredacted"]).abs() > 1e-6).all()
        assert unchanged["quality_score"].to_list() == unchanged["unredacted"].to_list()
        counters = root.read_json(stats_key("pii_redacted", shard.key))["counters"]
        assert counters.get("pii/rescored", 0) == changed.height
        rescored += changed.height
    assert rescored == 28  # every document with a planted email and IP (wiki and code, one in three)


def test_pii_redacted_carries_the_shards_funnel_chart(run):
    import base64
    import re

    from refinery.reports.funnel import files_stage_stats, funnel_chart_png

    cfg, root, results = run
    shard = input_shards(cfg)[0]
    md = metadata(results[f"pii_redacted[{shard.key}]"], "pii_redacted")["funnel_chart"]
    png = base64.b64decode(re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", md).group(1))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5_000
    stats = files_stage_stats(root, [shard.key])
    assert [st.stage for st in stats] == ["quality_scored", "pii_redacted"], "the stages this shard went through"
    assert funnel_chart_png(stats, f"funnel of {shard.key}") == png, "the chart is drawn from the stored stats, byte for byte"


def test_pii_redacted_safety_drops_land_in_rejects(run):
    cfg, root, _ = run
    for key in ("web-a", "web-b"):
        rejects = root.read_parquet(rejects_key("pii_redacted", key))
        assert rejects["rule"].to_list() == ["safety/blocked_words"]
        assert rejects["doc_id"].to_list() == [make_doc_id(key, 2)]
        assert set(rejects["stage"]) == {"pii_redacted"}
        assert root.read_json(stats_key("pii_redacted", key))["dropped"] == {"safety/blocked_words": 1}


def test_rerun_gives_identical_bytes(run, tmp_path):
    cfg, root, _ = run
    config_path = write_config(tmp_path)
    _, again = seed_deduped(config_path)
    materialize_all(config_path)
    assert again.read_json("models/quality/latest.json")["sha256"] == root.read_json("models/quality/latest.json")["sha256"]
    for shard in input_shards(cfg):
        for stage in ("quality_scored", "pii_redacted"):
            for key in (kept_documents_key(stage, shard.key), rejects_key(stage, shard.key)):
                assert again.sha256(key) == root.sha256(key), key


def test_quality_model_without_positive_documents_fails_naming_the_field(tmp_path):
    config_path = write_config(tmp_path, positive=("code",))
    cfg, root = seed_deduped(config_path)
    for shard in input_shards(cfg):
        if shard.bucket == "code":
            write_stage_documents(root, "deduped", shard.key,
                                  deduped_table(shard.key, "code", 3, random.Random(1)).with_columns(text=pl.lit("")))
    model_asset = module_assets(quality, config_path)["quality_model"]
    result = materialize([model_asset], config_path, raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error
    assert "stages.quality.positive_buckets" in failure.to_string()
    assert not root.exists("models/quality/latest.json")


def test_disabled_classifier_trains_nothing_and_keeps_every_document(tmp_path):
    config_path = write_config(tmp_path, enabled=False)
    cfg, root = seed_deduped(config_path)
    results = materialize_all(config_path)
    model_md = metadata(results["quality_model"], "quality_model")
    # Beside the provenance every asset records, only `enabled`; and the provenance names no output.
    assert {k: v for k, v in model_md.items() if k not in PROVENANCE_KEYS} == {"enabled": False}
    assert model_md["content_hashes"] == {} and "docs_in" not in model_md, "no row for what it has not"
    assert not root.exists("models/quality/latest.json")
    for shard in input_shards(cfg):
        docs = read_stage_documents(root, "quality_scored", shard.key)
        assert docs.height == 40 and docs["quality_score"].null_count() == 40
        assert root.read_json(stats_key("quality_scored", shard.key))["counters"] == {"quality/disabled": 40}
        # Safety still runs: web loses its blocked-domain and its blocked-word document.
        assert root.read_parquet(documents_key("pii_redacted", shard.key)).height == (38 if shard.bucket == "web" else 40)


def test_training_streams_only_the_capped_documents_and_trains_the_same_model(tmp_path):
    config_path = write_config(tmp_path, max_train_docs_per_class=5)
    cfg, root = seed_deduped(config_path)
    read = training_batches(cfg, root)
    assert max(batch.height for batch in read()) <= qfit.FEATURIZE_DOCS
    chosen = qfit.streamed_training_set(read, ["books", "wiki"], ["web"], 5, cfg.seed)
    assert chosen.group_by(pl.col("bucket") == "web").len()["len"].to_list() == [5, 5]
    everything = pl.concat([read_stage_documents(root, "deduped", s.key) for s in input_shards(cfg)])
    args = dict(num_features=4096, ngram=2, epochs=5, learning_rate=0.5, holdout_fraction=0.2, max_chars=100_000,
                max_docs_per_class=5, seed=cfg.seed)
    from_stream, _ = qfit.train_quality_model(read, ["books", "wiki"], ["web"], **args)
    from_all, _ = qfit.train_quality_model(everything, ["books", "wiki"], ["web"], **args)
    assert from_stream.to_bytes() == from_all.to_bytes()


@pytest.mark.slow
def test_sample_planted_pii_is_all_redacted_through_the_graph(tmp_path):
    """The bundled sample through every asset up to pii_redacted: each planted email, IP, phone
    number and card number that reaches pii_redacted is gone from its text and counted."""
    from orchestration.definitions import build_definitions as build_workspace
    from orchestration.demo import materialize_graph

    data = demo_config(tmp_path / "out")
    # The sample plants addresses of the documentation ranges (192.0.2.x, 2001:db8::), kept by default.
    data.setdefault("stages", {}).setdefault("pii", {})["redact_documentation_ips"] = True
    config_path = configs.write_config(tmp_path, data, "demo.yaml")
    defs = build_workspace(str(config_path))
    selection = list(dg.AssetSelection.assets("pii_redacted").upstream().resolve(defs.resolve_asset_graph()))
    materialize_graph(defs, dg.DagsterInstance.ephemeral(), selection, log=lambda _: None)

    root = LocalDataRoot(tmp_path / "out")
    cfg = load_config(config_path)
    before = pl.concat([read_stage_documents(root, "quality_scored", s.key) for s in input_shards(cfg)])
    after = pl.concat([root.read_parquet(documents_key("pii_redacted", s.key)) for s in input_shards(cfg)])
    planted = json.loads((REPO / "data" / "sample" / "ground_truth.json").read_text())["pii"]
    kind_of = {"email": "email", "ipv4": "ip", "ipv6": "ip", "phone": "phone", "credit_card": "credit_card"}
    reached = [p for p in planted if p["url"] in set(after["url"])]
    assert len({p["url"] for p in reached}) >= 5, "too few planted documents reach pii_redacted to test anything"
    texts_before = dict(zip(before["url"], before["text"]))
    for p in reached:
        assert p["value"] in texts_before[p["url"]], p  # planted text arrives intact ...
    for text in after["text"].drop_nulls():
        for p in planted:
            assert p["value"] not in text, p  # ... and leaves nowhere
    counts = dict(zip(after["url"], after["pii_counts"]))
    for url in {p["url"] for p in reached}:
        want = {}
        for p in reached:
            if p["url"] == url:
                want[kind_of[p["type"]]] = want.get(kind_of[p["type"]], 0) + 1
        for kind, n in want.items():
            assert counts[url][kind] >= n, (url, kind)
    totals = {}
    for s in input_shards(cfg):
        for name, n in root.read_json(stats_key("pii_redacted", s.key))["counters"].items():
            totals[name] = totals.get(name, 0) + n
    summed = after["pii_counts"].struct.unnest().sum()
    for kind in ("email", "ip", "phone", "credit_card"):
        assert totals.get(f"pii/{kind}", 0) == summed[kind][0]
