"""Bits per byte of a language model on the evaluation documents, per domain and per language.

Bits per byte is comparable across tokenizers (a tokenizer that cuts text into fewer tokens pays
more per token): a document's bits are the sum of its tokens' next-token negative log-likelihoods
in nats divided by ln 2, and its bytes are the UTF-8 bytes of its text. A set of documents scores
sum(bits) / sum(bytes), never a mean of per-document ratios, so a long document weighs by its size.

What is scored: each document as the shards hold it, its tokens and then EOD, every one of those
tokens exactly once. The sequence the model reads is EOD, the document's tokens, EOD: the first
token is predicted from a lone EOD (what precedes every document in the packed stream), the closing
EOD from the whole document.

A document longer than the model's window (`seq_len` tokens) is read in windows that slide by
`stride` tokens (default seq_len // 2, the usual strided evaluation): the first window scores its
first seq_len targets; every later window is seq_len tokens long, ends `stride` targets further,
and scores only those `stride` new targets, each of which so sees at least seq_len - stride tokens
of context. A document within one window is read once. Windows of many documents are batched
(`batch_rows` rows, padded with EOD whose targets count for nothing).

The model is a function `score(inputs, targets) -> nll`: (B, T) int64 inputs and targets (IGNORE
where a target does not count) to (B, T) per-token NLL in nats, zero at ignored targets. The
trainer's GPT is one (`model(inputs, targets, reduction="none")[1]`); tests pass hand-made ones.
Nothing here imports the trainer.

Memory: one batch of documents (the eval table is read in polars batches) and one batch of windows;
a document's token ids are held while its windows are scored.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Iterator

import numpy as np
import polars as pl

IGNORE = -100  # training/loss.py's ignored target: the score function counts nothing there
UNKNOWN_LANGUAGE = "unknown"  # an evaluation document without a language (a source that skips language ID)
LN2 = math.log(2.0)
# A run's per-document scores, stored column-wise in its results (`documents`): kept is whether the
# document is of a language the config keeps (refinery/ablations/eval_set.py), which alone a verdict reads.
DOCUMENT_COLUMNS = ("doc_id", "domain", "language", "kept", "bytes", "nats")

Score = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]  # noqa: F821 (torch is imported lazily)
Encode = Callable[[list[str]], list[np.ndarray]]


@dataclass
class Tally:
    """What a set of documents scored: how many, their tokens scored, their UTF-8 bytes, and the
    sum of their tokens' NLL in nats."""

    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    nats: float = 0.0

    @property
    def bits(self) -> float:
        return self.nats / LN2

    @property
    def bpb(self) -> float | None:
        return self.bits / self.bytes if self.bytes else None

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(self.documents + other.documents, self.tokens + other.tokens, self.bytes + other.bytes,
                     self.nats + other.nats)

    def to_dict(self) -> dict:
        return {**asdict(self), "bits": self.bits, "bpb": self.bpb}


def windows(n_targets: int, seq_len: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """(begin, end, first): the windows over a sequence with `n_targets` targets (one fewer than its
    tokens). A window reads inputs [begin, end) and scores the targets of inputs [first, end) (the
    target of input i is token i + 1). Every target is scored exactly once; see the module's doc."""
    if not 0 < stride <= seq_len:
        raise ValueError(f"stride {stride} must be in 1..seq_len ({seq_len})")
    end = min(seq_len, n_targets)
    yield 0, end, 0
    while end < n_targets:
        first, end = end, min(end + stride, n_targets)
        yield max(0, end - seq_len), end, first


@dataclass
class _Row:
    document: int  # position in the current batch of documents
    inputs: np.ndarray
    targets: np.ndarray  # IGNORE where the window only gives context


class BitsPerByte:
    """Scores documents with `score` and adds their tallies up per (domain, language)."""

    def __init__(self, score: Score, encode: Encode, eod_id: int, seq_len: int, stride: int | None = None,
                 batch_rows: int = 16, device: str = "cpu"):
        self.score, self.encode, self.eod = score, encode, int(eod_id)
        self.seq_len, self.stride = seq_len, stride or max(1, seq_len // 2)
        if not 0 < self.stride <= seq_len:
            raise ValueError(f"stride {self.stride} must be in 1..seq_len ({seq_len})")
        self.batch_rows, self.device = batch_rows, device
        self.cells: dict[tuple[str, str], Tally] = {}
        # every scored document, in the order read: what the report's paired bootstrap resamples
        self.documents: dict[str, list] = {k: [] for k in DOCUMENT_COLUMNS}

    def add_batch(self, batch: pl.DataFrame) -> None:
        """Score a batch of evaluation documents (columns text, domain, language; doc_id and kept
        where given: a document without `kept` counts as kept)."""
        texts = batch["text"].to_list()
        keep = [i for i, t in enumerate(texts) if t]  # an empty text has no byte to score
        if not keep:
            return
        domains, languages = batch["domain"].to_list(), batch["language"].to_list()
        ids = self.encode([texts[i] for i in keep])
        nats = np.zeros(len(keep), dtype=np.float64)
        tokens = np.zeros(len(keep), dtype=np.int64)
        rows: list[_Row] = []
        for d, doc in enumerate(ids):
            seq = np.concatenate([[self.eod], np.asarray(doc, dtype=np.int64), [self.eod]])
            tokens[d] = len(seq) - 1
            for begin, end, first in windows(len(seq) - 1, self.seq_len, self.stride):
                targets = seq[begin + 1:end + 1].copy()
                targets[:first - begin] = IGNORE
                rows.append(_Row(d, seq[begin:end], targets))
                if len(rows) == self.batch_rows:
                    self._score_rows(rows, nats)
                    rows = []
        if rows:
            self._score_rows(rows, nats)
        doc_ids = batch["doc_id"].to_list() if "doc_id" in batch.columns else [None] * batch.height
        kept = batch["kept"].to_list() if "kept" in batch.columns else [True] * batch.height
        for d, i in enumerate(keep):
            key = (str(domains[i]), str(languages[i] or UNKNOWN_LANGUAGE))
            tally = Tally(1, int(tokens[d]), len(texts[i].encode("utf-8")), float(nats[d]))
            self.cells[key] = self.cells.get(key, Tally()) + tally
            for column, value in zip(DOCUMENT_COLUMNS, (doc_ids[i], *key, bool(kept[i]), tally.bytes, tally.nats)):
                self.documents[column].append(value)

    def _score_rows(self, rows: list[_Row], nats: np.ndarray) -> None:
        import torch

        width = max(len(r.inputs) for r in rows)
        inputs = np.full((len(rows), width), self.eod, dtype=np.int64)
        targets = np.full((len(rows), width), IGNORE, dtype=np.int64)
        for k, r in enumerate(rows):
            inputs[k, :len(r.inputs)] = r.inputs
            targets[k, :len(r.targets)] = r.targets
        t = torch.from_numpy(targets).to(self.device)
        with torch.no_grad():
            nll = self.score(torch.from_numpy(inputs).to(self.device), t)
            per_row = torch.where(t != IGNORE, nll.float(), 0.0).double().sum(dim=1).cpu().numpy()
        for k, r in enumerate(rows):
            nats[r.document] += per_row[k]

    def run(self, batches: Iterable[pl.DataFrame]) -> dict[tuple[str, str], Tally]:
        for batch in batches:
            self.add_batch(batch)
        return self.cells


def totals_by(cells: dict[tuple[str, str], Tally], axis: str) -> dict[str, Tally]:
    """The cells summed per domain (`axis` "domain") or per language ("language"), or all together
    under "all" (`axis` "all")."""
    pick = {"domain": lambda k: k[0], "language": lambda k: k[1], "all": lambda k: "all"}[axis]
    out: dict[str, Tally] = {}
    for key, tally in sorted(cells.items()):
        out[pick(key)] = out.get(pick(key), Tally()) + tally
    return out


def cells_to_json(cells: dict[tuple[str, str], Tally]) -> list[dict]:
    """The cells as a JSON list, sorted by (domain, language): what a run's results file stores."""
    return [{"domain": d, "language": lang, **tally.to_dict()} for (d, lang), tally in sorted(cells.items())]


def cells_from_json(rows: list[dict]) -> dict[tuple[str, str], Tally]:
    return {(r["domain"], r["language"]): Tally(int(r["documents"]), int(r["tokens"]), int(r["bytes"]), float(r["nats"]))
            for r in rows}
