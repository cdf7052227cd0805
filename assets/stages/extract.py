"""`extracted_text`: HTML to plain text with resiliparse (DCLM's extractor), main content by default.

HTML content types are extracted; text content types pass through as they are; any other content
type is rejected `extract/unsupported_content_type` (detail: the type); a document whose text is
shorter than `min_text_chars` after extraction (or after stripping, for text) is rejected
`extract/empty`. The output table has the provenance columns and `text`; `raw` is dropped.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import polars as pl

from assets.stages.base import Drop, Stage, StageOutput, StageStats, count_in_out, rejects_frame
from refinery.config import ExtractConfig

STAGE = "extracted_text"


def html_extractor(main_content: bool) -> Callable[[str], str]:
    """resiliparse's plain-text extraction, imported here so loading the definitions stays fast."""
    try:
        from resiliparse.extract.html2text import extract_plain_text
    except ImportError as err:  # pragma: no cover - resiliparse is a declared dependency
        raise ImportError("extracted_text needs resiliparse: pip install resiliparse") from err

    def extract(html: str) -> str:
        return extract_plain_text(html, main_content=main_content)

    return extract


class Extractor(Stage):
    name = STAGE

    def __init__(self, cfg: ExtractConfig):
        self.cfg = cfg
        self.html_types = frozenset(t.lower() for t in cfg.html_content_types)
        self.text_prefixes = tuple(t.lower() for t in cfg.text_content_types)
        self.extract = html_extractor(cfg.main_content)

    def kind(self, content_type: str | None) -> str | None:
        """"html", "text", or None for a type this stage does not handle."""
        ct = (content_type or "").lower()
        if ct in self.html_types:
            return "html"
        if ct and ct.startswith(self.text_prefixes):
            return "text"
        return None

    def run(self, docs: pl.DataFrame) -> StageOutput:
        start = time.perf_counter()
        stats = StageStats(stage=self.name)
        texts: list[str | None] = []
        drops: dict[int, Drop] = {}
        kinds: dict[str | None, str | None] = {}
        extract, min_chars = self.extract, self.cfg.min_text_chars
        for i, (raw, content_type) in enumerate(docs.select("raw", "content_type").iter_rows()):
            if content_type not in kinds:
                kinds[content_type] = self.kind(content_type)
            kind, text = kinds[content_type], None
            if kind is None:
                drops[i] = Drop("extract/unsupported_content_type", None, content_type or "missing")
            elif raw is not None:
                text = extract(raw) if kind == "html" else raw
                if len(text.strip()) < min_chars:
                    drops[i] = Drop("extract/empty", len(text.strip()), f"< {min_chars} characters of text")
                    text = None
            else:
                drops[i] = Drop("extract/empty", 0, "no payload")
            texts.append(text)
        for rule in (d.rule for d in drops.values()):
            stats.dropped[rule] += 1
        # Rejects show the start of the raw payload, since their text is empty or was never made.
        rejects = rejects_frame(docs.rename({"raw": "text"}), self.name, drops)
        kept = (
            docs.with_columns(pl.Series("text", texts, dtype=pl.String))
            .filter(pl.col("text").is_not_null())
            .drop("raw")
        )
        # Bytes in are the raw payloads and bytes out the text, so byte retention shows how much of
        # the markup became text.
        count_in_out(stats, docs.rename({"raw": "text"}), kept)
        stats.wall_s = time.perf_counter() - start
        return StageOutput(kept, rejects, stats)

    def config_summary(self) -> dict[str, Any]:
        return self.cfg.model_dump(mode="json")
