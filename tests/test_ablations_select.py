"""Ablation variants as selections over stored verdicts (refinery/ablations/): each variant's
documents are exactly what its definition selects, checked against the rejects and attribute
tables; their text; equal token budgets; byte-identical rebuilds; the evaluation set, disjoint from
every variant and chosen without them; refusals of a budget or a variant that cannot work."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import polars as pl
import pytest

from refinery.ablations import build
from refinery.ablations.bounded import entry_tokens
from refinery.ablations.eval_set import EVAL_DOCUMENTS_KEY, ensure_eval_set, eval_documents
from refinery.holdout import held_out_mask
from refinery.commands import input_problem
from refinery.config import ConfigError, load_config
from refinery.curriculum import read_manifest, refuse_mismatch
from refinery.documents import CLEAN_STAGE, input_shards
from refinery.layout import documents_key, final_index_key, rejects_key
from refinery.global_steps.exact_dedup import text_hashes
from refinery.stages.attributes import stage_batches
from refinery.stages.heuristic import HeuristicFilter
from refinery.stages.pii import PiiRedactor, SafetyThenRedact
from refinery.models.quality import QualityScorer
from refinery.models.quality_training import load_published_model, training_batches
from refinery.storage import open_data_root
from refinery.tokenizer_file import read_tokenizer

from helpers.configs import write_config
from helpers.verdict_corpus import BLOCKED, EVAL_LINES, config_data, received_text, write_verdict_corpus

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
    """The documents the variant stores (its bounded sample): those its final shards' entries name
    (its documents' table is gone once tokenized), one row each."""
    vroot = build.variant_root(c.root, name)
    entries = [vroot.local_path(f"{ref['prefix']}.entries.parquet") for bucket in c.cfg.buckets
               if vroot.exists(final_index_key(bucket)) for ref in vroot.read_json(final_index_key(bucket))["shards"]]
    return pl.concat([pl.read_parquet(path, columns=["doc_id"]) for path in entries]).unique("doc_id", maintain_order=True)


def staged_docs(c, name: str) -> pl.DataFrame:
    """The documents of the variant's whole selection with their text: selected again into its
    staging tables, read, and the staging removed as the build leaves it."""
    build.select_variant(c.root, c.cfg, name)
    vroot = build.variant_root(c.root, name)
    docs = pl.concat([pl.read_parquet(vroot.local_path(f"{build.STAGING}/{s.key}.parquet")) for s in input_shards(c.cfg)])
    vroot.delete(build.STAGING)
    return docs


def selected(c, name: str) -> pl.DataFrame:
    """A row per document of the variant's whole selection (selection.parquet)."""
    return pl.read_parquet(build.variant_root(c.root, name).local_path(build.SELECTION_FACTS_KEY))


def grams(text: str, n: int = 13) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def shares_a_13_gram_with_the_eval_set(c, text: str) -> bool:
    if c.folder not in EVAL_GRAMS:
        EVAL_GRAMS[c.folder] = set().union(*(grams(t) for t in pl.concat(list(eval_documents(c.root)))["text"]))
    return bool(grams(text) & EVAL_GRAMS[c.folder])


EVAL_GRAMS: dict = {}  # corpus folder -> every 13-gram of its evaluation set


def eval_ids(c) -> set[str]:
    return set(pl.read_parquet(c.root.local_path(EVAL_DOCUMENTS_KEY))["doc_id"].to_list())


def rejects(c) -> pl.DataFrame:
    frames = [pl.read_parquet(c.root.local_path(rejects_key(t, s.key)), columns=["doc_id", "stage", "rule"])
              .with_columns(table=pl.lit(t))
              for s in input_shards(c.cfg)
              for t in ("language_filtered", "heuristic_filtered", "deduped", "quality_scored", "pii_redacted")]
    return pl.concat(frames)


def top_fraction(texts: dict[str, str], c, scores: dict[str, float | None], fraction: float) -> set[str]:
    """The documents a per-bucket, per-language top-`fraction` cut by tokens keeps, ranked by hand:
    best score first until they hold ceil(fraction x the group's tokens), every tie at the cutoff kept."""
    tokens = dict(zip(texts, entry_tokens([len(e.ids) for e in read_tokenizer(c.root, c.cfg.tokenizer.eod_token)
                                           .encode_batch(list(texts.values()), add_special_tokens=False)],
                                          c.cfg.ablations.seq_len, min(c.cfg.shards.overlap, c.cfg.ablations.seq_len // 2))))
    groups: dict[tuple[str, str], list[str]] = {}
    for d in texts:
        groups.setdefault((c.bucket[d], c.language[d]), []).append(d)
    kept = set()
    for members in groups.values():
        ranked = sorted((d for d in members if scores.get(d) is not None), key=lambda d: -scores[d])
        if not ranked:
            continue
        want = min(max(1, math.ceil(fraction * sum(tokens[d] for d in members))), sum(tokens[d] for d in ranked))
        held, at = 0, ranked[-1]
        for d in ranked:
            held += tokens[d]
            if held >= want:
                at = d
                break
        kept |= {d for d in ranked if scores[d] >= scores[at]}
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


def expected(c, name: str) -> dict[str, str]:
    """The variant's documents and their text from the tables: extracted_text's, pii_redacted's and
    the rejects', a readmitted document judged by the per-document stages after its rejection; those
    sharing a 13-gram with the evaluation set left out."""
    held = eval_ids(c)
    extracted = table(c.root, "extracted_text", input_shards(c.cfg))
    if name == "raw":
        texts = {d: t for d, t in extracted.select("doc_id", "text").iter_rows() if d not in held}
        return {d: t for d, t in texts.items() if not shares_a_13_gram_with_the_eval_set(c, t)}
    texts = dict(table(c.root, CLEAN_STAGE, input_shards(c.cfg)).select("doc_id", "text").iter_rows())
    scores = dict(c.score)
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
                texts[d] = judged["text"]
                scores[d] = judged.get("quality_score", scores.get(d))
    texts = {d: t for d, t in texts.items() if d not in held and not shares_a_13_gram_with_the_eval_set(c, t)}
    spec = VARIANTS[name]
    if "quality_top" in spec:
        kept = top_fraction(dict(sorted(texts.items())), c, scores, spec["quality_top"])
        return {d: t for d, t in texts.items() if d in kept}
    return texts


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_selects_exactly_what_its_definition_says_and_stores_a_sample_of_it(built, name):
    c, summaries = built
    chosen = selected(c, name)
    assert chosen["doc_id"].is_unique().all()
    assert set(chosen["doc_id"].to_list()) == set(expected(c, name))
    assert summaries[name]["documents"] == chosen.height > 0
    docs = variant_docs(c, name)
    assert docs["doc_id"].is_unique().all() and set(docs["doc_id"]) <= set(chosen["doc_id"])
    assert summaries[name]["stored"]["documents"] == docs.height > 0


def test_the_variants_differ_as_their_definitions_say(built):
    c, _ = built
    n = {name: selected(c, name).height for name in VARIANTS}
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
    raw = staged_docs(c, "raw")
    assert dict(raw.select("doc_id", "text").iter_rows()) == {d: c.extracted[d] for d in raw["doc_id"]}
    assert raw["text"].str.contains("@example.org").any()  # raw is not redacted
    funnel = staged_docs(c, "funnel")
    assert dict(funnel.select("doc_id", "text").iter_rows()) == {d: clean[d] for d in funnel["doc_id"]}
    where = dict(rejects(c).select("doc_id", "table").iter_rows())
    # let in after the heuristic stage: no later stage edits them, the pii stage redacts them
    readmitted = pl.concat([staged_docs(c, name).filter(~pl.col("doc_id").is_in(list(clean)))
                            for name in ("no_heuristic", "no_near_dedup", "no_dedup_safety")]).unique("doc_id")
    assert readmitted.height > 10 and readmitted["pii_counts"].is_not_null().all()
    for d, text in readmitted.select("doc_id", "text").iter_rows():
        assert text == EMAIL.sub("<EMAIL>", received_text(c, d, where[d]))
    assert readmitted["text"].str.contains("<EMAIL>").any()
    # a readmitted document's language and score are the funnel's, where it recorded them
    nolang = staged_docs(c, "no_dedup_safety").filter(~pl.col("doc_id").is_in(list(clean)))
    assert dict(nolang.select("doc_id", "language").iter_rows()) == {d: c.language[d] for d in nolang["doc_id"]}
    assert nolang["text"].str.contains(BLOCKED).any()  # safety left out: its rejects and the readmitted are kept


def test_every_variant_trains_on_the_same_budget_at_the_funnels_mixture(built):
    c, summaries = built
    budgets = {name: read_manifest(build.variant_root(c.root, name), build.PHASE).token_budget for name in VARIANTS}
    funnel = summaries["funnel"]["bucket_tokens"]
    weights = {b: t / sum(funnel.values()) for b, t in funnel.items()}  # each bucket's share of funnel's tokens
    for name in VARIANTS:
        assert summaries[name]["weights"] == pytest.approx(weights) and summaries[name]["mixture"] == "funnel"
        assert read_manifest(build.variant_root(c.root, name), build.PHASE).weights == pytest.approx(weights)
    smallest = min(build.usable_tokens(c.cfg, s["bucket_tokens"], weights) for s in summaries.values())
    assert set(budgets.values()) == {smallest} == {s["budget_tokens"] for s in summaries.values()}
    assert smallest % (c.cfg.ablations.micro_batch_size * c.cfg.ablations.seq_len) == 0
    # raw holds every page but the copies of held-out pages (they share a 13-gram with the evaluation set)
    assert 1.0 > summaries["raw"]["raw_byte_share"] > summaries["funnel"]["raw_byte_share"] > 0
    assert summaries["raw"]["eval_overlap"]["web"] + summaries["raw"]["eval_overlap"]["wiki"] > 0
    for name in ("funnel", "raw"):
        vcfg = build.variant_config(c.cfg, name, seed=2)
        assert vcfg.curriculum.total_tokens == smallest and vcfg.seed == c.cfg.seed + 2
        assert vcfg.training.run_dir == "runs/seed-2" and vcfg.training.model == c.cfg.ablations.model
        assert vcfg.data_root == str(c.root.root / "ablations" / "variants" / name)
        refuse_mismatch(vcfg, open_data_root(vcfg.data_root))  # what the Trainer checks before it trains


def load_config_data(folder: Path, **ablations):
    """The verdict corpus's config (no data) in `folder`, its `ablations` section updated with `ablations`."""
    folder.mkdir(exist_ok=True)
    return load_config(write_config(folder, config_data(**ablations)))


def served_tokens(c, name: str) -> dict[str, float]:
    """What a proxy run of variant `name` (seed 0) served each bucket, from its status.json."""
    from training.cli import run_train
    from training.proxy_run import proxy_run_dir, train_args
    from training.status import read_status

    vcfg = build.variant_config(c.cfg, name, seed=0)
    assert run_train(train_args(vcfg, "auto"), cfg=vcfg) == 0
    return {b: t["served"] for b, t in read_status(proxy_run_dir(vcfg))["mixture"][build.PHASE].items()}


def test_variants_with_a_fixed_mixture_serve_each_bucket_the_same_tokens_within_one_row(built):
    c, summaries = built
    # the variants' own mixtures differ: a proportional draw would train them on other bucket shares
    own = {n: summaries[n]["bucket_tokens"]["web"] / summaries[n]["tokens"] for n in ("funnel", "no_heuristic")}
    assert abs(own["funnel"] - own["no_heuristic"]) > 0.01
    funnel, other = served_tokens(c, "funnel"), served_tokens(c, "no_heuristic")
    row = c.cfg.ablations.seq_len
    assert set(funnel) == set(other) == {"web", "wiki"}
    for bucket in funnel:
        assert abs(funnel[bucket] - other[bucket]) <= row
        assert funnel[bucket] == pytest.approx(summaries["funnel"]["budget_tokens"] *
                                               summaries["funnel"]["weights"][bucket], abs=row)


def test_the_proportional_mixture_is_each_variants_own_shares(tmp_path):
    cfg = load_config_data(tmp_path / "own", mixture="proportional")
    selections = {"funnel": {"bucket_tokens": {"web": 300, "wiki": 100}},
                  "raw": {"bucket_tokens": {"web": 900, "wiki": 100}}}
    assert build.mixture_weights(cfg, selections, "raw") == {"web": 0.9, "wiki": 0.1}
    fixed = load_config_data(tmp_path / "fixed")
    assert build.mixture_weights(fixed, selections, "raw") == {"web": 0.75, "wiki": 0.25}


def test_a_variant_built_under_ablations_tokens_holds_at_most_its_bound(tmp_path):
    step = 2 * 32
    c = write_verdict_corpus(tmp_path, variants={"funnel": {}, "raw": {"base": "raw"}}, tokens=24 * step)
    summaries = build.build_variants(c.root, c.cfg)
    for name, summary in summaries.items():
        stored = summary["stored"]
        assert summary["budget_tokens"] == 24 * step
        selection = pl.read_parquet(build.variant_root(c.root, name).local_path(build.SELECTION_FACTS_KEY))
        for bucket, weight in summary["weights"].items():
            target = math.ceil(24 * step * weight * 1.05) + 32  # one pass, 5% and a row
            largest = selection.filter(pl.col("bucket") == bucket)["tokens"].max()
            assert summary["bound_tokens"][bucket] == target + largest
            # at most the bound, at least one pass of its share and a row; the selection is larger
            assert math.ceil(24 * step * weight) + 32 <= stored["bucket_tokens"][bucket] <= target + largest
            assert summary["bucket_tokens"][bucket] > target + largest
        assert stored["documents"] == variant_docs(c, name).height < summary["documents"]
        docs = variant_docs(c, name)
        for bucket in summary["weights"]:
            # the stored shards hold exactly the sample's entry tokens (bounded.entry_tokens packs as tokenize does)
            sample = selection.filter(pl.col("doc_id").is_in(docs["doc_id"].implode()) & (pl.col("bucket") == bucket))
            assert stored["bucket_tokens"][bucket] == sample["tokens"].sum()
            # spread over languages: each language in the sample as in the selection's bucket, within one document
            whole = selection.filter(pl.col("bucket") == bucket)
            for lang in set(whole["language"]):
                share = whole.filter(pl.col("language") == lang).height / whole.height
                assert abs(sample.filter(pl.col("language") == lang).height - share * sample.height) <= 1
        # what the runs do not read is gone: the staged selection, the stored documents and the per-file token series
        assert not build.variant_root(c.root, name).exists(build.STAGING)
        assert not build.variant_root(c.root, name).exists(build.STORED_DOCUMENTS)
        assert not build.variant_root(c.root, name).exists(build.TOKENIZED_SERIES)
    # the same inputs, the same sample
    again = build.build_variant_shards(c.root, c.cfg, "raw", summaries["raw"]["budget_tokens"], summaries["raw"]["weights"])
    assert again == summaries["raw"]


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_building_twice_gives_the_same_bytes(built):
    c, _ = built
    folder = c.root.root / "ablations"
    before = digests(folder)
    assert any(k.endswith("manifests/ablation.json") for k in before) and any(".bin" in k for k in before)
    for key in ("eval/info.json", "variants/top_half/summary.json", "variants/raw/summary.json",
                "variants/raw/selection.json"):
        (folder / key).unlink()  # stale: rebuilt
    budget, weights = build.budget_tokens(c.root, c.cfg)
    build.build_variant_shards(c.root, c.cfg, "no_heuristic", budget, weights["no_heuristic"])  # rebuilt whatever is there
    build.build_variants(c.root, c.cfg)
    assert digests(folder) == before


def test_the_evaluation_set_is_disjoint_from_every_variant_and_chosen_without_them(built):
    c, _ = built
    ev = pl.concat(list(eval_documents(c.root)))
    assert ev.columns == ["doc_id", "text", "domain", "language", "kept"] and ev["doc_id"].is_unique().all()
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
    pages = set(ev.filter(pl.col("domain").is_in(["web", "wiki"]))["doc_id"])
    for cfg in (c.cfg, other):
        assert set(extracted.filter(held_out_mask(cfg, extracted["doc_id"], extracted["bucket"]))["doc_id"]) == pages
    share = held.height / sum(1 for b in c.bucket.values() if b == "wiki")
    assert 0.05 < share < 0.45  # eval_fraction 0.2 of 60 documents
    # every bucket is a domain: web's held-out pages too, so a web filter is judged on web text
    web = ev.filter(pl.col("domain") == "web")
    assert web.height > 0 and set(web["doc_id"]).issubset({d for d, b in c.bucket.items() if b == "web"})
    # kept: the pages in a language the funnel keeps (en); the eval-set lines always
    pages = ev.filter(pl.col("domain").is_in(["web", "wiki"]))
    assert pages["kept"].to_list() == [lang == "en" for lang in pages["language"].to_list()]
    assert not pages["kept"].all() and pages["kept"].any()
    lines = ev.filter(~pl.col("domain").is_in(["web", "wiki"])).sort("doc_id")
    assert lines["kept"].all()
    assert lines.select("doc_id", "domain", "language").rows() == [
        ("bench/q1", "bench", "en"), ("bench/q2", "bench", "de"), ("extra/7", "extra", "en")]
    assert lines["text"].to_list() == [line["text"] for name in ("bench", "extra") for line in EVAL_LINES[name]]


def test_the_hold_out_leaves_the_main_graphs_quality_classifier_alone(built):
    """Adding an `ablations` section reruns nothing the main graph trains on: the classifier learns
    every document of its buckets, and its asset's config digest ignores the section."""
    from assets.provenance import CONFIG_READ, config_digest

    c, _ = built
    # The corpus's documents it trains on (the shipped labelled pages join them, as doc_ids "labelled:<url>")
    trained = {d for d in pl.concat(list(training_batches(c.cfg, c.root)()))["doc_id"].to_list()
               if not d.startswith("labelled:")}
    held = {d for d in eval_ids(c) if d in c.extracted}
    reached = {d for s in input_shards(c.cfg) for b in stage_batches(c.root, "deduped", s.key, 1000) for d in b["doc_id"]}
    assert held & reached and trained == reached
    assert "held_out" not in load_published_model(c.root)[1]["settings"]
    other = c.cfg.model_copy(update={"ablations": c.cfg.ablations.model_copy(update={"eval_fraction": 0.3})})
    without = c.cfg.model_copy(update={"ablations": None})
    for cfg in (other, without):
        assert config_digest(cfg, CONFIG_READ["quality_model"]) == config_digest(c.cfg, CONFIG_READ["quality_model"])


def test_a_budget_a_variant_cannot_fill_is_refused_naming_the_field_and_the_variant(built, tmp_path):
    c, summaries = built
    step = c.cfg.ablations.micro_batch_size * c.cfg.ablations.seq_len
    top = summaries["top_half"]
    tokens = (build.usable_tokens(c.cfg, top["bucket_tokens"], top["weights"]) // step + 1) * step
    cfg = c.cfg.model_copy(update={"ablations": c.cfg.ablations.model_copy(update={"tokens": tokens})})
    with pytest.raises(build.AblationError) as err:
        build.build_variant(c.root, cfg, "raw")
    message = str(err.value)
    assert message.startswith(f"ablations.tokens: {tokens:,} tokens, more than variant(s) can fill at the funnel "
                              f"mixture (ablations.mixture)")
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
    ensure_eval_set(c.root, c.cfg)
    with pytest.raises(build.AblationError, match=r"^ablations.variants.tiny: selects no document"):
        build.select_variant(c.root, c.cfg, "tiny")
    assert load_config(c.config_path).ablations.variants["tiny"].quality_top == 0.01


def test_a_document_that_shares_a_13_gram_with_an_evaluation_domain_is_in_no_variant(tmp_path):
    c = write_verdict_corpus(tmp_path, variants={"funnel": {}, "raw": {"base": "raw"},
                                                 "no_heuristic": {"without": ["heuristic"]}},
                             eval_sets=["evals/extra.jsonl", "evals/leak.jsonl"])
    clean = table(c.root, CLEAN_STAGE, input_shards(c.cfg))
    leaked = next(d for d, t in clean.select("doc_id", "text").iter_rows()
                  if len(re.findall(r"\w+", t)) >= 13 and not held_out_mask(c.cfg, pl.Series([d]), pl.Series([c.bucket[d]]))[0])
    words = re.findall(r"\w+", clean.filter(pl.col("doc_id") == leaked)["text"][0])
    # an evaluation item quoting 13 of its words, in other case and punctuation
    (tmp_path / "evals" / "leak.jsonl").write_text(json.dumps({"id": "q", "text": ", ".join(words[:13]).upper()}) + "\n")
    summaries = build.build_variants(c.root, c.cfg)
    for name, summary in summaries.items():
        assert leaked not in set(selected(c, name)["doc_id"]) and leaked not in set(variant_docs(c, name)["doc_id"])
        assert summary["eval_overlap"]["leak"] >= 1  # the report prints it per variant and domain
    assert set(summaries["funnel"]["eval_overlap"]) == {"bench", "extra", "leak", "web", "wiki"}


def test_a_bucket_floor_makes_the_sample_hold_what_the_schedule_variants_read():
    """The funnel variant also feeds the schedule variants: a floor (their largest demand of a
    bucket) makes the sample hold at least that much of it, even of a bucket its own mixture leaves
    out, and changes nothing of a bucket without one."""
    from refinery.ablations.bounded import bounded_sample
    facts = pl.DataFrame({"doc_id": [f"d{i:03d}" for i in range(300)],
                          "bucket": ["web"] * 100 + ["docs"] * 100 + ["code"] * 100,
                          "language": ["en", "de"] * 150, "tokens": [50] * 300})
    weights = {"web": 0.9, "docs": 0.1}
    plain, _ = bounded_sample(facts, 2000, weights, 32, seed=7)
    floored, bounds = bounded_sample(facts, 2000, weights, 32, seed=7, floors={"docs": 3000, "code": 1000})

    def held(ids, bucket):
        return facts.filter(pl.col("doc_id").is_in(ids.implode()) & (pl.col("bucket") == bucket))["tokens"].sum()

    assert held(plain, "docs") < 3000 <= held(floored, "docs") <= bounds["docs"] == 3000 + 50
    assert held(plain, "code") == 0 and 1000 <= held(floored, "code") <= 1050
    assert held(plain, "web") == held(floored, "web")
