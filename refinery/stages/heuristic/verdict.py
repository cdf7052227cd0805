"""What every rule family records into: the verdict on one document, stopping at the first failure
(the stage) or collecting every one (explain mode), and the threshold text of a reject's detail.

A family is a function `check(verdict, doc, thresholds, ...)` wrapped by `rule_family`, which
returns its first failure. `Verdict.fail` skips rules switched off and tells the family whether to
stop.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from refinery.stages.stats import Drop


def over(limit: float) -> str:
    """The detail of a value that must not exceed `limit`."""
    return f"> {limit:g}"


def under(limit: float) -> str:
    """The detail of a value that must reach `limit`."""
    return f"< {limit:g}"


class Verdict:
    """The rules a document fails, in the order they run. Evaluation stops at the first failure
    unless `every` is set (explain mode); rules named in `off` are never recorded."""

    __slots__ = ("drops", "every", "off")

    def __init__(self, off: frozenset[str] = frozenset(), every: bool = False):
        self.drops: list[Drop] = []
        self.every = every
        self.off = off

    def fail(self, rule: str, value: float | None, detail: str) -> bool:
        """Record a failure; True when the caller should stop evaluating."""
        if rule in self.off:
            return False
        self.drops.append(Drop(rule, value, detail))
        return not self.every

    def first_since(self, start: int) -> Drop | None:
        return self.drops[start] if len(self.drops) > start else None


def rule_family(check: Callable[..., None]) -> Callable[..., Drop | None]:
    """`check(verdict, *args)` recording a family's failures, called as `family(*args,
    verdict=None)`: a fresh verdict when none is given; returns the family's first failure."""

    @functools.wraps(check)
    def run(*args: Any, verdict: Verdict | None = None, **kwargs: Any) -> Drop | None:
        v = Verdict() if verdict is None else verdict
        start = len(v.drops)
        check(v, *args, **kwargs)
        return v.first_since(start)

    return run
