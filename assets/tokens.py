"""`tokenizer` (global), `tokenized_shards` and `shuffled_shards` (per bucket), `lineage_index` (global).

Thin wrappers: the work is in `refinery.stages.tokenize`, `refinery.stages.shuffle` and
`refinery.lineage`. Each bucket partition reads the clean tables of the input shards routed to it
(a static partition mapping from input shard to bucket).
"""

import dagster as dg

from refinery import layout
from assets.factory import StepResult, eager_after, global_step_asset
from assets.partitions import Partitions
from assets.provenance import Provenance, code_version
from assets.resource import RefineryResource
from refinery import lineage as lin
from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE, input_batches
from refinery.layout import rejects_key, stats_key
from refinery.stages import shuffle as sh
from refinery.stages import tokenize as tk

GROUP = "tokens"


def _shard_hashes(index: dict) -> dict[str, str]:
    hashes = {ref["prefix"] + suffix: digest for ref in index["shards"] for suffix, digest in ref["sha256"].items()}
    hashes[index["entries_table"]["key"]] = index["entries_table"]["sha256"]
    return hashes


def _shard_metadata(index: dict) -> dict:
    return {
        "tokens": dg.MetadataValue.int(index["tokens"]),
        "entries": dg.MetadataValue.int(index["entries"]),
        "documents": dg.MetadataValue.int(index["documents"]),
        "shards": dg.MetadataValue.int(len(index["shards"])),
        "dtype": dg.MetadataValue.text(index["dtype"]),
    }


def _tokens_per_s(tokens: int, wall_s: float) -> dg.MetadataValue:
    return dg.MetadataValue.float(round(tokens / wall_s, 1) if wall_s else 0.0)


def build_tokenizer(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg = refinery.config
        info = tk.build_tokenizer(refinery.root, cfg).info
        context.log.info(f"tokenizer: {info['source']}, vocab {info['vocab_size']}, sha256 {info['sha256'][:12]}")
        sample = info.get("sample", {})
        return StepResult(
            Provenance(version, {**cfg.tokenizer.model_dump(mode="json"), "seed": cfg.seed},
                       {layout.TOKENIZER_KEY: info["sha256"]}, wall_s=info["wall_s"],
                       docs_in=sample.get("docs", 0), bytes_in=sample.get("bytes", 0)),
            {
                "vocab_size": dg.MetadataValue.int(info["vocab_size"]),
                "eod_id": dg.MetadataValue.int(info["eod_id"]),
                "eod_token": dg.MetadataValue.text(info["eod_token"]),
                "dtype": dg.MetadataValue.text(info["dtype"]),
                "source": dg.MetadataValue.text(info["source"] if info["source"] == "trained" else info["path"]),
                "train_docs": dg.MetadataValue.int(sample.get("docs", 0)),
                "train_bytes": dg.MetadataValue.int(sample.get("bytes", 0)),
                "train_shards": dg.MetadataValue.json(sample.get("shards", {})),
            },
        )
    return step


def tokenize_bucket(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root, bucket = refinery.config, refinery.root, context.partition_key
        result = tk.tokenize_bucket(root, cfg, bucket, tk.read_tokenizer(root, cfg.tokenizer.eod_token))
        rejects = {rejects_key("tokenized_shards", bucket):
                   root.write_parquet(rejects_key("tokenized_shards", bucket), result.rejects)}
        root.write_json(stats_key("tokenized_shards", bucket), result.stats.to_dict())
        index, stats = result.index, result.stats
        tokens_per_s = index["tokens"] / stats.wall_s if stats.wall_s else 0.0
        context.log.info(f"tokenized_shards[{bucket}]: {stats.docs_out} docs -> {index['tokens']:,} tokens in "
                         f"{len(index['shards'])} shards ({tokens_per_s:,.0f} tokens/s)")
        settings = {"window": index["window"], "overlap": index["overlap"], "shard_tokens": cfg.shards.shard_tokens,
                    "encode_batch_docs": cfg.shards.encode_batch_docs, "vocab_size": index["vocab_size"]}
        provenance = Provenance.of_stats(stats, settings, version, {**rejects, **_shard_hashes(index)})
        return StepResult(provenance, {
            **_shard_metadata(index),
            "tokens_per_s": _tokens_per_s(index["tokens"], stats.wall_s),
            "windowed_docs": dg.MetadataValue.int(stats.counters["windowed_docs"]),
        })
    return step


def shuffle_bucket(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root, bucket = refinery.config, refinery.root, context.partition_key
        result = sh.shuffle_bucket(root, cfg.seed, bucket, cfg.shards.shard_tokens, cfg.shards.shuffle_buffer_mb)
        index = result.index
        context.log.info(f"shuffled_shards[{bucket}]: {index['entries']} entries through {result.runs} runs "
                         f"in {result.wall_s:.2f}s")
        config = {"seed": cfg.seed, "shard_tokens": cfg.shards.shard_tokens,
                  "shuffle_buffer_mb": cfg.shards.shuffle_buffer_mb}
        return StepResult(
            Provenance(version, config, _shard_hashes(index), wall_s=result.wall_s,
                       docs_in=index["documents"], docs_out=index["documents"]),
            {
                **_shard_metadata(index),
                "runs": dg.MetadataValue.int(result.runs),
                "tokens_per_s": _tokens_per_s(index["tokens"], result.wall_s),
                "index": dg.MetadataValue.path(root.display(layout.shard_index_key(tk.FINAL, bucket))),
            },
        )
    return step


def index_lineage(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg = refinery.config
        index = lin.build_lineage_index(refinery.root, cfg, log=context.log.info)
        context.log.info(f"lineage_index: {index['documents']} documents in {index['documents_parts']} parts, "
                         f"{index['final_shards_verified']} final shards verified and indexed")
        return StepResult(
            Provenance(version, {"buckets": list(cfg.buckets)}, {layout.LINEAGE_INDEX_KEY: index["sha256"]},
                       wall_s=index["wall_s"], docs_in=index["documents"], docs_out=index["documents"]),
            {
                "documents": dg.MetadataValue.int(index["documents"]),
                "documents_parts": dg.MetadataValue.int(index["documents_parts"]),
                "columns": dg.MetadataValue.json(index["columns"]),
                "final_shards_verified": dg.MetadataValue.int(index["final_shards_verified"]),
                "buckets": dg.MetadataValue.json(index["buckets"]),
            },
        )
    return step


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    # A batch holds one source's files, so it feeds one bucket; dynamic batches are unknown here.
    to_bucket = {} if cfg.partitions.dynamic else {b.key: cfg.source(b.source).bucket for b in input_batches(cfg)}
    clean_by_bucket = dg.AssetDep(
        CLEAN_STAGE, partition_mapping=dg.StaticPartitionMapping(to_bucket) if to_bucket else dg.AllPartitionMapping()
    )
    every = dg.AllPartitionMapping()
    tokenize_version, shuffle_version, lineage_version = code_version(tk), code_version(sh), code_version(lin)
    return dg.Definitions(assets=[
        global_step_asset(
            "tokenizer", build_tokenizer(tokenize_version), version=tokenize_version, group=GROUP,
            kinds={"tokenizers"}, automation_condition=dg.AutomationCondition.on_missing(),
            deps=[dg.AssetDep(CLEAN_STAGE, partition_mapping=every)],
            description="Byte-level BPE trained on a seeded sample of the clean corpus, or tokenizer.path loaded; "
            "written to tokenizer/tokenizer.json.",
        ),
        global_step_asset(
            "tokenized_shards", tokenize_bucket(tokenize_version), version=tokenize_version, group=GROUP,
            kinds={"numpy"}, automation_condition=dg.AutomationCondition.eager(), partitions_def=parts.buckets,
            deps=[dg.AssetDep("tokenizer"), clean_by_bucket],
            description="Clean documents encoded in parallel batches, EOD appended, windowed at the packing window "
            "with overlap, packed into shards/tokenized/<bucket>/ (.bin/.idx/.entries.parquet) plus entries.parquet.",
        ),
        global_step_asset(
            "shuffled_shards", shuffle_bucket(shuffle_version), version=shuffle_version, group=GROUP,
            kinds={"numpy"}, automation_condition=dg.AutomationCondition.eager(), partitions_def=parts.buckets,
            deps=[dg.AssetDep("tokenized_shards")],
            description="Seeded shuffle of the bucket's entries (never tokens) in bounded memory, into "
            "shards/final/<bucket>/ with sha256 of every file in index.json.",
        ),
        global_step_asset(
            "lineage_index", index_lineage(lineage_version), version=lineage_version, group=GROUP,
            kinds={"parquet"}, automation_condition=eager_after("shuffled_shards"),
            deps=[dg.AssetDep("shuffled_shards", partition_mapping=every),
                  dg.AssetDep(CLEAN_STAGE, partition_mapping=every)],
            description="lineage/documents/<input>.arrow (each input file's clean documents without text), "
            "lineage/final/<bucket>/shard-N.arrow (each final shard's entries with their documents) and "
            "lineage/index.json: answers `refinery lineage --shard S --offset N` reading one row.",
        ),
    ])
