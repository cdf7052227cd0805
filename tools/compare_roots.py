"""Compare two demo data roots: the pii_redacted documents, every final shard and selection file (bytes),
the phase manifests (field by field: a field only the new root has is listed, not failed), and each
phase's last checkpoint's token consumption (sampler state, steps, tokens, tokens per bucket).

    python tools/compare_roots.py OLD_ROOT NEW_ROOT     # exit 0 when identical
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

BYTE_COMPARED = ("documents/pii_redacted", "shards/final", "manifests")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files(root: Path, folder: str, suffixes: tuple[str, ...] = ()) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / folder).rglob("*")
                  if p.is_file() and (not suffixes or p.suffix in suffixes))


def compare_bytes(old: Path, new: Path, folder: str) -> list[str]:
    suffixes = (".npy",) if folder == "manifests" else ()  # manifest JSON is compared field by field
    a, b = files(old, folder, suffixes), files(new, folder, suffixes)
    problems = [f"{folder}: only in one root: {sorted(set(a) ^ set(b))}"] if a != b else []
    differ = [f for f in a if f in b and digest(old / f) != digest(new / f)]
    print(f"{folder}: {len(a)} files, {len(differ)} differ")
    return problems + [f"{f}: bytes differ" for f in differ]


def compare_json(old: Any, new: Any, path: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(new) - set(old)):
            print(f"  new field {path}/{key} = {json.dumps(new[key])[:80]}")
        problems = [f"{path}/{key}: missing" for key in sorted(set(old) - set(new))]
        for key in sorted(set(old) & set(new)):
            problems += compare_json(old[key], new[key], f"{path}/{key}")
        return problems
    return [] if old == new else [f"{path}: {str(old)[:80]} != {str(new)[:80]}"]


def compare_consumption(old: Path, new: Path) -> list[str]:
    problems = []
    for phase_dir in sorted((old / "runs").glob("*/*")):
        last = sorted(phase_dir.glob("checkpoints/*.pt"))[-1]
        rel = last.relative_to(old)
        a, b = torch.load(last, weights_only=True), torch.load(new / rel, weights_only=True)
        pairs = [("sampler", a["sampler"], b["sampler"])]
        pairs += [(f"train.{k}", a["train"][k], b["train"][k]) for k in ("step", "tokens", "bucket_tokens")]
        for name, x, y in pairs:
            if x != y:
                problems.append(f"{rel}: {name} differs")
        print(f"{rel}: sampler state, step, tokens and tokens per bucket compared")
    return problems


def main(old: Path, new: Path) -> int:
    problems = [p for folder in BYTE_COMPARED for p in compare_bytes(old, new, folder)]
    for manifest in files(old, "manifests", (".json",)):
        print(f"{manifest}:")
        problems += compare_json(json.loads((old / manifest).read_text()), json.loads((new / manifest).read_text()),
                                 manifest)
    problems += compare_consumption(old, new)
    print("\n".join(problems) if problems else "identical")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
