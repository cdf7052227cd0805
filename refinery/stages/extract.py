"""`extracted_text`: HTML to plain text with resiliparse (DCLM's extractor), by `method`: the article
text by default (resiliparse main content less page furniture, then a line-length boilerplate pass),
or resiliparse's own main content, or the whole page (refinery/stages/html.py).

HTML content types are extracted; text content types pass through as they are; any other content
type is rejected `extract/unsupported_content_type` (detail: the type); a document whose text is
shorter than `min_text_chars` after extraction (or after stripping, for text) is rejected
`extract/empty`. The output table has the provenance columns and `text`; `raw` is dropped.

No page can hold the stage: a page nested deeper than `max_tag_depth` is rejected
`extract/too_deep` before it is parsed (parse time grows with the square of the depth), and HTML is
parsed in an isolated worker process (refinery/stages/isolation.py) that is killed when one page runs
past `stages.record_timeout_s`: that page is rejected `extract/timeout`, one that crashes the parser
`extract/error`, and the batch goes on in a fresh worker.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import polars as pl

from refinery.stages.base import Outcome, RecordStage
from refinery.stages.html import EXTRACTORS, tag_depth
from refinery.stages.isolation import ERROR_DETAIL_CHARS, shared_worker, timeout_drop
from refinery.stages.stats import Drop
from refinery.config import ExtractConfig

STAGE = "extracted_text"


class Extractor(RecordStage):
    name = STAGE
    family = "extract"
    reads = ("raw", "content_type")
    writes = {"text": pl.String()}
    consumes = ("raw",)
    # Rejects show the start of the raw payload, since their text is empty or was never made; bytes
    # in are the raw payloads and bytes out the text, so byte retention shows how much of the
    # markup became text.
    bytes_in_column = "raw"
    # Pages sent to the worker at once: small enough that a killed worker's restart re-sends little.
    batch_size = 64

    def __init__(self, cfg: ExtractConfig):
        self.cfg = cfg
        self.html_types = frozenset(t.lower() for t in cfg.html_content_types)
        self.text_prefixes = tuple(t.lower() for t in cfg.text_content_types)
        self.html_to_text: Callable[[str], str] = EXTRACTORS[cfg.method]

    def kind(self, content_type: str | None) -> str | None:
        """"html", "text", or None for a type this stage does not handle."""
        ct = (content_type or "").lower()
        if ct in self.html_types:
            return "html"
        if ct and ct.startswith(self.text_prefixes):
            return "text"
        return None

    def screen(self, raw: str | None, content_type: str | None) -> Drop | str | None:
        """The drop a record gets before any parsing, its text when it needs none, or None when it
        is HTML to extract."""
        kind = self.kind(content_type)
        if kind is None:
            return Drop("extract/unsupported_content_type", None, content_type or "missing")
        if raw is None:
            return Drop("extract/empty", 0, "no payload")
        if kind == "text":
            return raw
        depth = tag_depth(raw, self.cfg.max_tag_depth)
        if depth > self.cfg.max_tag_depth:
            return Drop("extract/too_deep", depth, f"tags nested over {self.cfg.max_tag_depth} levels deep")
        return None

    def finish(self, text: str) -> Outcome:
        stripped = len(text.strip())
        if stripped < self.cfg.min_text_chars:
            return Drop("extract/empty", stripped, f"< {self.cfg.min_text_chars} characters of text")
        return {"text": text}

    def process_batch(self, batch: pl.DataFrame, counters: Counter) -> list[Outcome]:
        screened = [self.screen(raw, ct) for raw, ct in batch.select(self.reads).iter_rows()]
        html = [i for i, s in enumerate(screened) if s is None]
        outcomes: list[Outcome] = [s if isinstance(s, Drop) else None for s in screened]
        for i, s in enumerate(screened):
            if isinstance(s, str):
                outcomes[i] = self.finish(s)
        if html:
            budget = self.record_timeout_s or 0.0
            worker = shared_worker(self.html_to_text, budget or None)
            restarts = worker.restarts
            raws = batch["raw"]
            for i, (status, value) in zip(html, worker.map([raws[i] for i in html])):
                if status == "ok":
                    outcomes[i] = self.finish(value)
                elif status == "timeout":
                    outcomes[i] = timeout_drop(self.family, value, budget)
                else:
                    outcomes[i] = Drop(f"{self.family}/error", None, value[:ERROR_DETAIL_CHARS])
            if worker.restarts > restarts:
                counters["extract/worker_restarts"] += worker.restarts - restarts
        return outcomes

    def process(self, record: dict[str, Any], counters: Counter) -> Outcome:
        """One page in this process: the path the loop falls back to when a batch fails outside
        the worker (the worker cannot start, say). A parse here is timed, not killed."""
        screened = self.screen(record["raw"], record["content_type"])
        if isinstance(screened, Drop):
            return screened
        return self.finish(screened if screened is not None else self.html_to_text(record["raw"]))

    def config_summary(self) -> dict[str, Any]:
        return {**self.cfg.model_dump(mode="json"), "record_timeout_s": self.record_timeout_s}
