"""Attempts: every process start of a job is one, numbered, with its own record and log in the store.

attempts/<n>/started.json   claimed with a conditional write: two processes never share a number
attempts/<n>/env.json       versions, devices, driver (what a bug report needs)
attempts/<n>/log.txt        every line the process printed, with UTC timestamps (`rentune logs`)
attempts/<n>/ended.json     completed | interrupted | error; absent: killed (SIGKILL, node loss)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from entrypoint.job import layout
from entrypoint.job.state import dumps, read_json
from entrypoint.store import ObjectExists, ObjectNotFound, Store, StoreError
from jobspec.schema import JobSpec
from jobspec.urls import redact_text

__all__ = ["StoreLog", "attempt_numbers", "claim_attempt", "lease_start", "previous_attempts"]


def attempt_numbers(store: Store) -> list[int]:
    """The attempts recorded for a job, oldest first."""
    return sorted({int(i.key.split("/")[1]) for i in store.list(layout.ATTEMPTS) if i.key.split("/")[1].isdigit()})


def claim_attempt(store: Store, clock: Callable[[], float] = time.time, startup_seconds: float | None = None) -> int:
    """Claim the next attempt number with a conditional write (`started.json`), so two processes never
    share one; returns the number claimed. `startup_seconds`: how long this process took to start (the
    plan's `startup` figure), when it is a fresh `rentune run`."""
    number = max(attempt_numbers(store), default=0) + 1
    record = {"started_at": clock(), "startup_seconds": startup_seconds}
    while True:
        try:
            store.put_if_absent(layout.attempt_started(number), dumps(record))
            return number
        except ObjectExists:
            number += 1


def previous_attempts(store: Store, current: int) -> list[dict]:
    """Why each earlier process ended: its ended.json, or `killed` when it left none (SIGKILL, node loss)."""
    out = []
    for n in range(1, current):
        try:
            ended = read_json(store, layout.attempt_ended(n))
        except ObjectNotFound:
            why = "no end record: SIGKILL, OOM killer, node loss, or the store unreachable as it ended (see its log)"
            ended = {"outcome": "killed", "error": why}
        out.append({"attempt": n, **ended})
    return out


def lease_start(spec: JobSpec, store: Store) -> float:
    """rental.started_at, or when this job's first attempt started."""
    if spec.rental.started_at is not None:
        return spec.rental.started_at.timestamp()
    return read_json(store, layout.attempt_started(1))["started_at"]


class StoreLog:
    """Echo each line and keep it in the store (`attempts/<n>/log.txt`), so `rentune logs` works from any
    machine. Flushed at most every `every` seconds and at the end; a failed flush never stops the job."""

    def __init__(self, store: Store, key: str, echo: Callable[[str], None], every: float = 2.0):
        self.store, self.key, self.echo, self.every = store, key, echo, every
        self.lines: list[str] = []
        self.flushed = time.monotonic()

    def __call__(self, message: str) -> None:
        message = redact_text(message)  # a URL from the environment may hold a credential (jobspec/urls.py)
        self.echo(message)
        self.lines.append(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {message}")
        if time.monotonic() - self.flushed >= self.every:
            self.flush()

    def flush(self) -> None:
        self.flushed = time.monotonic()
        try:
            self.store.put_bytes(self.key, ("\n".join(self.lines) + "\n").encode())
        except StoreError as exc:
            self.echo(f"store: could not save the log ({exc}); continuing")
