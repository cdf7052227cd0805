"""`refinery init DIR`: a commented config for a directory of your own files.

It finds the inputs (WARC, JSONL, Parquet, Hugging Face datasets saved to disk), makes one bucket
per top-level directory (files directly in DIR go to the `web` bucket) and one source per bucket,
format and folder, finds the text, URL and id fields of the tables, and runs a sample of each
source's files through the funnel's own stages (ingest, extraction, language ID, heuristics) to see
how much clean text and which languages the corpus holds. The token budget follows from that
estimate at the demo tokenizer's bytes per token, with a margin for what dedup, PII and the
sampling error take; the curriculum mixes the buckets in proportion to it. The written config is
loaded back before `init` returns, so what it writes is a config every command accepts.

What the config leaves out is said in it and printed: every language found in the sample with its
share (and which were left out by the rule of `keeps_language`), and beside a source, a rule that
removes most of its sample, with the line that switches it.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import yaml

from refinery.config import ConfigError, LanguageConfig, load_config
from refinery.documents import HF_DATASET_DICT, hf_dataset_dirs
from refinery.documents.inputs import outside_folder
from refinery.preflight import not_a_file
from refinery.storage import create_temporary

# Bytes of clean text per token of the demo's tokenizer (byte-level BPE, vocab 4096, trained on the
# sample's clean text by the `tokenizer` asset): 3.37 on data/sample's JSONL text.
DEMO_BYTES_PER_TOKEN = 3.4
DEMO_VOCAB_SIZE = 4096
# The budget is this fraction of the estimated clean tokens: exact and near dedup, PII redaction
# and a sample that is not quite the whole corpus take the rest.
BUDGET_MARGIN = 0.5
SAMPLE_FILES = 3  # per source: the first, middle and last file
ROOT_BUCKET = "web"
# How `scan` marks, among the files it does not read, a symlink whose target is outside the scanned folder.
OUTSIDE_NOTE = " (a symlink out of this folder)"
UNREADABLE_NOTE = " (not a regular file: {kind})"
# A language goes into stages.language.languages when at least MIN_LANGUAGE_DOCS sampled documents are in it
# and it is at least MIN_LANGUAGE_SHARE of the whole sample or SOURCE_LANGUAGE_SHARE of one source's sample.
# A language a folder or file is largely in is one the user put there, however small that source is
# (the 4 English man pages among 564); a few pages of another language inside a source are what a crawl
# picks up along the way, and fewer than MIN_LANGUAGE_DOCS are usually pages language ID got wrong.
MIN_LANGUAGE_DOCS = 3
MIN_LANGUAGE_SHARE = 0.1
SOURCE_LANGUAGE_SHARE = 0.25
# A rule that removes at least this share of a source's sampled documents is named beside the source.
MOST_OF_SAMPLE = 0.5
UNWANTED_LANGUAGE = "language/unwanted_language"
TEXT_FIELDS = ("text", "content", "body", "document", "raw_content", "article", "markdown", "passage", "code")
URL_FIELDS = ("url", "link", "source_url", "uri", "href")
ID_FIELDS = ("id", "doc_id", "document_id", "uid", "uuid", "_id", "guid")
MIN_TEXT_CHARS = 40  # mean characters of a field that is not called text-like but is taken as the text
SAMPLE_RECORDS = 200  # records read per table to find its fields
# The trainer's step is micro_batch_size (4) x seq_len tokens; phases are whole steps.
MICRO_BATCH_SIZE = 4
LONG_SEQ_LEN, SHORT_SEQ_LEN = 512, 128
LONG_SEQ_MIN_TOKENS = 100_000  # below this a 512-token step leaves too few steps to train on
CONFIG_NAME = "refinery.yaml"


EXTENSIONS = {"warc": (".warc.gz", ".warc"), "jsonl": (".jsonl.gz", ".jsonl", ".ndjson.gz", ".ndjson"),
              "parquet": (".parquet",)}


def detect_format(path: str) -> str | None:
    """The source format of one path, or None when it is none Refinery reads."""
    if os.path.isdir(path):
        is_dataset = any(os.path.isfile(os.path.join(path, f)) for f in ("state.json", HF_DATASET_DICT))
        return "hf_dataset" if is_dataset else None
    name = os.path.basename(path).lower()
    return next((fmt for fmt, exts in EXTENSIONS.items() if name.endswith(exts)), None)


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
    """Files of one extension share a source (`*.jsonl.gz`); a dataset is a source of its own."""
    name = os.path.basename(path)
    if fmt == "hf_dataset":
        return glob.escape(name)
    ext = next(e for e in EXTENSIONS[fmt] if name.lower().endswith(e))
    return "*" + glob.escape(name[len(name) - len(ext):])


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
    _name_sources(sources)
    return sources, ignored


def folder_and_format(src: Found) -> str:
    """A source's folder (`web` for DIR itself), dataset name and file extension as a name:
    `man_de_jsonl`, `web_warc_gz`, `stories_hf_hf_dataset`."""
    where = [src.folder or ROOT_BUCKET]
    if src.fmt == "hf_dataset":
        where.append(os.path.basename(src.paths[0]) + "_hf_dataset")  # a dataset is one folder: its own source
    else:
        where.append(src.glob_name.removeprefix("*"))
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


def _sample_records(path: str, fmt: str) -> tuple[list[str], list[dict]]:
    """The columns (tables: every file's schema; JSONL: the keys seen) and some records."""
    if fmt == "jsonl":
        with open(path, "rb") as f:
            opener = gzip.open if f.read(2) == b"\x1f\x8b" else open
        records = []
        with opener(path, "rb") as f:
            for line in f:
                if len(records) >= SAMPLE_RECORDS:
                    break
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    records.append(obj)
        return sorted({k for r in records for k in r}), records
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt == "parquet":
        pf = pq.ParquetFile(path)
        batch = next(pf.iter_batches(batch_size=SAMPLE_RECORDS), None)
        return pf.schema_arrow.names, batch.to_pylist() if batch is not None else []
    with open(os.path.join(path, "state.json")) as f:
        first = json.load(f)["_data_files"][0]["filename"]
    if outside_folder(os.path.join(path, first), path) is not None:
        raise ValueError(f"{first} is a symlink out of the dataset's folder")  # ingest refuses it unread
    with pa.memory_map(os.path.join(path, first)) as source:
        reader = pa.ipc.open_stream(source)
        batch = next(iter(reader), None)
        return reader.schema.names, batch.to_pylist()[:SAMPLE_RECORDS] if batch is not None else []


def _pick(candidates: tuple[str, ...], columns: list[str], records: list[dict], kind: type | tuple) -> str | None:
    for name in candidates:
        if name in columns and any(isinstance(r.get(name), kind) for r in records):
            return name
    return None


def detect_fields(src: Found) -> None:
    """The text, URL and id fields of a JSONL or table source, from a sample of its first input and
    (tables) every input's columns; a source with no text field gets `problem` instead."""
    if src.fmt == "warc":
        return
    paths = src.paths if src.fmt != "jsonl" else src.paths[:1]
    schemas, records = [], []
    for path in paths:
        if src.fmt == "hf_dataset" and os.path.isfile(os.path.join(path, HF_DATASET_DICT)):
            with open(os.path.join(path, HF_DATASET_DICT)) as f:
                path = os.path.join(path, json.load(f)["splits"][0])
        if outside_folder(path, src.root) is not None:
            src.problem = os.path.relpath(path, src.root) + OUTSIDE_NOTE
            return
        try:
            columns, sample = _sample_records(path, src.fmt)
        except Exception as err:  # noqa: BLE001 - an unreadable input is reported, not fatal to init
            src.problem = f"{os.path.basename(path)} could not be read: {type(err).__name__}: {err}"
            return
        schemas.append(columns)
        records += sample
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
    url = _pick(URL_FIELDS, columns, records, str)
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
    inputs = hf_dataset_dirs(src.paths, src.root) if src.fmt == "hf_dataset" else src.paths  # a DatasetDict's splits
    for i, path in enumerate(_evenly(inputs, SAMPLE_FILES)):
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
        else:
            kept = docs
        langs = docs["language"].to_list() if "language" in docs.columns else [None] * docs.height
        src.outcomes.update(zip(langs, (removed_by.get(d) for d in docs["doc_id"].to_list())))
        src.sampled += 1
        src.sample_bytes += _size(path)
        kept_langs = kept["language"].to_list() if "language" in kept.columns else [None] * kept.height
        for lang, size in zip(kept_langs, kept["text"].str.len_bytes().fill_null(0).to_list()):
            src.clean_bytes_by_language[lang] += size


@dataclass
class LanguageChoice:
    """The languages found in the sample, those kept, and the sampled documents per language before
    and after the heuristics (the sample's retention per language)."""

    found: Counter  # language -> sampled documents language ID gave it
    clean: Counter  # language -> of those, documents the heuristics kept
    kept: list[str]

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
                verdict = (f"LEFT OUT: under {MIN_LANGUAGE_SHARE:.0%} of the sample, under "
                           f"{SOURCE_LANGUAGE_SHARE:.0%} of any source's")
            out.append(f"  {lang:<6}{n:>7,} {n / total:>6.1%}  {self.clean[lang]:>6,} clean after the heuristics  {verdict}")
        return out


def most_first(counts: Counter) -> list[str]:
    return sorted(counts, key=lambda key: (-counts[key], key))


def keeps_language(n: int, share: float, source_share: float) -> bool:
    """The rule init keeps a language by: MIN_LANGUAGE_DOCS, MIN_LANGUAGE_SHARE, SOURCE_LANGUAGE_SHARE."""
    return n >= MIN_LANGUAGE_DOCS and (share >= MIN_LANGUAGE_SHARE or source_share >= SOURCE_LANGUAGE_SHARE)


def choose_languages(sources: list[Found]) -> LanguageChoice:
    """Every language found in the sources' samples and those `keeps_language` keeps, most
    documents first (English when the sample names none)."""
    found: Counter = Counter()
    clean: Counter = Counter()
    source_share: dict[str, float] = {}
    for s in sources:
        for (lang, rule), n in s.outcomes.items():
            if lang is not None:
                found[lang] += n
                clean[lang] += n if rule is None else 0
        in_source = s.languages
        for lang, n in in_source.items():
            source_share[lang] = max(source_share.get(lang, 0.0), n / sum(in_source.values()))
    total = sum(found.values())
    kept = [lang for lang in most_first(found) if keeps_language(found[lang], found[lang] / total, source_share[lang])]
    return LanguageChoice(found, clean, kept or ["en"])


def clean_bytes_estimate(src: Found, languages: list[str]) -> int:
    """The source's clean bytes in the chosen languages, scaled from the sample to all its inputs."""
    if not src.sample_bytes:
        return 0
    kept = sum(b for lang, b in src.clean_bytes_by_language.items() if lang is None or lang in languages)
    return int(kept * src.input_bytes / src.sample_bytes)


# --------------------------------------------------------------------------------------------------
# The curriculum
# --------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    total: int
    seq_len: int
    phases: list[tuple[str, int]]  # (name, tokens)
    weights: dict[str, float]  # bucket -> weight, summing to 1


def plan_curriculum(bucket_tokens: dict[str, int]) -> Plan:
    """Two phases in whole optimizer steps: `main` (90%) and `anneal` (10%), every bucket weighted
    by its share of the estimated tokens; the budget is BUDGET_MARGIN of the estimate."""
    estimate = sum(bucket_tokens.values())
    budget = int(estimate * BUDGET_MARGIN)
    seq_len = LONG_SEQ_LEN if budget >= LONG_SEQ_MIN_TOKENS else SHORT_SEQ_LEN
    step = MICRO_BATCH_SIZE * seq_len
    anneal = max(1, int(budget * 0.1) // step) * step
    main = max(1, (budget - anneal) // step) * step
    if main + anneal > budget:
        raise ConfigError(
            f"the inputs hold about {estimate:,} clean tokens (sampled), too few for a curriculum of two phases of "
            f"{step:,}-token steps; add data, or write the curriculum by hand (docs/curriculum.md)"
        )
    fed = {b: t for b, t in bucket_tokens.items() if t > 0}
    raw = {b: t / sum(fed.values()) for b, t in fed.items()}
    # Round down to three places, so no bucket is asked for more than its share; the last takes the rest.
    weights = {b: math.floor(w * 1000) / 1000 for b, w in raw.items()}
    last = max(weights, key=lambda b: (raw[b], b))
    weights[last] = round(1 - sum(w for b, w in weights.items() if b != last), 3)
    return Plan(main + anneal, seq_len, [("main", main), ("anneal", anneal)], weights)


# --------------------------------------------------------------------------------------------------
# Writing the config
# --------------------------------------------------------------------------------------------------


def _flow(value: Any) -> str:
    """One YAML flow value, quoted where YAML would misread it (a `no` stays a string)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip().removesuffix("\n...")


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def sample_notes(src: Found, languages: list[str]) -> list[str]:
    """What the run would remove from the source's sample: the three rules that remove most, and for
    a rule that removes MOST_OF_SAMPLE or more, the switch that keeps those documents."""
    from refinery.config import HeuristicConfig

    total = src.sample_records
    removed = src.removed_by_rule(languages)
    clean = total - sum(removed.values())
    lines = [f"{src.sampled} of {len(src.paths)} input(s) sampled through the funnel: {clean:,} of {total:,} "
             f"records clean under this config"]
    rules = most_first(removed)
    if rules:
        lines[0] += "; removed by " + ", ".join(f"{rule} {removed[rule]:,}" for rule in rules[:3]) + (
            f" and {len(rules) - 3} more rule(s)" if len(rules) > 3 else "")
    for rule in rules:
        n = removed[rule]
        if n < MOST_OF_SAMPLE * total:
            break
        said = f"{rule} removes {n:,} of the {total:,} sampled records ({n / total:.0%})"
        if rule == UNWANTED_LANGUAGE:
            others = sorted(lang for lang in src.languages if lang not in languages)
            lines.append(f"{said}: they are in {', '.join(others)}, left out of stages.language.languages; "
                         f"add {'them' if len(others) > 1 else 'it'} there to keep them")
        elif rule in HeuristicConfig().rule_names():
            lines.append(f"{said}; if that is how these documents are meant to look (documentation, code), "
                         f"switch it off for this source with  rules_off: [{rule}]")
        elif rule == "language/low_score":
            lines.append(f"{said}; lower stages.language.min_score, or give this source  skip: [language]")
        else:
            lines.append(said)
    return lines


def render(root: str, config_dir: str, config_display: str, data_root: str, sources: list[Found], ignored: list[str],
           choice: LanguageChoice, bucket_tokens: dict[str, int], plan: Plan,
           quality: tuple[list[str], list[str]] | None) -> str:
    languages = choice.kept
    rel_root = os.path.relpath(root, config_dir)
    buckets = list(dict.fromkeys(s.bucket for s in sources))
    lines = [
        f"# Written by `refinery init {root}`: a first config for the files there. Read it, change what does not",
        "# fit, then materialize the whole graph with",
        f"#   refinery demo --config {config_display}",
        "# docs/config.md describes every field. Relative paths resolve against this file's folder.",
        "seed: 0",
        f"data_root: {_flow(data_root)}  # every table, shard, manifest and checkpoint of the run goes here",
        "",
        f"# One bucket per top-level directory of {rel_root}; files directly in it go to the `{ROOT_BUCKET}` bucket.",
        f"buckets: {_flow(buckets)}",
        "",
        "sources:",
    ]
    for s in sources:
        files = f"{len(s.paths)} {'dataset' if s.fmt == 'hf_dataset' else 'file'}{'s' if len(s.paths) != 1 else ''}"
        lines.append(f"  # {s.name}: {files} in {s.describe_folder()}, {_human(s.input_bytes)} of {s.fmt}" + (
            f"; fields {s.columns}" if s.columns else ""))
        if s.problem is not None:
            lines.append(f"  # NOT USED: {s.problem}; give text_field and uncomment it:")
        elif s.sampled:
            est = clean_bytes_estimate(s, languages)
            lines += [f"  # {line}" for line in sample_notes(s, languages)]
            lines.append(f"  # The whole source: about {_human(est)} of clean text, ~{int(est / DEMO_BYTES_PER_TOKEN):,} tokens")
        if s.skip:
            lines.append(f"  # `{s.bucket}` is not web prose: it skips {' and '.join(s.skip)}.")
        entry = {"name": s.name, "path": s.pattern(rel_root),
                 "format": s.fmt, "bucket": s.bucket, **s.fields}
        if s.skip:
            entry["skip"] = s.skip
        lines.append(f"  {'# ' if s.problem else ''}- {_flow(entry)}")
    unreadable_at = UNREADABLE_NOTE.split("{")[0]
    unreadable = [i.replace(unreadable_at, " (") for i in ignored if unreadable_at in i]
    unknown = [i for i in ignored if not i.endswith(OUTSIDE_NOTE) and unreadable_at not in i]
    outside = [i.removesuffix(OUTSIDE_NOTE) for i in ignored if i.endswith(OUTSIDE_NOTE)]
    for names, why in ((unknown, "no format Refinery knows"), (outside, "symlinks out of this folder"),
                       (unreadable, "not regular files; a source whose glob matches one is refused by the run")):
        if names:
            shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
            lines.append(f"  # Not read ({why}): {shown}")
    count = max(1, min(64, math.ceil(max(len(s.paths) for s in sources) / 16)))
    lines += [
        "",
        "# The per-document stages run on batches of input files, `count` per source (a file's batch never",
        "# changes when files are added); `workers` processes share a batch's files.",
        "partitions:",
        "  by: hash",
        f"  count: {count}",
        "  workers: 1",
        "",
        "stages:",
        "  language:",
        *(f"    # {line}" for line in choice.lines()),
        f"    # Kept: a language of at least {MIN_LANGUAGE_DOCS} sampled documents that is {MIN_LANGUAGE_SHARE:.0%} "
        f"of them or {SOURCE_LANGUAGE_SHARE:.0%} of one source's:",
        "    # a source largely in a language was put there for it; a few pages of another language inside a",
        f"    # source are what a crawl picks up, and fewer than {MIN_LANGUAGE_DOCS} are usually language ID's "
        "mistakes. Add a",
        "    # language LEFT OUT to keep its documents, or write `all` to keep every one.",
        f"    languages: {_flow(languages)}",
        f"    min_score: {LanguageConfig().min_score}",
        "  quality:",
    ]
    if quality is None:
        lines += ["    # A classifier needs curated buckets (positive) and raw web (negative); here there is no such",
                  "    # pair, so documents are not scored and no phase keeps only the best of a bucket.",
                  "    enabled: false"]
    else:
        lines += ["    # Trained in the pipeline: curated buckets positive, raw web negative. It scores every document",
                  "    # (threshold 0 drops none); the anneal phase keeps the better half of each bucket.",
                  f"    positive_buckets: {_flow(quality[0])}",
                  f"    negative_buckets: {_flow(quality[1])}"]
    lines += [
        "  # stages.custom_filters plugs filters of your own in (docs/custom_filters.md).",
        "",
        "tokenizer:",
        "  # A byte-level BPE trained on the clean corpus, as the demo's (whose bytes per token the budget uses).",
        f"  vocab_size: {DEMO_VOCAB_SIZE}",
        "",
        "shards:",
        f"  max_seq_len: {plan.seq_len}  # the packing window: the longest phase seq_len",
        f"  overlap: {plan.seq_len // 8}",
        "",
    ]
    estimate = sum(bucket_tokens.values())
    lines += [
        f"# The budget: the sample's clean text scaled to every input, about {estimate:,} tokens at the demo",
        f"# tokenizer's {DEMO_BYTES_PER_TOKEN} bytes per token (per bucket: "
        + ", ".join(f"{b} {t:,}" for b, t in bucket_tokens.items()) + "),",
        f"# times {BUDGET_MARGIN} for what dedup and PII take, in whole steps of training.micro_batch_size x seq_len",
        f"# = {MICRO_BATCH_SIZE} x {plan.seq_len} tokens. Buckets are mixed as they come; `refinery validate --config",
        f"# {config_display}` checks the plan against the real inventory once the shards exist (docs/curriculum.md).",
        "curriculum:",
        f"  total_tokens: {plan.total}",
        "  phases:",
    ]
    for name, tokens in plan.phases:
        phase = {"name": name, "tokens": tokens, "seq_len": plan.seq_len, "weights": plan.weights}
        if name == "anneal" and quality is not None:
            phase["quality_top_fraction"] = 0.5
        lines.append(f"    - {_flow(phase)}")
    lines += [
        "",
        "training:",
        f"  micro_batch_size: {MICRO_BATCH_SIZE}",
        "  run_dir: runs/main  # relative to data_root",
        "",
        "# Eval sets to scan every phase's documents for (word 13-grams) before it trains:",
        "# contamination: {eval_sets: [{name: my_eval, path: evals/my_eval.jsonl}]}",
        "",
    ]
    return "\n".join(lines)


def write_config(root: str, config_path: str, data_root: str | None = None, force: bool = False,
                 log: Any = print) -> str:
    """Scan `root`, sample it, write the config to `config_path` and load it back; returns its text."""
    from refinery.config import SourceConfig

    if not os.path.isdir(root):
        raise ConfigError(f"{root}: not a directory; give the folder that holds your WARC, JSONL, Parquet or "
                          "Hugging Face dataset files")
    if os.path.exists(config_path) and not force:
        raise ConfigError(f"{config_path} exists; pass --force to overwrite it, or --config to write elsewhere")
    root = os.path.abspath(root)
    config_dir = os.path.dirname(os.path.abspath(config_path))
    out = os.path.abspath(data_root) if data_root else os.path.join(config_dir, "refinery-out")
    sources, ignored = scan(root, frozenset({out, os.path.abspath(config_path)}))
    if not sources:
        raise ConfigError(f"{root}: no WARC, JSONL, Parquet or Hugging Face dataset inputs found"
                          + (f" (not read: {', '.join(ignored[:5])})" if ignored else ""))
    for s in sources:
        detect_fields(s)
        if s.problem is None:
            log(f"sampling {s.name}: {min(len(s.paths), SAMPLE_FILES)} of {len(s.paths)} input(s) through the funnel")
            try:
                sample_funnel(s, SourceConfig(name=s.name, path=s.glob_name, format=s.fmt, bucket=s.bucket, **s.fields))
            except (ValueError, OSError) as err:  # an input the run would refuse too (a missing column, a bad dataset)
                s.problem = f"reading a sample failed: {err}"
    usable = [s for s in sources if s.problem is None]
    if not usable:
        raise ConfigError(f"{root}: no input has a text field: " + "; ".join(f"{s.name}: {s.problem}" for s in sources))
    choice = choose_languages(usable)
    languages = choice.kept
    for line in choice.lines():
        log(line)
    for s in usable:
        if s.sampled:
            for line in sample_notes(s, languages)[1:]:
                log(f"{s.name}: {line}")
    bucket_tokens: dict[str, int] = {}
    for s in sources:
        est = clean_bytes_estimate(s, languages) if s.problem is None else 0
        bucket_tokens[s.bucket] = bucket_tokens.get(s.bucket, 0) + int(est / DEMO_BYTES_PER_TOKEN)
    plan = plan_curriculum(bucket_tokens)
    # Curated prose is the classifier's positive class; code and maths (which skip the prose rules) are not prose.
    curated = sorted({s.bucket for s in usable if not s.skip and s.bucket != ROOT_BUCKET} & set(plan.weights))
    quality = (curated, [ROOT_BUCKET]) if ROOT_BUCKET in plan.weights and curated else None
    text = render(root, config_dir, os.path.relpath(config_path), os.path.relpath(out, config_dir), sources, ignored,
                  choice, bucket_tokens, plan, quality)
    os.makedirs(config_dir, exist_ok=True)
    fd, tmp = create_temporary(config_dir, ".refinery-init-", ".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    try:
        load_config(tmp)  # what init writes, every command must accept
    except ConfigError:
        os.unlink(tmp)
        raise
    os.replace(tmp, config_path)
    return text


def run_init(args: argparse.Namespace) -> int:
    from refinery import preflight

    write_config(args.dir, args.config, args.out, args.force)
    preflight.require(args.config, preflight.GRAPH)  # what `refinery demo` will check, said now
    print(f"wrote {args.config}; materialize the whole graph with\n  refinery demo --config {args.config}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "init", help="write a commented config for a directory of your own files (formats, buckets, budget)",
        description="Write a commented config for DIR: one bucket per top-level directory (files directly in DIR "
        "go to `web`), one source per bucket, format and folder, the text fields of JSONL and tables, the "
        "languages found (every one with its share, and which it left out) and a token budget estimated "
        "from a sample run through the funnel's stages; beside a source, a rule that removes most of its "
        "sample, with the `rules_off` line that switches it. The "
        "written config then goes through the same preflight as `refinery demo`, so what it prints is what "
        "will run; edit the commented fields (languages, budget, phases) before materializing.",
        epilog="examples:\n  refinery init ~/corpus --config corpus.yaml\n  refinery demo --config corpus.yaml")
    p.add_argument("dir", metavar="DIR", help="the folder of WARC(.gz), JSONL(.gz), Parquet files and HF datasets")
    p.add_argument("--config", default=CONFIG_NAME, help=f"the config to write (default {CONFIG_NAME})")
    p.add_argument("--out", default=None, help="the data root (default: refinery-out beside the config)")
    p.add_argument("--force", action="store_true", help="overwrite an existing config")
    p.set_defaults(func=run_init)
