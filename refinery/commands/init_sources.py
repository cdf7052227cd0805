"""What `refinery init DIR` finds in a directory: the inputs (WARC, JSONL, Parquet, Hugging Face
datasets saved to disk) grouped into one source per bucket, format and folder, the text, URL and id
fields of the tables, a sample of each source run through the funnel's own stages, and the
languages that sample holds. refinery/commands/init.py writes the config from it."""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from refinery.config import LanguageConfig
from refinery.documents.inputs import outside_folder
from refinery.preflight import not_a_file
from refinery.stages.readers import format_of_path, input_format

SAMPLE_FILES = 3  # per source: the first, middle and last file
ROOT_BUCKET = "web"
# How `scan` marks, among the files it does not read, a symlink whose target is outside the scanned folder.
OUTSIDE_NOTE = " (a symlink out of this folder)"
UNREADABLE_NOTE = " (not a regular file: {kind})"
# A language goes into stages.language.languages when at least MIN_LANGUAGE_DOCS sampled documents are in it
# and it is at least MIN_LANGUAGE_SHARE of the whole sample, or, in one source's sample or one sampled file,
# the main language (most documents) or at least PART_LANGUAGE_SHARE of them (`keeps_language`).
# A language a folder or file is largely in is one the user put there, however small that source is
# (the 4 English man pages among 564, one Japanese file among Russian ones); a few pages of another language
# inside a source are what a crawl picks up along the way, and fewer than MIN_LANGUAGE_DOCS are usually
# pages language ID got wrong.
MIN_LANGUAGE_DOCS = 3
MIN_LANGUAGE_SHARE = 0.1
PART_LANGUAGE_SHARE = 0.25
# A rule that removes this share of a source's sampled documents, or of the bytes the heuristics judged, is named.
COSTLY_SHARE = 0.1
# Beyond the SAMPLE_FILES read whole, up to LANGUAGE_FILES more files of a source (evenly spread) give
# their first LANGUAGE_DOCS_PER_FILE documents to language ID, so a language that only a file outside
# the sample holds is seen: bounded work per source, whatever its number of files.
LANGUAGE_FILES = 200
LANGUAGE_DOCS_PER_FILE = 10
URL_SHARE = 0.9  # of a column's sampled values that are URLs, for it to be taken as the URL
URL_VALUE = re.compile(r"[a-z][a-z0-9+.-]*://\S+$", re.I)
EXAMPLE_CHARS = 100
UNWANTED_LANGUAGE = "language/unwanted_language"
TEXT_FIELDS = ("text", "content", "body", "document", "raw_content", "article", "markdown", "passage", "code")
URL_FIELDS = ("url", "page_url", "link", "source_url", "uri", "href")
ID_FIELDS = ("id", "doc_id", "document_id", "uid", "uuid", "_id", "guid")
MIN_TEXT_CHARS = 40  # mean characters of a field that is not called text-like but is taken as the text
SAMPLE_RECORDS = 200  # records read per table to find its fields


def detect_format(path: str) -> str | None:
    """The source format of one path, or None when it is none Refinery reads."""
    fmt = format_of_path(path)
    return fmt.name if fmt is not None else None


@dataclass
class Found:
    """The inputs of one format in one folder of one bucket: a source to write."""

    bucket: str
    fmt: str
    folder: str  # relative to DIR ("" for DIR itself)
    glob_name: str  # the glob of the source's file names in `folder` (a dataset's own name)
    root: str  # DIR, which every input (a dataset's splits and files included) must stay inside
    paths: list[str] = field(default_factory=list)
    name: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)
    problem: str | None = None
    skip: list[str] = field(default_factory=list)
    input_bytes: int = 0
    sampled: int = 0
    sample_bytes: int = 0  # input bytes of the sampled files
    # (language or None, the rule that removed the record or None) -> sampled records: every record the
    # sampled files hold, so the removals under any choice of languages follow (`removed_by_rule`).
    outcomes: Counter = field(default_factory=Counter)
    file_languages: list[Counter] = field(default_factory=list)  # per sampled file: language -> documents
    # Documents per language of the files outside the sample (their first few documents each).
    other_file_languages: Counter = field(default_factory=Counter)
    heuristic_bytes: int = 0  # text bytes of the sampled documents the heuristics judged, and by rule removed:
    removed_bytes: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # rule -> the URL or title of one it removed
    clean_bytes_by_language: Counter = field(default_factory=Counter)

    @property
    def languages(self) -> Counter:
        """Language -> sampled documents language ID gave it (at min_score or above), before the heuristics."""
        found: Counter = Counter()
        for (lang, _), n in self.outcomes.items():
            if lang is not None:
                found[lang] += n
        return found

    @property
    def sample_records(self) -> int:
        return sum(self.outcomes.values())

    def removed_by_rule(self, languages: list[str]) -> Counter:
        """Rule -> sampled records the run would remove with `languages` kept: a document of another
        language goes at language ID, before any heuristic sees it."""
        removed: Counter = Counter()
        for (lang, rule), n in self.outcomes.items():
            if lang is not None and lang not in languages:
                removed[UNWANTED_LANGUAGE] += n
            elif rule is not None:
                removed[rule] += n
        return removed

    def describe_folder(self) -> str:
        return f"{self.folder}/" if self.folder else "the folder itself"

    def pattern(self, prefix: str = "") -> str:
        """The source's glob: `prefix` (DIR relative to the config's folder) / folder / names."""
        parts = [glob.escape(p) for p in os.path.join(prefix, self.folder).split(os.sep) if p and p != "."]
        return "/".join([*parts, self.glob_name])


def _glob_name(path: str, fmt: str) -> str:
    """Files of one extension share a source (`*.jsonl`), compressed or not (`_merge_compressed` makes
    the glob `*.jsonl*` when both are there); a dataset is a source of its own."""
    name = os.path.basename(path)
    if input_format(fmt).is_folder:
        return glob.escape(name)
    ext = next(e for e in input_format(fmt).extensions if name.lower().endswith(e))
    if ext.endswith(".gz"):
        ext = ext[:-3]
        name = name[:-3]
    return "*" + glob.escape(name[len(name) - len(ext):])


def _merge_compressed(src: Found) -> None:
    """A source's glob for its files as they are: `*.jsonl.gz` when all are compressed, `*.jsonl`
    when none is, and `*.jsonl*` when the folder holds both (the readers tell gzip by its magic bytes)."""
    if input_format(src.fmt).is_folder:
        return
    gz = {p.lower().endswith(".gz") for p in src.paths}
    src.glob_name += src.paths[0][-3:] if gz == {True} else "*" if gz == {True, False} else ""


def bucket_name(folder: str) -> str:
    """A folder's name as a bucket name (lower case letters, digits and underscores: safe in paths)."""
    return re.sub(r"[^a-z0-9]+", "_", folder.lower()).strip("_") or ROOT_BUCKET


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(_size(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    try:
        return os.path.getsize(path)
    except OSError:  # a symlink loop or dangling link inside a dataset folder: reading it fails later, by name
        return 0


def scan(root: str, exclude: frozenset[str] = frozenset()) -> tuple[list[Found], list[str]]:
    """The sources under `root` and the files it cannot read, leaving out the paths in `exclude`
    (the config and data root, when they live inside `root`). A top-level directory is a bucket
    (everything under it, at any depth, feeds it); files directly in `root` go to `web`."""
    found: dict[tuple[str, str, str, str], Found] = {}
    ignored: list[str] = []
    # Real paths of the folders walked: a link to one of them (to a parent: a loop) is not walked again.
    folders_seen = {os.path.realpath(root)}

    def visit(path: str, bucket: str) -> None:
        if os.path.abspath(path) in exclude:
            return
        if outside_folder(path, root) is not None:
            # Ingest refuses it too (`ingest/outside_source`): a link out of the folder is not its data.
            ignored.append(os.path.relpath(path, root) + OUTSIDE_NOTE)
            return
        fmt = detect_format(path)
        if fmt is None and os.path.isdir(path):
            if os.path.realpath(path) in folders_seen:
                return
            folders_seen.add(os.path.realpath(path))
            for name in sorted(os.listdir(path)):
                if not name.startswith("."):
                    visit(os.path.join(path, name), bucket)
            return
        # A symlink loop, a dangling link, a FIFO or a device is no input: noted, and its folder still read.
        kind = None if os.path.isdir(path) else not_a_file(path)
        if kind is not None:
            ignored.append(os.path.relpath(path, root) + UNREADABLE_NOTE.format(kind=kind))
            return
        if fmt is None:
            ignored.append(os.path.relpath(path, root))
            return
        folder = os.path.relpath(os.path.dirname(path), root)
        folder = "" if folder == "." else folder
        names = _glob_name(path, fmt)
        entry = found.setdefault((bucket, fmt, folder, names), Found(bucket, fmt, folder, names, root))
        entry.paths.append(path)
        entry.input_bytes += _size(path)

    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith("."):
            continue
        top_level_dir = os.path.isdir(path) and detect_format(path) is None
        visit(path, bucket_name(name) if top_level_dir else ROOT_BUCKET)
    sources = list(found.values())
    for src in sources:
        _merge_compressed(src)
    _name_sources(sources)
    return sources, ignored


def folder_and_format(src: Found) -> str:
    """A source's folder (`web` for DIR itself), dataset name and file extension as a name:
    `man_de_jsonl`, `web_warc_gz`, `stories_hf_hf_dataset`."""
    where = [src.folder or ROOT_BUCKET]
    if input_format(src.fmt).is_folder:
        where.append(os.path.basename(src.paths[0]) + "_" + src.fmt)  # a dataset is one folder: its own source
    else:
        where.append(src.glob_name.strip("*"))
    return bucket_name("_".join(where))


def _name_sources(sources: list[Found]) -> None:
    """`<bucket>` when a bucket has one source; when it has more, each is named after its folder and
    format (`man_de_jsonl`, `man_en_jsonl`), so the names say which is which; a number ends a tie."""
    per_bucket = Counter(s.bucket for s in sources)
    taken: set[str] = set()
    for s in sources:
        base = s.bucket if per_bucket[s.bucket] == 1 else folder_and_format(s)
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        s.name = name
        if "code" in s.bucket:  # code is neither prose nor in a natural language
            s.skip = ["language", "heuristic"]
        elif "math" in s.bucket:  # formulas fail the prose rules
            s.skip = ["heuristic"]


# --------------------------------------------------------------------------------------------------
# Fields of JSONL and tables
# --------------------------------------------------------------------------------------------------


def _pick(candidates: tuple[str, ...], columns: list[str], records: list[dict], kind: type | tuple) -> str | None:
    for name in candidates:
        if name in columns and any(isinstance(r.get(name), kind) for r in records):
            return name
    return None


def _url_column(columns: list[str], records: list[dict], text: str) -> str | None:
    """The first column whose sampled values are nearly all URLs (`scheme://...`), whatever its name."""
    for name in columns:
        values = [r.get(name) for r in records if r.get(name) is not None]
        if name != text and values and sum(isinstance(v, str) and URL_VALUE.match(v) is not None
                                           for v in values) >= URL_SHARE * len(values):
            return name
    return None


def detect_fields(src: Found) -> None:
    """The text, URL and id fields of a JSONL or table source, from a sample of its first input and
    (tables) every input's columns; a source with no text field gets `problem` instead."""
    fmt = input_format(src.fmt)
    if fmt.sample is None:  # WARC: its records carry no fields
        return
    # A table's columns are in its schema, so every input's are read; a record format's, in its first records.
    paths = src.paths if fmt.schemas is not None else src.paths[:1]
    schemas, records = [], []
    for path in paths:
        path = (fmt.inputs([path], src.root) or [path])[0]  # a DatasetDict's first split
        if outside_folder(path, src.root) is not None:
            src.problem = os.path.relpath(path, src.root) + OUTSIDE_NOTE
            return
        try:
            columns, records_read = fmt.sample(path, SAMPLE_RECORDS)
        except Exception as err:  # noqa: BLE001 - an unreadable input is reported, not fatal to init
            src.problem = f"{os.path.basename(path)} could not be read: {type(err).__name__}: {err}"
            return
        schemas.append(columns)
        records += records_read
    # For tables only the columns every file has are safe to name (a missing one stops the file).
    columns = [c for c in schemas[0] if all(c in s for s in schemas)]
    src.columns = columns
    text = _pick(TEXT_FIELDS, columns, records, (str, bytes))
    if text is None:  # the string field with the longest values, if they are long enough to be text
        lengths = {c: sum(len(r[c]) for r in records if isinstance(r.get(c), str)) for c in columns}
        text = max((c for c in lengths if lengths[c] >= MIN_TEXT_CHARS * len(records)), key=lambda c: lengths[c],
                   default=None)
    if text is None:
        differ = len({tuple(c) for c in schemas}) > 1
        src.problem = ("no text column that every file has (" + "; ".join(
            f"{os.path.basename(p)}: {c}" for p, c in list(zip(paths, schemas))[:3]) + ")") if differ \
            else f"no text field found (fields: {columns})"
        return
    src.fields["text_field"] = text
    url = _pick(URL_FIELDS, columns, records, str) or _url_column(columns, records, text)
    if url is not None:
        src.fields["url_field"] = url
    ident = _pick(ID_FIELDS, columns, records, (str, int))
    if ident is not None and ident != text:
        src.fields["id_field"] = ident


# --------------------------------------------------------------------------------------------------
# The sample through the funnel
# --------------------------------------------------------------------------------------------------


def _evenly(paths: list[str], k: int) -> list[str]:
    if len(paths) <= k:
        return paths
    return [paths[round(i * (len(paths) - 1) / (k - 1))] for i in range(k)]


def sample_funnel(src: Found, source_cfg: Any) -> None:
    """Run up to SAMPLE_FILES of the source's inputs through ingest, extraction, language ID (every
    language) and the heuristics, as the graph would, and record each record's language and the rule
    that removed it (`outcomes`) and the clean bytes per language."""
    from refinery.stages import extract, heuristic, ingest, language
    from refinery.config import ExtractConfig, HeuristicConfig
    from refinery.documents import InputShard

    extract_cfg = ExtractConfig()
    lid = language.LanguageFilter.from_config(LanguageConfig(languages="all"))
    rules = heuristic.HeuristicFilter(HeuristicConfig())
    inputs = input_format(src.fmt).inputs(src.paths, src.root)  # a DatasetDict's splits
    sampled = _evenly(inputs, SAMPLE_FILES)
    others = [] if "language" in src.skip else [p for p in inputs if p not in sampled]
    for i, path in enumerate(_evenly(others, LANGUAGE_FILES)):
        shard = InputShard(key=f"{src.name}-languages{i}", source=src.name, bucket=src.bucket, path=path, folder=src.root)
        head = ingest.read_input_shard(shard, source_cfg, extract_cfg).documents.head(LANGUAGE_DOCS_PER_FILE)
        judged = lid.run(extract.Extractor(extract_cfg).run(head).documents).documents
        langs = Counter(judged["language"].drop_nulls().to_list())
        src.other_file_languages.update(langs)
        src.file_languages.append(langs)
    for i, path in enumerate(sampled):
        # With the scanned folder as the source's, a link out of it is an `ingest/outside_source` reject, unread.
        shard = InputShard(key=f"{src.name}-sample{i}", source=src.name, bucket=src.bucket, path=path, folder=src.root)
        stages = [ingest.read_input_shard(shard, source_cfg, extract_cfg)]
        stages.append(extract.Extractor(extract_cfg).run(stages[-1].documents))
        if "language" not in src.skip:
            stages.append(lid.run(stages[-1].documents))
        docs = stages[-1].documents
        for out in stages:  # removed before a language was known
            src.outcomes.update((None, rule) for rule in out.rejects["rule"].to_list())
        removed_by = {}
        if "heuristic" not in src.skip:
            out = rules.run(docs)
            removed_by = dict(zip(out.rejects["doc_id"].to_list(), out.rejects["rule"].to_list()))
            kept = out.documents
            note_removals(src, docs, removed_by)
        else:
            kept = docs
        langs = docs["language"].to_list() if "language" in docs.columns else [None] * docs.height
        src.outcomes.update(zip(langs, (removed_by.get(d) for d in docs["doc_id"].to_list())))
        src.file_languages.append(Counter(lang for lang in langs if lang is not None))
        src.sampled += 1
        src.sample_bytes += _size(path)
        kept_langs = kept["language"].to_list() if "language" in kept.columns else [None] * kept.height
        for lang, size in zip(kept_langs, kept["text"].str.len_bytes().fill_null(0).to_list()):
            src.clean_bytes_by_language[lang] += size


def note_removals(src: Found, docs: Any, removed_by: dict[str, str]) -> None:
    """The text bytes the heuristics judged and those each rule removed, and one removed document's
    URL (else its first line) per rule, for init's note on a costly rule."""
    src.heuristic_bytes += int(docs["text"].str.len_bytes().fill_null(0).sum() or 0)
    for row in docs.filter(docs["doc_id"].is_in(list(removed_by))).select("doc_id", "url", "text").iter_rows():
        doc_id, url, text = row
        rule = removed_by[doc_id]
        src.removed_bytes[rule] += len((text or "").encode())
        first = next((line.strip() for line in (text or "").splitlines() if line.strip()), "")
        src.examples.setdefault(rule, url or first[:EXAMPLE_CHARS])


@dataclass
class LanguageChoice:
    """The languages found in the sample, those kept, and the sampled documents per language before
    and after the heuristics (the sample's retention per language)."""

    found: Counter  # language -> sampled documents language ID gave it
    clean: Counter  # language -> of those, documents the heuristics kept
    kept: list[str]
    # language -> of `found`, documents from the first few of a file outside the sample (no verdict)
    outside: Counter = field(default_factory=Counter)

    def ordered(self) -> list[str]:
        return most_first(self.found)

    def lines(self) -> list[str]:
        """The table of every language found: documents, share, documents clean, kept or left out."""
        total = sum(self.found.values())
        if not total:
            return ["no source's sample went through language ID (or none had a document language ID "
                    f"could name); keeping {', '.join(self.kept)}"]
        out = [f"languages in the {total:,} sampled documents language ID named (fastText lid.176, score >= "
               f"{LanguageConfig().min_score}):"]
        for lang in self.ordered():
            n = self.found[lang]
            if lang in self.kept:
                verdict = "kept"
            elif n < MIN_LANGUAGE_DOCS:
                verdict = f"LEFT OUT: fewer than {MIN_LANGUAGE_DOCS} documents"
            else:
                verdict = (f"LEFT OUT: under {MIN_LANGUAGE_SHARE:.0%} of the sample; no source's or file's "
                           f"main language or {PART_LANGUAGE_SHARE:.0%} of it")
            seen = f" ({self.outside[lang]:,} of them the first of files outside the sample)" if self.outside[lang] else ""
            out.append(f"  {lang:<6}{n:>7,} {n / total:>6.1%}  {self.clean[lang]:>6,} clean after the heuristics  "
                       f"{verdict}{seen}")
        return out


def most_first(counts: Counter) -> list[str]:
    return sorted(counts, key=lambda key: (-counts[key], key))


def keeps_language(n: int, share: float, part_share: float, main_of_a_part: bool) -> bool:
    """The rule init keeps a language by: at least MIN_LANGUAGE_DOCS sampled documents, and
    MIN_LANGUAGE_SHARE of the whole sample, or PART_LANGUAGE_SHARE of one source's sample or one sampled
    file's (`part_share`, the largest), or the main language of one of them."""
    return n >= MIN_LANGUAGE_DOCS and (share >= MIN_LANGUAGE_SHARE or part_share >= PART_LANGUAGE_SHARE
                                       or main_of_a_part)


def choose_languages(sources: list[Found]) -> LanguageChoice:
    """Every language found in the sources' samples and those `keeps_language` keeps, most
    documents first (English when the sample names none)."""
    found: Counter = Counter()
    clean: Counter = Counter()
    outside: Counter = Counter()
    part_share: dict[str, float] = {}
    main_of_a_part: set[str] = set()
    for s in sources:
        for (lang, rule), n in s.outcomes.items():
            if lang is not None:
                found[lang] += n
                clean[lang] += n if rule is None else 0
        found.update(s.other_file_languages)  # seen in files outside the sample: no verdict, so none clean
        outside.update(s.other_file_languages)
        for part in [s.languages, *s.file_languages]:  # the source's sample, then each sampled file
            if part:
                main_of_a_part.add(most_first(part)[0])
            for lang, n in part.items():
                part_share[lang] = max(part_share.get(lang, 0.0), n / sum(part.values()))
    total = sum(found.values())
    kept = [lang for lang in most_first(found)
            if keeps_language(found[lang], found[lang] / total, part_share[lang], lang in main_of_a_part)]
    return LanguageChoice(found, clean, kept or ["en"], outside)


def clean_bytes_estimate(src: Found, languages: list[str]) -> int:
    """The source's clean bytes in the chosen languages, scaled from the sample to all its inputs."""
    if not src.sample_bytes:
        return 0
    kept = sum(b for lang, b in src.clean_bytes_by_language.items() if lang is None or lang in languages)
    return int(kept * src.input_bytes / src.sample_bytes)
