"""Which shard token a training run fed at (step, row, position): the sampler continues from the
sampler state of the run's nearest checkpoint before that step (or from the start when there is
none), the same integer arithmetic the trainer ran, so no per-token log is needed.

`refinery lineage --run DIR --step S --row R --pos P [--rank K]` then follows that shard token to
its document, URL and funnel history through the lineage index (refinery/lineage.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import torch

from refinery.config import RefineryConfig
from refinery.storage import DataRoot
from refinery.layout import CHECKPOINTS_DIR
from training.checkpoint import SAMPLER, CheckpointManager
from training.data import CurriculumData
from training.metrics import JsonLines
from training.sampler import CurriculumSampler
from training.sampler_state import SamplerStateError


class TokenLookupError(ValueError):
    """The (run, step, row, position) does not name a token the run trained on; the message says why."""


def run_world_size(run_dir: str | Path, step: int) -> int:
    """The world size the run had at `step`, from its metrics; refuses a step the run never took."""
    records = {r["step"]: r for r in JsonLines(Path(run_dir) / "metrics.jsonl").read()}
    if not records and (phases := phase_folders(Path(run_dir))):
        # The training's folder (`training.run_dir`) rather than one phase's: say which phase took the step.
        ranges = ", ".join(f"{p.name} (steps {lo}..{hi})" for p, (lo, hi) in phases.items())
        took = next((p for p, (lo, hi) in phases.items() if lo <= step <= hi), None)
        hint = f"; step {step} is in {took.name}: --run {took}" if took else f"; none trained step {step}"
        raise TokenLookupError(f"{run_dir} holds a curriculum's runs, one folder per phase: {ranges}; pass the "
                               f"folder of the phase that trained the step{hint}")
    if step not in records:
        trained = f"steps {min(records)}..{max(records)}" if records else "no steps"
        raise TokenLookupError(f"{run_dir} has no step {step} in metrics.jsonl (it trained {trained})")
    return int(records[step].get("world_size", 1))


def phase_folders(folder: Path) -> dict[Path, tuple[int, int]]:
    """The phase run folders directly under `folder` that trained steps, with their first and last step."""
    out = {}
    for sub in [p for p in folder.iterdir() if (p / "metrics.jsonl").is_file()] if folder.is_dir() else []:
        steps = [r["step"] for r in JsonLines(sub / "metrics.jsonl").read()]
        if steps:
            out[sub] = (min(steps), max(steps))
    return dict(sorted(out.items(), key=lambda item: item[1]))  # in the order they trained


def resume_before(sampler: CurriculumSampler, run_dir: str | Path, step: int) -> int:
    """Load the sampler state of the run's newest intact checkpoint taken before step `step` (1-based)
    whose state fits this sampler; returns the step it resumes after (0: none fits)."""
    manager = CheckpointManager(Path(run_dir) / CHECKPOINTS_DIR, 1)
    for meta in reversed(manager.complete()):
        if meta["step"] >= step or manager.verify(meta["path"]) is not None:
            continue
        # Memory-mapped: only the sampler's few entries are read, never the weights.
        state = torch.load(meta["path"], map_location="cpu", weights_only=True, mmap=True).get(SAMPLER)
        try:
            if state is not None:
                sampler.load_state_dict(state, int(state.get("world_size", 1)))
                return sampler.step
        except SamplerStateError:
            continue  # another trainer version or manifests: an older checkpoint, else the start
    return 0


def locate_token(cfg: RefineryConfig, root: DataRoot, step: int, row: int, pos: int,
                 run_dir: str | Path | None = None) -> dict[str, Any]:
    """The shard token at position `pos` of global batch row `row` of step `step` (1-based, as logged),
    planned from the nearest checkpoint of `run_dir` before the step when given."""
    tc = cfg.training
    data = CurriculumData.open(cfg, root, tc.micro_batch_size * tc.grad_accum_steps)
    G, total = data.schedule.global_batch, data.schedule.total_steps
    if not 1 <= step <= total:
        raise TokenLookupError(f"step {step} is outside the curriculum's steps 1..{total}")
    if not 0 <= row < G:
        raise TokenLookupError(f"row {row} is outside the global batch of {G} rows")
    sampler = data.sampler(cfg.curriculum.allow_bucket_exhaustion)
    if run_dir is not None:
        resume_before(sampler, run_dir, step)
    while sampler.step < step - 1:
        sampler.plan_steps(step - 1 - sampler.step)
    plan = sampler.plan_next()
    if not 0 <= pos < plan.seq_len:
        raise TokenLookupError(f"position {pos} is outside step {step}'s sequence length {plan.seq_len}")
    pieces = plan.pieces(slice(row, row + 1))
    lengths = pieces.b - pieces.a
    i = int(np.searchsorted(np.cumsum(lengths), pos, side="right"))
    into = pos - int(np.sum(lengths[:i]))
    entry_set = plan.sets[int(pieces.set_index[i])]
    entry, token = int(pieces.entry[i]), int(pieces.a[i]) + into
    prefix, offset = data.buckets[entry_set.bucket].shard_token(entry, token)
    return {"step": step, "row": row, "pos": pos, "phase": data.schedule.phase_names[plan.phase],
            "seq_len": plan.seq_len, "bucket": entry_set.bucket, "epoch": int(pieces.epoch[i]),
            "bucket_entry": entry, "entry_token": token, "shard": prefix, "offset": offset}


def global_row(cfg: RefineryConfig, run_dir: str | Path, step: int, rank: int, row: int) -> int:
    """Row `row` of rank `rank`'s slice of step `step`, as a row of the global batch."""
    world = run_world_size(run_dir, step)
    G = cfg.training.micro_batch_size * cfg.training.grad_accum_steps
    per = G // world
    if not 0 <= rank < world:
        raise TokenLookupError(f"rank {rank} is outside the run's world size {world} at step {step}")
    if not 0 <= row < per:
        raise TokenLookupError(f"row {row} is outside rank {rank}'s {per} rows (global batch {G}, world size {world})")
    return rank * per + row
