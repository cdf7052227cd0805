"""What a sampler served, piece by piece: shared by the sampler and ordering tests."""

from __future__ import annotations


def served_pieces(data, plans):
    """(phase, set key, epoch, entry, a, b) of every piece of every row, in global order, of step
    plans or chunk plans (both give `pieces(rows)`, `phase` and `sets`)."""
    out = []
    for plan in plans:
        p = plan.pieces(slice(0, data.schedule.global_batch))
        for si, e, entry, a, b in zip(p.set_index, p.epoch, p.entry, p.a, p.b):
            out.append((plan.phase, plan.sets[si].key, int(e), int(entry), int(a), int(b)))
    return out
