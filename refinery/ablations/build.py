"""Building a variant: its own small data root at `ablations/variants/<name>/` under the run's, which
the project's Trainer runs on unchanged (`variant_config`).

    selection.json, selection.parquet             what its whole selection counts: documents, bytes,
                                                  tokens per bucket, share of the raw text, each evaluation
                                                  domain's n-gram overlap; a row per selected document
                                                  (doc id, bucket, language, tokens, bytes; no text)
    documents/pii_redacted/<input file>.parquet   the documents it stores: a bounded sample of the selection
                                                  (refinery/ablations/bounded.py), with the clean documents'
                                                  columns, one table per input file; read once, by the
                                                  tokenizer, and deleted with the token series (the runs
                                                  read the final shards, whose entries name the documents)
    tokenizer/tokenizer.json, info.json           the run's tokenizer, copied
    shards/final/<bucket>/                        tokenized, packed and shuffled by the functions the main
                                                  graph's tokenized_shards and shuffled_shards call
                                                  (refinery.global_steps.tokenize, refinery.global_steps.shuffle);
                                                  the per-file series under shards/tokenized/ go once shuffled
    manifests/ablation.json                       ONE phase, built by phase_manifests' functions
                                                  (refinery.curriculum), whose budget is the ablation budget
    summary.json                                  the selection's counts, the mixture, the budget, the bound
                                                  and what it stores

The selection is the documents refinery/ablations/selection.py gives, less those sharing an n-gram
with an evaluation domain (refinery/ablations/overlap.py), its quality cut applied; it is staged
under `staging/` until the sample is stored. The packing window is `ablations.seq_len` (the overlap
at most half of it). The `funnel` variant's documents, which the schedule variants order by
difficulty, are scored as they are tokenized by the main graph's published reference model when
`stages.difficulty` is enabled (`scores_difficulty`), so each carries the score the main graph gives
it; every other variant's difficulty is null. The phase's bucket weights are the mixture
(`mixture_weights`: by default each bucket's share of the `funnel` variant's tokens, the same for
every variant); every variant trains on the same budget (`budget_tokens`: `ablations.tokens`, or the
smallest variant's usable tokens at its mixture), drawn by the sampler with the run's seed. A
variant that cannot fill the budget at its mixture, or that selects no document, is refused
(`AblationError`, a ConfigError: the commands exit 2 with it) naming the field and the variant.

Building twice gives the same bytes (every writer is deterministic and atomic).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import polars as pl

from refinery import curriculum as cur
from refinery import layout
from refinery.ablations.bounded import bounded_sample, entry_tokens
from refinery.ablations.eval_set import EVAL_DOCUMENTS_KEY, ensure_eval_set
from refinery.ablations.overlap import OverlapFilter, domain_indexes
from refinery.ablations.schedules import funnel_demand
from refinery.holdout import eval_buckets, held_out_mask
from refinery.ablations.selection import (READ_ROWS, PartitionCounts, clean_schema, quality_cut, quality_cutoffs,
                                          variant_batches, variant_selection)
from refinery.ablations.verdicts import verdicts_digest
from refinery.models import difficulty_published as dpub
from refinery.config import ConfigError, RefineryConfig
from refinery.config.ablations import FUNNEL_VARIANT
from refinery.documents import CLEAN_STAGE, InputShard, input_shards
from refinery.global_steps import shuffle as sh
from refinery.global_steps import tokenize as tk
from refinery.stages.attributes import stage_batches
from refinery.stages.parquet_batches import ParquetBatchWriter, parquet_batches
from refinery.stages.registry import TEXT_STAGE, funnel_order
from refinery.storage import DataRoot, open_data_root

PHASE = "ablation"
SUMMARY_KEY = "summary.json"  # in the variant's root
SELECTION_KEY = "selection.json"  # in the variant's root: the counts of its whole selection
SELECTION_FACTS_KEY = "selection.parquet"  # and a row per selected document (no text)
SELECTION_SCHEMA = {"doc_id": pl.String, "bucket": pl.String, "language": pl.String, "shard": pl.String,
                    "bytes": pl.Int64, "tokens": pl.Int64}
RAW_BYTES_KEY = "ablations/raw_bytes.json"
STAGING = "staging"  # in the variant's root: its whole selection, until its sample is stored
TOKENIZED_SERIES = f"shards/{tk.TOKENIZED}"  # in the variant's root: deleted once its buckets are shuffled
STORED_DOCUMENTS = layout.documents_prefix(CLEAN_STAGE)  # in the variant's root: deleted once tokenized


class AblationError(ConfigError):
    """A variant that cannot be built as configured; the message names the field and the variant."""


def variant_names(cfg: RefineryConfig) -> list[str]:
    assert cfg.ablations is not None, "the config has no `ablations` section"
    return list(cfg.ablations.variants)


def variant_root_key(name: str) -> str:
    return f"ablations/variants/{name}"


def variant_root(root: DataRoot, name: str) -> DataRoot:
    return open_data_root(f"{root.url.rstrip('/')}/{variant_root_key(name)}")


def _variant_data_root(cfg: RefineryConfig, name: str) -> str:
    return f"{cfg.resolve(cfg.data_root).rstrip('/')}/{variant_root_key(name)}"


def step_tokens(cfg: RefineryConfig) -> int:
    """Tokens of one optimizer step of a proxy run (one micro batch, no accumulation)."""
    assert cfg.ablations is not None
    return cfg.ablations.micro_batch_size * cfg.ablations.seq_len


def scores_difficulty(cfg: RefineryConfig, name: str) -> bool:
    """Whether variant `name`'s documents carry difficulty scores: the `funnel` variant's (what the
    schedule variants train on, and order by) when the main graph scores its own. Scored with the
    main graph's reference model rather than one trained in the variant's root: the same model, the
    same tokenizer and the same text give each document the main graph's score, so a phase's bands
    order what the main run's would, and nothing is trained again (a model of the variant's bounded
    sample, held-out documents left out, would rank by another yardstick)."""
    return name == FUNNEL_VARIANT and cfg.stages.difficulty.enabled


def _derived(cfg: RefineryConfig, name: str, curriculum: dict | None, seed: int | None = None,
             run_dir: str | None = None) -> RefineryConfig:
    """The run's config pointed at the variant's root: packing window seq_len, the difficulty score
    on only where `scores_difficulty`, the proxy model and its run settings, no validation loss or
    anneal playbook."""
    ab = cfg.ablations
    assert ab is not None
    # Only the fields the config sets: a default taken as set would be checked as the user's (the
    # quality classifier's default buckets against the declared ones).
    data = cfg.model_dump(mode="json", exclude_unset=True)
    data.update(data_root=_variant_data_root(cfg, name), ablations=None, curriculum=curriculum,
                seed=cfg.seed if seed is None else seed)
    data.setdefault("stages", {}).setdefault("difficulty", {})["enabled"] = scores_difficulty(cfg, name)
    data.setdefault("shards", {}).update(max_seq_len=ab.seq_len, overlap=min(cfg.shards.overlap, ab.seq_len // 2))
    data.setdefault("contamination", {})["anneal_phase"] = None
    data.setdefault("training", {}).update(
        model=ab.model.model_dump(mode="json"), micro_batch_size=ab.micro_batch_size, grad_accum_steps=1, lr=ab.lr,
        warmup_steps=ab.warmup_steps, eval_every_tokens=0, eval_entries_per_bucket=0, anneal_halt_on_val_rise=None,
        run_dir=run_dir or cfg.training.run_dir)
    return RefineryConfig.model_validate({**data, "base_dir": cfg.base_dir})


def _curriculum(budget: int, seq_len: int, weights: dict[str, float]) -> dict[str, Any]:
    # Exhaustion allowed: a bucket whose rows run a row past its share (the sampler keeps each
    # within one row of plan) is dropped for the rest of the run instead of halting it; the budget
    # leaves a row per bucket of slack (`usable_tokens`), so this is a guard, not a plan.
    return {"total_tokens": budget, "allow_bucket_exhaustion": True,
            "phases": [{"name": PHASE, "tokens": budget, "seq_len": seq_len, "weights": weights}]}


# ---- the selection -------------------------------------------------------------------------------


def _text_bytes(batch: pl.DataFrame) -> int:
    return int(batch["text"].str.len_bytes().cast(pl.Int64).sum() or 0)


def _staged(shard: InputShard) -> str:
    return f"{STAGING}/{shard.key}.parquet"


def _uncut(shard: InputShard) -> str:
    return f"{STAGING}/uncut/{shard.key}.parquet"


def _stage_documents(root: DataRoot, vroot: DataRoot, cfg: RefineryConfig, name: str) -> tuple[PartitionCounts, dict]:
    """The variant's whole selection under `staging/`, one table per input file: its documents
    (refinery/ablations/selection.py) less those sharing an n-gram with an evaluation domain
    (refinery/ablations/overlap.py), its quality cut applied (the cut needs every file's scores, so
    the uncut tables come first, under `staging/uncut/`). Returns the selection's counts and each
    domain's overlap."""
    sel = variant_selection(cfg, name)
    counts = PartitionCounts()
    shards = input_shards(cfg)
    drop_overlap = OverlapFilter(domain_indexes(root, cfg))
    first = _staged if sel.quality_top is None else _uncut
    for shard in shards:
        with vroot.writer(first(shard)) as path, ParquetBatchWriter(path, clean_schema(root, shard.key)) as out:
            for batch in variant_batches(root, cfg, sel, shard.key, counts):
                out.write(drop_overlap(batch))
    if sel.quality_top is not None:
        # ranked by tokens, as a phase's `top N%` is: the better-scored documents are longer
        tokenizer = tk.read_tokenizer(vroot, cfg.tokenizer.eod_token)
        cutoffs = quality_cutoffs((b.with_columns(tokens=pl.Series(_entry_tokens(tokenizer, cfg, b["text"]),
                                                                   dtype=pl.Int64))
                                   for s in shards for b in parquet_batches(
            vroot.local_path(_uncut(s)), READ_ROWS, ["bucket", "language", "quality_score", "text"])), sel.quality_top)
        for shard in shards:
            with vroot.writer(_staged(shard)) as path, ParquetBatchWriter(path, clean_schema(root, shard.key)) as out:
                for batch in parquet_batches(vroot.local_path(_uncut(shard)), READ_ROWS):
                    out.write(quality_cut(batch, cutoffs))
        vroot.delete(f"{STAGING}/uncut")
    return counts, drop_overlap.counts


def _selection_facts(vroot: DataRoot, cfg: RefineryConfig) -> pl.DataFrame:
    """doc_id, shard, bucket, language, tokens (of its entries at the packing window), bytes of every
    staged document: what the counts and the bounded sample are computed from (no text)."""
    tokenizer = tk.read_tokenizer(vroot, cfg.tokenizer.eod_token)
    frames = []
    for shard in input_shards(cfg):
        for batch in parquet_batches(vroot.local_path(_staged(shard)), READ_ROWS,
                                     ["doc_id", "bucket", "language", "text"]):
            batch = batch.filter(pl.col("text").fill_null("") != "")  # an empty text is never tokenized
            frames.append(batch.select("doc_id", "bucket", language=pl.col("language").cast(pl.String),
                                       shard=pl.lit(shard.key), bytes=pl.col("text").str.len_bytes().cast(pl.Int64),
                                       tokens=pl.Series(_entry_tokens(tokenizer, cfg, batch["text"]), dtype=pl.Int64)))
    return pl.concat(frames) if frames else pl.DataFrame(schema=SELECTION_SCHEMA)


def _entry_tokens(tokenizer, cfg: RefineryConfig, texts: pl.Series) -> list[int]:
    """Tokens of the entries each text becomes at the packing window (`ablations.seq_len`); an empty
    text none (it is never tokenized)."""
    assert cfg.ablations is not None
    window = cfg.ablations.seq_len
    texts = texts.fill_null("").to_list()
    lengths = [len(ids) for ids in tk.encode_texts(tokenizer, texts, np.int32)]
    return [tokens if text else 0 for text, tokens in
            zip(texts, entry_tokens(lengths, window, min(cfg.shards.overlap, window // 2)))]


def select_variant(root: DataRoot, cfg: RefineryConfig, name: str) -> dict[str, Any]:
    """Stage the variant's whole selection and write what it counts (`selection.json`, with
    `selection.parquet`: a row per document, no text); returns the counts."""
    vroot = variant_root(root, name)
    for key in (layout.TOKENIZER_KEY, layout.TOKENIZER_INFO_KEY):
        vroot.write_bytes(key, root.read_bytes(key))
    counts, overlap = _stage_documents(root, vroot, cfg, name)
    facts = _selection_facts(vroot, cfg)
    if facts.is_empty():
        raise AblationError(f"ablations.variants.{name}: selects no document (after the held-out evaluation "
                            f"documents and those sharing a {cfg.contamination.ngram}-gram with one); widen it or "
                            f"remove it")
    with vroot.writer(SELECTION_FACTS_KEY) as path:
        facts.sort("doc_id").write_parquet(path)
    bucket_tokens = {b: int(facts.filter(pl.col("bucket") == b)["tokens"].sum()) for b in cfg.buckets}
    raw = raw_bytes(root, cfg)
    selection = {
        "inputs": inputs_digest(root, cfg, name),
        "documents": facts.height,
        "tokens": sum(bucket_tokens.values()),
        "bucket_tokens": bucket_tokens,
        "bytes": int(facts["bytes"].sum()),
        "raw_byte_share": round(int(facts["bytes"].sum()) / raw, 6) if raw else 0.0,
        "funnel_documents": counts.funnel,
        "readmitted_documents": counts.readmitted,
        "judged_out": counts.judged_out,
        "held_out": counts.held_out,
        "eval_overlap": overlap,
    }
    vroot.write_json(SELECTION_KEY, selection)
    return selection


def selection_counts(root: DataRoot, cfg: RefineryConfig, name: str) -> dict[str, Any]:
    """The variant's `selection.json`, selected first when missing or selected from other inputs."""
    vroot = variant_root(root, name)
    if vroot.exists(SELECTION_KEY):
        selection = vroot.read_json(SELECTION_KEY)
        if selection.get("inputs") == inputs_digest(root, cfg, name):
            return selection
    return select_variant(root, cfg, name)


def raw_bytes(root: DataRoot, cfg: RefineryConfig) -> int:
    """UTF-8 bytes of extracted_text's text, held-out documents left out: what the `raw` variant
    starts from and each variant's share is of. Counted once per state of the funnel
    (`ablations/raw_bytes.json`, keyed by the `funnel` variant's `inputs_digest`)."""
    digest = inputs_digest(root, cfg, FUNNEL_VARIANT)
    if root.exists(RAW_BYTES_KEY) and root.read_json(RAW_BYTES_KEY).get("inputs") == digest:
        return root.read_json(RAW_BYTES_KEY)["bytes"]
    total = 0
    for shard in input_shards(cfg):
        for batch in stage_batches(root, TEXT_STAGE, shard.key, READ_ROWS, columns=["doc_id", "bucket", "text"]):
            total += _text_bytes(batch.filter(~held_out_mask(cfg, batch["doc_id"], batch["bucket"])))
    root.write_json(RAW_BYTES_KEY, {"inputs": digest, "bytes": total})
    return total


def inputs_digest(root: DataRoot, cfg: RefineryConfig, name: str) -> str:
    """What a variant's selection was made from: the config (the variant, the ablation and run
    settings that shape it), the funnel's verdicts (`verdicts_digest`), the tokenizer and the
    evaluation set (its domains' n-grams are kept out)."""
    assert cfg.ablations is not None
    ab = cfg.ablations
    h = hashlib.sha256(json.dumps([cfg.fingerprint(), ab.variants[name].model_dump(mode="json"), ab.seq_len,
                                   ab.eval_fraction, eval_buckets(cfg), cfg.contamination.ngram],
                                  sort_keys=True).encode())
    h.update(verdicts_digest(root, cfg, funnel_order()).encode())
    for key in (layout.TOKENIZER_KEY, EVAL_DOCUMENTS_KEY):
        if root.exists(key):
            h.update(root.sha256(key).encode())
    return h.hexdigest()


# ---- the budget and the mixture ------------------------------------------------------------------


def _shares(bucket_tokens: dict[str, int]) -> dict[str, float]:
    total = sum(bucket_tokens.values())
    return {b: t / total for b, t in bucket_tokens.items() if t} if total else {}


def mixture_weights(cfg: RefineryConfig, selections: dict[str, dict[str, Any]], name: str) -> dict[str, float]:
    """The bucket weights variant `name` trains on: `ablations.mixture: funnel` (the default), each
    bucket's share of the `funnel` variant's selected tokens, the same for every variant, so that a
    variant differs only in which documents of each bucket it holds; `proportional`, the variant's
    own shares (its mixture moves with its filters)."""
    assert cfg.ablations is not None
    source = FUNNEL_VARIANT if cfg.ablations.mixture == "funnel" else name
    return _shares(selections[source]["bucket_tokens"])


def usable_tokens(cfg: RefineryConfig, bucket_tokens: dict[str, int], weights: dict[str, float]) -> int:
    """The tokens a variant of `bucket_tokens` can train on at `weights`: the most whose every
    bucket's share, plus the sampler's row of slack, it holds, in whole optimizer steps (0 when a
    bucket of the mixture is empty)."""
    assert cfg.ablations is not None
    seq_len = cfg.ablations.seq_len
    fits = min((max(0, bucket_tokens.get(b, 0) - seq_len) / w for b, w in weights.items()), default=0.0)
    return int(fits) // step_tokens(cfg) * step_tokens(cfg)


def budget_tokens(root: DataRoot, cfg: RefineryConfig) -> tuple[int, dict[str, dict[str, float]]]:
    """(the tokens every variant trains on, each variant's mixture weights): `ablations.tokens`, or
    the smallest variant's usable tokens; each variant is selected first where missing.
    AblationError when a variant cannot fill the budget at its mixture."""
    assert cfg.ablations is not None
    selections = {name: selection_counts(root, cfg, name) for name in variant_names(cfg)}
    weights = {name: mixture_weights(cfg, selections, name) for name in selections}
    usable = {name: usable_tokens(cfg, s["bucket_tokens"], weights[name]) for name, s in selections.items()}
    mixture = f"at the {cfg.ablations.mixture} mixture (ablations.mixture)"
    if cfg.ablations.tokens is None:
        smallest = min(usable, key=usable.__getitem__)
        if usable[smallest] <= 0:
            raise AblationError(f"ablations.variants.{smallest}: holds fewer tokens than one proxy optimizer step "
                                f"({step_tokens(cfg):,}) in a bucket {mixture}; widen it or remove it")
        return usable[smallest], weights
    short = {n: u for n, u in usable.items() if u < cfg.ablations.tokens}
    if short:
        listed = ", ".join(f"{n!r} {u:,}" for n, u in sorted(short.items()))
        raise AblationError(f"ablations.tokens: {cfg.ablations.tokens:,} tokens, more than variant(s) can fill "
                            f"{mixture} (usable tokens: {listed}); lower ablations.tokens to at most "
                            f"{min(short.values()):,}, or leave it out for the smallest variant's")
    return cfg.ablations.tokens, weights


# ---- the stored variant ---------------------------------------------------------------------------


def _floors(cfg: RefineryConfig, name: str, budget: int) -> dict[str, int]:
    """What the variant stores of each bucket at least: for `funnel`, what the schedule variants and
    anneal mixtures read of it."""
    return funnel_demand(cfg, budget) if name == FUNNEL_VARIANT else {}


def _reference_sha256(root: DataRoot, cfg: RefineryConfig, name: str) -> str | None:
    """The sha256 of the reference model that scores the variant (None: not scored, or not published yet)."""
    if not scores_difficulty(cfg, name) or not root.exists(layout.DIFFICULTY_MODEL_KEY):
        return None
    return root.sha256(layout.DIFFICULTY_MODEL_KEY)


def _built_digest(root: DataRoot, cfg: RefineryConfig, name: str, budget: int, weights: dict[str, float]) -> str:
    return hashlib.sha256(json.dumps([inputs_digest(root, cfg, name), budget, weights, cfg.seed,
                                      _floors(cfg, name, budget), _reference_sha256(root, cfg, name)],
                                     sort_keys=True).encode()).hexdigest()


def build_variant_shards(root: DataRoot, cfg: RefineryConfig, name: str, budget: int,
                         weights: dict[str, float]) -> dict[str, Any]:
    """The variant's stored documents (its bounded sample of the selection, refinery/ablations/
    bounded.py), tokenizer and final shards, and its summary.json (rebuilt whatever is there);
    returns the summary: the selection's counts, the mixture, the budget, the bound and what it stores."""
    assert cfg.ablations is not None
    vroot = variant_root(root, name)
    if not all(vroot.exists(_staged(s)) for s in input_shards(cfg)) or not vroot.exists(SELECTION_FACTS_KEY):
        select_variant(root, cfg, name)
    selection = selection_counts(root, cfg, name)
    facts = pl.read_parquet(vroot.local_path(SELECTION_FACTS_KEY))
    stored, bounds = bounded_sample(facts, budget, weights, cfg.ablations.seq_len, cfg.seed,
                                    _floors(cfg, name, budget))
    wanted = stored.implode()
    for shard in input_shards(cfg):
        key = layout.documents_key(CLEAN_STAGE, shard.key)
        with vroot.writer(key) as path, ParquetBatchWriter(path, clean_schema(root, shard.key)) as out:
            for batch in parquet_batches(vroot.local_path(_staged(shard)), READ_ROWS):
                out.write(batch.filter(pl.col("doc_id").is_in(wanted)))
    vroot.delete(STAGING)
    vcfg = _derived(cfg, name, None)
    tokenizer = tk.read_tokenizer(vroot, vcfg.tokenizer.eod_token)
    reference = dpub.load_published_model(root) if scores_difficulty(cfg, name) else None
    for shard in input_shards(vcfg):
        tk.tokenize_file(vroot, vcfg, shard, tokenizer, reference=reference)
    fields = tk.series_fields(vcfg, tokenizer)
    tokens = {}
    for bucket in vcfg.buckets:
        parts = [s.key for s in tk.bucket_shards(vcfg, bucket)]
        result = sh.shuffle_bucket(vroot, vcfg.seed, bucket, parts, fields, vcfg.shards.shard_tokens,
                                   vcfg.shards.shuffle_buffer_mb)
        tokens[bucket] = result.index["tokens"]
    # The stored documents were read once, by the tokenizer, and the per-file token series once, by
    # the shuffle; the proxy runs read the final shards.
    vroot.delete(STORED_DOCUMENTS)
    vroot.delete(TOKENIZED_SERIES)
    kept = facts.filter(pl.col("doc_id").is_in(wanted))
    summary = {
        "variant": name,
        "built": _built_digest(root, cfg, name, budget, weights),
        **{k: v for k, v in selection.items() if k != "inputs"},
        "mixture": cfg.ablations.mixture,
        "weights": weights,
        "budget_tokens": budget,
        "bound_tokens": bounds,
        **({"difficulty_model_sha256": reference[1]} if reference is not None else {}),
        "stored": {"documents": kept.height, "tokens": sum(tokens.values()), "bucket_tokens": tokens,
                   "bytes": int(kept["bytes"].sum())},
    }
    vroot.write_json(SUMMARY_KEY, summary)
    return summary


def variant_summary(root: DataRoot, cfg: RefineryConfig, name: str, budget: int,
                    weights: dict[str, float]) -> dict[str, Any]:
    """The variant's summary.json, its shards built first when missing or built from other inputs."""
    vroot = variant_root(root, name)
    if vroot.exists(SUMMARY_KEY):
        summary = vroot.read_json(SUMMARY_KEY)
        if summary.get("built") == _built_digest(root, cfg, name, budget, weights):
            return summary
    return build_variant_shards(root, cfg, name, budget, weights)


def build_variant(root: DataRoot, cfg: RefineryConfig, name: str) -> dict[str, Any]:
    """Build the variant `name`: the evaluation set first (when missing or stale), every variant's
    selection where the budget needs it (each when missing, or selected from other inputs), its
    stored sample and shards, then its one-phase manifest. Returns its summary."""
    if name not in variant_names(cfg):
        raise AblationError(f"ablations.variants: no variant {name!r}; the config has {variant_names(cfg)}")
    ensure_eval_set(root, cfg)
    budget, weights = budget_tokens(root, cfg)
    summary = variant_summary(root, cfg, name, budget, weights[name])
    vroot = variant_root(root, name)
    vcfg = _derived(cfg, name, _curriculum(budget, cfg.ablations.seq_len, weights[name]))
    report, inventory, selections = cur.validate_data_root(vcfg, vroot)
    if not report.ok or inventory is None:
        raise AblationError(f"ablations.variants.{name}: its one-phase curriculum does not validate: "
                            + "; ".join(str(e) for e in report.errors))
    cur.write_manifest(vroot, cur.build_phase_manifest(vcfg, vroot, PHASE, report, inventory, selections))
    return summary


def build_variants(root: DataRoot, cfg: RefineryConfig) -> dict[str, dict[str, Any]]:
    """Every variant, built in the config's order (each variant's selection once)."""
    return {name: build_variant(root, cfg, name) for name in variant_names(cfg)}


def variant_config(cfg: RefineryConfig, name: str, seed: int) -> RefineryConfig:
    """The config the project's Trainer runs for variant `name` and proxy seed `seed` (0, 1, ...):
    data_root the variant's root, its one phase as built (budget and weights read from its
    manifest), the proxy model and run settings, the run's seed plus `seed`, and run_dir
    `runs/seed-<seed>` inside the variant's root. The variant must be built (`build_variant`)."""
    vroot = open_data_root(_variant_data_root(cfg, name))
    try:
        manifest = cur.read_manifest(vroot, PHASE)
    except (FileNotFoundError, cur.ManifestError) as err:
        raise AblationError(f"ablations.variants.{name}: not built yet ({err}); build the variant first") from None
    assert cfg.ablations is not None
    curriculum = _curriculum(manifest.token_budget, cfg.ablations.seq_len, manifest.weights)
    return _derived(cfg, name, curriculum, seed=cfg.seed + seed, run_dir=f"runs/seed-{seed}")
