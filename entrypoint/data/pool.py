"""Processes that work beside the data phase on chunks of its rows: each builds its function once
(`make(*args)`, a module-level function, as spawned processes import it by name), then takes chunks in
order; each dies with its parent (Linux PR_SET_PDEATHSIG), so a SIGKILLed data phase leaves none behind.
The tokenizer (data/tokens.py) and the leak check's sketches (data/leaks.py) use them."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

__all__ = ["PARALLEL_FROM", "Processes", "processes_for", "process_pool"]

PARALLEL_FROM = 50_000  # rows from which work goes to a process per core: starting one costs a second or more


def processes_for(rows: int) -> int:
    """One below PARALLEL_FROM rows, else one per core up to 8."""
    return 1 if rows < PARALLEL_FROM else max(1, min(8, len(os.sched_getaffinity(0))))


class Processes:
    """The processes of a process_pool."""

    def __init__(self, pool, processes: int):
        self.pool, self.processes = pool, processes

    def map(self, parts: Iterable) -> Iterator:
        """Each part's result, in order, with at most two parts per process in flight (Pool.imap would queue
        every part at once and buffer results the caller has not taken yet)."""
        pending: collections.deque = collections.deque()
        for part in parts:
            pending.append(self.pool.apply_async(_work_on, (part,)))
            if len(pending) >= 2 * self.processes:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


@contextmanager
def process_pool(make: Callable[..., Callable], args: tuple, processes: int) -> Iterator[Processes | None]:
    """`processes` processes running `make(*args)` on parts (None for one process: the caller works in
    its own process); closed on exit."""
    if processes <= 1:
        yield None
        return
    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(processes, _start, (make, args))
    try:
        yield Processes(pool, processes)
    finally:
        pool.terminate()
        pool.join()


_work: Callable | None = None


def _start(make: Callable[..., Callable], args: tuple) -> None:
    global _work
    with contextlib.suppress(OSError, AttributeError):  # Linux only; elsewhere the pool's own cleanup
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the processes are the parallelism
    _work = make(*args)


def _work_on(part):
    return _work(part)
