"""Would pii_redacted pay as edits over extracted_text (issue 49, item 1)? On a materialized data root:
the bytes of `documents/pii_redacted` (the clean text, stored whole) against the attribute table the
same documents would be (doc_id, its text edits as spans over quality_scored's text, the columns it
adds, quality_score among them since redaction re-scores what it changed), and what each of its readers would pay per read: the whole text table read against the text
rebuilt through the attribute chain (extracted_text's text and every attribute table after it,
`stage_batches`), in CPU seconds, best of `--repeats`, the two alternating.

    python bench/pii_edits.py --config configs/demo.yaml [--repeats 5]
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import io  # noqa: E402
import time  # noqa: E402

import polars as pl  # noqa: E402

from refinery.config import load_config  # noqa: E402
from refinery.documents import CLEAN_STAGE, input_shards  # noqa: E402
from refinery.layout import documents_key  # noqa: E402
from refinery.stages.attributes import READ_ROWS, attribute_rows, read_stage_documents, stage_batches  # noqa: E402
from refinery.stages import registry  # noqa: E402
from refinery.storage import open_data_root, write_parquet_file  # noqa: E402

UPSTREAM = registry.funnel_stage(CLEAN_STAGE).upstream
RESCORED = "quality_score"


def cpu() -> float:
    return time.process_time()


def read_whole(root, parts: list[str]) -> int:
    return sum(pl.read_parquet(root.local_path(documents_key(CLEAN_STAGE, p)))["text"].str.len_bytes().sum() or 0
               for p in parts)


def read_chain(root, parts: list[str]) -> int:
    return sum(batch["text"].str.len_bytes().sum() or 0 for p in parts for batch in stage_batches(root, UPSTREAM, p, READ_ROWS))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cfg = load_config(args.config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    parts = [s.key for s in input_shards(cfg) if root.exists(documents_key(CLEAN_STAGE, s.key))]
    whole = edits = changed = docs = 0
    for part in parts:
        kept = pl.read_parquet(root.local_path(documents_key(CLEAN_STAGE, part)))
        # Redaction re-scores the text it changed: as an attribute table, quality_score is a column it adds.
        upstream = read_stage_documents(root, UPSTREAM, part).drop(RESCORED)
        kept = kept.select(*upstream.columns, *(c for c in kept.columns if c not in upstream.columns))
        rows = attribute_rows(CLEAN_STAGE, upstream, kept)
        buf = io.BytesIO()
        write_parquet_file(rows, buf)
        whole += root.local_path(documents_key(CLEAN_STAGE, part)).stat().st_size
        edits += len(buf.getvalue())
        docs += kept.height
        changed += int(rows.select(pl.col(c).is_not_null().sum() for c in rows.columns if c.startswith("text")).max_horizontal().item() or 0)
    times = {"whole": [], "chain": []}
    for _ in range(args.repeats):
        for name, read in (("whole", read_whole), ("chain", read_chain)):
            t0 = cpu()
            read(root, parts)
            times[name].append(cpu() - t0)
    best = {k: min(v) for k, v in times.items()}
    print(f"{docs} clean documents in {len(parts)} files, {changed} with text edits by pii_redacted")
    print(f"documents/pii_redacted: {whole:,} B stored whole; as an attribute table: {edits:,} B "
          f"({edits / whole:.3f}x)")
    print(f"a read of the clean text: {best['whole']:.3f} CPU-s whole, {best['chain']:.3f} CPU-s through the attribute "
          f"chain from extracted_text ({best['chain'] / best['whole']:.1f}x), best of {args.repeats}")


if __name__ == "__main__":
    main()
