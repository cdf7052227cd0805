"""The sampler's state: what a checkpoint holds of the global order (`CurriculumSampler.state_dict`),
the states after each step of a chunk (`ChunkStates`), and the checks a saved state passes before a
run continues from it (`refuse_foreign_state`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from training.entry_sets import Cursor, EntrySet
from training.handover import Handover, settle
from training.schedule import StepSchedule

# Version 4: cursors belong to groups of entry sets (one per bucket and selection, whatever the
# order), and `handovers` says what a pass begun in another order took. Version 3 (cursors per set)
# is read when it holds no ordered set's cursor: there the two mean the same. Version 3 computed
# pass orders block by block, version 2 held each pass as a full permutation, version 1 drew each
# row's bucket at random.
SAMPLER_STATE_VERSION = 4


class SamplerStateError(ValueError):
    """A saved sampler state that does not fit this run; the message says what changed."""


@dataclass
class ChunkStates:
    """The sampler state after each step of one chunk, held as arrays; `state(i)` builds step i's
    dict. A checkpoint asks for one state in hundreds of steps, so the loader passes these along
    instead of a dict per step."""

    first_step: int  # the chunk's first step, 0-based: state(i) is the state after step first_step + i
    shared: dict[str, Any]  # what every step's state holds alike
    keys: list[str]  # group keys, sorted
    cursors: np.ndarray  # int64 (steps, keys, 4)
    phase: str
    buckets: list[str]
    served: np.ndarray  # int64 (steps, buckets): rows served in the chunk's phase
    plan_offset: np.ndarray  # int64 (steps, buckets)
    handovers: dict[str, Handover]  # of the groups the chunk did not read, and of those it read as at its start

    def __len__(self) -> int:
        return len(self.cursors)

    def state(self, i: int) -> dict[str, Any]:
        cursors = dict(zip(self.keys, self.cursors[i].tolist()))
        handovers = {g: settle(g, h, Cursor(*cursors[g])) for g, h in self.handovers.items()}
        return {**self.shared, "step": self.first_step + i + 1, "cursors": cursors,
                "handovers": {g: h.to_dict() for g, h in sorted(handovers.items()) if h is not None},
                "served": {**self.shared["served"], self.phase: dict(zip(self.buckets, self.served[i].tolist()))},
                "plan_offset": dict(zip(self.buckets, self.plan_offset[i].tolist())),
                "dropped": [list(d) for d in self.shared["dropped"]]}


def refuse_foreign_state(state: dict[str, Any], schedule: StepSchedule, seed: int,
                         set_by_key: dict[str, EntrySet]) -> None:
    """Raise SamplerStateError, saying what changed, unless `state` continues this run's global order:
    a version this sampler reads, the same global batch and seed, and the same manifests for the
    phases trained so far."""
    version = state.get("version")
    ordered = [k for k in state.get("cursors", {}) if k in set_by_key and set_by_key[k].group != k]
    if version != SAMPLER_STATE_VERSION and not (version == 3 and not ordered):
        why = {
            1: "that trainer drew each row's bucket at random, this one allocates rows to buckets exactly per step",
            2: "that trainer held each pass's order as a full permutation of the set, this one computes it block by "
               "block (training/pass_order.py), so the same cursor names another entry",
            3: f"that trainer gave the ordered sets {', '.join(ordered)} cursors of their own, restarting their "
               "buckets' passes, where this one continues each pass across orders",
        }.get(version, f"this trainer reads {SAMPLER_STATE_VERSION}")
        raise SamplerStateError(
            f"sampler state version {version}: {why} (version {SAMPLER_STATE_VERSION}); the run's global order "
            "cannot continue: resume with the trainer version that wrote the checkpoint, or start a new run"
        )
    if state["global_batch"] != schedule.global_batch:
        raise SamplerStateError(
            f"the checkpoint's global batch is {state['global_batch']} rows, this run's is "
            f"{schedule.global_batch}; the global order depends on it, so set training.micro_batch_size * "
            f"training.grad_accum_steps back to {state['global_batch']}"
        )
    if state["seed"] != seed:
        raise SamplerStateError(f"the checkpoint's seed is {state['seed']}, this run's is {seed}; restore seed")
    now = schedule.fingerprint_before(int(state["step"]))
    if state["schedule"] != now:
        saved, current = state.get("phases", {}), schedule.phase_fingerprints_before(int(state["step"]))
        changed = [p for p in {**saved, **current} if saved.get(p) != current.get(p)]
        raise SamplerStateError(
            f"the manifests of the phases trained so far changed since the checkpoint: phases "
            f"{', '.join(map(repr, changed))} (schedule fingerprint {state['schedule']} -> {now}); resume "
            "against the manifests it was trained on, or start a new run"
        )
