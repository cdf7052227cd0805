"""Ablation variants as selections over stored verdicts (refinery/ablations/): each variant's
documents are exactly what its definition selects, checked against the rejects and attribute
tables; their text; equal token budgets; byte-identical rebuilds; the evaluation set, disjoint from
every variant and chosen without them; refusals of a budget or a variant that cannot work."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import polars as pl
import pytest

from refinery.ablations import build
from refinery.ablations.eval_set import EVAL_DOCUMENTS_KEY, eval_documents
from refinery.holdout import held_out_mask
from refinery.commands import input_problem
from refinery.config import ConfigError, load_config
from refinery.curriculum import read_manifest, refuse_mismatch
from refinery.documents import CLEAN_STAGE, input_shards
from refinery.layout import documents_key, rejects_key
from refinery.global_steps.exact_dedup import text_hashes
from refinery.stages.attributes import stage_batches
from refinery.stages.heuristic import HeuristicFilter
from refinery.stages.pii import PiiRedactor, SafetyThenRedact
from refinery.models.quality import QualityScorer
from refinery.models.quality_training import load_published_model, training_batches
from refinery.storage import open_data_root

from helpers.verdict_corpus import BLOCKED, EVAL_LINES, received_text, write_verdict_corpus

VARIANTS = {
    "funnel": {},
    "raw": {"base": "raw"},
    "no_heuristic": {"without": ["heuristic"]},
    "no_gopher_rep": {"without": ["gopher_rep"]},
    "no_near_dedup": {"without": ["near_dedup"]},
    "no_dedup_safety": {"without": ["deduped", "safety"]},
    "top_half": {"quality_top": 0.5},
    "no_language_top": {"without": ["language"], "quality_top": 0.6},
}
# verdict and rule family each `without` lets back in (refinery/stages/registry.py's names)
READMITS = {
    "no_heuristic": lambda stage, rule: stage == "heuristic_filtered",
    "no_gopher_rep": lambda stage, rule: rule.startswith("gopher_rep/"),
    "no_near_dedup": lambda stage, rule: stage == "near_deduped",
    "no_dedup_safety": lambda stage, rule: stage in ("exact_deduped", "near_deduped") or rule.startswith("safety/"),
    "no_language_top": lambda stage, rule: stage == "language_filtered",
}
EMAIL = re.compile(r"person\d+@example\.org", re.IGNORECASE)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    c = write_verdict_corpus(tmp_path_factory.mktemp("ablations"), variants=VARIANTS)
    summaries = build.build_variants(c.root, c.cfg)
    return c, summaries


def table(root, stage: str, shards) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(root.local_path(documents_key(stage, s.key))) for s in shards])


def variant_docs(c, name: str) -> pl.DataFrame:
    return table(build.variant_root(c.root, name), CLEAN_STAGE, input_shards(c.cfg))


def eval_ids(c) -> set[str]:
    return set(pl.read_parquet(c.root.local_path(EVAL_DOCUMENTS_KEY))["doc_id"].to_list())


def rejects(c) -> pl.DataFrame:
    frames = [pl.read_parquet(c.root.local_path(rejects_key(t, s.key)), columns=["doc_id", "stage", "rule"])
              .with_columns(table=pl.lit(t))
              for s in input_shards(c.cfg)
              for t in ("language_filtered", "heuristic_filtered", "deduped", "quality_scored", "pii_redacted")]
    return pl.concat(frames)


def top_fraction(docs: list[str], c, scores: dict[str, float | None], fraction: float) -> set[str]:
    """The documents a per-bucket, per-language top-`fraction` cut keeps, computed by hand."""
    groups: dict[tuple[str, str], list[str]] = {}
    for d in docs:
        groups.setdefault((c.bucket[d], c.language[d]), []).append(d)
    kept = set()
    for members in groups.values():
        ranked = sorted((scores[d] for d in members if scores.get(d) is not None), reverse=True)
        if not ranked:
            continue
        cutoff = ranked[min(max(1, math.ceil(fraction * len(members))), len(ranked)) - 1]
        kept |= {d for d in members if scores.get(d) is not None and scores[d] >= cutoff}
    return kept


ORDER = ["language_filtered", "heuristic_filtered", "deduped", "quality_scored", "pii_redacted"]


def judged_alone(c, name: str, row: dict, table: str, seen: set[tuple[int, int]]) -> dict | None:
    """What the stages after `table` make of one readmitted document on its own (None: one of them
    removes it, by a verdict the variant keeps): the funnel's per-document stage classes, one
    document at a time, and exact dedup's hash against `seen` (the hashes dedup saw, and those of
    the documents let in before this one)."""
    leaves = READMITS[name]
    cfg = c.cfg
    stages = []
    if ORDER.index(table) < ORDER.index("heuristic_filtered"):
        stages.append(HeuristicFilter(cfg.stages.heuristic, []))
    if ORDER.index(table) < ORDER.index("deduped") and not leaves("exact_deduped", "exact_dedup/duplicate"):
        stages.append("exact_dedup")
    if ORDER.index(table) < ORDER.index("quality_scored"):
        model, pointer = load_published_model(c.root)
        enforce = not leaves("quality_scored", "quality/below_threshold")
        stages.append(QualityScorer(model, cfg.stages.quality.threshold, enforce, pointer["model_hash"]))
    stages.append(PiiRedactor.from_config(cfg.stages.pii) if leaves("pii_redacted", "safety/")
                  else SafetyThenRedact.from_config(cfg.stages))
    doc = pl.DataFrame([row])
    for stage in stages:
        if stage == "exact_dedup":
            hi, lo = text_hashes([doc["text"][0]])
            key = (int(hi[0]), int(lo[0]))
            if key in seen:
                return None
            seen.add(key)
            continue
        out = stage.run(doc)
        if out.documents.height:
            doc = out.documents
        elif not leaves(out.rejects["stage"][0], out.rejects["rule"][0]):
            return None
    return doc.row(0, named=True)


def expected(c, name: str) -> set[str]:
    """The variant's documents from the tables: extracted_text's, pii_redacted's and the rejects',
    a readmitted document judged by the per-document stages after its rejection."""
    held = eval_ids(c)
    extracted = table(c.root, "extracted_text", input_shards(c.cfg))
    if name == "raw":
        return set(extracted["doc_id"].to_list()) - held
    kept = set(table(c.root, CLEAN_STAGE, input_shards(c.cfg))["doc_id"].to_list())
    scores = dict(c.score)
    back = set()
    if name in READMITS:
        rows = {r["doc_id"]: r for r in extracted.iter_rows(named=True)}
        signatures = pl.concat([pl.read_parquet(p) for p in (c.root.root / "dedup" / "signatures").glob("*.parquet")])
        seen = set(zip(signatures["hash_hi"].to_list(), signatures["hash_lo"].to_list()))
        for d, stage, rule, t in rejects(c).iter_rows():
            if not READMITS[name](stage, rule) or d in held:
                continue
            row = {**rows[d], "text": received_text(c, d, t), "language": c.language[d]}
            judged = judged_alone(c, name, row, t, seen)
            if judged is not None:
                back.add(d)
                scores[d] = judged.get("quality_score", scores.get(d))
    selected = (kept | back) - held
    spec = VARIANTS[name]
    return top_fraction(sorted(selected), c, scores, spec["quality_top"]) if "quality_top" in spec else selected


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_holds_exactly_what_its_definition_selects(built, name):
    c, summaries = built
    docs = variant_docs(c, name)
    assert docs["doc_id"].is_unique().all()
    assert set(docs["doc_id"].to_list()) == expected(c, name)
    assert summaries[name]["documents"] == docs.height > 0


def test_the_variants_differ_as_their_definitions_say(built):
    c, _ = built
    n = {name: variant_docs(c, name).height for name in VARIANTS}
    r = rejects(c)
    assert n["funnel"] < n["no_gopher_rep"] < n["no_heuristic"] < n["raw"]
    assert r.filter(pl.col("stage") == "near_deduped").height and n["no_near_dedup"] > n["funnel"]
    assert n["top_half"] < n["funnel"]
    # the corpus plants what the semantics turn on: readmitted documents with the blocked word, and
    # readmitted documents that the later per-document stages remove (the quality threshold, the
    # safety filter, the heuristic rules for language rejects)
    assert any(BLOCKED in c.extracted[d] for d in r.filter(pl.col("stage") == "heuristic_filtered")["doc_id"])
    _, summaries = built
    assert summaries["no_heuristic"]["judged_out"] > 0 and summaries["no_language_top"]["judged_out"] > 0
    assert summaries["funnel"]["judged_out"] == summaries["raw"]["judged_out"] == 0


def test_the_text_each_variant_carries(built):
    c, _ = built
    shards = input_shards(c.cfg)
    clean = dict(table(c.root, CLEAN_STAGE, shards).select("doc_id", "text").iter_rows())
    raw = variant_docs(c, "raw")
    assert dict(raw.select("doc_id", "text").iter_rows()) == {d: c.extracted[d] for d in raw["doc_id"]}
    assert raw["text"].str.contains("@example.org").any()  # raw is not redacted
    funnel = variant_docs(c, "funnel")
    assert dict(funnel.select("doc_id", "text").iter_rows()) == {d: clean[d] for d in funnel["doc_id"]}
    where = dict(rejects(c).select("doc_id", "table").iter_rows())
    # let in after the heuristic stage: no later stage edits them, the pii stage redacts them
    readmitted = pl.concat([variant_docs(c, name).filter(~pl.col("doc_id").is_in(list(clean)))
                            for name in ("no_heuristic", "no_near_dedup", "no_dedup_safety")]).unique("doc_id")
    assert readmitted.height > 10 and readmitted["pii_counts"].is_not_null().all()
    for d, text in readmitted.select("doc_id", "text").iter_rows():
        assert text == EMAIL.sub("<EMAIL>", received_text(c, d, where[d]))
    assert readmitted["text"].str.contains("<EMAIL>").any()
    # a readmitted document's language and score are the funnel's, where it recorded them
    nolang = variant_docs(c, "no_dedup_safety").filter(~pl.col("doc_id").is_in(list(clean)))
    assert dict(nolang.select("doc_id", "language").iter_rows()) == {d: c.language[d] for d in nolang["doc_id"]}
    assert nolang["text"].str.contains(BLOCKED).any()  # safety left out: its rejects and the readmitted are kept


def test_every_variant_trains_on_the_same_budget(built):
    c, summaries = built
    budgets = {name: read_manifest(build.variant_root(c.root, name), build.PHASE).token_budget for name in VARIANTS}
    smallest = min(build.usable_tokens(c.cfg, s) for s in summaries.values())
    assert set(budgets.values()) == {smallest} == {s["budget_tokens"] for s in summaries.values()}
    assert smallest % (c.cfg.ablations.micro_batch_size * c.cfg.ablations.seq_len) == 0
    assert summaries["raw"]["raw_byte_share"] == 1.0 > summaries["funnel"]["raw_byte_share"] > 0
    for name in ("funnel", "raw"):
        vcfg = build.variant_config(c.cfg, name, seed=2)
        assert vcfg.curriculum.total_tokens == smallest and vcfg.seed == c.cfg.seed + 2
        assert vcfg.training.run_dir == "runs/seed-2" and vcfg.training.model == c.cfg.ablations.model
        assert vcfg.data_root == str(c.root.root / "ablations" / "variants" / name)
        refuse_mismatch(vcfg, open_data_root(vcfg.data_root))  # what the Trainer checks before it trains


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_building_twice_gives_the_same_bytes(built):
    c, _ = built
    folder = c.root.root / "ablations"
    before = digests(folder)
    assert any(k.endswith("manifests/ablation.json") for k in before) and any(".bin" in k for k in before)
    for key in ("eval/info.json", "variants/top_half/summary.json", "variants/raw/summary.json"):
        (folder / key).unlink()  # stale: rebuilt
    build.build_variant_shards(c.root, c.cfg, "no_heuristic")  # rebuilt whatever is there
    build.build_variants(c.root, c.cfg)
    assert digests(folder) == before


def test_the_evaluation_set_is_disjoint_from_every_variant_and_chosen_without_them(built):
    c, _ = built
    ev = pl.concat(list(eval_documents(c.root)))
    assert ev.columns == ["doc_id", "text", "domain", "language"] and ev["doc_id"].is_unique().all()
    for name in VARIANTS:
        assert not set(variant_docs(c, name)["doc_id"]) & set(ev["doc_id"])
    held = ev.filter(pl.col("domain") == "wiki")
    assert held.height > 0 and set(held["doc_id"]).issubset({d for d, b in c.bucket.items() if b == "wiki"})
    assert dict(held.select("doc_id", "text").iter_rows()) == {d: c.extracted[d] for d in held["doc_id"]}
    assert dict(held.select("doc_id", "language").iter_rows()) == {d: c.language[d] for d in held["doc_id"]}
    # chosen by the seed and the doc id alone: another set of variants holds out the same documents
    extracted = table(c.root, "extracted_text", input_shards(c.cfg))
    other = c.cfg.model_copy(update={"ablations": c.cfg.ablations.model_copy(update={"variants": {
        "funnel": c.cfg.ablations.variants["funnel"]}})})
    for cfg in (c.cfg, other):
        assert set(extracted.filter(held_out_mask(cfg, extracted["doc_id"], extracted["bucket"]))["doc_id"]) == \
            set(held["doc_id"])
    share = held.height / sum(1 for b in c.bucket.values() if b == "wiki")
    assert 0.05 < share < 0.45  # eval_fraction 0.2 of 60 documents
    lines = ev.filter(pl.col("domain") != "wiki").sort("doc_id")
    assert lines.select("doc_id", "domain", "language").rows() == [
        ("bench/q1", "bench", "en"), ("bench/q2", "bench", "de"), ("extra/7", "extra", "en")]
    assert lines["text"].to_list() == [line["text"] for name in ("bench", "extra") for line in EVAL_LINES[name]]


def test_the_quality_classifier_never_trains_on_an_evaluation_document(built):
    """The classifier that `quality_top` ranks by learns the curated bucket less its held-out pages:
    one that learned them would rank web pages by their likeness to the very pages scored."""
    from assets.provenance import CONFIG_READ, config_digest

    c, _ = built
    # The corpus's documents it trains on (the shipped labelled pages join them, as doc_ids "labelled:<url>")
    trained = {d for d in pl.concat(list(training_batches(c.cfg, c.root)()))["doc_id"].to_list()
               if not d.startswith("labelled:")}
    held = {d for d in eval_ids(c) if d in c.extracted}
    reached = {d for s in input_shards(c.cfg) for b in stage_batches(c.root, "deduped", s.key, 1000) for d in b["doc_id"]}
    assert held & reached  # held-out pages reach the classifier's input, and stay out of it
    assert trained == reached - held
    assert load_published_model(c.root)[1]["settings"]["held_out"] == {"eval_fraction": 0.2, "eval_buckets": ["wiki"]}
    # another hold-out is another training set: the model's asset version follows it
    other = c.cfg.model_copy(update={"ablations": c.cfg.ablations.model_copy(update={"eval_fraction": 0.3})})
    assert config_digest(other, CONFIG_READ["quality_model"]) != config_digest(c.cfg, CONFIG_READ["quality_model"])


def test_a_budget_a_variant_cannot_fill_is_refused_naming_the_field_and_the_variant(built, tmp_path):
    c, summaries = built
    step = c.cfg.ablations.micro_batch_size * c.cfg.ablations.seq_len
    tokens = (build.usable_tokens(c.cfg, summaries["top_half"]) // step + 1) * step
    cfg = c.cfg.model_copy(update={"ablations": c.cfg.ablations.model_copy(update={"tokens": tokens})})
    with pytest.raises(build.AblationError) as err:
        build.build_variant(c.root, cfg, "raw")
    message = str(err.value)
    assert message.startswith(f"ablations.tokens: {tokens:,} tokens, more than variant(s) can fill")
    assert "'top_half'" in message and "'raw'" not in message
    assert isinstance(err.value, ConfigError) and input_problem(RuntimeError("run failed")) is None
    wrapped = RuntimeError("the asset failed")
    wrapped.__cause__ = err.value
    assert input_problem(wrapped) == message  # what `refinery` commands exit 2 with


def test_a_variant_that_selects_no_document_is_refused_with_its_name(tmp_path):
    c = write_verdict_corpus(tmp_path, variants={"funnel": {}, "tiny": {"quality_top": 0.01}})
    for shard in input_shards(c.cfg):  # nothing scored: a quality cut keeps nothing
        path = c.root.local_path(documents_key(CLEAN_STAGE, shard.key))
        pl.read_parquet(path).with_columns(quality_score=pl.lit(None, pl.Float64)).write_parquet(path)
    with pytest.raises(build.AblationError, match=r"^ablations.variants.tiny: selects no document"):
        build.build_variant_shards(c.root, c.cfg, "tiny")
    assert load_config(c.config_path).ablations.variants["tiny"].quality_top == 0.01
