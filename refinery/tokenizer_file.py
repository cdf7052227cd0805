"""The tokenizer.json file: parsing it, reading it from a local path or from the data root (where the
`tokenizer` asset writes it), and the error either raises.

Kept apart from refinery/global_steps/tokenize.py, which trains tokenizers and packs shards over polars
tables, so that a reader of the file alone (a `refinery lineage` query decoding its text window)
imports only `tokenizers`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

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


class ByteLevelDecoder:
    """Token ids to text exactly as a byte-level BPE tokenizer's `decode(ids, skip_special_tokens=False)`
    gives it (ids it does not know are skipped, as there): the id -> token table of tokenizer.json
    (model vocabulary, then added tokens) and the library's own ByteLevel decoder, without building
    the model and its merges. A `refinery lineage` query decodes a few dozen tokens; building the
    whole tokenizer cost it 0.1-0.2 s (bench/RESULTS.md)."""

    def __init__(self, tokens: dict[int, str]):
        from tokenizers import decoders

        self.tokens = tokens
        self.decoder = decoders.ByteLevel()

    @classmethod
    def from_json(cls, spec: dict) -> "ByteLevelDecoder | None":
        """The decoder of a parsed tokenizer.json, or None when it is not byte-level BPE."""
        if (spec.get("decoder") or {}).get("type") != "ByteLevel" or (spec.get("model") or {}).get("type") != "BPE":
            return None
        tokens = {i: t for t, i in spec["model"]["vocab"].items()}
        tokens.update({a["id"]: a["content"] for a in spec.get("added_tokens") or ()})
        return cls(tokens)

    def decode(self, ids: list[int]) -> str:
        return self.decoder.decode([self.tokens[i] for i in ids if i in self.tokens])


def read_decoder(root: DataRoot, eod_token: str) -> Callable[[list[int]], str]:
    """`decode(ids) -> str` for the data root's tokenizer, special tokens kept: a `ByteLevelDecoder`'s
    for a byte-level BPE tokenizer (the pipeline trains one), else the whole parsed tokenizer's."""
    import json

    if not root.exists(TOKENIZER_KEY):
        read_tokenizer(root, eod_token)  # raises its error
    text = root.read_bytes(TOKENIZER_KEY).decode()
    try:
        spec = json.loads(text)
        fast = ByteLevelDecoder.from_json(spec) if isinstance(spec, dict) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        fast = None  # the library's parse below says what is wrong with the file
    if fast is not None and eod_token in fast.tokens.values():
        return fast.decode
    tok = parse_tokenizer(text, eod_token, root.display(TOKENIZER_KEY))
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def read_tokenizer(root: DataRoot, eod_token: str):
    if not root.exists(TOKENIZER_KEY):
        raise TokenizeError(f"{root.display(TOKENIZER_KEY)}: no tokenizer; materialize the `tokenizer` asset first")
    return parse_tokenizer(root.read_bytes(TOKENIZER_KEY).decode(), eod_token, root.display(TOKENIZER_KEY))
