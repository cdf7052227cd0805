"""`refinery lineage`: a token named by shard and offset (refinery/lineage.py), or by a training run's
(step, rank, row, position), which training/token_lineage.py turns into a shard and offset by
replaying the sampler. The command sits here because it joins the two floors.
"""

from __future__ import annotations

import argparse
import sys

from refinery.lineage import CONTEXT_TOKENS, format_lineage, resolve_token
from refinery.lineage_index import LineageError
from refinery.preflight import Needs
from refinery.shard_header import ShardFormatError
from refinery.storage import dumps_json, open_data_root


def run_lineage(args: argparse.Namespace) -> int:
    cfg = args.loaded_config  # the preflight's (refinery/commands/__init__.py), so the YAML is parsed once
    root = open_data_root(cfg.resolve(cfg.data_root))
    shard, offset, trained = args.shard, args.offset, None
    if args.run is not None:
        # The trainer's side (training/token_lineage.py) plans the sampler from the run's nearest
        # checkpoint; imported only here, so a shard-level query stays free of torch.
        from training.token_lineage import TokenLookupError, global_row, locate_token

        if None in (args.step, args.row, args.pos):
            print("refinery lineage: --run needs --step S --row R --pos P (and --rank K under torchrun)", file=sys.stderr)
            return 2
        try:
            row = global_row(cfg, args.run, args.step, args.rank, args.row)
            trained = {"run": args.run, "rank": args.rank, **locate_token(cfg, root, args.step, row, args.pos, args.run)}
        except TokenLookupError as err:
            print(f"refinery lineage: {err}", file=sys.stderr)
            return 2
        shard, offset = trained["shard"], trained["offset"]
    if offset is None:
        print("refinery lineage: --shard needs --offset N (a token offset inside the shard)", file=sys.stderr)
        return 2
    if args.context < 0:
        print(f"refinery lineage: --context {args.context}: give 0 or more tokens", file=sys.stderr)
        return 2
    try:
        result = resolve_token(root, cfg, shard, offset, args.context)
    except (LineageError, ShardFormatError) as err:
        print(f"refinery lineage: {err}", file=sys.stderr)
        return 2
    if trained is not None:
        result = {"trained": trained, **result}
    if args.json:
        sys.stdout.write(dumps_json(result).decode())
    else:
        if trained is not None:
            print(f"trained   {trained['run']} step {trained['step']} (phase {trained['phase']}, seq_len "
                  f"{trained['seq_len']}), rank {trained['rank']} row {args.row} position {trained['pos']}: "
                  f"epoch {trained['epoch']} of bucket {trained['bucket']}")
        print(format_lineage(result))
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `refinery lineage`. The query flags form a mutually exclusive group (`parser.query`),
    so another way to name a token (e.g. a trainer's run/step/rank/row/pos) adds to it."""
    p = subparsers.add_parser(
        "lineage", help="trace a token in a shard back to its document, URL and funnel history",
        description="Trace one token back to where it came from: the shard entry and window holding it, the decoded "
                    "text around it (with the tokenizer the shards were made with), its document's doc_id, URL, input "
                    "file and record, and what every funnel stage recorded about that document. Name the token by "
                    "shard and offset, or by a training run's step, row and position (the sampler is replayed; nothing "
                    "is logged per token).",
        epilog="examples:\n  refinery lineage --config configs/demo.yaml --shard web/shard-00000 --offset 1234\n"
               "  refinery lineage --config configs/demo.yaml --run out/demo/runs/demo/main --step 40 --row 0 --pos 17",
    )
    p.add_argument("--config", required=True, help="the run's YAML config (e.g. configs/demo.yaml)")
    query = p.add_mutually_exclusive_group(required=True)
    query.add_argument("--shard", help="a final shard, <bucket>/shard-NNNNN or shards/final/<bucket>/shard-NNNNN, or one input "
                                       "file's tokenized shard, shards/tokenized/<bucket>/<file>/shard-NNNNN")
    query.add_argument("--run", help="a training run directory: name the token by --step, --row and --pos")
    p.add_argument("--offset", type=int, help="token offset inside --shard")
    p.add_argument("--step", type=int, help="with --run: the optimizer step (1-based, as in metrics.jsonl)")
    p.add_argument("--rank", type=int, default=0, help="with --run: the rank whose batch slice --row counts in")
    p.add_argument("--row", type=int, help="with --run: the row of that rank's batch")
    p.add_argument("--pos", type=int, help="with --run: the position in the row")
    p.add_argument("--context", type=int, default=CONTEXT_TOKENS, metavar="N",
                   help=f"tokens of decoded text shown on each side of the token (default {CONTEXT_TOKENS})")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # Replaying a run's sampler needs its curriculum.
    p.set_defaults(func=run_lineage, needs=lambda args: Needs(curriculum=args.run is not None))
    p.query = query  # type: ignore[attr-defined]
    return p
