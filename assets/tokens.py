"""`tokenizer` (global), `tokenized_shards` and `shuffled_shards` (per bucket), `lineage_index` (global).

Thin wrappers: the work is in `refinery.stages.tokenize`, `refinery.stages.shuffle` and
`refinery.lineage`. Each bucket partition reads the clean tables of the input shards routed to it
(a static partition mapping from input shard to bucket).
"""

import dagster as dg

from assets.factory import code_version, eager_after, provenance_metadata
from refinery.stages import shuffle as sh
from refinery.stages import tokenize as tk
from orchestration.resources import RefineryResource
from refinery import lineage as lin
from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE, input_batches, rejects_key, stats_key

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


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    # A batch holds one source's files, so it feeds one bucket; dynamic batches are unknown here.
    to_bucket = {} if cfg.partitions.dynamic else {b.key: cfg.source(b.source).bucket for b in input_batches(cfg)}
    clean_by_bucket = dg.AssetDep(
        CLEAN_STAGE, partition_mapping=dg.StaticPartitionMapping(to_bucket) if to_bucket else dg.AllPartitionMapping()
    )
    tokenize_version = code_version(tk)

    @dg.asset(
        name="tokenizer",
        automation_condition=dg.AutomationCondition.on_missing(),
        deps=[dg.AssetDep(CLEAN_STAGE, partition_mapping=dg.AllPartitionMapping())],
        group_name=GROUP,
        code_version=tokenize_version,
        kinds={"tokenizers"},
        description="Byte-level BPE trained on a seeded sample of the clean corpus, or tokenizer.path loaded; "
        "written to tokenizer/tokenizer.json.",
    )
    def tokenizer(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        built = tk.build_tokenizer(refinery.root, refinery.config)
        info = built.info
        context.log.info(f"tokenizer: {info['source']}, vocab {info['vocab_size']}, sha256 {info['sha256'][:12]}")
        sample = info.get("sample", {})
        return dg.MaterializeResult(
            metadata={
                "vocab_size": dg.MetadataValue.int(info["vocab_size"]),
                "eod_id": dg.MetadataValue.int(info["eod_id"]),
                "eod_token": dg.MetadataValue.text(info["eod_token"]),
                "dtype": dg.MetadataValue.text(info["dtype"]),
                "source": dg.MetadataValue.text(info["source"] if info["source"] == "trained" else info["path"]),
                "train_docs": dg.MetadataValue.int(sample.get("docs", 0)),
                "train_bytes": dg.MetadataValue.int(sample.get("bytes", 0)),
                "train_shards": dg.MetadataValue.json(sample.get("shards", {})),
                "wall_s": dg.MetadataValue.float(round(info["wall_s"], 3)),
                "config": dg.MetadataValue.json({**refinery.config.tokenizer.model_dump(mode="json"),
                                                 "seed": refinery.config.seed}),
                "code_version": dg.MetadataValue.text(tokenize_version),
                "content_hashes": dg.MetadataValue.json({tk.TOKENIZER_KEY: info["sha256"]}),
            }
        )

    @dg.asset(
        name="tokenized_shards",
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep("tokenizer"), clean_by_bucket],
        partitions_def=parts.buckets,
        group_name=GROUP,
        code_version=tokenize_version,
        kinds={"numpy"},
        description="Clean documents encoded in parallel batches, EOD appended, windowed at the packing window "
        "with overlap, packed into shards/tokenized/<bucket>/ (.bin/.idx/.entries.parquet) plus entries.parquet.",
    )
    def tokenized_shards(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        cfg, root, bucket = refinery.config, refinery.root, context.partition_key
        tok = tk.read_tokenizer(root, cfg.tokenizer.eod_token)
        result = tk.tokenize_bucket(root, cfg, bucket, tok)
        outputs = {
            rejects_key("tokenized_shards", bucket): root.write_parquet(rejects_key("tokenized_shards", bucket), result.rejects)
        }
        root.write_json(stats_key("tokenized_shards", bucket), result.stats.to_dict())
        index, stats = result.index, result.stats
        tokens_per_s = index["tokens"] / stats.wall_s if stats.wall_s else 0.0
        context.log.info(f"tokenized_shards[{bucket}]: {stats.docs_out} docs -> {index['tokens']:,} tokens in "
                         f"{len(index['shards'])} shards ({tokens_per_s:,.0f} tokens/s)")
        settings = {"window": index["window"], "overlap": index["overlap"], "shard_tokens": cfg.shards.shard_tokens,
                    "encode_batch_docs": cfg.shards.encode_batch_docs, "vocab_size": index["vocab_size"]}
        md = provenance_metadata(stats, settings, tokenize_version, {**outputs, **_shard_hashes(index)})
        md.update(_shard_metadata(index))
        md["tokens_per_s"] = dg.MetadataValue.float(round(tokens_per_s, 1))
        md["windowed_docs"] = dg.MetadataValue.int(stats.counters["windowed_docs"])
        return dg.MaterializeResult(metadata=md)

    shuffle_version = code_version(sh)

    @dg.asset(
        name="shuffled_shards",
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep("tokenized_shards")],
        partitions_def=parts.buckets,
        group_name=GROUP,
        code_version=shuffle_version,
        kinds={"numpy"},
        description="Seeded shuffle of the bucket's entries (never tokens) in bounded memory, into "
        "shards/final/<bucket>/ with sha256 of every file in index.json.",
    )
    def shuffled_shards(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        cfg, root, bucket = refinery.config, refinery.root, context.partition_key
        result = sh.shuffle_bucket(root, cfg.seed, bucket, cfg.shards.shard_tokens, cfg.shards.shuffle_buffer_mb)
        index = result.index
        context.log.info(f"shuffled_shards[{bucket}]: {index['entries']} entries through {result.runs} runs "
                         f"in {result.wall_s:.2f}s")
        return dg.MaterializeResult(
            metadata={
                **_shard_metadata(index),
                "content_hashes": dg.MetadataValue.json(_shard_hashes(index)),
                "runs": dg.MetadataValue.int(result.runs),
                "wall_s": dg.MetadataValue.float(round(result.wall_s, 3)),
                "tokens_per_s": dg.MetadataValue.float(round(index["tokens"] / result.wall_s, 1) if result.wall_s else 0.0),
                "index": dg.MetadataValue.path(root.display(tk.index_key(tk.FINAL, bucket))),
                "config": dg.MetadataValue.json({"seed": cfg.seed, "shard_tokens": cfg.shards.shard_tokens,
                                                 "shuffle_buffer_mb": cfg.shards.shuffle_buffer_mb}),
                "code_version": dg.MetadataValue.text(shuffle_version),
            }
        )

    lineage_version = code_version(lin)

    @dg.asset(
        name="lineage_index",
        automation_condition=eager_after("shuffled_shards"),
        deps=[dg.AssetDep("shuffled_shards", partition_mapping=dg.AllPartitionMapping()),
              dg.AssetDep(CLEAN_STAGE, partition_mapping=dg.AllPartitionMapping())],
        group_name=GROUP,
        code_version=lineage_version,
        kinds={"parquet"},
        description="lineage/documents.parquet (clean documents without text, sorted by doc_id) and "
        "lineage/index.json: answers `refinery lineage --shard S --offset N` without scanning.",
    )
    def lineage_index(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        index = lin.build_lineage_index(refinery.root, refinery.config, log=context.log.info)
        context.log.info(f"lineage_index: {index['documents']} documents, "
                         f"{index['final_shards_verified']} final shards verified")
        return dg.MaterializeResult(
            metadata={
                "documents": dg.MetadataValue.int(index["documents"]),
                "row_groups": dg.MetadataValue.int(len(index["row_group_first_doc_ids"])),
                "columns": dg.MetadataValue.json(index["columns"]),
                "final_shards_verified": dg.MetadataValue.int(index["final_shards_verified"]),
                "buckets": dg.MetadataValue.json(index["buckets"]),
                "wall_s": dg.MetadataValue.float(round(index["wall_s"], 3)),
                "code_version": dg.MetadataValue.text(lineage_version),
                "content_hashes": dg.MetadataValue.json({lin.DOCUMENTS_KEY: index["documents_sha256"]}),
            }
        )

    return dg.Definitions(assets=[tokenizer, tokenized_shards, shuffled_shards, lineage_index])
