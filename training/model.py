"""A small GPT with rotary position embeddings, in one file (nanoGPT's shape).

`forward(idx, targets=None, doc_ids=None)` returns `(logits, None)` without targets and `(None, loss)`
with them: the loss is computed chunk by chunk from the last hidden state (`LinearCrossEntropy`), so
the B x T x vocab logits never exist in training. With `doc_ids`, attention is causal *within* each
packed document only. Positions stay continuous across packed documents (seed 003: RoPE is not reset
at boundaries). Targets equal to -100 are ignored. `reduction="none"` returns the per-token loss,
which the trainer splits by bucket.

Two attention paths compute the same thing:
- "sdpa": a dense B x T x T document-causal mask for scaled_dot_product_attention. Runs anywhere
  (CI on CPU), but the mask is O(T^2) and rules out the flash kernels: a 124M GPT does not fit 32K
  tokens per row on an H100 this way.
- "flex": FlexAttention with a BlockMask built from the doc ids' block boundaries, O((T/128)^2)
  small integers and no T x T tensor; on CUDA the kernel is compiled (fused, flash-style memory).
  On CPU torch runs it eagerly and forward only, which the tests use to check it against sdpa.

`set_rope_scaling` switches RoPE to YaRN (Peng et al. 2023) when a phase extends the context.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.utils.checkpoint import checkpoint

IGNORE = -100
FLEX_BLOCK_SIZE = 128  # FlexAttention's tile on CUDA
AttentionBackend = Literal["sdpa", "flex"]


@dataclass
class GPTConfig:
    vocab_size: int = 8192  # the tokenizer's vocabulary
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    rope_base: float = 10_000.0  # RoFormer's base

    def to_dict(self) -> dict:
        return asdict(self)


# ---- rotary embeddings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeScaling:
    """YaRN: positions up to `factor * original_seq_len` on a model trained at `original_seq_len`.
    beta_fast/beta_slow bound the ramp in rotations over the original length (the paper's 32 and 1)."""

    factor: float
    original_seq_len: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self):
        if self.factor < 1.0:
            raise ValueError(f"rope scaling factor {self.factor} must be >= 1 (YaRN extends, never shrinks, the context)")
        if self.original_seq_len < 1 or self.beta_fast <= self.beta_slow:
            raise ValueError(f"rope scaling needs original_seq_len >= 1 and beta_fast > beta_slow, got {self}")


def rope_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def yarn_frequencies(head_dim: int, base: float, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """YaRN's NTK-by-parts inverse frequencies and its attention temperature, as float64.

    A pair whose wavelength fits more than beta_fast times into the original length keeps its
    frequency (extrapolates), one that fits fewer than beta_slow times is divided by `factor`
    (interpolates), and pairs in between blend linearly in the pair index. The returned mscale
    multiplies cos and sin, so q.k logits grow by mscale^2 = 1/t with sqrt(1/t) = 0.1 ln(factor) + 1."""
    inv_freq = rope_inv_freq(head_dim, base)

    def pair_index_at(rotations: float) -> float:  # the pair that turns `rotations` times over the original length
        return head_dim * math.log(scaling.original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index_at(scaling.beta_fast)), 0)
    high = min(math.ceil(pair_index_at(scaling.beta_slow)), head_dim // 2 - 1)
    span = max(high - low, 1e-3)  # equal bounds: a step, not a division by zero
    interpolated = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / span).clamp(0.0, 1.0)
    blended = inv_freq * (1.0 - interpolated) + inv_freq / scaling.factor * interpolated
    mscale = 0.1 * math.log(scaling.factor) + 1.0 if scaling.factor > 1.0 else 1.0
    return blended, mscale


def rope_tables(seq_len: int, head_dim: int, base: float, device: torch.device,
                scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq, mscale = yarn_frequencies(head_dim, base, scaling) if scaling else (rope_inv_freq(head_dim, base), 1.0)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return (angles.cos() * mscale).float().to(device), (angles.sin() * mscale).float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


# ---- document masks ------------------------------------------------------------------------------


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
    whole = torch.ones(n, dtype=torch.bool, device=doc_ids.device)
    whole[-1] = T % block_size == 0
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


_compiled: dict = {}


def _cuda_kernel(fn, device: torch.device, **compile_options):
    """`fn` torch.compile'd once for CUDA; `fn` itself inside an enclosing compile (which fuses it)
    and on CPU (eager, for tests)."""
    if device.type != "cuda" or torch.compiler.is_compiling():
        return fn
    if fn not in _compiled:
        _compiled[fn] = torch.compile(fn, **compile_options)
    return _compiled[fn]


def _flex_kernel(device: torch.device):
    """FlexAttention compiled on CUDA: eager flex materialises the scores, which the block mask avoids."""
    return _cuda_kernel(flex_attention, device, dynamic=False)


# ---- the loss ------------------------------------------------------------------------------------


def _loss_chunk_tokens(vocab_size: int) -> int:
    return max(256, (1 << 28) // vocab_size)  # fp32 logits of a chunk stay near 1 GiB


class LinearCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of `h @ weight.T` against `targets`, without the N x V logits.

    Chunk by chunk, forward computes the logits in `compute_dtype`, the loss in fp32, and at once the
    gradients for a loss whose upstream gradient is one number for every counted token (a sum or a
    mean: what training backpropagates): d h = (softmax - onehot) @ W and d W = (softmax - onehot)^T h.
    Backward scales those: straight away when the upstream gradient is a sum's (an expanded scalar),
    after checking on the host otherwise. Any other upstream gradient (per-token weights, a NaN) is
    honoured exactly by recomputing each chunk. At a 50K vocabulary the logits and their fp32 copies
    are most of a 124M GPT's activation memory at 32K tokens per row; this keeps one chunk of them."""

    @staticmethod
    def forward(ctx, h, weight, targets, compute_dtype, want_grads):
        per_token = torch.empty(h.size(0), dtype=torch.promote_types(compute_dtype, torch.float32), device=h.device)
        grad_h = torch.empty_like(h) if want_grads else None
        grad_w = torch.zeros_like(weight, dtype=per_token.dtype) if want_grads else None
        w = weight.to(compute_dtype)
        for lo, hc, tc, loss, dlogits in LinearCrossEntropy._chunks(h, w, targets, want_grads):
            per_token[lo:lo + hc.size(0)] = loss
            if want_grads:
                grad_h[lo:lo + hc.size(0)] = dlogits @ w
                grad_w += dlogits.t() @ hc
        ctx.compute_dtype = compute_dtype
        ctx.save_for_backward(h, weight, targets, grad_h, grad_w)
        return per_token

    @staticmethod
    def backward(ctx, grad_out):
        h, weight, targets, grad_h, grad_w = ctx.saved_tensors
        if grad_out.stride(0) == 0:  # the gradient of a sum, expanded: one factor for every token, and
            scale = grad_out[0]  # used on the device, with no read on the host (a NaN makes all NaN)
            return (grad_h * scale).to(h.dtype), (grad_w * scale).to(weight.dtype), None, None, None
        counted = targets != IGNORE
        low = torch.where(counted, grad_out, torch.inf).min()
        if bool(low == torch.where(counted, grad_out, -torch.inf).max()):  # training: one factor for every counted token
            return (grad_h * low).to(h.dtype), (grad_w * low).to(weight.dtype), None, None, None
        gh, gw = torch.empty_like(h), torch.zeros_like(weight, dtype=grad_w.dtype)
        grad_out = torch.where(counted, grad_out, 0.0)  # an ignored token passes on nothing, NaN included
        w = weight.to(ctx.compute_dtype)
        for lo, hc, _, _, dlogits in LinearCrossEntropy._chunks(h, w, targets, True):
            dlogits = dlogits * grad_out[lo:lo + hc.size(0), None].to(dlogits.dtype)
            gh[lo:lo + hc.size(0)] = dlogits @ w
            gw += dlogits.t() @ hc
        return gh, gw.to(weight.dtype), None, None, None

    @staticmethod
    def _chunks(h, w, targets, want_grads):
        """(offset, h chunk, targets chunk, per-token loss, d loss / d logits or None) per chunk, with
        the matmuls in w's dtype."""
        step = _loss_chunk_tokens(w.size(0))
        kernel = _cuda_kernel(_loss_and_dlogits if want_grads else _loss_only, h.device)
        for lo in range(0, h.size(0), step):
            hc, tc = h[lo:lo + step].to(w.dtype), targets[lo:lo + step]
            loss, dlogits = kernel(hc @ w.t(), tc)
            yield lo, hc, tc, loss, dlogits


def _loss_only(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, None]:
    """Per-token cross-entropy in at least fp32, 0 where the target is IGNORE."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    picked = targets.clamp(min=0)[:, None]
    loss = torch.logsumexp(wide, dim=-1) - wide.gather(1, picked).squeeze(1)
    return torch.where(targets != IGNORE, loss, 0.0), None


def _loss_and_dlogits(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and d loss / d logits = softmax - onehot (0 on IGNORE rows), in the logits' dtype.
    Written out of place so that on CUDA it compiles to a reduction and one pointwise pass over the
    logits; in eager it was most of a 124M GPT's step at 4K (each op a full pass over fp32 logits)."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    counted = targets != IGNORE
    picked = targets.clamp(min=0)[:, None]
    lse = torch.logsumexp(wide, dim=-1)
    loss = torch.where(counted, lse - wide.gather(1, picked).squeeze(1), 0.0)
    onehot = torch.arange(wide.size(1), device=wide.device)[None, :] == picked
    dlogits = torch.where(counted[:, None], torch.exp(wide - lse[:, None]) - onehot.to(wide.dtype), 0.0)
    return loss, dlogits.to(logits.dtype)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token loss (0 where the target is IGNORE) of logits h @ weight.T; matmuls in the autocast
    dtype when autocast is on."""
    dtype = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
    want_grads = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    with torch.autocast(h.device.type, enabled=False):
        return LinearCrossEntropy.apply(h, weight, targets, dtype, want_grads)


# ---- the network ---------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | BlockMask | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(mask, BlockMask):
            y = _flex_kernel(x.device)(q, k, v, block_mask=mask)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=self.dropout if self.training else 0.0
            )
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.up = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.down = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.ln1(x), cos, sin, mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """`attention`, `checkpoint_activations` (recompute each block in backward instead of keeping
    its activations) and `flex_block_size` change how, not what, the model computes, so they are
    not part of GPTConfig and a checkpoint resumes under any of them."""

    def __init__(self, cfg: GPTConfig, attention: AttentionBackend = "sdpa", checkpoint_activations: bool = False,
                 flex_block_size: int = FLEX_BLOCK_SIZE):
        super().__init__()
        if cfg.n_embd % cfg.n_head or (cfg.n_embd // cfg.n_head) % 2:
            raise ValueError(f"n_embd {cfg.n_embd} must split into {cfg.n_head} heads of even size (RoPE rotates pairs)")
        self.cfg = cfg
        if attention not in ("sdpa", "flex"):
            raise ValueError(f"attention {attention!r}: sdpa or flex (resolve_attention turns training.attention into one)")
        if attention == "flex" and cfg.dropout > 0.0:
            raise ValueError(f"flex attention has no attention dropout (dropout {cfg.dropout}); use sdpa")
        self.attention = attention
        self.checkpoint_activations = checkpoint_activations
        self.flex_block_size = flex_block_size
        self.rope_scaling: RopeScaling | None = None
        self._rope_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (GPT-2)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("down.weight"):  # GPT-2's scaled residual init
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def set_rope_scaling(self, scaling: RopeScaling | None) -> None:
        """RoPE as trained (None) or YaRN-scaled from the next forward on."""
        self.rope_scaling = scaling

    def compile_blocks(self) -> None:
        """torch.compile each block in place (torchtitan's per-block compile): the state_dict keeps
        its keys, and the mask is built outside the compiled graphs."""
        for block in self.blocks:
            block.compile()

    def _rope(self, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (T, str(device), self.rope_scaling)
        if key not in self._rope_cache:
            self._rope_cache = {key: rope_tables(T, self.cfg.n_embd // self.cfg.n_head, self.cfg.rope_base, device,
                                                 self.rope_scaling)}
        return self._rope_cache[key]

    def _mask(self, doc_ids: torch.Tensor | None, B: int, T: int, device: torch.device):
        if self.attention == "flex":
            if doc_ids is None:
                doc_ids = torch.zeros(B, T, dtype=torch.int32, device=device)
            return document_block_mask(doc_ids, self.flex_block_size)
        return None if doc_ids is None else dense_document_mask(doc_ids)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, doc_ids: torch.Tensor | None = None,
                reduction: str = "mean"):
        B, T = idx.shape
        cos, sin = self._rope(T, idx.device)
        mask = self._mask(doc_ids, B, T, idx.device)
        x = self.drop(self.wte(idx))
        recompute = self.checkpoint_activations and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, cos, sin, mask, use_reentrant=False) if recompute else block(x, cos, sin, mask)
        h = self.ln_f(x)
        if targets is None:
            return self.lm_head(h), None
        per_token = linear_cross_entropy(h.reshape(B * T, -1), self.lm_head.weight, targets.reshape(-1))
        if reduction == "none":
            return None, per_token.view(B, T)
        return None, per_token.sum() / (targets != IGNORE).sum().clamp(min=1)

    def configure_optimizer(self, lr: float, weight_decay: float, betas=(0.9, 0.95)) -> torch.optim.AdamW:
        """AdamW decaying only tensors of 2+ dimensions (matrices, embeddings), not norms or biases."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        fused = all(p.is_cuda for p in params)  # one kernel for the whole update instead of a few per tensor
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)
