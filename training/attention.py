"""Document-masked causal attention: which backend trains, and the mask each one takes.

Two backends compute the same thing:
- "sdpa": a dense B x T x T document-causal mask for scaled_dot_product_attention. Runs anywhere
  (CI on CPU), but the mask is O(T^2) and rules out the flash kernels: a 124M GPT does not fit 32K
  tokens per row on an H100 this way.
- "flex": FlexAttention with a BlockMask built from the doc ids' block boundaries, O((T/128)^2)
  small integers and no T x T tensor; on CUDA the kernel is compiled (fused, flash-style memory).
  On CPU torch runs it eagerly and forward only, which the tests use to check it against sdpa.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from training.kernels import cuda_kernel

FLEX_BLOCK_SIZE = 128  # FlexAttention's tile on CUDA
AttentionBackend = Literal["sdpa", "flex"]


def resolve_attention(choice: str, device: torch.device, dropout: float = 0.0) -> AttentionBackend:
    """training.attention -> the backend to train with: `auto` is flex on CUDA (sdpa when attention
    dropout is on, which FlexAttention lacks) and sdpa elsewhere; FlexAttention has no backward on CPU."""
    if choice not in ("auto", "sdpa", "flex"):
        raise ValueError(f"training.attention {choice!r}: one of auto, sdpa, flex")
    if choice == "auto":
        return "flex" if device.type == "cuda" and dropout == 0.0 else "sdpa"
    if choice == "flex" and device.type != "cuda":
        raise ValueError(f"training.attention flex trains on CUDA only (torch {torch.__version__} has no FlexAttention "
                         f"backward on {device.type}); use auto or sdpa")
    if choice == "flex" and dropout > 0.0:
        raise ValueError(f"training.attention flex has no attention dropout; set training.model.dropout 0 "
                         f"(now {dropout}) or training.attention sdpa")
    return choice  # type: ignore[return-value]


def dense_document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """B x 1 x T x T boolean: query i sees key j iff j <= i and both are in one document."""
    T = doc_ids.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    return ((doc_ids[:, :, None] == doc_ids[:, None, :]) & causal)[:, None]


ROW_ORDER_ERROR = ("doc_ids must not decrease along a row (packed documents are contiguous runs); the block mask "
                   "reads each block's documents from its first and last token")


def _check_row_order(doc_ids: torch.Tensor) -> None:
    if doc_ids.size(1) <= 1:
        return
    ordered = (doc_ids[:, 1:] >= doc_ids[:, :-1]).all()
    if doc_ids.is_cuda:  # asserted on the device (a failure surfaces as a device-side assert at the
        torch._assert_async(ordered)  # next sync): reading the answer here would stall the step
    elif not bool(ordered):
        raise ValueError(ROW_ORDER_ERROR)


def document_block_mask(doc_ids: torch.Tensor, block_size: int = FLEX_BLOCK_SIZE) -> BlockMask:
    """The document-causal BlockMask of packed rows, from per-token doc ids that never decrease along
    a row. Block pairs are classified from each block's first and last doc id: kv block j can reach
    q block i iff j <= i and j's last document is not before i's first (ids only grow, so for j < i
    it is i's first); it needs no mask at all (a full block) iff j < i and j's first document is
    i's last, so that both blocks lie inside one document. Blocks holding padding past T are never full. Memory:
    B x (T/block)^2, never T x T."""
    _check_row_order(doc_ids)
    B, T = doc_ids.shape
    n = -(-T // block_size)
    starts = torch.arange(n, device=doc_ids.device) * block_size
    first = doc_ids[:, starts]  # (B, n)
    last = doc_ids[:, (starts + block_size).clamp(max=T) - 1]
    q_first, kv_last = first[:, :, None], last[:, None, :]
    idx = torch.arange(n, device=doc_ids.device)
    below = idx[None, :] <= idx[:, None]  # kv block j <= q block i
    strictly_below = idx[None, :] < idx[:, None]
    reachable = below & (kv_last >= q_first)
    # Whether each block lies wholly inside T. Not `whole[-1] = ...`: assigning a Python value into a
    # CUDA tensor copies it from the host and waits for the device, and the trainer builds the next
    # step's mask while the device runs this step's backward (bench/RESULTS.md, issue 29).
    whole = idx < (n if T % block_size == 0 else n - 1)
    full = strictly_below & (first[:, None, :] == last[:, :, None]) & whole[:, None] & whole[None, :]
    partial = reachable & ~full

    def ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = blocks.sum(-1, dtype=torch.int32)
        indices = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[:, None], indices[:, None]

    padded = F.pad(doc_ids, (0, n * block_size - T), value=-1)  # mask_mod reads padded positions too

    def same_document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (padded[b, q_idx] == padded[b, kv_idx])

    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=block_size,
                                    mask_mod=same_document_causal, seq_lengths=(T, T))


def _flex_kernel(device: torch.device):
    """FlexAttention compiled on CUDA: eager flex materialises the scores, which the block mask avoids."""
    return cuda_kernel(flex_attention, device, dynamic=False)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | BlockMask | None,
           dropout_p: float) -> torch.Tensor:
    """Attention of (B, heads, T, head_dim) queries, keys and values: flex for a BlockMask, else sdpa
    with the dense mask (causal when there is none)."""
    if isinstance(mask, BlockMask):
        return _flex_kernel(q.device)(q, k, v, block_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=dropout_p)
