"""A small GPT with rotary position embeddings (nanoGPT's shape): the config, the blocks, the model
and its optimizer.

`forward(idx, targets=None, doc_ids=None)` returns `(logits, None)` without targets and `(None, loss)`
with them: the loss is computed chunk by chunk from the last hidden state (training/loss.py), so
the B x T x vocab logits never exist in training. With `doc_ids`, attention is causal *within* each
packed document only (training/attention.py: sdpa with a dense mask, or flex with a block mask).
Positions stay continuous across packed documents (training/rope.py; `set_rope_scaling` switches
RoPE to YaRN when a phase extends the context). Targets equal to -100 are ignored.
`reduction="none"` returns the per-token loss, which the trainer splits by bucket.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask
from torch.utils.checkpoint import checkpoint

from training.attention import FLEX_BLOCK_SIZE, AttentionBackend, attend, dense_document_mask, document_block_mask
from training.loss import IGNORE, linear_cross_entropy
from training.rope import RopeScaling, apply_rope, rope_tables


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
        y = attend(q, k, v, mask, self.dropout if self.training else 0.0)
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

    def attention_mask(self, doc_ids: torch.Tensor | None, B: int, T: int,
                       device: torch.device) -> torch.Tensor | BlockMask | None:
        """What `forward` attends with for these doc ids (a BlockMask, a dense mask or None). The
        trainer builds the next step's ahead, while the device still runs this one's backward: on
        CUDA its dozens of small kernels would otherwise start a step with the device waiting."""
        if self.attention == "flex":
            if doc_ids is None:
                doc_ids = torch.zeros(B, T, dtype=torch.int32, device=device)
            return document_block_mask(doc_ids, self.flex_block_size)
        return None if doc_ids is None else dense_document_mask(doc_ids)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, doc_ids: torch.Tensor | None = None,
                reduction: str = "mean", mask: torch.Tensor | BlockMask | None = None):
        """`mask`: `attention_mask(doc_ids, ...)` built ahead; None builds it here from `doc_ids`."""
        B, T = idx.shape
        cos, sin = self._rope(T, idx.device)
        if mask is None:
            mask = self.attention_mask(doc_ids, B, T, idx.device)
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
