"""Tokenizer training/loading, batch encoding, and windowing + packing documents into token shards.

No Dagster here. `assets/tokens.py` wires these into the `tokenizer` and `tokenized_shards` assets.

- The tokenizer is a byte-level BPE trained with HF `tokenizers` on a seeded sample of the clean
  corpus (the `cfg.tokenizer.train_docs` documents whose seeded hash of doc_id is smallest), or the
  `tokenizer.json` named by `cfg.tokenizer.path` (refinery/tokenizer_file.py reads and parses the
  file). Nothing is ever downloaded.
- Encoding runs `encode_batch_fast` on lists of documents, so the Rust side spreads a batch over
  every core and skips the offsets nobody reads.
- Tokenization runs per input file (`tokenize_file`), so it fans out over files like the funnel.
  Each document gets an EOD token and is cut into windows of at most `packing_window(cfg)` tokens
  (`refinery.shard_format.split_windows`); entries are appended to shards of about
  `cfg.shards.shard_tokens` tokens by a `ShardSeries`, which also writes the series' entry table
  and `index.json` (see docs/formats.md): one series per input file under
  `shards/tokenized/<bucket>/<file key>/`, read in order by the bucket's shuffle.
- With `stages.difficulty.enabled`, each document is scored by the reference model as it is
  encoded (`refinery.models.difficulty`), and every entry of the document carries its `difficulty`
  beside `quality_score`; disabled, the column is null.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import polars as pl

from refinery.stages.stats import BucketCounts, Drop, StageStats, rejects_frame, text_bytes
from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE, InputShard, empty_rejects, input_shards
from refinery.layout import (TOKENIZER_INFO_KEY, TOKENIZER_KEY, bucket_entries_key, bucket_shards_prefix,
                             shard_index_key, shard_key)
from refinery.models import difficulty as dfc
from refinery.models import difficulty_published as dpub
from refinery.stages.attributes import stage_batches
from refinery.shard_format import SHARD_SUFFIXES, ShardWriter, shard_files, split_windows, token_dtype
from refinery.storage import DataRoot, LocalDataRoot
# The tokenizer.json file's functions live in a module without polars (a lineage query reads the file
# alone); they are named here too, where the pipeline's callers find them.
from refinery.tokenizer_file import TokenizeError, load_tokenizer_file, parse_tokenizer, read_tokenizer  # noqa: F401

TOKENIZED = "tokenized"
FINAL = "final"
INDEX_VERSION = 1
# A 50 MB single-line record would dominate BPE training; the first 100k characters of a document
# already show its byte-pair statistics.
TRAIN_MAX_CHARS = 100_000
# Rows of a clean table read at a time when sampling for the tokenizer (doc ids, then texts).
SAMPLE_READ_ROWS = 10_000
# Bytes of text one encoding batch holds at most (and `shards.encode_batch_docs` documents).
ENCODE_BATCH_BYTES = 16 << 20
# Row groups of the bucket entry table: small enough that a reader can stream it in bounded memory.
ENTRY_ROW_GROUP = 65_536

ENTRY_TABLE_SCHEMA: dict[str, pl.DataType] = {
    "entry": pl.Int64(),  # position in the bucket, counting across its shards in order
    "shard": pl.Int32(),
    "index": pl.Int32(),  # position inside the shard
    "start": pl.Int64(),  # first token's offset inside the shard
    "tokens": pl.Int32(),
    "overlap": pl.Int32(),
    "doc_id": pl.String(),
    "window": pl.Int32(),
    "n_windows": pl.Int32(),
    "quality_score": pl.Float64(),
    "difficulty": pl.Float64(),  # the document's mean token loss under the reference model (refinery/models/difficulty.py)
    "language": pl.String(),  # language_filtered's language (null where a source skips it): a phase's quality cut is per language
}


# --------------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------------


def packing_window(cfg: RefineryConfig) -> int:
    """The longest entry a shard holds: the curriculum's longest seq_len, else shards.max_seq_len."""
    if cfg.curriculum is not None:
        return max(p.seq_len for p in cfg.curriculum.phases)
    return cfg.shards.max_seq_len


def windowing_overlap(cfg: RefineryConfig) -> int:
    window = packing_window(cfg)
    if 2 * cfg.shards.overlap > window:
        raise TokenizeError(
            f"shards.overlap {cfg.shards.overlap} is more than half the packing window {window} "
            f"(the longest curriculum seq_len); lower shards.overlap to at most {window // 2}"
        )
    return cfg.shards.overlap


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------


def _sample_key(seed: int, doc_id: str) -> bytes:
    return hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()


def bucket_shards(cfg: RefineryConfig, bucket: str) -> list[InputShard]:
    return [s for s in input_shards(cfg) if s.bucket == bucket]


def training_sample(root: DataRoot, cfg: RefineryConfig, stage: str = CLEAN_STAGE) -> tuple[list[str], dict[str, Any]]:
    """The clean documents with the smallest seeded hash of doc_id, in that hash order: at most
    `tokenizer.train_docs` of them, and of those the first whose texts (each cut to TRAIN_MAX_CHARS
    characters) add up to at most `tokenizer.train_bytes` bytes.

    Memory: `train_docs` keys (the doc ids are streamed past a bounded heap, never held for the
    corpus) and the chosen texts, which never hold more than `train_bytes` plus one text: while
    they are read, file by file, the text latest in hash order is let go whenever they pass the
    bound, and with it every text after it (`_capped_texts`).
    """
    counted = [0]

    def keyed() -> Iterator[tuple[bytes, str, str]]:
        for shard in input_shards(cfg):
            for batch in stage_batches(root, stage, shard.key, SAMPLE_READ_ROWS, columns=["doc_id"]):
                counted[0] += batch.height
                yield from ((_sample_key(cfg.seed, d), shard.key, d) for d in batch["doc_id"].to_list())

    # heapq.nsmallest is sorted(...)[:n] in a heap of n.
    chosen = heapq.nsmallest(cfg.tokenizer.train_docs, keyed())
    texts = _capped_texts(root, cfg, stage, chosen)
    used = [(shard_name, d) for _, shard_name, d in chosen if d in texts]
    sample = [texts[d] for _, d in used]
    per_shard = Counter(shard_name for shard_name, _ in used)
    info = {
        "docs": len(sample),
        "bytes": sum(len(t.encode()) for t in sample),
        "shards": dict(sorted(per_shard.items())),
        "corpus_docs": counted[0],
        "seed": cfg.seed,
    }
    return sample, info


def _capped_texts(root: DataRoot, cfg: RefineryConfig, stage: str,
                  chosen: list[tuple[bytes, str, str]]) -> dict[str, str]:
    """doc_id -> text (its first TRAIN_MAX_CHARS characters) of the longest prefix of `chosen` (in
    hash order; documents without text left out) whose texts add up to at most `train_bytes`.

    Texts are read file by file, not in hash order. Whenever those held pass the bound, the one
    latest in hash order cannot be in the prefix (the texts before it already pass the bound), nor
    can any after it: it is let go, and later ones at or past its rank are never held."""
    rank = {d: i for i, (_, _, d) in enumerate(chosen)}
    by_shard: dict[str, set[str]] = {}
    for _, shard_name, doc_id in chosen:
        by_shard.setdefault(shard_name, set()).add(doc_id)
    cap, ceiling, held = cfg.tokenizer.train_bytes, len(chosen), 0
    texts: dict[str, str] = {}
    latest: list[tuple[int, str, int]] = []  # (-rank, doc_id, bytes) of the texts held: a max-heap by rank
    for shard_name, ids in sorted(by_shard.items()):
        wanted = pl.Series(sorted(ids), dtype=pl.String).implode()
        for batch in stage_batches(root, stage, shard_name, SAMPLE_READ_ROWS, columns=["doc_id", "text"],
                                   max_bytes=cfg.stages.extract.batch_bytes):
            batch = batch.filter(pl.col("doc_id").is_in(wanted) & (pl.col("text").str.len_bytes() > 0))
            cut = batch["text"].str.slice(0, TRAIN_MAX_CHARS)
            for doc_id, text, size in zip(batch["doc_id"].to_list(), cut.to_list(), cut.str.len_bytes().to_list()):
                if rank[doc_id] >= ceiling:
                    continue
                texts[doc_id] = text
                held += size
                heapq.heappush(latest, (-rank[doc_id], doc_id, size))
                while held > cap:
                    minus_rank, dropped, dropped_size = heapq.heappop(latest)
                    del texts[dropped]
                    held -= dropped_size
                    ceiling = -minus_rank
    return texts


def train_tokenizer(texts: list[str], vocab_size: int, eod_token: str):
    """A byte-level BPE over `texts`, with `eod_token` as special token 0.

    Deterministic: the same texts in the same order give the same tokenizer.json bytes (the
    trainer's pair counts are merged in a fixed order; tests/test_tokenize.py checks it).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eod_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


@dataclass
class TokenizerBuild:
    tokenizer: Any
    info: dict[str, Any]


def build_tokenizer(root: DataRoot, cfg: RefineryConfig) -> TokenizerBuild:
    """Load `tokenizer.path`, or keep the data root's pinned tokenizer.json (`tokenizer.pin`), or
    train on the seeded sample; write tokenizer.json (unless pinned, untouched) and its info."""
    t0 = time.perf_counter()
    if cfg.tokenizer.path is None and cfg.tokenizer.pin and root.exists(TOKENIZER_KEY):
        data = root.read_bytes(TOKENIZER_KEY)
        tok = parse_tokenizer(data.decode(), cfg.tokenizer.eod_token, root.display(TOKENIZER_KEY))
        info = {"source": "pinned", "path": TOKENIZER_KEY}
        return TokenizerBuild(tok, _tokenizer_info(root, cfg, tok, info, hashlib.sha256(data).hexdigest(), t0))
    if cfg.tokenizer.path is not None:
        path = cfg.resolve(cfg.tokenizer.path)
        tok = load_tokenizer_file(path, cfg.tokenizer.eod_token)
        info: dict[str, Any] = {"source": "file", "path": path}
    else:
        texts, sample = training_sample(root, cfg)
        if not texts:
            raise TokenizeError(
                f"no clean documents to train the tokenizer on (documents/{CLEAN_STAGE}/ is empty); "
                f"materialize {CLEAN_STAGE} first, or set tokenizer.path to a tokenizer.json"
            )
        tok = train_tokenizer(texts, cfg.tokenizer.vocab_size, cfg.tokenizer.eod_token)
        info = {"source": "trained", "sample": sample, "requested_vocab_size": cfg.tokenizer.vocab_size}
    sha = root.write_bytes(TOKENIZER_KEY, tok.to_str().encode())
    return TokenizerBuild(tok, _tokenizer_info(root, cfg, tok, info, sha, t0))


def _tokenizer_info(root: DataRoot, cfg: RefineryConfig, tok, info: dict[str, Any], sha: str,
                    t0: float) -> dict[str, Any]:
    """`info` completed with the tokenizer's vocabulary, EOD and dtype, written beside it; then the
    build's wall time (not written, so the info file's bytes depend on the tokenizer alone)."""
    info.update(
        vocab_size=tok.get_vocab_size(),
        eod_token=cfg.tokenizer.eod_token,
        eod_id=tok.token_to_id(cfg.tokenizer.eod_token),
        dtype=str(token_dtype(tok.get_vocab_size())),
        sha256=sha,
    )
    root.write_json(TOKENIZER_INFO_KEY, info)
    info["wall_s"] = time.perf_counter() - t0
    return info


def encode_texts(tokenizer, texts: list[str], dtype: np.dtype) -> list[np.ndarray]:
    """Token ids of each text, encoded as one parallel batch (no special tokens added)."""
    return [np.asarray(e.ids, dtype=dtype) for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


# --------------------------------------------------------------------------------------------------
# Shard series: entries in, rolled shards + entry table + index.json out
# --------------------------------------------------------------------------------------------------


def staging_dir(root: DataRoot) -> Path:
    """Where shards are assembled before publishing: inside a local root (same filesystem, so
    publishing is a rename), else the system temp folder."""
    if isinstance(root, LocalDataRoot):
        base = root.root / ".staging"
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=base))
    return Path(tempfile.mkdtemp(prefix="refinery-shards-"))


def publish_file(root: DataRoot, local: Path, key: str) -> None:
    with root.writer(key) as tmp:
        shutil.move(local, tmp)


@dataclass
class ShardSeries:
    """Shards `shard-00000`, `shard-00001`, ... under `shards/<stage>/<bucket>/` (with `part`:
    `shards/<stage>/<bucket>/<part>/`), each closed once it would pass `shard_tokens`; then the
    entry table and index.json.

    Shards are assembled in a staging folder and published by `finish()`, so a failure leaves the
    bucket's previous shards as they were. Use as a context manager: the staging folder is removed
    whatever happens.
    """

    root: DataRoot
    stage: str
    bucket: str
    dtype: np.dtype
    shard_tokens: int
    extra_index: dict[str, Any] = field(default_factory=dict)
    part: str | None = None

    def __post_init__(self) -> None:
        self._stage_dir = staging_dir(self.root)
        self._writer: ShardWriter | None = None
        self._shards: list[dict[str, Any]] = []
        self._staged: list[tuple[Path, str]] = []
        self._rows: dict[str, list] = {k: [] for k in ENTRY_TABLE_SCHEMA}
        self._arrow_schema = pl.DataFrame(schema=ENTRY_TABLE_SCHEMA).to_arrow().schema
        self._table_path = self._stage_dir / "entries.parquet"
        self._table_writer = None
        self.entries = 0
        self.tokens = 0
        self.documents = 0

    def __enter__(self) -> "ShardSeries":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._table_writer is not None:
            self._table_writer.close()
        shutil.rmtree(self._stage_dir, ignore_errors=True)

    def add(
        self, tokens: np.ndarray, doc_id: str, overlap: int, window: int, n_windows: int, quality: float | None,
        difficulty: float | None = None, language: str | None = None,
    ) -> None:
        n = len(tokens)
        if self._writer is not None and self._writer.num_entries and self._writer.num_tokens + n > self.shard_tokens:
            self._close_shard()
        if self._writer is None:
            self._writer = ShardWriter(self._stage_dir / f"shard-{len(self._shards):05d}", self.dtype)
        rows = self._rows
        rows["entry"].append(self.entries)
        rows["shard"].append(len(self._shards))
        rows["index"].append(self._writer.num_entries)
        rows["start"].append(self._writer.num_tokens)
        rows["tokens"].append(n)
        rows["overlap"].append(overlap)
        rows["doc_id"].append(doc_id)
        rows["window"].append(window)
        rows["n_windows"].append(n_windows)
        rows["quality_score"].append(quality)
        rows["difficulty"].append(difficulty)
        rows["language"].append(language)
        self._writer.add(tokens, doc_id, overlap=overlap, window=window, n_windows=n_windows)
        self.entries += 1
        self.tokens += n
        if window == n_windows - 1:
            self.documents += 1

    def _close_shard(self) -> None:
        import pyarrow.parquet as pq

        assert self._writer is not None
        writer, number = self._writer, len(self._shards)
        hashes = writer.close()
        key = shard_key(self.stage, self.bucket, number, self.part)
        self._staged.append((writer.prefix, key))
        self._shards.append({"prefix": key, "tokens": writer.num_tokens, "entries": writer.num_entries, "sha256": hashes})
        table = pl.DataFrame(self._rows, schema=ENTRY_TABLE_SCHEMA).to_arrow()
        if self._table_writer is None:
            self._table_writer = pq.ParquetWriter(self._table_path, self._arrow_schema, compression="zstd")
        self._table_writer.write_table(table, row_group_size=ENTRY_ROW_GROUP)
        self._rows = {k: [] for k in ENTRY_TABLE_SCHEMA}
        self._writer = None

    def finish(self) -> dict[str, Any]:
        """Publish the last shard, the entry table and index.json; delete shards of an earlier,
        larger run. Returns the index."""
        import pyarrow.parquet as pq

        if self._writer is not None:
            self._close_shard()
        if self._table_writer is None:
            pq.write_table(self._arrow_schema.empty_table(), self._table_path, compression="zstd")
        else:
            self._table_writer.close()
            self._table_writer = None
        # Published only now, so a run that fails part-way leaves the previous shards untouched.
        for staged, key in self._staged:
            files = shard_files(staged)
            for suffix in (".bin", ".entries.parquet", ".idx"):  # .idx last: it marks the shard complete
                publish_file(self.root, files[suffix], key + suffix)
        table_key = bucket_entries_key(self.stage, self.bucket, self.part)
        table_sha = hashlib.sha256(self._table_path.read_bytes()).hexdigest()
        publish_file(self.root, self._table_path, table_key)
        index = {
            "version": INDEX_VERSION,
            "stage": self.stage,
            "bucket": self.bucket,
            **({"part": self.part} if self.part is not None else {}),
            "dtype": str(self.dtype),
            "tokens": self.tokens,
            "entries": self.entries,
            "documents": self.documents,
            "shards": self._shards,
            "entries_table": {"key": table_key, "sha256": table_sha},
            **self.extra_index,
        }
        key = shard_index_key(self.stage, self.bucket, self.part)
        self.root.write_json(key, index)
        keep = {key, table_key} | {s["prefix"] + suffix for s in self._shards for suffix in SHARD_SUFFIXES}
        for stale in self.root.list(bucket_shards_prefix(self.stage, self.bucket, self.part)):
            if stale not in keep:
                self.root.delete(stale)
        return index


# --------------------------------------------------------------------------------------------------
# tokenized_shards
# --------------------------------------------------------------------------------------------------


def series_fields(cfg: RefineryConfig, tokenizer) -> dict[str, Any]:
    """What every token series of a run shares, in its index.json: the token dtype, the tokenizer's
    vocabulary size and EOD id, and the packing window and overlap."""
    vocab = tokenizer.get_vocab_size()
    return {"dtype": str(token_dtype(vocab)), "vocab_size": vocab,
            "eod_id": int(tokenizer.token_to_id(cfg.tokenizer.eod_token)),
            "window": packing_window(cfg), "overlap": windowing_overlap(cfg)}


@dataclass
class TokenizeResult:
    index: dict[str, Any]
    stats: StageStats
    rejects: pl.DataFrame


def tokenize_file(root: DataRoot, cfg: RefineryConfig, shard: InputShard, tokenizer,
                  stage: str = CLEAN_STAGE, reference: tuple[dfc.ReferenceModel, str] | None = None) -> TokenizeResult:
    """Encode the clean documents of one input file (rows in table order), append EOD, window, and
    pack them into `shards/tokenized/<bucket>/<file key>/`. The table is read `encode_batch_docs`
    rows and at most ENCODE_BATCH_BYTES of text at a time, so memory is two batches' (one encoding
    while the last is packed), whatever the file's or its documents' sizes; a file is the unit of work,
    so tokenization fans out like the funnel (the shuffle then reads a bucket's files in order).

    With `stages.difficulty.enabled`, documents are scored by `reference` (the model and its file's
    sha256, as `difficulty_published.load_published_model` gives them; read from the data root when None)."""
    t0 = time.perf_counter()
    fields = series_fields(cfg, tokenizer)
    window, overlap, dtype = fields.pop("window"), fields.pop("overlap"), np.dtype(fields.pop("dtype"))
    eod = np.asarray([fields["eod_id"]], dtype=dtype)
    stats = StageStats(stage="tokenized_shards")
    reject_parts: list[pl.DataFrame] = []
    windowed = 0
    if cfg.stages.difficulty.enabled and reference is None:
        reference = dpub.load_published_model(root)
    model = reference[0] if cfg.stages.difficulty.enabled else None
    extra = {**fields, "window": window, "overlap": overlap,
             **({"difficulty_model_sha256": reference[1]} if model is not None else {})}

    def encode(batch: pl.DataFrame) -> tuple[pl.DataFrame, list[int], list[np.ndarray], list[float | None]]:
        if "quality_score" not in batch.columns:
            batch = batch.with_columns(quality_score=pl.lit(None, dtype=pl.Float64))
        texts = batch["text"].to_list()
        keep = [i for i, t in enumerate(texts) if t]
        encoded = encode_texts(tokenizer, [texts[i] for i in keep], dtype)
        if model is None:
            return batch, keep, encoded, [None] * len(encoded)
        scores = dfc.score_documents(model, encoded)
        return batch, keep, encoded, [None if np.isnan(v) else float(v) for v in scores]

    batches = stage_batches(root, stage, shard.key, cfg.shards.encode_batch_docs, max_bytes=ENCODE_BATCH_BYTES)
    # The Rust encoder releases the GIL, so the next batch encodes while this thread packs the last.
    with ShardSeries(root, TOKENIZED, shard.bucket, dtype, cfg.shards.shard_tokens, extra, part=shard.key) as series, \
            ThreadPoolExecutor(max_workers=1) as pool:
        pending = [pool.submit(encode, batch) for batch in itertools.islice(batches, 1)]
        while pending:
            batch, keep, encoded, difficulties = pending.pop().result()
            pending = [pool.submit(encode, nxt) for nxt in itertools.islice(batches, 1)]
            ids, qualities = batch["doc_id"].to_list(), batch["quality_score"].to_list()
            languages = batch["language"].to_list() if "language" in batch.columns else [None] * batch.height
            for i, doc_tokens, difficulty in zip(keep, encoded, difficulties):
                doc_tokens = np.concatenate([doc_tokens, eod])
                cuts = split_windows(len(doc_tokens), window, overlap)
                windowed += len(cuts) > 1
                for w, (a, b, ov) in enumerate(cuts):
                    series.add(doc_tokens[a:b], ids[i], ov, w, len(cuts), qualities[i], difficulty, languages[i])
            kept = set(keep)
            drops = {i: Drop("tokenize/empty_text", 0.0, "no text to tokenize") for i in range(batch.height) if i not in kept}
            batch_bytes = int(text_bytes(batch).sum())  # Int64: len_bytes is UInt32 and polars sums it in UInt32
            stats.docs_in += batch.height
            stats.docs_out += len(keep)
            stats.bytes_in += batch_bytes
            stats.bytes_out += batch_bytes  # a dropped (empty) text has no bytes
            stats.dropped.update(d.rule for d in drops.values())
            if drops:
                reject_parts.append(rejects_frame(batch, "tokenized_shards", drops))
        index = series.finish()
    stats.counters.update(
        tokens=index["tokens"], entries=index["entries"], shards=len(index["shards"]), windowed_docs=windowed
    )
    stats.by_bucket[shard.bucket] = BucketCounts(docs_in=stats.docs_in, docs_out=stats.docs_out,
                                                 bytes_in=stats.bytes_in, bytes_out=stats.bytes_out)
    stats.wall_s = time.perf_counter() - t0
    rejects = pl.concat(reject_parts) if reject_parts else empty_rejects()
    return TokenizeResult(index, stats, rejects)
