"""The body of one reward worker process.

Kept free of torch and of the trainer so that a fresh worker starts fast;
the pool's fork server preloads this module (and math-verify with it), so
a worker that replaces a killed one is ready in milliseconds.
"""

from __future__ import annotations

import signal
from multiprocessing.connection import Connection

from thinkrl.rewards import math as _math_answer  # noqa: F401  (preloaded: sympy imports once)
from thinkrl.rewards.reward_fn import RewardFnSpec, Task, score_one


READY = -1
"""Position of the message a worker sends once its function is built (with
None, or the error that stopped it)."""
STARTED = -2
"""Position of the message a worker sends as it starts building its function
(importing a user's file): the parent's import deadline runs from here, so
the fork server's own start-up is not charged to the user's file."""


def worker_main(conn: Connection, spec: RewardFnSpec) -> None:
    """Send `(STARTED, None)`, build the function, send `(READY, None)`, then receive lists of `Task`s and send back
    `(position, Outcome)` per task as each finishes (so the parent can time
    every sample); stop on None or EOF."""
    # Ctrl-C reaches the whole process group: the parent decides what stops, so
    # a worker must not die mid-message with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn.send((STARTED, None))
    try:
        function = spec.build()
    except Exception as err:  # the parent built it already, so the file changed since
        conn.send((READY, f"{type(err).__name__}: {err}"))
        return
    conn.send((READY, None))
    while True:
        try:
            tasks: list[Task] | None = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if tasks is None:
            return
        for task in tasks:
            conn.send((task.position, score_one(function, task)))
