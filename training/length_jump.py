"""What changes at the step where the curriculum's seq_len changes (seed 000): the RoPE scaling of
the phase that starts there, and optionally Adam's state.

RoPE: each phase's `rope_scaling`, as its manifest pins it, resolves to a `RopeScaling` or None
(plain RoPE) in the step schedule (training/schedule.py: `phase_rope_scalings`); see
refinery/config/curriculum.py PhaseConfig for the spellings. Everything is a pure function of the
manifests and the step, so a resumed run sets the same scaling at the same step.

Adam (training.length_jump_adam), applied once, in the optimizer step of the first step at the new
length (after gradient clipping, before the update):
- "reset": the attention parameters' Adam state starts afresh: exp_avg_sq, and with it exp_avg and
  the step count. torch's AdamW bias-corrects both moments with one per-parameter step, so a zeroed
  exp_avg_sq under an old step count would make the next updates up to 1/sqrt(1 - beta2) times too
  large (4.5x at beta2 0.95), and a reset step count under an old exp_avg would inflate the momentum.
- "renorm": every parameter's exp_avg_sq is rescaled once so that its bias-corrected mean equals
  the mean square of the first gradient at the new length; the update then divides by the new
  gradients' scale instead of the old length's, and Adam's running average continues from there.
"""

from __future__ import annotations

from typing import Iterable

import torch

from training.model import GPT
from training.schedule import StepSchedule

LENGTH_JUMP_MODES = ("none", "reset", "renorm")


def attention_parameters(model: GPT) -> list[torch.nn.Parameter]:
    return [p for name, p in model.named_parameters() if ".attn." in name]


def reset_adam_state(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> None:
    for p in params:
        state = optimizer.state.get(p)
        if not state:
            continue
        state["exp_avg"].zero_()
        state["exp_avg_sq"].zero_()
        if torch.is_tensor(state["step"]):
            state["step"].zero_()
        else:
            state["step"] = 0.0


def renorm_second_moments(optimizer: torch.optim.Optimizer) -> None:
    """exp_avg_sq *= mean(grad^2) / mean(bias-corrected exp_avg_sq), per parameter tensor; tensors
    without a gradient, a state or a non-zero second moment are left as they are."""
    for group in optimizer.param_groups:
        beta2 = group["betas"][1]
        for p in group["params"]:
            state = optimizer.state.get(p)
            if p.grad is None or not state:
                continue
            v = state["exp_avg_sq"]
            step = state["step"].to(v.device, torch.float32) if torch.is_tensor(state["step"]) else state["step"]
            v_mean = v.float().mean() / (1.0 - beta2 ** step)
            g_mean = p.grad.float().pow(2).mean()
            ratio = torch.where((v_mean > 0) & (g_mean > 0), g_mean / v_mean.clamp(min=torch.finfo(torch.float32).tiny),
                                torch.ones_like(v_mean))
            v.mul_(ratio.to(v.dtype))


class LengthJump:
    """Called at the start of every step: sets the step's phase's RoPE scaling on the model, and at
    the first step of a new seq_len arms the Adam treatment, which an optimizer step pre-hook applies
    in the next optimizer step that runs (that step's, unless its loss was non-finite and skipped)."""

    def __init__(self, model: GPT, optimizer: torch.optim.Optimizer, schedule: StepSchedule, adam_mode: str = "none"):
        if adam_mode not in LENGTH_JUMP_MODES:
            raise ValueError(f"training.length_jump_adam {adam_mode!r}: one of {LENGTH_JUMP_MODES}")
        self.model, self.optimizer, self.schedule, self.adam_mode = model, optimizer, schedule, adam_mode
        self.scalings = schedule.rope_scalings()
        self.armed = False
        if adam_mode != "none":
            optimizer.register_step_pre_hook(self._before_optimizer_step)

    def enter(self, step: int) -> None:
        self.model.set_rope_scaling(self.scalings[self.schedule.phase_at(step)])
        if self.adam_mode != "none" and self.schedule.length_changes_at(step):
            self.armed = True

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        if not self.armed:
            return
        self.armed = False
        if self.adam_mode == "reset":
            reset_adam_state(optimizer, attention_parameters(self.model))
        else:
            renorm_second_moments(optimizer)
