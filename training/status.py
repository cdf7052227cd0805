"""The run status file, `<run_dir>/status.json`: what an orchestrator reads to decide whether to
resume. `halted` is terminal for auto-resume (gpt-simple's rule): a bucket ran dry, the loss went
non-finite, or a validation loss rose during anneal, and resubmitting the same run would only do it
again. Besides state and reason, the trainer records `mixture` (tokens planned and served per phase
and bucket) and `validation` (the latest per-bucket validation loss).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from refinery.storage import atomic_path, dumps_json

STATES = ("running", "completed", "halted", "failed")
STATUS_FILE = "status.json"


def write_status(run_dir: str | Path, state: str, reason: str = "", **fields: Any) -> dict[str, Any]:
    """Replace the status atomically. `fields`: step, phase, checkpoint, tokens, finished, ..."""
    if state not in STATES:
        raise ValueError(f"unknown run state {state!r}; one of {STATES}")
    status = {"state": state, "reason": reason, "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}
    with atomic_path(Path(run_dir) / STATUS_FILE) as tmp:
        tmp.write_bytes(dumps_json(status))
    return status


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / STATUS_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())
