"""The step where seq_len changes: YaRN frequencies against hand-computed values, the per-phase RoPE
scaling switching at exactly that step (also across a resume), and Adam's length-jump treatments."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from refinery.config import ConfigError, load_config
from training.length_jump import attention_parameters, renorm_second_moments, reset_adam_state
from training.model import GPT, GPTConfig
from training.rope import RopeScaling, rope_tables, yarn_frequencies
from training.schedule import phase_rope_scalings
from synthetic.curriculum import SyntheticPhase, tiny_run
from training.trainer import RunOptions, Trainer

torch.set_num_threads(1)


# ---- YaRN ------------------------------------------------------------------------------------------


def test_yarn_frequencies_equal_hand_computed_values():
    """head_dim 64, base 10^4, 1024 -> 4096. The ramp runs from pair floor(64 ln(1024 / (32 * 2pi)) /
    (2 ln 10^4)) = floor(5.656) = 5 to pair ceil(64 ln(1024 / 2pi) / (2 ln 10^4)) = ceil(17.697) = 18;
    pairs up to 5 keep 10^4^(-2i/64), pairs from 18 on are divided by 4, pair i between blends with
    weight (i - 5) / 13 on the divided one; mscale = 1 + 0.1 ln 4."""
    inv_freq, mscale = yarn_frequencies(64, 10_000.0, RopeScaling(4.0, 1024))
    assert inv_freq.shape == (32,)
    expected = {0: 1.0, 4: 0.31622776601683794, 5: 0.23713737056616552, 6: 0.1675686367152062,
                10: 0.04001274813854407, 18: 0.0014058533129758727, 31: 3.33380358040831e-05}
    for pair, value in expected.items():
        assert float(inv_freq[pair]) == pytest.approx(value, rel=1e-12), pair
    assert mscale == pytest.approx(1.138629436111989, rel=1e-12)


def test_yarn_tables_carry_the_temperature_and_factor_one_is_plain_rope():
    plain_cos, plain_sin = rope_tables(16, 8, 10_000.0, torch.device("cpu"))
    cos, sin = rope_tables(16, 8, 10_000.0, torch.device("cpu"), RopeScaling(1.0, 8))
    assert torch.allclose(cos, plain_cos) and torch.allclose(sin, plain_sin)
    cos, _ = rope_tables(16, 8, 10_000.0, torch.device("cpu"), RopeScaling(2.0, 8))
    assert float(cos[0, 0]) == pytest.approx(1 + 0.1 * math.log(2))  # position 0: cos 1 times mscale
    with pytest.raises(ValueError, match=">= 1"):
        RopeScaling(0.5, 8)


def test_phase_scalings_inherit_scale_from_the_native_length_and_switch_off():
    explicit = SimpleNamespace(factor=3.0, original_seq_len=100, beta_fast=16.0, beta_slow=2.0)
    got = phase_rope_scalings([1024, 1024, 4096, 32768, 32768, 2048, 8192],
                              [None, None, "auto", "auto", None, "none", explicit])
    assert got == [None, None, RopeScaling(4.0, 1024), RopeScaling(32.0, 1024), RopeScaling(32.0, 1024), None,
                   RopeScaling(3.0, 100, 16.0, 2.0)]
    assert phase_rope_scalings([64, 32], [None, "auto"]) == [None, None]  # shorter: plain RoPE fits
    with pytest.raises(ValueError, match="first phase"):
        phase_rope_scalings([64], ["auto"])


# ---- the trainer: the scale and the Adam treatment change at the boundary step ----------------------

TWO_PHASES = [
    SyntheticPhase("short", 1024, {"web": 0.7, "math": 0.3}, seq_len=32),
    SyntheticPhase("long", 1024, {"web": 0.7, "math": 0.3}, seq_len=64, rope_scaling="auto"),
]


def train_recording(config, adam: dict, **options):
    """Trains; returns {step index: (rope scaling seen by each forward, attention and MLP Adam step counts)}."""
    seen: dict[int, tuple] = {}
    forwards: list = []

    def sink(m):
        counts = tuple(int(trainer.optimizer.state[p]["step"]) for p in watched)
        seen[m["step"] - 1] = (tuple(forwards), counts)
        forwards.clear()

    trainer = Trainer(load_config(config), RunOptions(sinks=[sink], **options))
    watched = (trainer.model.blocks[0].attn.qkv.weight, trainer.model.blocks[0].mlp.up.weight)
    trainer.model.register_forward_pre_hook(lambda mod, args: forwards.append(mod.rope_scaling))
    status = trainer.train()
    return trainer, status, seen


@pytest.mark.parametrize("adam", ["none", "reset"])
def test_rope_scale_and_adam_reset_change_exactly_at_the_boundary_step(tmp_path, adam):
    config = tiny_run(tmp_path, training={"length_jump_adam": adam}, phases=TWO_PHASES)
    trainer, status, seen = train_recording(config, adam)
    assert status["finished"]
    b, total = trainer.schedule.phase_starts[1], trainer.schedule.total_steps
    assert 0 < b < total and trainer.schedule.seq_len_at(b) == 64 and trainer.schedule.seq_len_at(b - 1) == 32
    yarn = RopeScaling(2.0, 32)
    assert [seen[s][0] for s in range(total)] == [(None, None)] * b + [(yarn, yarn)] * (total - b)
    for s in range(total):
        attn_steps, mlp_steps = seen[s][1]
        assert mlp_steps == s + 1
        assert attn_steps == (s + 1 if adam == "none" or s < b else s - b + 1), s


def test_adam_reset_happens_once_across_a_resume_at_the_boundary(tmp_path):
    config = tiny_run(tmp_path, training={"length_jump_adam": "reset"}, phases=TWO_PHASES)
    _, status, _ = train_recording(config, "reset", stop_after_phase="short")
    assert status["state"] == "completed" and not status.get("finished")
    trainer, status, seen = train_recording(config, "reset")
    b, total = trainer.schedule.phase_starts[1], trainer.schedule.total_steps
    assert status["finished"] and sorted(seen) == list(range(b, total))
    assert [seen[s] for s in (b, total - 1)] == [((RopeScaling(2.0, 32),) * 2, (1, b + 1)),
                                                 ((RopeScaling(2.0, 32),) * 2, (total - b, total))]


def test_default_adds_no_optimizer_hook(tmp_path):
    trainer = Trainer(load_config(tiny_run(tmp_path, phases=TWO_PHASES)))
    assert trainer.cfg.training.length_jump_adam == "none" and not trainer.optimizer._optimizer_step_pre_hooks


# ---- the Adam treatments on their own -----------------------------------------------------------------


def stepped_optimizer(steps=3):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=2, n_embd=8))
    opt = model.configure_optimizer(lr=1e-2, weight_decay=0.1)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    return model, opt


def test_reset_clears_attention_moments_and_step_and_nothing_else():
    model, opt = stepped_optimizer()
    before = {p: copy.deepcopy(opt.state[p]) for p in model.parameters()}
    attention = attention_parameters(model)
    assert {id(p) for p in attention} == {id(model.blocks[0].attn.qkv.weight), id(model.blocks[0].attn.proj.weight)}
    reset_adam_state(opt, attention)
    for p in model.parameters():
        old, new = before[p], opt.state[p]
        if any(p is a for a in attention):
            assert float(new["step"]) == 0 and not new["exp_avg"].any() and not new["exp_avg_sq"].any()
        else:
            assert all(torch.equal(old[k], new[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_renorm_rescales_each_second_moment_to_the_new_gradients_mean_square():
    model, opt = stepped_optimizer()
    for p in model.parameters():
        p.grad = 5.0 * torch.randn_like(p)  # the new length's gradients, on another scale
    before = {p: opt.state[p]["exp_avg_sq"].clone() for p in model.parameters()}
    first = {p: opt.state[p]["exp_avg"].clone() for p in model.parameters()}
    renorm_second_moments(opt)
    for p in model.parameters():
        v_hat_mean = float(before[p].mean()) / (1 - 0.95**3)
        expected = before[p] * float(p.grad.pow(2).mean()) / v_hat_mean
        assert torch.allclose(opt.state[p]["exp_avg_sq"], expected, rtol=1e-5)
        assert float(opt.state[p]["exp_avg_sq"].mean()) / (1 - 0.95**3) == pytest.approx(float(p.grad.pow(2).mean()), rel=1e-5)
        assert torch.equal(opt.state[p]["exp_avg"], first[p]) and int(opt.state[p]["step"]) == 3


def test_renorm_hook_acts_once_in_the_optimizer_step_of_the_first_longer_step(tmp_path):
    trainer = Trainer(load_config(tiny_run(tmp_path, training={"length_jump_adam": "renorm"}, phases=TWO_PHASES)))
    model, opt, jump = trainer.model, trainer.optimizer, trainer.length_jump
    b = trainer.schedule.phase_starts[1]
    torch.manual_seed(1)

    def step_with_new_grads(step):
        jump.enter(step)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * (1.0 if step < b else 4.0)
        before = {p: opt.state[p]["exp_avg_sq"].clone() for p in model.parameters() if p in opt.state}
        opt.step()
        return before

    for s in range(3):
        step_with_new_grads(s)
    for s in (b, b + 1):
        before = step_with_new_grads(s)
        for p in model.parameters():
            g2 = p.grad.pow(2)
            v = before[p] * float(g2.mean()) / (float(before[p].mean()) / (1 - 0.95**3)) if s == b else before[p]
            assert torch.allclose(opt.state[p]["exp_avg_sq"], 0.95 * v + 0.05 * g2, rtol=1e-5), (s, p.shape)
    assert model.rope_scaling == RopeScaling(2.0, 32)


def test_config_takes_an_explicit_yarn_and_names_a_bad_one(tmp_path):
    explicit = {"type": "yarn", "factor": 4.0, "original_seq_len": 16}
    phases = [TWO_PHASES[0], SyntheticPhase("long", 1024, {"web": 0.7, "math": 0.3}, seq_len=64, rope_scaling=explicit)]
    trainer = Trainer(load_config(tiny_run(tmp_path / "ok", phases=phases)))
    assert trainer.length_jump.scalings == [None, RopeScaling(4.0, 16)]
    phases[1] = SyntheticPhase("long", 1024, {"web": 0.7, "math": 0.3}, seq_len=64, rope_scaling={**explicit, "type": "ntk"})
    with pytest.raises(ConfigError, match=r"curriculum.phases\[1\].rope_scaling"):
        load_config(tiny_run(tmp_path / "bad", phases=phases))
