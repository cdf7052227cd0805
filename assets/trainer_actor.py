"""The Ray actor that runs one trainer subprocess on its node (`training.launch: ray`,
assets/ray_trainer.py drives it). It imports neither dagster nor torch, so the Ray worker that hosts
it starts in the time `import ray` takes; the trainer it launches imports what it needs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # on the actor's node: the checkout its Ray workers import
# A launch whose actor or node died: counted as a trainer killed by SIGKILL, which it was or will be.
NODE_LOST_EXIT = -signal.SIGKILL


class TrainerProcess:
    """A Ray actor that runs one trainer subprocess on its node and hands over, at each `poll`, the
    Pipes messages and log output the trainer wrote since the last."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="refinery-trainer-"))
        self.messages, self.log = self.workdir / "messages.jsonl", self.workdir / "trainer.log"
        self.messages.touch()
        self.process: subprocess.Popen | None = None
        self.read = {"messages": 0, "log": 0}  # bytes of each file handed over so far

    def where(self) -> dict[str, str]:
        """The id of this actor's node and the path there of the Pipes message file."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "messages": str(self.messages)}

    def start(self, args: list[str], env: dict[str, str]) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([sys.executable, *args], cwd=REPO, env={**os.environ, **env},
                                            stdout=log, stderr=subprocess.STDOUT)

    def poll(self) -> tuple[int | None, list[str], bytes]:
        """(the exit status, or None while the trainer runs; the complete message lines and the log
        bytes written since the last poll). The status is read first, so that once it is set the
        files hold everything the trainer wrote."""
        assert self.process is not None, "start() first"
        code = self.process.poll()
        messages = self._new_bytes("messages", self.messages)
        complete = messages[:messages.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self.read["messages"] -= len(messages) - len(complete)
        return code, complete.decode().splitlines(), self._new_bytes("log", self.log)

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the trainer (it checkpoints and exits), SIGKILL it if it is still there `grace_s`
        later; returns its exit status."""
        try:
            if self.process is None or self.process.poll() is not None:
                return None if self.process is None else self.process.returncode
            self.process.terminate()
            try:
                return self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                return self.process.wait()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _new_bytes(self, name: str, path: Path) -> bytes:
        with open(path, "rb") as f:
            f.seek(self.read[name])
            data = f.read()
        self.read[name] += len(data)
        return data
