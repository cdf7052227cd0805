"""The data root as a local folder (or a shared file system every node mounts)."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from refinery.storage.base import TEMPORARY_SUFFIX, DataRoot, atomic_path


class LocalDataRoot(DataRoot):
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root not in p.parents and p != self.root:
            raise ValueError(f"key {key!r} escapes the data root {self.root}")
        return p

    @contextmanager
    def writer(self, key: str) -> Iterator[Path]:
        with atomic_path(self._path(key)) as tmp:
            yield tmp

    def local_path(self, key: str) -> Path:
        p = self._path(key)
        if not p.exists():
            raise FileNotFoundError(f"{p}: not found in the data root; materialize the asset that writes it first")
        return p

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root)).replace(os.sep, "/")
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, key: str) -> None:
        p = self._path(key)
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()

    def display(self, key: str) -> str:
        return str(self._path(key))

    def remove_leftover_temporaries(self, keys: Iterable[str]) -> int:
        # One listing a folder, not a glob a key: a stage's folder holds a file per input file.
        names_by_folder: dict[Path, set[str]] = {}
        for key in keys:
            path = self._path(key)
            names_by_folder.setdefault(path.parent, set()).add(path.name)
        removed = 0
        for folder, names in names_by_folder.items():
            if not folder.is_dir():
                continue
            for entry in os.scandir(folder):
                name = entry.name
                if name.startswith(".") and name.endswith(TEMPORARY_SUFFIX) and name[1:].rsplit(".", 2)[0] in names:
                    Path(entry.path).unlink(missing_ok=True)
                    removed += 1
        return removed
