"""Progress for long work: a bar on a terminal, silence when piped, and log lines for Dagster.

`Progress(total, desc)` draws a tqdm bar on stderr only when stderr is a terminal (REFINERY_PROGRESS=1
forces it on, =0 off), so `--json` output and CI logs stay clean. Given `log=` (an asset passes
`context.log.info`), it also emits one line each time another `every_pct` percent is done, which is
what the Dagster UI shows for a running materialization. `track(iterable, ...)` wraps an iterable.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Iterable, Iterator, TextIO, TypeVar

T = TypeVar("T")

FORCE_ENV = "REFINERY_PROGRESS"


def bars_enabled(stream: TextIO | None = None) -> bool:
    forced = os.environ.get(FORCE_ENV)
    if forced in {"0", "1"}:
        return forced == "1"
    stream = stream if stream is not None else sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


class Progress:
    """Count work done out of `total`; draw a bar on a terminal and log every `every_pct` percent."""

    def __init__(
        self,
        total: int | None,
        desc: str = "",
        unit: str = "it",
        log: Callable[[str], None] | None = None,
        every_pct: int = 10,
        stream: TextIO | None = None,
    ):
        if every_pct <= 0 or every_pct > 100:
            raise ValueError(f"every_pct must be in 1..100, got {every_pct}")
        self.total = total
        self.desc = desc
        self.unit = unit
        self.log = log
        self.every_pct = every_pct
        self.done = 0
        self._next_pct = every_pct
        self._start = time.perf_counter()
        self._bar = None
        stream = stream if stream is not None else sys.stderr
        if bars_enabled(stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True, leave=True)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        if self.log is None or not self.total:
            return
        pct = 100 * self.done // self.total
        if pct >= self._next_pct:
            self.log(self._line(pct))
            self._next_pct = (pct // self.every_pct + 1) * self.every_pct

    def describe(self, desc: str) -> None:
        """Rename the work in progress (e.g. the phase now training), on the bar and in later log lines."""
        if desc == self.desc:
            return
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description_str(desc)

    def _line(self, pct: int) -> str:
        elapsed = time.perf_counter() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return f"{self.desc}: {min(pct, 100)}% ({self.done:,}/{self.total:,} {self.unit}, {rate:,.1f} {self.unit}/s)"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(
    items: Iterable[T],
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    log: Callable[[str], None] | None = None,
    every_pct: int = 10,
) -> Iterator[T]:
    """Yield `items`, counting each one into a `Progress` (total from len() when not given)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, desc=desc, unit=unit, log=log, every_pct=every_pct) as bar:
        for item in items:
            yield item
            bar.update(1)
