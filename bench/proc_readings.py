"""What /proc says of a process: its memory (and the PSS of the token shards it maps), its open files
and maps, and the processes under it. Standard library only: bench/trainer_scale.py's children
import it before they time the trainer's imports."""

import os
from pathlib import Path


def proc_memory(pid: int) -> dict[str, float]:
    """MiB from /proc/<pid>/status and smaps_rollup; Pss_bin, the PSS of the shards' token files
    mapped (pages of entries gathered, and the pages the kernel maps around each on a fault);
    counts of open files and memory maps."""
    out: dict[str, float] = {"Pss_bin": 0.0}
    for name in ("status", "smaps_rollup"):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem", "VmHWM", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                out[key] = int(rest.split()[0]) / 1024
    in_bin = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if not line[:1].isupper():  # a mapping's header: address range, perms, ..., path
            in_bin = line.endswith(".bin")
        elif in_bin and line.startswith("Pss:"):
            out["Pss_bin"] += int(line.split()[1]) / 1024
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    out["maps"] = len(Path(f"/proc/{pid}/maps").read_text().splitlines())
    return out


def descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for kid in (task / "children").read_text().split():
            found += [int(kid), *descendants(int(kid))]
    return found
