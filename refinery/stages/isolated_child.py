"""The child side of `refinery.stages.isolation.IsolatedWorker`: answer each item of each batch the
parent sends with `("ok", fn(item))` or `("error", "Type: message")`.

Its own module, importing no other module of the library than refinery/parent_death.py, because
it is all the child imports besides the function it serves: the child is a fresh interpreter
(`python -c CHILD_CODE`), not a `multiprocessing` spawn, which would import the parent's main
module first (in a Ray worker, Ray's default_worker.py and with it all of `ray`; under
`refinery demo`, the command line's module), and `isolation.py` itself brings polars and the config
through `refinery.stages.stats`. A child started this way costs a Python start-up, this module and
the function's module (resiliparse and numpy for the extractor's): one per worker process, so one
per Ray node.
"""

from __future__ import annotations

import signal
from multiprocessing.connection import Connection

# Run by `python -c` with the pipe's file descriptor as its argument: the parent's sys.path comes
# first (so the child imports the same checkout and the parent's modules: a test's function), then
# this module.
CHILD_CODE = ("import sys; from multiprocessing.connection import Connection; conn = Connection(int(sys.argv[1])); "
              "sys.path[:] = conn.recv(); from refinery.stages.isolated_child import serve; serve(conn)")


def serve(conn: Connection) -> None:
    """Receive the function, say "ready", then answer every batch until the parent closes the pipe."""
    from refinery.parent_death import set_parent_death_signal

    # A parent killed while this child parses (C code that may run for minutes) takes it along.
    set_parent_death_signal(signal.SIGKILL)
    fn = conn.recv()
    conn.send(("ready", None))
    while True:
        try:
            items = conn.recv()
        except EOFError:
            return
        for item in items:
            try:
                conn.send(("ok", fn(item)))
            except Exception as err:  # noqa: BLE001 - the parent turns it into the item's reject
                conn.send(("error", f"{type(err).__name__}: {err}"))
