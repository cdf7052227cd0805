"""Seed 002's second equation, the throughput contract: a run of N tokens in T days needs
tau = N / (T x 86,400) tokens per second in aggregate, tau / G per GPU, and tau x b_t bytes per
second of reads at the corpus's b_t bytes per token. DeepSeek-V3: 14.8T tokens in 54 days on 2,048
GPUs is 3.17M tokens/s, about 1,550 per GPU, and 12.7 MB/s at 4 bytes per token. (Seed 002 writes
12.7 GB/s and 60 PB of reads; 3.17e6 tokens/s x 4 B is 12.7e6 B/s, and 14.8T tokens x 4 B is 59 TB
a pass, consistent with its own 6.2 KB/s per GPU: the seed's GB and PB are off by a thousand.)

b_t is measured where the corpus exists: the text bytes `tokenized_shards` read over the tokens the
final shards hold; 4 (a typical BPE figure for English web text) otherwise. `refinery validate`
prints the contract beside the curriculum's; the trainer records what it achieves per GPU, and the
`training_run` asset compares the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from refinery.layout import final_index_key
from refinery.stages.stats import StageStats
from refinery.storage import DataRoot

DEFAULT_BYTES_PER_TOKEN = 4.0
# Bytes of clean text per token of the demo's tokenizer (byte-level BPE, vocab 4096, trained on the
# sample's clean text by the `tokenizer` asset): 3.37 on data/sample's JSONL text.
DEMO_BYTES_PER_TOKEN = 3.4
SECONDS_PER_DAY = 86_400
TOKENIZE_STAGE = "tokenized_shards"


@dataclass(frozen=True)
class ThroughputContract:
    tokens: int  # N, the curriculum's budget
    gpus: int  # G
    days: float  # T
    bytes_per_token: float  # b_t
    bytes_per_token_source: str  # "measured" or "default"

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.days * SECONDS_PER_DAY)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def read_bytes_per_s(self) -> float:
        return self.tokens_per_s * self.bytes_per_token

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "read_bytes_per_s": self.read_bytes_per_s}

    def lines(self) -> list[str]:
        return [
            f"throughput contract: {self.tokens:,} tokens in {self.days:g} days on {self.gpus:,} GPUs needs "
            f"{self.tokens_per_s / 1e6:,.2f}M tokens/s in aggregate, {self.tokens_per_s_per_gpu:,.0f} tokens/s per GPU",
            f"read bandwidth: {rate(self.read_bytes_per_s)} at {self.bytes_per_token:.2f} bytes per token "
            f"({self.bytes_per_token_source})",
        ]


def rate(bytes_per_s: float) -> str:
    """`12.7 MB/s`: decimal units, three significant figures."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def measured_bytes_per_token(root: DataRoot, buckets: list[str]) -> float | None:
    """Text bytes tokenized over tokens in the final shards, or None before both exist."""
    stats = [StageStats.from_dict(root.read_json(k)) for k in root.list(f"stats/{TOKENIZE_STAGE}") if k.endswith(".json")]
    text_bytes = sum(s.bytes_in for s in stats)
    tokens = sum(int(root.read_json(final_index_key(b)).get("tokens", 0)) for b in buckets
                 if root.exists(final_index_key(b)))
    return text_bytes / tokens if text_bytes and tokens else None


def throughput_contract(tokens: int, gpus: int, days: float, root: DataRoot | None = None,
                        buckets: list[str] | None = None) -> ThroughputContract:
    measured = measured_bytes_per_token(root, buckets or []) if root is not None else None
    return ThroughputContract(tokens, gpus, days, measured or DEFAULT_BYTES_PER_TOKEN,
                              "measured from the shards" if measured else "default: no shards yet")


def achieved_share(contract: ThroughputContract, tokens_per_s_per_gpu: float) -> float:
    """What a run achieves per GPU, as a fraction of what the contract needs."""
    return tokens_per_s_per_gpu / contract.tokens_per_s_per_gpu
