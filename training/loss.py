"""The training loss: per-token cross-entropy of the LM head's logits, computed chunk by chunk from
the last hidden state (`LinearCrossEntropy`), so the B x T x vocab logits never exist in training.
Targets equal to IGNORE (-100) count for nothing.
"""

from __future__ import annotations

import functools

import torch

from training.kernels import cuda_kernel

IGNORE = -100


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
                _accumulate_mm(grad_w, dlogits.t(), hc)
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
            _accumulate_mm(gw, dlogits.t(), hc)
        return gh, gw.to(weight.dtype), None, None, None

    @staticmethod
    def _chunks(h, w, targets, want_grads):
        """(offset, h chunk, targets chunk, per-token loss, d loss / d logits or None) per chunk, with
        the matmuls in w's dtype."""
        step = _loss_chunk_tokens(w.size(0))
        if not want_grads:
            kernel = cuda_kernel(_loss_only, h.device)
        elif h.device.type == "cuda" or torch.compiler.is_compiling():
            kernel = cuda_kernel(_loss_and_dlogits, h.device)
        else:
            kernel = _loss_and_dlogits_in_place
        for lo in range(0, h.size(0), step):
            hc, tc = h[lo:lo + step].to(w.dtype), targets[lo:lo + step]
            loss, dlogits = kernel(hc @ w.t(), tc)
            yield lo, hc, tc, loss, dlogits


def _accumulate_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, with acc in fp32 and a, b possibly bf16. On CUDA one GEMM that adds into acc
    (`addmm` with out_dtype, torch >= 2.8): the fp32 product of a 50K-vocabulary LM head is never
    written and read back, and never rounded to bf16 before the add. Elsewhere (CPU: unchanged), or
    where that path is missing or wrong, the product then an add."""
    if acc.is_cuda and a.dtype != acc.dtype and _fused_accumulate_ok(acc.device, a.dtype):
        torch.addmm(acc, a, b, acc.dtype, out=acc)
    else:
        acc += a @ b


@functools.cache
def _fused_accumulate_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `addmm(acc, a, b, out_dtype, out=acc)` exists here and adds in place correctly: checked
    once per process and device on a small product against the product-then-add."""
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a, b = (torch.randn(s, generator=gen).to(device, dtype) for s in ((64, 96), (64, 80)))
        a = a.t()  # transposed, as the loss passes it
        acc = torch.randn(96, 80, generator=gen).to(device)
        want = acc + (a @ b).float()
        torch.addmm(acc, a, b, torch.float32, out=acc)
        return bool(torch.allclose(acc, want, rtol=1e-2, atol=1e-2))
    except (RuntimeError, TypeError, NotImplementedError):
        return False


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


def _loss_and_dlogits_in_place(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_loss_and_dlogits`, bit for bit, for eager CPU: the softmax written once and corrected in
    place (minus one at each target, zero on IGNORE rows) instead of a one-hot matrix and two more
    passes over the logits: half the time of the out-of-place form, which the CPU tests spend most of
    a training step in."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    counted = targets != IGNORE
    picked = targets.clamp(min=0)
    lse = torch.logsumexp(wide, dim=-1)
    loss = torch.where(counted, lse - wide.gather(1, picked[:, None]).squeeze(1), 0.0)
    dlogits = torch.exp(wide - lse[:, None])
    dlogits[torch.arange(dlogits.size(0), device=dlogits.device), picked] -= 1.0
    dlogits[~counted] = 0.0
    return loss, dlogits.to(logits.dtype)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token loss (0 where the target is IGNORE) of logits h @ weight.T; matmuls in the autocast
    dtype when autocast is on."""
    dtype = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
    want_grads = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    with torch.autocast(h.device.type, enabled=False):
        return LinearCrossEntropy.apply(h, weight, targets, dtype, want_grads)
