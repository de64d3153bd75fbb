"""The kinds of failure a user sees, and the exit code of each. Imports nothing heavy: `cli.py` maps every
error to its exit code through `exit_code` without loading torch.

    0    success
    1    the job failed while running (anything not listed below; the attempt record holds the error)
    2    InvalidInput: the spec, data, model, store URI or a setting cannot be used, or an object in the
         store is unreadable (the message names it); fix it and run again
    3    Conflict: the store refuses (this job id with another spec, a sealed test split opened elsewhere)
    130  Interrupted by SIGINT (Ctrl-C), 143 by SIGTERM: stopped after committing what it could; run again
         to resume

Errors raised deep in the library subclass one of these, so the mapping lives here once.
"""

from __future__ import annotations

import signal

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "Conflict",
    "DiskFull",
    "Interrupted",
    "InvalidInput",
    "STOP_SIGNALS",
    "exit_code",
    "signal_name",
]

EXIT_FAILED, EXIT_INVALID, EXIT_CONFLICT = 1, 2, 3
# 128 + 15: what docker and Kubernetes report for a process that ended on SIGTERM.
EXIT_INTERRUPTED = 143


class InvalidInput(ValueError):
    """Input rentune cannot use: the message names the file or spec field and what was expected (exit 2)."""


class Conflict(RuntimeError):
    """The store already holds something this run would contradict; nothing was overwritten (exit 3)."""


class DiskFull(RuntimeError):
    """A node's disk (the work dir) ran out of space; the message names the folder, what is free and what was
    needed. Nothing committed is lost: free space and run again to resume (exit 1)."""


# Both stop a job the same way: training finishes its step and commits it, any other phase stops at once.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    """How a log line names a stop signal: "SIGTERM", or "SIGINT (Ctrl-C)"."""
    name = signal.Signals(signum).name
    return f"{name} (Ctrl-C)" if signum == signal.SIGINT else name


class Interrupted(RuntimeError):
    """Stopped on SIGTERM or SIGINT (`signum`); the newest committed state is where the next process resumes
    (exit 128 + signum: 143 or 130, as a shell reports a process those signals ended)."""

    def __init__(self, message: str, signum: int = signal.SIGTERM):
        super().__init__(message)
        self.signum = int(signum)


def exit_code(exc: BaseException) -> int:
    """The exit code for an error that ended a command."""
    if isinstance(exc, Interrupted):
        return 128 + exc.signum
    if isinstance(exc, Conflict):
        return EXIT_CONFLICT
    if isinstance(exc, InvalidInput):
        return EXIT_INVALID
    return EXIT_FAILED
