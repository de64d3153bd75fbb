"""The one way a command ends on an error: `exits()` prints it and exits with `errors.exit_code`.

    0    success
    1    the job failed (anything unexpected: printed with its type; the attempt record in the store has it)
    2    invalid input (`InvalidInput`, a `SpecError`, a `Refused`)
    3    the store refuses (`Conflict`)
    143  stopped by SIGTERM, 130 by SIGINT (Ctrl-C) (`Interrupted`)

A command raises; this is the only place a command exits (tests/unit/test_commands.py checks it).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import click

from entrypoint.errors import EXIT_FAILED, EXIT_INVALID, InvalidInput, exit_code
from entrypoint.store import StoreError
from jobspec.load import SpecError

__all__ = ["Refused", "exits"]


class Refused(InvalidInput):
    """Input a command refuses with lines it worded itself: each goes to stderr as it is (no `rentune:`
    prefix, no spec source), then exit 2."""

    def __init__(self, *lines: str):
        self.lines = list(lines)
        super().__init__("\n".join(lines))


def _lines(exc: Exception, source: str | None) -> list[str]:
    """What the user reads on stderr. Input errors say what to fix (after the spec's `source`, when given);
    anything unexpected is a failed job, with its type."""
    if isinstance(exc, SpecError):
        return list(exc.errors)
    if isinstance(exc, Refused):
        return exc.lines
    if isinstance(exc, InvalidInput):
        what = f"{source}: {exc}" if source else str(exc)
    elif exit_code(exc) == EXIT_FAILED and not isinstance(exc, StoreError):
        what = f"job failed: {type(exc).__name__}: {exc}"
    else:
        what = str(exc)
    return [f"rentune: {what}"]


@contextlib.contextmanager
def exits(source: str | None = None) -> Iterator[None]:
    """Print an error that ends the command and exit with its code; `source` (a spec's file name) goes
    before the message of an InvalidInput. Nested, the innermost one reports."""
    try:
        yield
    except Exception as exc:
        for line in _lines(exc, source):
            click.echo(line, err=True)
        sys.exit(EXIT_INVALID if isinstance(exc, SpecError) else exit_code(exc))
