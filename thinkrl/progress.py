"""Progress inside a step, for a person watching: the decoders tell how many
tokens and rows they are at, the learner which micro-batch, and the progress
bar (the one listener) shows it beside the stage. A long step on a busy
laptop then reads as work, not a hang.

In-process only: ranks on Ray workers keep theirs (the bar still shows the
stage). One listener chain per process: runs on two threads at once share it. Told at most every `INTERVAL_S`, so a decoder's loop pays one clock
read per token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

INTERVAL_S = 0.5
_listener: Callable[[str], None] | None = None
_last_told = 0.0


@contextlib.contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    """`listener(text)` hears what is told while the block runs, beside any
    listener already there (a notebook's around `thinkrl.train`, and the bar)."""
    global _listener
    before = _listener
    _listener = listener if before is None else (lambda text: (before(text), listener(text)))
    try:
        yield
    finally:
        _listener = before


def tell(make_text: Callable[[], str], *, force: bool = False) -> None:
    """Tells the listener `make_text()` (built only when someone listens and
    the last telling is `INTERVAL_S` old, or with `force`)."""
    global _last_told
    if _listener is None:
        return
    now = time.monotonic()
    if force or now - _last_told >= INTERVAL_S:
        _last_told = now
        _listener(make_text())


class DecodeProgress:
    """`decoded(step, running)` per decoding step: tokens per response so far,
    rows still running (`running()`, read only when told), tokens per second
    per row over the call."""

    def __init__(self, rows: int, max_tokens: int) -> None:
        self.rows, self.max_tokens, self.start = rows, max_tokens, time.monotonic()

    def decoded(self, step: int, running: Callable[[], int]) -> None:
        if _listener is None or time.monotonic() - self.start < INTERVAL_S:  # a short call says nothing
            return
        tell(lambda: (f"{step}/{self.max_tokens} tokens, {running()}/{self.rows} rows running, "
                      f"{step / max(time.monotonic() - self.start, 1e-9):.1f} tokens/s per row"))
