"""A small GPT with rotary position embeddings, in one file (nanoGPT's shape).

`forward(idx, targets=None, doc_ids=None)` returns `(logits, loss)`. With `doc_ids`, attention is
causal *within* each packed document only (a block-diagonal causal mask for SDPA). Positions stay
continuous across packed documents (seed 003: RoPE is not reset at boundaries). Targets equal to
-100 are ignored. `reduction="none"` returns the per-token loss, which the trainer splits by bucket.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE = -100


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


def rope_tables(seq_len: int, head_dim: int, base: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
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
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_embd % cfg.n_head or (cfg.n_embd // cfg.n_head) % 2:
            raise ValueError(f"n_embd {cfg.n_embd} must split into {cfg.n_head} heads of even size (RoPE rotates pairs)")
        self.cfg = cfg
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

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, doc_ids: torch.Tensor | None = None,
                reduction: str = "mean"):
        B, T = idx.shape
        cos, sin = rope_tables(T, self.cfg.n_embd // self.cfg.n_head, self.cfg.rope_base, idx.device)
        mask = None
        if doc_ids is not None:
            causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
            mask = ((doc_ids[:, :, None] == doc_ids[:, None, :]) & causal)[:, None]
        x = self.drop(self.wte(idx))
        for block in self.blocks:
            x = block(x, cos, sin, mask)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE,
                               reduction=reduction)
        return logits, loss.view(B, T) if reduction == "none" else loss

    def configure_optimizer(self, lr: float, weight_decay: float, betas=(0.9, 0.95)) -> torch.optim.AdamW:
        """AdamW decaying only tensors of 2+ dimensions (matrices, embeddings), not norms or biases."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)
