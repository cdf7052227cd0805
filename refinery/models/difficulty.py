"""The difficulty score: a document's mean per-token loss (nats) under a small reference language model.

The reference model is a token n-gram model over the pipeline tokenizer's ids with interpolated
absolute discounting (Ney, Essen and Kneser 1994; the interpolated form of Chen and Goodman 1999,
Kneser-Ney's recursion without its continuation counts). With D the discount, c the training
counts, T(h) the number of distinct tokens seen after context h and V the vocabulary size:

    p_0(w)     = 1 / V                                                   (the uniform floor)
    p_k(w | h) = max(c(h w) - D, 0) / c(h) + D T(h) / c(h) p_{k-1}(w | h')  when c(h) > 0, else p_{k-1}(w | h')

for contexts h of k - 1 tokens (h' drops the oldest), up to the model's order; so every probability
is above zero. The score of a document is the mean of -ln p(token | the order - 1 tokens before it)
over its tokens (each document starts after order - 1 padding symbols, so contexts never reach into
another document); fewer than two tokens give no score. Higher is harder. CCNet (Wenzek et al.
2020) ranks web text the same way, by the perplexity of a KenLM 5-gram trained on Wikipedia.

Storage: per order, the sorted 64-bit hashes of its n-grams with their counts, and per context
length, the sorted hashes of the contexts with their total count and number of distinct followers;
scoring is `np.searchsorted` lookups over a whole batch of documents at once. A hash chains the
tokens through SplitMix64, so any order fits in 64 bits; two distinct n-grams share a hash with
probability about 2**-64 per pair. Training reads at most `max_tokens` tokens, which bounds the
model: at most 28 bytes per training token and order (training holds 24 bytes per distinct n-gram,
plus the copies its merges sort). The same documents, tokenizer and settings give the same file
bytes (`to_bytes` writes the .npz with fixed timestamps).

Training it from the data root, publishing and loading it: refinery/models/difficulty_published.py.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from refinery.hashing import splitmix64

MODEL_FORMAT = 1
# Hash seeds: the empty context, and the salt that spreads a token id over 64 bits.
EMPTY_CONTEXT = np.uint64(0x243F6A8885A308D3)
TOKEN_SALT = np.uint64(0x13198A2E03707344)
# Training hashes about this many tokens at once; scoring, this many positions at once.
TRAIN_BATCH_TOKENS = 1 << 18
SCORE_BATCH_TOKENS = 1 << 18
# A document's first 100k tokens place its difficulty as well as all of it would, and bound the
# scorer's memory (about 100 bytes per scored token) on a 50 MB single-line record.
SCORE_MAX_TOKENS = 100_000


class DifficultyModelError(ValueError):
    """A reference model file that cannot be read, or that does not fit the run's tokenizer."""


# --------------------------------------------------------------------------------------------------
# Hashing
# --------------------------------------------------------------------------------------------------


def _extend(mixed_context: np.ndarray, token_hashes: np.ndarray) -> np.ndarray:
    """The hash of each context and one more token, from `splitmix64` of the context's hash."""
    return splitmix64(mixed_context ^ token_hashes)


@dataclass(frozen=True)
class _Positions:
    """For every predicted token of a batch of documents: the hash of each n-gram ending at it
    (`ngrams[k]`: order k + 1) and of its context (`contexts[k]`: the k tokens before it)."""

    ngrams: list[np.ndarray]
    contexts: list[np.ndarray]
    doc_starts: np.ndarray  # where each document's positions begin


def _positions(documents: list[np.ndarray], order: int, pad: int) -> _Positions:
    lengths = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
    doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(documents) else lengths
    # Each document after order - 1 padding symbols, so no context reaches into the one before it.
    padding = np.full(order - 1, pad, dtype=np.uint64)
    padded = np.concatenate([padding, *(part for d in documents for part in (d.astype(np.uint64), padding))])
    token_hashes = splitmix64(padded ^ TOKEN_SALT)
    # Where each predicted token sits in `padded`: its index in the documents plus the padding before it.
    targets = np.arange(lengths.sum()) + np.repeat(np.arange(1, len(documents) + 1) * (order - 1), lengths)
    context = np.full(len(targets), EMPTY_CONTEXT, dtype=np.uint64)
    ngrams, contexts = [], []
    for k in range(order):
        contexts.append(context)
        mixed = splitmix64(context)
        ngrams.append(_extend(mixed, token_hashes[targets]))
        if k + 1 < order:
            context = _extend(mixed, token_hashes[targets - (k + 1)])
    return _Positions(ngrams, contexts, doc_starts)


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceModel:
    """Per order k + 1 (index k): sorted n-gram hashes and their counts; per context length k:
    sorted context hashes, their total counts and distinct followers."""

    order: int
    vocab_size: int
    discount: float
    tokens: int  # training tokens seen
    tokenizer_sha256: str
    ngram_keys: tuple[np.ndarray, ...]
    ngram_counts: tuple[np.ndarray, ...]
    context_keys: tuple[np.ndarray, ...]
    context_totals: tuple[np.ndarray, ...]
    context_followers: tuple[np.ndarray, ...]

    @property
    def pad(self) -> int:
        """The padding symbol before each document: an id no token has."""
        return self.vocab_size

    def distinct_ngrams(self) -> list[int]:
        return [len(k) for k in self.ngram_keys]

    def to_bytes(self) -> bytes:
        """The model as an .npz file whose bytes depend on the model alone."""
        meta = {"format": MODEL_FORMAT, "order": self.order, "vocab_size": self.vocab_size, "discount": self.discount,
                "tokens": self.tokens, "tokenizer_sha256": self.tokenizer_sha256}
        arrays = {"meta": np.array(json.dumps(meta, sort_keys=True))}
        for k in range(self.order):
            arrays[f"ngram_keys_{k + 1}"] = self.ngram_keys[k]
            arrays[f"ngram_counts_{k + 1}"] = self.ngram_counts[k]
            arrays[f"context_keys_{k}"] = self.context_keys[k]
            arrays[f"context_totals_{k}"] = self.context_totals[k]
            arrays[f"context_followers_{k}"] = self.context_followers[k]
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name in sorted(arrays):
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                with archive.open(info, "w") as f:
                    np.lib.format.write_array(f, arrays[name], allow_pickle=False)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> "ReferenceModel":
        """The model in an .npz written by `to_bytes`; `name` says which file in the error. Every
        member's size and array header is checked (`model_layout`) before any array is read, so a
        small file that would decompress to gigabytes is refused from its zip directory; the values
        are checked after (`_checked`): sorted unique keys, counts of at least one."""
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                meta, members = model_layout(archive, len(data), name)
                arrays = {member[:-len(".npy")]: _read_member(archive, member) for member in members}
            order = meta["order"]
            model = cls(
                order=order, vocab_size=meta["vocab_size"], discount=meta["discount"], tokens=meta["tokens"],
                tokenizer_sha256=meta["tokenizer_sha256"],
                ngram_keys=tuple(arrays[f"ngram_keys_{k + 1}"] for k in range(order)),
                ngram_counts=tuple(arrays[f"ngram_counts_{k + 1}"] for k in range(order)),
                context_keys=tuple(arrays[f"context_keys_{k}"] for k in range(order)),
                context_totals=tuple(arrays[f"context_totals_{k}"] for k in range(order)),
                context_followers=tuple(arrays[f"context_followers_{k}"] for k in range(order)),
            )
            return _checked(model, name)
        except DifficultyModelError:
            raise
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
            raise _not_a_model(name, f"{type(err).__name__}: {err}") from None


def _not_a_model(name: str, why: str) -> DifficultyModelError:
    return DifficultyModelError(f"{name}: not a reference model file ({why}); materialize difficulty_model again, "
                                f"or name a model Refinery wrote")


# The members' declared sizes, decompressed, at most this many times the file's (hash keys barely
# compress; counts do, about 4x; a model Refinery writes stays under 4x), and at most MODEL_BYTES_PER_TOKEN
# per training token and order (the bound training keeps), plus headers.
MAX_EXPANSION = 16
MODEL_BYTES_PER_TOKEN = 28
META_MAX_BYTES = 64 * 1024
# Each member's dtype: the keys are 64-bit hashes, the rest counts.
MEMBER_KINDS = {"ngram_keys": "u8", "ngram_counts": "u", "context_keys": "u8", "context_totals": "u",
                "context_followers": "u"}


def _member_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, header bytes) of the .npy member `info`, reading only its header."""
    with archive.open(info) as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0(f))
        return shape, dtype, f.tell()


def _read_member(archive: zipfile.ZipFile, member: str) -> np.ndarray:
    with archive.open(member) as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def model_layout(archive: zipfile.ZipFile, file_bytes: int, name: str) -> tuple[dict[str, Any], list[str]]:
    """The model's meta and its array members, checked from the zip directory and the .npy
    headers alone: the members a model of its order has and no other, a 1-D array of the right
    dtype in each, the sizes the headers declare adding up to each member's, and all of them
    within MAX_EXPANSION times the file and MODEL_BYTES_PER_TOKEN per training token and order.
    Reads the meta member (at most META_MAX_BYTES) and no array."""
    infos = {info.filename: info for info in archive.infolist()}
    meta_info = infos.get("meta.npy")
    if meta_info is None or meta_info.file_size > META_MAX_BYTES:
        raise _not_a_model(name, "no meta member, or one over 64 KiB")
    shape, dtype, _ = _member_header(archive, meta_info)
    if shape != () or dtype.kind != "U":
        raise _not_a_model(name, f"meta is {dtype} of shape {shape}, not a string")
    try:
        meta = json.loads(str(_read_member(archive, "meta.npy")))
    except ValueError as err:
        raise _not_a_model(name, f"meta is not JSON: {err}") from None
    if meta.get("format") != MODEL_FORMAT:
        raise DifficultyModelError(f"{name}: reference model format {meta.get('format')!r}, "
                                   f"this Refinery reads format {MODEL_FORMAT}")
    checks = {"order": lambda v: type(v) is int and 1 <= v <= 8, "vocab_size": lambda v: type(v) is int and v >= 1,
              "discount": lambda v: type(v) in (int, float) and 0.0 < v < 1.0,
              "tokens": lambda v: type(v) is int and 0 <= v <= 1 << 40,
              "tokenizer_sha256": lambda v: isinstance(v, str)}
    for field, ok in checks.items():
        if not ok(meta.get(field)):
            raise _not_a_model(name, f"meta {field} {meta.get(field)!r} is out of range")
    order, tokens = meta["order"], meta["tokens"]
    members = [f"{kind}_{k + 1 if kind.startswith('ngram') else k}.npy" for k in range(order) for kind in MEMBER_KINDS]
    if set(infos) != {"meta.npy", *members}:
        raise _not_a_model(name, f"members {sorted(set(infos) ^ {'meta.npy', *members})} do not fit a model of "
                                 f"order {order}")
    declared = sum(infos[m].file_size for m in members)
    bound = min(MAX_EXPANSION * file_bytes, MODEL_BYTES_PER_TOKEN * max(tokens, 1) * order) + 1024 * len(members)
    if declared > bound:
        raise _not_a_model(name, f"its members declare {declared:,} bytes decompressed, more than {bound:,} for a "
                                 f"{file_bytes:,}-byte file of {tokens:,} training tokens")
    for m in members:
        shape, dtype, header = _member_header(archive, infos[m])
        kind = MEMBER_KINDS[m.rsplit("_", 1)[0]]
        if (len(shape) != 1 or dtype.kind != kind[0] or (len(kind) > 1 and dtype.itemsize != int(kind[1:]))
                or shape[0] > tokens + 1 or header + shape[0] * dtype.itemsize != infos[m].file_size):
            raise _not_a_model(name, f"{m} holds {dtype} of shape {shape} in {infos[m].file_size:,} bytes")
    return meta, members


def check_model_file(path: str) -> None:
    """Raise DifficultyModelError unless the file at `path` has a model's layout (`model_layout`:
    its zip directory, array headers and meta; no array is read), for the preflight."""
    try:
        with zipfile.ZipFile(path) as archive:
            model_layout(archive, Path(path).stat().st_size, path)
    except DifficultyModelError:
        raise
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
        raise _not_a_model(path, f"{type(err).__name__}: {err}") from None


def _checked(model: ReferenceModel, name: str) -> ReferenceModel:
    """`model`, once its values can be a model's: per order, strictly increasing keys with as many
    counts, every count at least one, and no context with more distinct followers than uses."""
    def increasing(keys: np.ndarray) -> bool:
        return bool(np.all(keys[1:] > keys[:-1]))

    for k in range(model.order):
        tables = {f"ngram_keys_{k + 1}": model.ngram_keys[k], f"ngram_counts_{k + 1}": model.ngram_counts[k],
                  f"context_keys_{k}": model.context_keys[k], f"context_totals_{k}": model.context_totals[k],
                  f"context_followers_{k}": model.context_followers[k]}
        ngrams, contexts = len(model.ngram_keys[k]), len(model.context_keys[k])
        wrong = next((n for n, a in tables.items() if len(a) != (ngrams if n.startswith("ngram") else contexts)), None)
        wrong = wrong or next((n for n, a in tables.items() if "keys" in n and not increasing(a)), None)
        wrong = wrong or next((n for n, a in tables.items() if "keys" not in n and len(a) and a.min() < 1), None)
        if wrong is None and np.any(model.context_followers[k] > model.context_totals[k]):
            wrong = f"context_followers_{k}"
        if wrong is not None:
            raise _not_a_model(name, f"{wrong}: not sorted unique keys, counts of at least one and followers within "
                                     f"totals, as a trained model's are")
    return model


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def _merge(keys: np.ndarray, contexts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal keys summed: sorted unique keys, the context of each, and its total count."""
    order = np.argsort(keys, kind="stable")
    keys, contexts, counts = keys[order], contexts[order], counts[order]
    first = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if len(keys) else np.zeros(0, np.int64)
    return keys[first], contexts[first], np.add.reduceat(counts, first) if len(keys) else counts


class _Counts:
    """One order's n-gram counts, merged as batches arrive: pending batches join the table once
    they outgrow it, so the sorting work stays O(tokens log tokens) in all."""

    def __init__(self) -> None:
        self.table = (np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.int64))
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, keys: np.ndarray, contexts: np.ndarray) -> None:
        self.pending.append(_merge(keys, contexts, np.ones(len(keys), np.int64)))
        if sum(len(p[0]) for p in self.pending) >= len(self.table[0]):
            self._fold()

    def _fold(self) -> None:
        parts = [self.table, *self.pending]
        self.table = _merge(*(np.concatenate([p[i] for p in parts]) for i in range(3)))
        self.pending = []

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(n-gram keys, counts, context keys, context totals, context distinct followers)."""
        self._fold()
        keys, contexts, counts = self.table
        context_keys, _, totals = _merge(contexts, contexts, counts)
        _, _, followers = _merge(contexts, contexts, np.ones(len(contexts), np.int64))
        return keys, counts.astype(np.uint32), context_keys, totals.astype(np.uint32), followers.astype(np.uint32)


def capped(documents: Iterable[np.ndarray], max_tokens: int) -> Iterator[np.ndarray]:
    """The documents until `max_tokens` tokens in all, the last one cut to fit; nothing more is read."""
    left = max_tokens
    for doc in documents:
        if len(doc):
            yield doc[:left]
            left -= min(len(doc), left)
            if not left:
                return


def _batched(items: Iterable[Any], size: Callable[[Any], int], batch_size: int) -> Iterator[list[Any]]:
    """Consecutive items grouped until each group's sizes add up to `batch_size` (the last may be smaller)."""
    batch, total = [], 0
    for item in items:
        batch.append(item)
        total += size(item)
        if total >= batch_size:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


def train(documents: Iterable[np.ndarray], vocab_size: int, order: int = 3, max_tokens: int = 4_000_000,
          discount: float = 0.75, tokenizer_sha256: str = "") -> ReferenceModel:
    """The reference model of the documents' token ids (read in order, up to `max_tokens` tokens)."""
    if order < 1 or max_tokens < 1 or not 0.0 < discount < 1.0:
        raise ValueError(f"order {order} (>= 1), max_tokens {max_tokens} (>= 1) and discount {discount} (in (0, 1))")
    counts = [_Counts() for _ in range(order)]
    tokens = 0
    for batch in _batched(capped(documents, max_tokens), len, TRAIN_BATCH_TOKENS):
        pos = _positions(batch, order, vocab_size)
        for k in range(order):
            counts[k].add(pos.ngrams[k], pos.contexts[k])
        tokens += sum(len(d) for d in batch)
    tables = [c.tables() for c in counts]
    return ReferenceModel(order, vocab_size, discount, tokens, tokenizer_sha256,
                          *(tuple(t[i] for t in tables) for i in range(5)))


# --------------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------------


def _lookup(keys: np.ndarray, queries: np.ndarray, *columns: np.ndarray) -> list[np.ndarray]:
    """Each column's value at the query's key, or 0 where the (sorted) keys lack it."""
    if not len(keys):
        return [np.zeros(len(queries)) for _ in columns]
    at = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    found = keys[at] == queries
    return [np.where(found, column[at], 0).astype(np.float64) for column in columns]


def _log_probs(model: ReferenceModel, documents: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """ln p of every token of the documents, and where each document's tokens begin."""
    pos = _positions(documents, model.order, model.pad)
    d = model.discount
    p = np.full(len(pos.ngrams[0]), 1.0 / model.vocab_size)
    for k in range(model.order):
        [seen] = _lookup(model.ngram_keys[k], pos.ngrams[k], model.ngram_counts[k])
        total, followers = _lookup(model.context_keys[k], pos.contexts[k], model.context_totals[k],
                                   model.context_followers[k])
        known = total > 0
        safe = np.where(known, total, 1.0)
        p = np.where(known, (np.maximum(seen - d, 0.0) + d * followers * p) / safe, p)
    return np.log(p), pos.doc_starts


def score_documents(model: ReferenceModel, documents: list[np.ndarray]) -> np.ndarray:
    """Each document's mean per-token negative log-likelihood in nats (of its first SCORE_MAX_TOKENS
    tokens); NaN for a document of fewer than two tokens. Documents are scored in batches of about
    SCORE_BATCH_TOKENS positions, each as a few array operations over the whole batch."""
    scores = np.full(len(documents), np.nan)
    chosen = [i for i, doc in enumerate(documents) if len(doc) >= 2]
    for index in _batched(chosen, lambda i: min(len(documents[i]), SCORE_MAX_TOKENS), SCORE_BATCH_TOKENS):
        logp, starts = _log_probs(model, [documents[i][:SCORE_MAX_TOKENS] for i in index])
        lengths = np.diff(np.append(starts, len(logp)))
        scores[index] = -np.add.reduceat(logp, starts) / lengths
    return scores


def score(model: ReferenceModel, tokens: np.ndarray) -> float | None:
    """One document's difficulty (see `score_documents`), or None below two tokens."""
    value = score_documents(model, [tokens])[0]
    return None if np.isnan(value) else float(value)
