"""The map of the data root: every key an asset, the trainer or a command reads or writes, named once.

A key is a POSIX path relative to the data root (refinery/storage/ reads and writes it, locally or on
S3). Nothing else in the code spells a data-root path; a change of layout is a change here.

    documents/<stage>/<partition>.parquet      the kept documents, full text, of raw_documents, extracted_text
                                               and pii_redacted
    attributes/<stage>/<partition>.parquet     the kept documents of each stage in between, as verdicts: doc_id,
                                               the columns the stage adds, its text edits as spans
    rejects/<stage>/<partition>.parquet        what it removed, with stage, rule and value
    stats/<stage>/<partition>.json             its counters
    dedup/signatures/<input shard>.parquet     hash and band hashes per document
    dedup/sketches/<input shard>.parquet       bottom-k sketches, dropped once near_dup_clusters has run
    dedup/exact/<hash range>.parquet           exact duplicates dropped, per hash range
    dedup/near/edges/<band>.parquet            verified near-duplicate pairs, per LSH band
    dedup/near/clusters.parquet                near-duplicate clusters and their survivors
    models/quality/                            the quality classifier
    models/difficulty/reference.npz            the difficulty score's reference n-gram model
    tokenizer/tokenizer.json, info.json        the tokenizer and what it was trained on
    shards/<stage>/<bucket>/shard-NNNNN.*      token shards (stage `tokenized`, then `final`)
    shards/<stage>/<bucket>/index.json         a bucket's shards with their sha256
    shards/tokenized/<bucket>/<file>/dropped.json  the file's series dropped once the bucket's shuffle published
    lineage/documents/<input>.arrow, index.json  the lineage index: each input file's documents, text-free;
                                                 lineage/final/<bucket>/shard-N.rows, one per final shard
    manifests/<phase>.json                     a phase's manifest; manifests/<phase>/<bucket>-selection.npy, -bands.npy
    contamination/<phase>/...                  scan report, hits, and the drop policy's exclusions
    curriculum/schedule.png                    the schedule picture
    reports/funnel.json, funnel.png            the whole funnel's report
    <training.run_dir>/<phase>/checkpoints/    a training run's mirror on a remote data root
"""

from __future__ import annotations

from refinery.stages import registry

# --- per-document stages ----------------------------------------------------------------------


def documents_prefix(stage: str) -> str:
    return f"documents/{stage}"


def documents_key(stage: str, partition: str) -> str:
    return f"{documents_prefix(stage)}/{partition}.parquet"


# The per-document stages that store their kept documents as an attribute table, each with the stage
# whose documents it narrows (refinery/stages/attributes.py reads them back): the text is stored in
# full only where it is made (extracted_text) and where it is final (pii_redacted). From
# refinery/stages/registry.py.
ATTRIBUTE_STAGES = registry.attribute_stages()


def attributes_key(stage: str, partition: str) -> str:
    return f"attributes/{stage}/{partition}.parquet"


def kept_documents_prefix(stage: str) -> str:
    """The folder of `kept_documents_key`'s tables of a stage."""
    return f"attributes/{stage}" if stage in ATTRIBUTE_STAGES else documents_prefix(stage)


def kept_documents_key(stage: str, partition: str) -> str:
    """The table a per-document stage writes its kept documents to: its attribute table, or its
    documents table for a stage that stores the text."""
    return attributes_key(stage, partition) if stage in ATTRIBUTE_STAGES else documents_key(stage, partition)


def rejects_key(stage: str, partition: str) -> str:
    return f"rejects/{stage}/{partition}.parquet"


def stats_key(stage: str, partition: str) -> str:
    return f"stats/{stage}/{partition}.json"


STATS_PREFIX = "stats"

# --- dedup --------------------------------------------------------------------------------------

NEAR_CLUSTERS_KEY = "dedup/near/clusters.parquet"


def signatures_key(shard: str) -> str:
    return f"dedup/signatures/{shard}.parquet"


SKETCHES_PREFIX = "dedup/sketches"


def sketches_key(shard: str) -> str:
    """One input file's bottom-k sketches (doc_key, bottom): read by near_deduped's verification only."""
    return f"{SKETCHES_PREFIX}/{shard}.parquet"


def sketches_dropped_key(shard: str) -> str:
    """The marker left where `sketches_key(shard)` was, once near_dup_clusters dropped it (refinery/dropped.py)."""
    return f"{SKETCHES_PREFIX}/{shard}.dropped.json"


def exact_drops_key(hash_range: str) -> str:
    return f"dedup/exact/{hash_range}.parquet"


def near_edges_key(band: str) -> str:
    return f"dedup/near/edges/{band}.parquet"


# --- models and tokenizer -----------------------------------------------------------------------

QUALITY_MODEL_DIR = "models/quality"
DIFFICULTY_MODEL_KEY = "models/difficulty/reference.npz"
TOKENIZER_KEY = "tokenizer/tokenizer.json"
TOKENIZER_INFO_KEY = "tokenizer/info.json"

# --- token shards -------------------------------------------------------------------------------

FINAL_SHARDS_PREFIX = "shards/final"


def bucket_shards_prefix(stage: str, bucket: str, part: str | None = None) -> str:
    """`shards/<stage>/<bucket>`: stage `final` (a bucket's shuffled shards); with `part`,
    `shards/<stage>/<bucket>/<part>`: stage `tokenized` (one input file's documents, in order, the
    part being the file's partition key)."""
    return f"shards/{stage}/{bucket}" + (f"/{part}" if part is not None else "")


def shard_key(stage: str, bucket: str, number: int, part: str | None = None) -> str:
    """A shard's key without its suffix (`.bin`, `.idx`, `.entries.parquet`)."""
    return f"{bucket_shards_prefix(stage, bucket, part)}/shard-{number:05d}"


def shard_index_key(stage: str, bucket: str, part: str | None = None) -> str:
    """A series' shards (a bucket's, or one part's of it), each with its token count and sha256."""
    return f"{bucket_shards_prefix(stage, bucket, part)}/index.json"


def bucket_entries_key(stage: str, bucket: str, part: str | None = None) -> str:
    """Every entry of a series' shards in shard order: doc_id, window and the columns carried with it."""
    return f"{bucket_shards_prefix(stage, bucket, part)}/entries.parquet"


def series_dropped_key(stage: str, bucket: str, part: str) -> str:
    """The marker left in a part's series folder once its shards and entry table were dropped
    (refinery/dropped.py); the series' index.json stays beside it."""
    return f"{bucket_shards_prefix(stage, bucket, part)}/dropped.json"


def final_index_key(bucket: str) -> str:
    return shard_index_key("final", bucket)


# --- lineage ------------------------------------------------------------------------------------

LINEAGE_DOCUMENTS_PREFIX = "lineage/documents"
LINEAGE_INDEX_KEY = "lineage/index.json"
LINEAGE_SHARD_MAPS_PREFIX = "lineage/final"


def documents_part_key(input_key: str) -> str:
    """`web-cc001` -> `lineage/documents/web-cc001.arrow`: that input file's documents, text-free."""
    return f"{LINEAGE_DOCUMENTS_PREFIX}/{input_key}.arrow"


def shard_lineage_key(shard_prefix: str) -> str:
    """`shards/final/web/shard-00003` -> `lineage/final/web/shard-00003.rows` (refinery/lineage_index.py's rows)."""
    return "lineage/" + shard_prefix.removeprefix("shards/") + ".rows"


def bucket_lineage_key(bucket: str) -> str:
    """The per-shard listing (entries, bytes, sha256) of a bucket's lineage files."""
    return f"{LINEAGE_SHARD_MAPS_PREFIX}/{bucket}/index.json"


# --- curriculum ---------------------------------------------------------------------------------

MANIFESTS_PREFIX = "manifests"
SCHEDULE_PLOT_KEY = "curriculum/schedule.png"


def manifest_key(phase: str) -> str:
    return f"{MANIFESTS_PREFIX}/{phase}.json"


def manifest_phase(key: str) -> str | None:
    """The phase whose manifest `key` is (`manifests/<phase>.json`), or None for any other key."""
    name = key.removeprefix(MANIFESTS_PREFIX + "/")
    if name == key or "/" in name or not name.endswith(".json"):
        return None
    return name.removesuffix(".json")


def selection_key(phase: str, bucket: str) -> str:
    """The sorted global entry ids a phase keeps of a bucket (a quality cutoff, or dropped documents)."""
    return f"{MANIFESTS_PREFIX}/{phase}/{bucket}-selection.npy"


def bands_key(phase: str, bucket: str) -> str:
    """The band file of a bucket in an ordered phase: the entry ids it serves, band after band."""
    return f"{MANIFESTS_PREFIX}/{phase}/{bucket}-bands.npy"


# --- contamination ------------------------------------------------------------------------------


def exclusions_key(phase: str) -> str:
    """Doc ids the drop policy removed from a phase; phase_manifests honours it on every rebuild."""
    return f"contamination/{phase}/excluded_doc_ids.json"


def hits_key(phase: str) -> str:
    """The contaminated documents the latest contamination_scan found, before its policy applied."""
    return f"contamination/{phase}/hits.parquet"


def scan_report_key(phase: str) -> str:
    return f"contamination/{phase}/scan.json"


# --- reports and training runs ------------------------------------------------------------------

FUNNEL_REPORT_KEY = "reports/funnel.json"
FUNNEL_CHART_KEY = "reports/funnel.png"
CHECKPOINTS_DIR = "checkpoints"


def run_key(run_dir: str, *parts: str) -> str:
    """A file of a training run mirrored on the data root: `<training.run_dir>/<parts...>`."""
    return "/".join([run_dir.strip("/"), *parts])
