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
share (and which were left out by the rule of `keeps_language`), and beside a source, every rule that
removes 10% or more of its sampled documents or bytes (COSTLY_SHARE), with the line that switches it
and one document it removed.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Any

import yaml

from refinery.commands.init_sources import (MIN_LANGUAGE_DOCS, MIN_LANGUAGE_SHARE, COSTLY_SHARE, OUTSIDE_NOTE,
                                            PART_LANGUAGE_SHARE, ROOT_BUCKET, SAMPLE_FILES, UNREADABLE_NOTE,
                                            UNWANTED_LANGUAGE, Found, LanguageChoice, choose_languages,
                                            clean_bytes_estimate, detect_fields, most_first, sample_funnel, scan)
from refinery.config import ConfigError, LanguageConfig, load_config
from refinery.stages.readers import input_format
from refinery.storage import create_temporary
from refinery.throughput import DEMO_BYTES_PER_TOKEN

DEMO_VOCAB_SIZE = 4096
# The budget is this fraction of the estimated clean tokens: exact and near dedup, PII redaction
# and a sample that is not quite the whole corpus take the rest.
BUDGET_MARGIN = 0.5
# The trainer's step is micro_batch_size (4) x seq_len tokens; phases are whole steps.
MICRO_BATCH_SIZE = 4
LONG_SEQ_LEN, SHORT_SEQ_LEN = 512, 128
LONG_SEQ_MIN_TOKENS = 100_000  # below this a 512-token step leaves too few steps to train on
CONFIG_NAME = "refinery.yaml"


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
    a rule that removes COSTLY_SHARE or more of its documents or of the bytes the heuristics judged, the
    switch that keeps those documents and one of them (its URL, else its first line)."""
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
        n, size = removed[rule], src.removed_bytes[rule]
        by_bytes = src.heuristic_bytes > 0 and size >= COSTLY_SHARE * src.heuristic_bytes
        if n < COSTLY_SHARE * total and not by_bytes:
            continue
        said = f"{rule} removes {n:,} of the {total:,} sampled records ({n / total:.0%})"
        if size:
            said += f", {size / src.heuristic_bytes:.0%} of the bytes the heuristics judged"
        if rule in src.examples:
            said += f", e.g. {src.examples[rule]}"
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
        files = f"{len(s.paths)} {'dataset' if input_format(s.fmt).is_folder else 'file'}{'s' if len(s.paths) != 1 else ''}"
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
        f"of them, or the main language or {PART_LANGUAGE_SHARE:.0%} of one source's or sampled file's:",
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
        lines += ["    # Trained in the pipeline: curated buckets positive, raw web negative, with the real documentation,",
                  "    # low-value pages and spam Refinery ships (shipped_labelled_pages), so that it ranks pages within",
                  "    # web too. It scores every document (threshold 0 drops none); the anneal phase keeps the better",
                  "    # half of each bucket's tokens.",
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
        "  # relative to data_root; each phase trains in a folder of its own, runs/curriculum/<phase>",
        "  run_dir: runs/curriculum",
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
        "from a sample run through the funnel's stages; beside a source, every rule that removes 10% or "
        "more of its sampled documents or bytes, with the `rules_off` line that switches it and one document it "
        "removed. The "
        "written config then goes through the same preflight as `refinery demo`, so what it prints is what "
        "will run; edit the commented fields (languages, budget, phases) before materializing.",
        epilog="examples:\n  refinery init ~/corpus --config corpus.yaml\n  refinery demo --config corpus.yaml")
    p.add_argument("dir", metavar="DIR", help="the folder of WARC(.gz), JSONL(.gz), Parquet files and HF datasets")
    p.add_argument("--config", default=CONFIG_NAME, help=f"the config to write (default {CONFIG_NAME})")
    p.add_argument("--out", default=None, help="the data root (default: refinery-out beside the config)")
    p.add_argument("--force", action="store_true", help="overwrite an existing config")
    p.set_defaults(func=run_init)
