"""Building a variant: its own small data root at `ablations/variants/<name>/` under the run's, which
the project's Trainer runs on unchanged (`variant_config`).

    documents/pii_redacted/<input file>.parquet   its documents (refinery/ablations/selection.py), with
                                                  the clean documents' columns, one table per input file
    tokenizer/tokenizer.json, info.json           the run's tokenizer, copied
    shards/tokenized/..., shards/final/<bucket>/  tokenized, packed and shuffled by the functions the main
                                                  graph's tokenized_shards and shuffled_shards call
                                                  (refinery.global_steps.tokenize, refinery.global_steps.shuffle)
    manifests/ablation.json                       ONE phase, built by phase_manifests' functions
                                                  (refinery.curriculum), whose budget is the ablation budget
    summary.json                                  its counts: documents, tokens (all it holds), bytes,
                                                  raw_byte_share, budget_tokens (what it trains on)

The packing window is `ablations.seq_len` (the overlap at most half of it) and the difficulty
score is off. The phase's bucket weights are the variant's own token shares, so it trains on its
documents as selected; every variant trains on the same budget (`budget_tokens`: `ablations.tokens`,
or the smallest variant's usable tokens), drawn by the sampler with the run's seed. A variant that
cannot fill `ablations.tokens`, or that selects no document, is refused (`AblationError`, a
ConfigError: the commands exit 2 with it) naming the field and the variant.

Building twice gives the same bytes (every writer is deterministic and atomic).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import polars as pl

from refinery import curriculum as cur
from refinery import layout
from refinery.ablations.eval_set import ensure_eval_set
from refinery.holdout import eval_buckets, held_out_mask
from refinery.ablations.selection import (READ_ROWS, PartitionCounts, clean_schema, quality_cut, quality_cutoffs,
                                          variant_batches, variant_selection)
from refinery.ablations.verdicts import verdicts_digest
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
RAW_BYTES_KEY = "ablations/raw_bytes.json"
STAGING = "staging"  # in the variant's root: its documents before its quality cut


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


def _derived(cfg: RefineryConfig, name: str, curriculum: dict | None, seed: int | None = None,
             run_dir: str | None = None) -> RefineryConfig:
    """The run's config pointed at the variant's root: packing window seq_len, no difficulty score,
    the proxy model and its run settings, no validation loss or anneal playbook."""
    ab = cfg.ablations
    assert ab is not None
    # Only the fields the config sets: a default taken as set would be checked as the user's (the
    # quality classifier's default buckets against the declared ones).
    data = cfg.model_dump(mode="json", exclude_unset=True)
    data.update(data_root=_variant_data_root(cfg, name), ablations=None, curriculum=curriculum,
                seed=cfg.seed if seed is None else seed)
    data.setdefault("stages", {}).setdefault("difficulty", {})["enabled"] = False
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


# ---- documents ----------------------------------------------------------------------------------


def _text_bytes(batch: pl.DataFrame) -> int:
    return int(batch["text"].str.len_bytes().cast(pl.Int64).sum() or 0)


def _write_documents(root: DataRoot, vroot: DataRoot, cfg: RefineryConfig, name: str) -> PartitionCounts:
    """The variant's documents table of every input file, its quality cut applied. A variant with a
    cut writes its uncut documents under `staging/` first (the cut needs every file's scores), so
    its documents table never holds uncut rows, even for a moment."""
    sel = variant_selection(cfg, name)
    counts = PartitionCounts()
    shards = input_shards(cfg)

    def final(shard: InputShard) -> str:
        return layout.documents_key(CLEAN_STAGE, shard.key)

    def uncut(shard: InputShard) -> str:
        return final(shard) if sel.quality_top is None else f"{STAGING}/{shard.key}.parquet"

    for shard in shards:
        with vroot.writer(uncut(shard)) as path, ParquetBatchWriter(path, clean_schema(root, shard.key)) as out:
            for batch in variant_batches(root, cfg, sel, shard.key, counts):
                out.write(batch)
    if sel.quality_top is not None:
        cutoffs = quality_cutoffs((b for s in shards for b in parquet_batches(
            vroot.local_path(uncut(s)), READ_ROWS, ["bucket", "language", "quality_score"])), sel.quality_top)
        for shard in shards:
            with vroot.writer(final(shard)) as path, ParquetBatchWriter(path, clean_schema(root, shard.key)) as out:
                for batch in parquet_batches(vroot.local_path(uncut(shard)), READ_ROWS):
                    out.write(quality_cut(batch, cutoffs))
        vroot.delete(STAGING)
    return counts


def _documents_summary(vroot: DataRoot, cfg: RefineryConfig) -> tuple[int, int]:
    documents = text_bytes = 0
    for shard in input_shards(cfg):
        for batch in parquet_batches(vroot.local_path(layout.documents_key(CLEAN_STAGE, shard.key)), READ_ROWS, ["text"]):
            documents += batch.height
            text_bytes += _text_bytes(batch)
    return documents, text_bytes


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
    """What a variant's shards were built from: the config (the variant, the ablation and run
    settings that shape them), the funnel's verdicts (`verdicts_digest`) and the tokenizer."""
    assert cfg.ablations is not None
    ab = cfg.ablations
    h = hashlib.sha256(json.dumps([cfg.fingerprint(), ab.variants[name].model_dump(mode="json"), ab.seq_len,
                                   ab.eval_fraction, eval_buckets(cfg)], sort_keys=True).encode())
    h.update(verdicts_digest(root, cfg, funnel_order()).encode())
    if root.exists(layout.TOKENIZER_KEY):
        h.update(root.sha256(layout.TOKENIZER_KEY).encode())
    return h.hexdigest()


# ---- shards -------------------------------------------------------------------------------------


def build_variant_shards(root: DataRoot, cfg: RefineryConfig, name: str) -> dict[str, Any]:
    """The variant's documents, tokenizer and final shards, and its summary.json (rebuilt whatever is
    there); returns the summary."""
    vroot = variant_root(root, name)
    counts = _write_documents(root, vroot, cfg, name)
    documents, text_bytes = _documents_summary(vroot, cfg)
    if documents == 0:
        raise AblationError(f"ablations.variants.{name}: selects no document (after the held-out evaluation "
                            f"documents); widen it or remove it")
    for key in (layout.TOKENIZER_KEY, layout.TOKENIZER_INFO_KEY):
        vroot.write_bytes(key, root.read_bytes(key))
    vcfg = _derived(cfg, name, None)
    tokenizer = tk.read_tokenizer(vroot, vcfg.tokenizer.eod_token)
    for shard in input_shards(vcfg):
        tk.tokenize_file(vroot, vcfg, shard, tokenizer)
    fields = tk.series_fields(vcfg, tokenizer)
    tokens = {}
    for bucket in vcfg.buckets:
        parts = [s.key for s in tk.bucket_shards(vcfg, bucket)]
        result = sh.shuffle_bucket(vroot, vcfg.seed, bucket, parts, fields, vcfg.shards.shard_tokens,
                                   vcfg.shards.shuffle_buffer_mb)
        tokens[bucket] = result.index["tokens"]
    raw = raw_bytes(root, cfg)
    summary = {
        "variant": name,
        "inputs": inputs_digest(root, cfg, name),
        "documents": documents,
        "tokens": sum(tokens.values()),
        "bucket_tokens": tokens,
        "bytes": text_bytes,
        "raw_byte_share": round(text_bytes / raw, 6) if raw else 0.0,
        "funnel_documents": counts.funnel,
        "readmitted_documents": counts.readmitted,
        "judged_out": counts.judged_out,
        "held_out": counts.held_out,
    }
    vroot.write_json(SUMMARY_KEY, summary)
    return summary


def variant_summary(root: DataRoot, cfg: RefineryConfig, name: str) -> dict[str, Any]:
    """The variant's summary.json, its shards built first when missing or built from other inputs."""
    vroot = variant_root(root, name)
    if vroot.exists(SUMMARY_KEY):
        summary = vroot.read_json(SUMMARY_KEY)
        if summary.get("inputs") == inputs_digest(root, cfg, name):
            return summary
    return build_variant_shards(root, cfg, name)


def usable_tokens(cfg: RefineryConfig, summary: dict[str, Any]) -> int:
    """The tokens a variant can train on: its tokens less a row of slack per bucket it holds (the
    sampler keeps each bucket within one row of its share), in whole optimizer steps."""
    assert cfg.ablations is not None
    buckets = sum(1 for t in summary["bucket_tokens"].values() if t)
    spare = summary["tokens"] - buckets * cfg.ablations.seq_len
    return max(0, spare // step_tokens(cfg) * step_tokens(cfg))


def budget_tokens(root: DataRoot, cfg: RefineryConfig) -> int:
    """The tokens every variant trains on: `ablations.tokens`, or the smallest variant's usable
    tokens; each variant's shards are built first where missing. AblationError when a variant
    cannot fill it."""
    assert cfg.ablations is not None
    usable = {name: usable_tokens(cfg, variant_summary(root, cfg, name)) for name in variant_names(cfg)}
    if cfg.ablations.tokens is None:
        smallest = min(usable, key=usable.__getitem__)
        if usable[smallest] <= 0:
            raise AblationError(f"ablations.variants.{smallest}: holds fewer tokens than one proxy optimizer step "
                                f"({step_tokens(cfg):,}) per bucket; widen it or remove it")
        return usable[smallest]
    short = {n: u for n, u in usable.items() if u < cfg.ablations.tokens}
    if short:
        listed = ", ".join(f"{n!r} {u:,}" for n, u in sorted(short.items()))
        raise AblationError(f"ablations.tokens: {cfg.ablations.tokens:,} tokens, more than variant(s) can fill "
                            f"(usable tokens: {listed}); lower ablations.tokens to at most {min(short.values()):,}, "
                            f"or leave it out for the smallest variant's")
    return cfg.ablations.tokens


# ---- the variant ---------------------------------------------------------------------------------


def _weights(summary: dict[str, Any]) -> dict[str, float]:
    total = summary["tokens"]
    return {b: t / total for b, t in summary["bucket_tokens"].items() if t}


def build_variant(root: DataRoot, cfg: RefineryConfig, name: str) -> dict[str, Any]:
    """Build the variant `name`: the evaluation set first (when missing or stale), its shards, and
    the other variants' where the budget needs them (each when missing, or built from other inputs:
    `variant_summary`), then its one-phase manifest. Returns its summary with the budget: documents,
    tokens, bytes, raw_byte_share, budget_tokens and the selection's counts."""
    if name not in variant_names(cfg):
        raise AblationError(f"ablations.variants: no variant {name!r}; the config has {variant_names(cfg)}")
    ensure_eval_set(root, cfg)
    summary = variant_summary(root, cfg, name)
    budget = budget_tokens(root, cfg)
    vroot = variant_root(root, name)
    vcfg = _derived(cfg, name, _curriculum(budget, cfg.ablations.seq_len, _weights(summary)))
    report, inventory, selections = cur.validate_data_root(vcfg, vroot)
    if not report.ok or inventory is None:
        raise AblationError(f"ablations.variants.{name}: its one-phase curriculum does not validate: "
                            + "; ".join(str(e) for e in report.errors))
    cur.write_manifest(vroot, cur.build_phase_manifest(vcfg, vroot, PHASE, report, inventory, selections))
    summary = {**summary, "budget_tokens": budget}
    vroot.write_json(SUMMARY_KEY, summary)
    return summary


def build_variants(root: DataRoot, cfg: RefineryConfig) -> dict[str, dict[str, Any]]:
    """Every variant, built in the config's order (each variant's shards once)."""
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
