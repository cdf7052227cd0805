"""Content digests that compare two data roots written by runs of the same config."""

from __future__ import annotations

import hashlib
import json
from typing import Iterable

# Timing fields are the only thing allowed to differ between two runs of the same config.
TIMING_FIELDS = {"wall_s", "docs_per_s", "tokens_per_s", "elapsed_s", "started_at", "finished_at"}


def strip_timing(obj):
    if isinstance(obj, dict):
        return {k: strip_timing(v) for k, v in obj.items() if k not in TIMING_FIELDS}
    if isinstance(obj, list):
        return [strip_timing(v) for v in obj]
    return obj


def digests(items: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    """name -> sha256 of its bytes; a JSON file is hashed without its timing fields."""
    out = {}
    for name, data in items:
        if name.endswith(".json"):
            data = json.dumps(strip_timing(json.loads(data)), sort_keys=True).encode()
        out[name] = hashlib.sha256(data).hexdigest()
    return out
