"""A progress line at least every HEARTBEAT_SECONDS from work that can run for minutes without a natural
line of its own (the probe's measurements, generation, an eval-loss pass, a merge, the parity check): what
is done of how much, the rate and the time so far, so that whoever watches the console or `rentune logs`
can tell a slow phase on a loaded machine from a hung one.

    with Heartbeat(ctx.log, "generation", total=len(prompts), unit="answers") as beat:
        for batch in batches:
            ...
            beat.advance(len(batch))

A daemon thread writes the line; work that ends within the interval writes none. RENTUNE_HEARTBEAT_SECONDS
sets another interval (the tests use a fraction of a second).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from entrypoint.errors import InvalidInput

__all__ = ["HEARTBEAT_SECONDS", "Heartbeat", "heartbeat_seconds"]

HEARTBEAT_SECONDS = 30.0


def heartbeat_seconds() -> float:
    """RENTUNE_HEARTBEAT_SECONDS, or HEARTBEAT_SECONDS."""
    text = os.environ.get("RENTUNE_HEARTBEAT_SECONDS", "").strip()
    if not text:
        return HEARTBEAT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise InvalidInput(f"RENTUNE_HEARTBEAT_SECONDS={text!r}: expected a number of seconds above 0")
    return seconds


class Heartbeat:
    """`what: done/total unit in S s (R unit/s)[; now: doing]`, every `every` seconds (heartbeat_seconds())
    until the block ends."""

    def __init__(
        self,
        log: Callable[[str], None],
        what: str,
        total: int,
        unit: str,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log, self.what, self.total, self.unit, self.clock = log, what, total, unit, clock
        self.every = every if every is not None else heartbeat_seconds()
        self.done = 0
        self.doing: str | None = None
        self.started = clock()  # the line's time counts from here: construct it when the work starts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def advance(self, count: int = 1, doing: str | None = None) -> None:
        """`count` more units done; `doing`, when given, names what runs now (shown until the next call)."""
        self.done += count
        self.doing = doing

    def line(self) -> str:
        took = self.clock() - self.started
        rate = f"{self.done / took:.2f} {self.unit}/s" if took > 0 and self.done else "none done yet"
        now = f"; now: {self.doing}" if self.doing else ""
        return f"{self.what}: {self.done}/{self.total} {self.unit} in {took:.0f} s ({rate}){now}"

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self.log(self.line())

    def start(self) -> Heartbeat:
        """Start the line's thread (what `with` does; for work whose end is signalled by a callback)."""
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self.what}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; no line after this returns."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
