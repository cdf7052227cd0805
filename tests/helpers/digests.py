"""Content digests that compare two data roots written by runs of the same config."""

from __future__ import annotations

import hashlib
import json
from typing import Iterable

from refinery.commands.compare import strip_timing  # timing fields: all two runs of one config may disagree on


def digests(items: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    """name -> sha256 of its bytes; a JSON file is hashed without its timing fields."""
    out = {}
    for name, data in items:
        if name.endswith(".json"):
            data = json.dumps(strip_timing(json.loads(data)), sort_keys=True).encode()
        out[name] = hashlib.sha256(data).hexdigest()
    return out


def dropped_by(listing: dict[str, str], key: str) -> bool:
    """Whether `key` is a file of a store that the root `listing` describes dropped once read: the
    marker refinery/dropped.py leaves is there (beside a sketches file, or in a token series' folder)."""
    markers = (key.removesuffix(".parquet") + ".dropped.json", key.rsplit("/", 1)[0] + "/dropped.json")
    return key not in listing and any(m in listing for m in markers)
