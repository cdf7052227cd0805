"""The tokenizer and the shards: how the clean corpus becomes packed token windows."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from refinery.config.section import Section


# The largest vocabulary a config may ask for: 4x Gemma's 262,144 (Gemma Team 2024), the largest
# published language-model vocabulary, and far inside what the shards' uint32 tokens hold
# (refinery/shard_format.py token_dtype). The BPE trainer reserves about 70 bytes per requested
# token up front: 10^9 asked it for 70 GB and 2^31 aborted the process (SIGABRT) mid-run.
MAX_VOCAB_SIZE = 1 << 20


def check_vocab_size(v: int | None) -> int | None:
    if v is not None and v > MAX_VOCAB_SIZE:
        raise ValueError(f"{v} is above {MAX_VOCAB_SIZE:,} tokens, the largest vocabulary Refinery trains or "
                         f"packs (the BPE trainer reserves memory per requested token up front); give at most "
                         f"{MAX_VOCAB_SIZE}")
    return v


class TokenizerConfig(Section):
    """Train a byte-level BPE on the clean corpus, or load `path` (a tokenizer.json). Never downloads.
    With `pin`, a run that finds the data root's tokenizer/tokenizer.json keeps it."""

    path: str | None = None
    # Keep the data root's tokenizer/tokenizer.json once one is there instead of training again on
    # the changed corpus, so a filter or curriculum change keeps every token id; delete the file
    # (or set false) to retrain.
    pin: bool = False
    vocab_size: int = Field(default=8192, ge=260)
    _vocab_bound = field_validator("vocab_size")(check_vocab_size)
    train_docs: int = Field(default=20_000, ge=1)
    # The training sample's texts (each cut to 100k characters) add up to at most this many bytes:
    # of the train_docs documents chosen, those first in seeded hash order that fit. It bounds the
    # sample's memory whatever the documents' sizes.
    train_bytes: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024, le=64 * 1024 * 1024 * 1024)
    eod_token: str = "<|endoftext|>"


class ShardsConfig(Section):
    """Packing window, windowing overlap, shard size and the external shuffle's memory bound."""

    max_seq_len: int = Field(default=2048, ge=8)  # the packing window; the curriculum's longest seq_len
    overlap: int = Field(default=128, ge=0)
    shard_tokens: int = Field(default=4_000_000, ge=1024)
    shuffle_buffer_mb: int = Field(default=64, ge=1)
    encode_batch_docs: int = Field(default=512, ge=1)

    @model_validator(mode="after")
    def _overlap(self) -> "ShardsConfig":
        if self.overlap * 2 > self.max_seq_len:
            raise ValueError(f"overlap {self.overlap} is more than half of max_seq_len {self.max_seq_len}")
        return self
