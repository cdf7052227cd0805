"""Document tables as a stage receives them: the provenance columns every stage carries, then text."""

from __future__ import annotations

import polars as pl

from refinery.documents import PROVENANCE_SCHEMA


def provenance_frame(texts: list[str | None], urls: list[str | None] | None = None, *, doc_prefix: str = "web-a",
                     source: str = "web", bucket: str = "web", file: str = "a.jsonl",
                     fetch_time: str | None = None, content_type: str = "text/plain",
                     language: str | None = None) -> pl.DataFrame:
    """One row per text, with doc ids `<doc_prefix>/<record>` (as `make_doc_id` writes them), urls
    `https://x.example/<record>` unless given, and `language` as a column when one is named."""
    n = len(texts)
    columns = {
        "doc_id": [f"{doc_prefix}/{i:07d}" for i in range(n)],
        "url": urls if urls is not None else [f"https://x.example/{i}" for i in range(n)],
        "source": [source] * n, "bucket": [bucket] * n, "file": [file] * n,
        "record_index": list(range(n)), "record_offset": [i * 100 for i in range(n)],
        "fetch_time": [fetch_time] * n, "content_type": [content_type] * n,
        "text": texts,
    }
    schema = {**PROVENANCE_SCHEMA, "text": pl.String}
    if language is not None:
        columns["language"], schema["language"] = [language] * n, pl.String
    return pl.DataFrame(columns, schema=schema)
