"""The tokenizer.json file: parsing it, reading it from a local path or from the data root (where the
`tokenizer` asset writes it), and the error either raises.

Kept apart from refinery/stages/tokenize.py, which trains tokenizers and packs shards over polars
tables, so that a reader of the file alone (a `refinery lineage` query decoding its text window)
imports only `tokenizers`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from refinery.layout import TOKENIZER_KEY

if TYPE_CHECKING:
    from refinery.storage import DataRoot


class TokenizeError(ValueError):
    """A tokenizer or token shard that cannot be built or read as configured."""


def parse_tokenizer(data: str, eod_token: str, origin: str):
    """A tokenizer from tokenizer.json text; it must know `eod_token`."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(data)
    except Exception as err:  # the Rust side raises a bare Exception on malformed JSON
        raise TokenizeError(f"{origin}: not a valid tokenizer.json: {err}") from None
    if tok.token_to_id(eod_token) is None:
        raise TokenizeError(
            f"{origin}: the tokenizer has no {eod_token!r} token; set tokenizer.eod_token to its "
            f"end-of-document token, or add that special token to the tokenizer"
        )
    return tok


def load_tokenizer_file(path: str, eod_token: str):
    p = Path(path)
    if not p.is_file():
        raise TokenizeError(f"{p}: tokenizer.path names no file; give a local tokenizer.json (nothing is downloaded)")
    return parse_tokenizer(p.read_text(), eod_token, str(p))


def read_tokenizer(root: DataRoot, eod_token: str):
    if not root.exists(TOKENIZER_KEY):
        raise TokenizeError(f"{root.display(TOKENIZER_KEY)}: no tokenizer; materialize the `tokenizer` asset first")
    return parse_tokenizer(root.read_bytes(TOKENIZER_KEY).decode(), eod_token, root.display(TOKENIZER_KEY))
