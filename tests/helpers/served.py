"""What a sampler served, piece by piece: shared by the sampler and ordering tests."""

from __future__ import annotations

from collections import defaultdict


def served_pieces(data, plans):
    """(phase, set key, epoch, entry, a, b) of every piece of every row, in global order, of step
    plans or chunk plans (both give `pieces(rows)`, `phase` and `sets`)."""
    out = []
    for plan in plans:
        p = plan.pieces(slice(0, data.schedule.global_batch))
        for si, e, entry, a, b in zip(p.set_index, p.epoch, p.entry, p.a, p.b):
            out.append((plan.phase, plan.sets[si].key, int(e), int(entry), int(a), int(b)))
    return out


def assert_each_pass_reads_each_entry_once(reads, members, length_of) -> dict[tuple, list[int]]:
    """`reads`: (stream, pass, entry, a, b) in the order read. Within a pass an entry's pieces tile
    [0, its length) once, and every pass of a stream but its last reads each of `members[stream]`
    whole. Returns (stream, pass) -> entries in the order their first token was read."""
    ranges: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    first: dict[tuple, list[int]] = defaultdict(list)
    for stream, epoch, entry, a, b in reads:
        if a == 0:
            first[(stream, epoch)].append(entry)
        ranges[(stream, epoch, entry)].append((a, b))
    last = {}
    for stream, epoch, _ in ranges:
        last[stream] = max(last.get(stream, epoch), epoch)
    for (stream, epoch, entry), got in ranges.items():
        got.sort()
        assert got[0][0] == 0 and all(r0[1] == r1[0] for r0, r1 in zip(got, got[1:])), \
            f"{stream} pass {epoch}: entry {entry} read as {got}, not once"
        if epoch < last[stream]:
            assert got[-1][1] == length_of(stream, entry), f"{stream} pass {epoch}: entry {entry} read in part"
    for stream, final in last.items():
        for epoch in range(final):
            read = sorted(e for (s, p, e) in ranges if s == stream and p == epoch)
            assert read == sorted(members[stream]), f"{stream} pass {epoch} read {len(read)} of {len(members[stream])}"
    return dict(first)
