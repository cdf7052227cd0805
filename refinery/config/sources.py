"""The inputs: each source's files, format and bucket, and how the files are grouped into the
partitions of the per-document stages."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from refinery.config.section import Section
from refinery.stages import registry

SKIPPABLE_STAGES = registry.skippable_names()


class SourceConfig(Section):
    """One input corpus: files matched by `path` (a glob, relative to the config file), all in one
    format, all feeding one bucket. Curated sources (code, math) usually skip the web heuristics."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$",
                      description="Names the source in partition keys, doc ids and reports.")
    path: str = Field(description="A glob relative to the config file's folder. `warc`, `jsonl` and `parquet` "
                      "match files; `hf_dataset` matches `save_to_disk` directories (a DatasetDict's "
                      "directory stands for each of its splits).")
    format: Literal["warc", "jsonl", "parquet", "hf_dataset"] = Field(
        description="`warc` (WARC or WARC.gz; the HTTP payload, HTML or text), `jsonl` (one JSON object a line, "
        "gzip or not), `parquet` (any Parquet file), `hf_dataset` (a Hugging Face `datasets` "
        "`save_to_disk` directory: Arrow stream files, read without the `datasets` package).")
    bucket: str = Field(description="The curriculum bucket every document of the source feeds; one of `buckets`.")
    text_field: str = Field(default="text", description="JSONL, Parquet and HF datasets: the field (column) holding "
                            "the document's text. A record whose value is null or not a string is one "
                            "`ingest/missing_text` reject; a Parquet or Arrow file without the column is an "
                            "error naming the columns it has.")
    url_field: str = Field(default="url", description="JSONL, Parquet and HF datasets: the field holding the "
                           "document's URL (the `url` column: URL rules, blocked domains, lineage). Absent or "
                           "empty: no URL.")
    id_field: str | None = Field(default=None, description="JSONL, Parquet and HF datasets: a field holding the "
                                 "record's own id in its source. A record without a URL is named by it: the "
                                 "`url` column gets the id, so rejects and lineage show which record it was. "
                                 "Parquet and Arrow files must have the column when it is set.")
    skip: list[Literal[SKIPPABLE_STAGES]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="Stages this source's documents pass through untouched "
        "(`heuristic` also skips `stages.custom_filters`).")
    # Heuristic rules that do not fit this source's documents, by reason name (e.g. c4/curly_bracket
    # for documentation and code, whose shell and config snippets hold braces, and C4's line rules,
    # c4_lines/..., LINE_RULES, where short lines and indentation are content); checked against
    # HeuristicConfig.rule_names() when the whole config loads.
    rules_off: list[str] = Field(default_factory=list, description="Heuristic rules switched off for this "
                                 "source, by reason name (e.g. `c4/curly_bracket` for code).")
    http_status_kept: list[int | str] = Field(
        default_factory=lambda: ["200-299"], description="WARC: the HTTP statuses whose responses are kept, "
        "each a code (`200`) or an inclusive range (`200-299`); any other response is one `ingest/http_status` "
        "reject (an error page is not the document its URL names).")

    @field_validator("http_status_kept")
    @classmethod
    def _status_ranges(cls, v: list[int | str]) -> list[int | str]:
        for item in v:
            lo, _, hi = str(item).partition("-")
            if not (lo.strip().isdigit() and (not hi or hi.strip().isdigit())
                    and 100 <= int(lo) <= int(hi or lo) <= 599):
                raise ValueError(f"{item!r} is not an HTTP status (100-599) or a range of them such as '200-299'")
        return v

    def keeps_http_status(self, status: int) -> bool:
        for item in self.http_status_kept:
            lo, _, hi = str(item).partition("-")
            if int(lo) <= status <= int(hi or lo):
                return True
        return False


class PartitionsConfig(Section):
    """How input files are grouped into the partitions of the per-document stages.

    `by: file` makes every input file its own partition. `by: hash` puts a file in batch
    `blake2b(file key) mod count` of its group, where the group is the source, or the source plus
    the crawl snapshot that `snapshot_pattern` (a regex with one capture group, searched in the
    file's path) names. A file's batch never depends on which other files exist, so new files join
    batches without moving old ones, and a new crawl snapshot makes new batches. `workers` is the
    pool that a partition's files fan out over (1: in the run's own process). `dynamic: true` keeps
    the batch keys in the Dagster instance (a DynamicPartitionsDefinition) instead of the code,
    registered `register_chunk` at a time by the `input_batches_sensor`. A backfill runs
    `batches_per_run` batches per run, and the hash-range and band stages one partition per run,
    so runs spread over machines; left unset, a backfill is one run per asset group (one machine)."""

    by: Literal["file", "hash"] = "file"
    count: int = Field(default=16, ge=1, le=100_000)
    snapshot_pattern: str | None = None
    workers: int = Field(default=1, ge=1, le=256)
    dynamic: bool = False
    register_chunk: int = Field(default=1000, ge=1, le=10_000)
    batches_per_run: int | None = Field(default=None, ge=1)

    @field_validator("snapshot_pattern")
    @classmethod
    def _one_group(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            groups = re.compile(v).groups
        except re.error as err:
            raise ValueError(f"not a regular expression ({err})") from None
        if groups != 1:
            raise ValueError(f"needs exactly one capture group (the snapshot name), has {groups}")
        return v
