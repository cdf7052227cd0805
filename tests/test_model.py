"""The GPT: shapes, loss, document-masked attention, and which parameters AdamW decays."""

import pytest
import torch

from training.model import GPT, IGNORE, GPTConfig, apply_rope, rope_tables

torch.set_num_threads(1)


def tiny_model(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=16, **kw)).eval()


def test_forward_returns_logits_and_mean_loss_over_counted_targets():
    model = tiny_model()
    idx = torch.randint(0, 64, (2, 8))
    targets = torch.randint(0, 64, (2, 8))
    targets[:, -1] = IGNORE
    logits, loss = model(idx, targets=targets)
    assert logits.shape == (2, 8, 64)
    per_token = model(idx, targets=targets, reduction="none")[1]
    assert per_token.shape == (2, 8) and float(per_token[:, -1].detach().abs().sum()) == 0.0
    assert torch.allclose(loss, per_token.sum() / 14)
    assert model(idx)[1] is None


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
