"""The anneal playbook's validation loss (seed 000): per-bucket loss on held-out entries (chosen in
training/heldout.py), every `training.eval_every_tokens` trained tokens, with the history per phase
that the rule halting a run on a rising validation loss reads (`training.halt.HaltPolicy`).

`Evaluator` runs the evaluations (on rows of the phase's length, which `training.data` packs) and
keeps their history; its state travels in the checkpoint's
train state with the held-out entries' fingerprints, so a resumed run evaluates at the same steps
and refuses held-out entries that changed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from training.checkpoint import ResumeRefused
from training.heldout import heldout_fingerprints
from training.loss import IGNORE

if TYPE_CHECKING:
    from training.data import CurriculumData
    from training.distributed import Distributed
    from training.model import GPT


class Evaluator:
    """Validation loss per bucket every `every_tokens` trained tokens (none when 0), with the history
    per phase the halt rule reads."""

    def __init__(self, data: "CurriculumData", model: "GPT", dist: "Distributed", micro_batch_size: int,
                 every_tokens: int):
        self.data, self.model, self.dist = data, model, dist
        self.micro_batch_size, self.every_tokens = micro_batch_size, every_tokens
        self.val_history: dict[str, dict[str, list[float]]] = {}  # phase -> bucket -> validation losses, in order
        self.val_last: dict[str, Any] = {}  # the latest evaluation: step and loss per bucket

    def after_step(self, step: int, tokens: int, phase_index: int, record: dict[str, Any]) -> str | None:
        """When the step of phase `phase_index` that brought the run to `tokens` crossed a multiple of
        every_tokens: per-bucket validation loss into `record` (`val_loss/<bucket>`) and the phase's
        history; returns the phase's name then, else None."""
        every = self.every_tokens
        if not every or tokens // every == (tokens - self.data.schedule.step_tokens(phase_index)) // every:
            return None
        phase = self.data.schedule.phase_names[phase_index]
        t0 = time.perf_counter()
        losses = self.losses(phase_index)
        for name, loss in losses.items():
            record[f"val_loss/{name}"] = loss
            self.val_history.setdefault(phase, {}).setdefault(name, []).append(loss)
        record["time/eval_s"] = time.perf_counter() - t0
        self.val_last = {"step": step, "phase": phase, "loss": losses}
        return phase

    def losses(self, phase: int) -> dict[str, float]:
        """Mean loss per bucket over its held-out entries packed into rows of phase `phase`'s length,
        with the current weights (no gradient, no RNG use, so training is unchanged by evaluating)."""
        device = self.dist.device
        names = [n for n in self.data.bucket_names if self.data.heldout.get(n) is not None and self.data.heldout[n].size]
        sums = torch.zeros(2, len(names), device=device, dtype=torch.float64)
        mb = self.micro_batch_size
        self.model.eval()
        with torch.no_grad():
            for i, name in enumerate(names):
                rows = self.data.eval_rows(name, phase)
                for lo in range(0, len(rows.tokens), mb):
                    tokens = torch.from_numpy(rows.tokens[lo:lo + mb]).to(device)
                    mask = torch.from_numpy(rows.target_mask[lo:lo + mb]).to(device)
                    targets = torch.full_like(tokens, IGNORE)
                    targets[:, :-1] = tokens[:, 1:]
                    targets[~mask] = IGNORE
                    doc_ids = torch.from_numpy(rows.doc_ids[lo:lo + mb]).to(device)
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                        _, per_token = self.model(tokens, targets=targets, doc_ids=doc_ids, reduction="none")
                    sums[0, i] += per_token.double().sum()
                    sums[1, i] += mask.sum()
        self.model.train()
        self.dist.all_reduce(sums)  # the ranks hold the same weights; summing keeps their verdicts identical
        return {name: float(sums[0, i] / sums[1, i]) for i, name in enumerate(names) if sums[1, i] > 0}

    def state_dict(self) -> dict[str, Any]:
        return {"val_history": self.val_history, "val_last": self.val_last,
                "heldout": heldout_fingerprints(self.data.heldout)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        now = heldout_fingerprints(self.data.heldout)
        saved = state.get("heldout") or dict.fromkeys(now, "")  # a checkpoint from before held-out entries
        changed = sorted(b for b in saved.keys() & now.keys() if saved[b] != now[b])
        if changed:
            raise ResumeRefused(
                f"the held-out validation entries of bucket(s) {changed} differ from the checkpoint's "
                "(training.eval_entries_per_bucket or the seed changed), so the entry sets the sampler's cursors point "
                "into differ too; restore training.eval_entries_per_bucket or start a new run_dir"
            )
        self.val_history, self.val_last = state.get("val_history", {}), state.get("val_last", {})
