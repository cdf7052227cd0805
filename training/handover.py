"""A pass read in more than one order: which set's order a group's stream follows, and what the
orders before it took of the pass under way.

Cursors belong to groups, not phases: a bucket served in phase 1 continues in phase 2 from where it
stopped (gpt-simple restarted it). A phase with a quality selection reads a different group with its
own cursor, so the anneal slice gets its own passes; two phases with the same selection share one
cursor, whatever their orders. A phase that reads the group in another order than the phase before
goes on with the pass under way (`Handover`): the entries the pass took are left out of the new
order, computed from their ordinals in the earlier orders, nothing stored per entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from training.entry_sets import Cursor, EntrySet


@dataclass(frozen=True)
class Handover:
    """Which set's order a group's stream follows (`reader`), and, when the pass under way was begun
    in other orders, what they took of it: `taken` holds (set key, n) for each set that read the
    first n ordinals of its order in pass `epoch` (the entries it skipped as taken are taken too), so
    whether an entry was read in the pass is computed from its ordinal in each of those orders, never
    stored. `carry` is the entry the last handover left mid-way (-1: none): the reader finishes it
    first, while its cursor's ordinal is `carry_at` (one before the reader's first ordinal not
    known taken). A group whose stream follows its own unordered set, with nothing taken, has none."""

    reader: str
    epoch: int
    taken: tuple[tuple[str, int], ...] = ()
    carry: int = -1
    carry_at: int = -1

    def in_carry(self, cursor: Cursor) -> bool:
        return self.carry >= 0 and cursor.epoch == self.epoch and cursor.ordinal == self.carry_at

    def to_dict(self) -> dict[str, Any]:
        return {"reader": self.reader, "epoch": self.epoch, "taken": dict(self.taken), "carry": [self.carry, self.carry_at]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Handover":
        return cls(str(d["reader"]), int(d["epoch"]), tuple(sorted((str(k), int(n)) for k, n in d["taken"].items())),
                   int(d["carry"][0]), int(d["carry"][1]))


def settle(group: str, handover: Handover | None, cursor: Cursor) -> Handover | None:
    """`handover` as it stands with the group's cursor at `cursor`: what it says of a pass the cursor
    has left is dropped, and so is the handover once it says nothing (the group's own set reads)."""
    if handover is None:
        return None
    if cursor.epoch != handover.epoch:
        handover = Handover(handover.reader, cursor.epoch)
    if handover.reader == group and not handover.taken and handover.carry < 0:
        return None
    return handover


def read_by(es: EntrySet, cursor: Cursor, handover: Handover | None,
            set_by_key: dict[str, EntrySet]) -> tuple[Cursor, Handover | None]:
    """The cursor and handover of `es`'s group (now at `cursor`, `handover`) once `es` reads it.
    When another set of the group read it last, the pass goes on in `es`'s order: the other's
    ordinals read so far join what the pass took, an entry it stopped inside is finished first, and
    `es` starts at its first ordinal not known taken (the pass's end when the other read its whole
    order)."""
    previous = handover.reader if handover is not None else es.group
    if previous == es.key:
        return cursor, handover
    current = handover if handover is not None and handover.epoch == cursor.epoch else None
    taken = dict(current.taken) if current is not None else {}
    if current is not None and current.in_carry(cursor):
        partial = current.carry
    elif cursor.offset > 0:
        other = set_by_key[previous]
        partial = int(other.ids_at(other.order(cursor.epoch).positions(np.array([cursor.ordinal])))[0])
    else:
        partial = -1
    n = cursor.ordinal + (cursor.offset > 0)
    if n > 0:
        taken[previous] = max(taken.get(previous, 0), n)
    start = es.size if previous in set_by_key and n >= set_by_key[previous].size else taken.get(es.key, 0)
    if partial >= 0:
        cursor = Cursor(cursor.position, cursor.epoch, start - 1, cursor.offset)
    else:
        cursor = Cursor(cursor.position, cursor.epoch, start, 0)
    after = Handover(es.key, cursor.epoch, tuple(sorted(taken.items())), partial, start - 1 if partial >= 0 else -1)
    return cursor, settle(es.group, after, cursor)


def taken_sets(handover: Handover | None, cursor: Cursor,
               set_by_key: dict[str, EntrySet]) -> tuple[tuple[EntrySet, int], ...]:
    """What the earlier readers of the cursor's pass took, as (set, ordinals read) for `EntrySet.window`."""
    if handover is None or handover.epoch != cursor.epoch:
        return ()
    return tuple((set_by_key[k], n) for k, n in handover.taken)
