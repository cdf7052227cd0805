"""The GPT: shapes, loss, document-masked attention (sdpa and flex), checkpointing, compile, and which
parameters AdamW decays."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import training.loss as loss_module
from training.attention import _flex_kernel, dense_document_mask, document_block_mask, resolve_attention
from training.loss import IGNORE, linear_cross_entropy
from training.model import GPT, GPTConfig
from training.rope import apply_rope, rope_tables

torch.set_num_threads(1)


def tiny_model(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=16), **kw).eval()


def test_forward_returns_logits_without_targets_and_mean_loss_over_counted_targets_with_them():
    model = tiny_model()
    idx = torch.randint(0, 64, (2, 8))
    targets = torch.randint(0, 64, (2, 8))
    targets[:, -1] = IGNORE
    logits, none = model(idx)
    assert logits.shape == (2, 8, 64) and none is None
    no_logits, loss = model(idx, targets=targets)
    assert no_logits is None
    per_token = model(idx, targets=targets, reduction="none")[1]
    assert per_token.shape == (2, 8) and float(per_token[:, -1].detach().abs().sum()) == 0.0
    assert torch.allclose(loss, per_token.sum() / 14)
    reference = F.cross_entropy(logits.view(-1, 64), targets.view(-1), ignore_index=IGNORE, reduction="none")
    assert torch.allclose(per_token.view(-1), reference, atol=1e-6)


@pytest.mark.parametrize("upstream", ["uniform", "per_token", "nan"])
def test_chunked_linear_cross_entropy_matches_the_full_logits_loss_and_gradients(monkeypatch, upstream):
    """Chunks of 7 tokens over 30 (the last one short), three ignored targets; the uniform upstream
    gradient takes the gradients made in forward, any other recomputes them."""
    monkeypatch.setattr(loss_module, "_loss_chunk_tokens", lambda vocab: 7)
    torch.manual_seed(0)
    h = torch.randn(30, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (30,))
    targets[[3, 10, 11]] = IGNORE
    grad_out = {"uniform": torch.full((30,), 0.25, dtype=torch.float64), "per_token": torch.rand(30, dtype=torch.float64),
                "nan": torch.full((30,), float("nan"), dtype=torch.float64)}[upstream]
    reference = F.cross_entropy(h @ w.t(), targets, ignore_index=IGNORE, reduction="none")
    got = linear_cross_entropy(h, w, targets)
    assert torch.allclose(got, reference) and float(got[3]) == 0.0
    want = torch.autograd.grad(reference, (h, w), grad_out)
    have = torch.autograd.grad(got, (h, w), grad_out)
    for a, b in zip(want, have):
        assert torch.allclose(a, b, equal_nan=True)
    assert bool(torch.isnan(have[1]).any()) == (upstream == "nan")
    with torch.no_grad():
        assert not linear_cross_entropy(h, w, targets).requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_in_place_loss_kernel_is_bit_identical_to_the_out_of_place_one(dtype):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(37, 53, generator=gen) * 4).to(dtype)
    targets = torch.randint(0, 53, (37,), generator=gen)
    targets[::5] = IGNORE
    for want, got in zip(loss_module._loss_and_dlogits(logits, targets),
                         loss_module._loss_and_dlogits_in_place(logits, targets)):
        assert want.dtype == got.dtype and torch.equal(want, got)


def test_the_gradient_of_a_summed_loss_takes_the_forward_gradients_without_a_host_read(monkeypatch):
    """What the trainer backpropagates, sum / n: autograd hands the loss an expanded scalar, which
    scales the gradients made in forward on the device (no recompute, no `bool()` of a tensor)."""
    monkeypatch.setattr(loss_module, "_loss_chunk_tokens", lambda vocab: 7)
    passes = []
    chunks = loss_module.LinearCrossEntropy._chunks
    monkeypatch.setattr(loss_module.LinearCrossEntropy, "_chunks",
                        staticmethod(lambda *a: (passes.append(a[3]), chunks(*a))[1]))
    torch.manual_seed(0)
    h = torch.randn(30, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (30,))
    targets[[3, 10, 11]] = IGNORE
    reference = F.cross_entropy(h @ w.t(), targets, ignore_index=IGNORE, reduction="sum") / 27 * 2
    want = torch.autograd.grad(reference, (h, w))
    got = linear_cross_entropy(h, w, targets).view(5, 6)
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: pytest.fail("the backward read a tensor on the host"))
    have = torch.autograd.grad(got.sum() / 27 * 2, (h, w))
    monkeypatch.undo()
    for a, b in zip(want, have):
        assert torch.allclose(a, b)
    assert passes == [True], "one pass over the chunks, in forward"


def test_attention_stays_inside_each_packed_document():
    model = tiny_model()
    idx = torch.randint(1, 64, (1, 10))
    doc_ids = torch.tensor([[0] * 4 + [1] * 6])
    base = model(idx, doc_ids=doc_ids)[0]
    changed = idx.clone()
    changed[0, :4] = (changed[0, :4] + 7) % 64  # rewrite document 0 only
    after = model(changed, doc_ids=doc_ids)[0]
    assert torch.allclose(base[0, 4:], after[0, 4:], atol=1e-6), "document 1 must not see document 0"
    unmasked = model(changed)[0]
    assert not torch.allclose(base[0, 4:], unmasked[0, 4:], atol=1e-6)


def test_rope_scores_depend_on_relative_position_and_any_length_runs():
    torch.manual_seed(1)
    q, k = torch.randn(8), torch.randn(8)
    cos, sin = rope_tables(40, 8, 10_000.0, torch.device("cpu"))

    def score(m, n):
        return float(apply_rope(q, cos[m], sin[m]) @ apply_rope(k, cos[n], sin[n]))

    assert score(7, 3) == pytest.approx(score(30, 26), abs=1e-5)
    assert score(7, 3) != pytest.approx(score(7, 6), abs=1e-3)
    logits = tiny_model()(torch.randint(0, 64, (1, 300)))[0]
    assert logits.shape == (1, 300, 64) and torch.isfinite(logits).all()


def test_weight_decay_only_on_matrices():
    model = tiny_model()
    opt = model.configure_optimizer(lr=1e-3, weight_decay=0.1)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_heads_must_split_the_width_into_even_halves():
    with pytest.raises(ValueError, match="heads of even size"):
        GPT(GPTConfig(vocab_size=8, n_head=3, n_embd=16))


# ---- document masks: the flex block mask against the dense reference -----------------------------

LAYOUTS = {
    "one document": lambda T: [0] * T,
    "every token its own document": lambda T: list(range(T)),
    "documents spanning several blocks": lambda T: [0] * (T // 2 + 3) + [1] * (T - T // 2 - 3),
    "random runs": lambda T: sorted(torch.randint(0, 5, (T,), generator=torch.Generator().manual_seed(T)).tolist()),
}


@pytest.mark.parametrize("T,block", [(64, 8), (37, 8), (5, 8), (48, 16)])
def test_flex_block_mask_attends_exactly_like_the_dense_document_mask(T, block):
    doc_ids = torch.tensor([make(T) for make in LAYOUTS.values()])
    torch.manual_seed(T)
    q, k, v = (torch.randn(len(LAYOUTS), 2, T, 8) for _ in range(3))
    mask = document_block_mask(doc_ids, block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is unfused
        out = flex_attention(q, k, v, block_mask=mask)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_document_mask(doc_ids))
    assert torch.allclose(out, reference, atol=1e-5)
    # the same block classification as torch's own builder, which evaluates every (q, kv) pair
    padded = torch.nn.functional.pad(doc_ids, (0, -(-T // block) * block - T), value=-1)
    theirs = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (padded[b, qi] == padded[b, ki]), len(LAYOUTS), None,
                               T, T, device="cpu", BLOCK_SIZE=block)
    assert torch.equal(mask.kv_num_blocks, theirs.kv_num_blocks)
    assert torch.equal(mask.full_kv_num_blocks, theirs.full_kv_num_blocks)
    assert torch.equal(mask.to_dense(), theirs.to_dense())


def test_block_mask_skips_other_documents_blocks_and_marks_whole_document_blocks_full():
    doc_ids = torch.tensor([[0] * 16 + [1] * 16 + [2] * 8])  # blocks of 8: docs 0,0,1,1,2
    mask = document_block_mask(doc_ids, 8)
    assert mask.kv_num_blocks[0, 0].tolist() == [1, 1, 1, 1, 1]  # the diagonal blocks, causal inside
    assert mask.full_kv_num_blocks[0, 0].tolist() == [0, 1, 0, 1, 0]  # block 1 sees 0, block 3 sees 2, whole
    assert mask.full_kv_indices[0, 0, 3, 0] == 2


def test_flex_model_matches_sdpa_model_on_packed_rows():
    sdpa = tiny_model()
    flex = tiny_model(attention="flex", flex_block_size=8)
    idx = torch.randint(0, 64, (2, 29))
    doc_ids = torch.tensor([[0] * 29, [0] * 3 + [1] * 12 + [2] * 9 + [3] * 5])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        for ids in (doc_ids, None):
            assert torch.allclose(flex(idx, doc_ids=ids)[0], sdpa(idx, doc_ids=ids)[0], atol=1e-5)


def test_block_mask_refuses_doc_ids_that_go_back():
    with pytest.raises(ValueError, match="must not decrease"):
        document_block_mask(torch.tensor([[0, 0, 1, 0]]), 2)


def test_attention_choice_is_flex_on_cuda_and_sdpa_on_cpu():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_attention("auto", cuda) == "flex" and resolve_attention("auto", cpu) == "sdpa"
    assert resolve_attention("auto", cuda, dropout=0.1) == "sdpa"
    assert resolve_attention("sdpa", cuda) == "sdpa" and resolve_attention("flex", cuda) == "flex"
    with pytest.raises(ValueError, match="CUDA only"):
        resolve_attention("flex", cpu)
    with pytest.raises(ValueError, match="no attention dropout"):
        resolve_attention("flex", cuda, dropout=0.1)
    with pytest.raises(ValueError, match="one of auto, sdpa, flex"):
        resolve_attention("flash", cuda)


# ---- activation checkpointing and torch.compile: same numbers ------------------------------------


def loss_and_grads(model):
    torch.manual_seed(5)
    idx = torch.randint(0, 64, (2, 24))
    doc_ids = torch.tensor([[0] * 10 + [1] * 14, [0] * 24])
    model.train()
    loss = model(idx, targets=idx, doc_ids=doc_ids)[1]
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    loss, grads = loss_and_grads(tiny_model())
    model = tiny_model(checkpoint_activations=True)
    recomputed = []
    model.blocks[0].register_forward_pre_hook(lambda *a: recomputed.append(1))
    loss_ckpt, grads_ckpt = loss_and_grads(model)
    assert len(recomputed) == 2, "block 0 runs again in backward"
    assert torch.allclose(loss, loss_ckpt) and all(torch.allclose(a, b, atol=1e-7) for a, b in zip(grads, grads_ckpt))


def test_compiled_blocks_give_the_same_loss_gradients_and_state_dict_keys():
    loss, grads = loss_and_grads(tiny_model())
    model = tiny_model()
    keys = list(model.state_dict())
    model.compile_blocks()
    loss_c, grads_c = loss_and_grads(model)
    assert list(model.state_dict()) == keys
    assert torch.allclose(loss, loss_c, atol=1e-6) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, grads_c))


def test_compiled_flex_kernel_with_the_block_mask_matches_the_dense_reference():
    """The kernel CUDA runs: torch.compile'd flex_attention at the 128-token block, here on CPU (forward)."""
    T = 300  # three blocks, the last one partial
    doc_ids = torch.tensor([[0] * T, [0] * 40 + [1] * 150 + [2] * 110])
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 2, T, 16) for _ in range(3))
    out = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=document_block_mask(doc_ids))
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_document_mask(doc_ids))
    assert torch.allclose(out, reference, atol=1e-5)


def test_compiled_loss_kernel_matches_eager():
    """The loss kernel CUDA runs compiled, here compiled for CPU: loss and softmax - onehot."""
    torch.manual_seed(4)
    logits = torch.randn(40, 300, dtype=torch.bfloat16)
    targets = torch.randint(0, 300, (40,))
    targets[[0, 7]] = IGNORE
    loss, dlogits = loss_module._loss_and_dlogits(logits, targets)
    loss_c, dlogits_c = torch.compile(loss_module._loss_and_dlogits)(logits, targets)
    assert dlogits.dtype == torch.bfloat16 and float(dlogits[7].abs().sum()) == 0.0
    assert torch.allclose(loss, loss_c, atol=1e-4) and torch.allclose(dlogits.float(), dlogits_c.float(), atol=1e-2)
    assert torch.allclose(dlogits.float().sum(1)[1:7], torch.zeros(6), atol=2e-2)  # softmax - onehot sums to 0


def test_flex_kernel_is_compiled_once_on_cuda_and_left_to_an_enclosing_compile(monkeypatch):
    cuda = torch.device("cuda", 0)  # torch.compile is lazy: nothing runs on the device here
    assert _flex_kernel(torch.device("cpu")) is flex_attention
    compiled = _flex_kernel(cuda)
    assert compiled is not flex_attention and _flex_kernel(cuda) is compiled
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _flex_kernel(cuda) is flex_attention


def test_flex_block_mask_passes_through_compiled_blocks():
    """Dynamo traces each block with the BlockMask as an input (aot_eager: inductor's CPU flex template
    cannot lower a query that is a view, which the CUDA template can)."""
    sdpa = tiny_model()
    flex = tiny_model(attention="flex")
    for block in flex.blocks:
        block.compile(backend="aot_eager")
    idx = torch.randint(0, 64, (2, 200))
    doc_ids = torch.tensor([[0] * 200, [0] * 50 + [1] * 150])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        assert torch.allclose(flex(idx, doc_ids=doc_ids)[0], sdpa(idx, doc_ids=doc_ids)[0], atol=1e-5)


def test_the_trainer_hands_its_switches_to_the_model(tmp_path):
    from refinery.config import load_config
    from synthetic.curriculum import tiny_run
    from training.trainer import Trainer

    config = tiny_run(tmp_path, training={"compile": True, "activation_checkpointing": True, "attention": "sdpa"})
    model = Trainer(load_config(config)).model
    assert model.checkpoint_activations and model.attention == "sdpa"
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    with pytest.raises(ValueError, match="CUDA only"):
        Trainer(load_config(tiny_run(tmp_path / "flex", training={"attention": "flex"})))


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_an_attention_mask_built_ahead_gives_the_same_loss_as_doc_ids(attention):
    """The trainer builds each micro-batch's mask before its step (`attention_mask`, passed as `mask=`)."""
    model = tiny_model(attention=attention, flex_block_size=8)
    idx, targets = torch.randint(0, 64, (2, 24)), torch.randint(0, 64, (2, 24))
    doc_ids = torch.tensor([[0] * 10 + [1] * 14, [0] * 24])
    mask = model.attention_mask(doc_ids, 2, 24, idx.device)
    with warnings.catch_warnings(), torch.no_grad():  # flex has no backward on CPU
        warnings.simplefilter("ignore")  # eager flex warns that it is unfused
        _, built_here = model(idx, targets, doc_ids=doc_ids)
        _, built_ahead = model(idx, targets, mask=mask)
    assert torch.equal(built_here, built_ahead)


def test_the_loss_weight_gradient_accumulates_as_product_then_add_off_cuda():
    """The GEMM that adds into the fp32 accumulator is the CUDA path's; elsewhere the product, then the add."""
    acc = torch.randn(6, 5)
    a, b = torch.randn(4, 6).bfloat16().t(), torch.randn(4, 5).bfloat16()
    want = acc + a @ b
    loss_module._accumulate_mm(acc, a, b)
    assert torch.equal(acc, want)
