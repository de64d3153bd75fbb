"""The node's disk: room for a checkpoint before it is written, and a full disk named as such wherever it
shows (an OSError with ENOSPC, or torch's `PytorchStreamWriter failed writing file` / `unexpected pos`
when `torch.save` hits a full disk).

    check_room(folder, needed, what)   DiskFull before writing, when the filesystem has less than needed
    disk_full(exc, folder)             the DiskFull an error really is, or None
    child_failed(done, label, ...)     a failed subprocess's stderr into the log; the DiskFull it was, or None
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from entrypoint.errors import DiskFull

__all__ = ["HEADROOM", "check_room", "child_failed", "disk_full", "folder_bytes", "free_bytes", "last_error_line"]

HEADROOM = 1.2  # a checkpoint may be a little larger than the last one (trainer state, logs)
# What torch's zip writer says when a write comes up short (a full disk), in the torch versions we use.
_TORCH_SHORT_WRITE = ("unexpected pos", "PytorchStreamWriter failed writing", "No space left on device")
_FULL_IN_TEXT = (*_TORCH_SHORT_WRITE, "[Errno 28]", "ENOSPC")  # the same, in a child process's stderr


def free_bytes(folder: Path) -> int:
    """Free bytes on the filesystem holding `folder` (or its nearest existing parent)."""
    path = Path(folder).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) if Path(folder).exists() else 0


def check_room(folder: Path, needed: int, what: str) -> None:
    """Raise DiskFull when the filesystem of `folder` has less than `needed` bytes (x HEADROOM) free."""
    free = free_bytes(folder)
    if free < needed * HEADROOM:
        raise DiskFull(_message(folder, free, needed, what))


def disk_full(exc: BaseException, folder: Path, needed: int | None = None, what: str = "") -> DiskFull | None:
    """`exc` (or an error in its chain) as a DiskFull naming `folder` (and `what` was being written, which
    needs about `needed` bytes, when known), when it is a full disk; else None."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFull):
            return error
        full = (isinstance(error, OSError) and error.errno == errno.ENOSPC) or (
            isinstance(error, RuntimeError) and any(text in str(error) for text in _TORCH_SHORT_WRITE)
        )
        if full:
            cause = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
            return DiskFull(_message(folder, free_bytes(folder), needed, what, cause))
        error = error.__cause__ or error.__context__
    return None


def _message(folder: Path, free: int, needed: int | None, what: str, cause: str | None = None) -> str:
    need = f"; {what or 'what was written'} needs about {needed / 1e6:.1f} MB" if needed else ""
    failed = f" (writing failed: {cause})" if cause else ""
    return (
        f"the work dir {folder} is out of space: {free / 1e6:.1f} MB free on its filesystem{need}{failed}. Nothing "
        "committed is lost: free space there or give --workdir a larger disk, then run the same command again "
        "to resume"
    )


def child_failed(
    done: subprocess.CompletedProcess,
    label: str,
    folder: Path,
    log: Callable[[str], None],
    needed: int | None = None,
    what: str = "",
) -> DiskFull | None:
    """A child process (the verify phase's fresh process, the parity process) that exited non-zero: every
    line of its stderr goes into `log` (the attempt's log.txt keeps it whole); returns the DiskFull it was,
    naming the line that said so, the free space of `folder` and `needed` bytes of `what`, or None."""
    lines = [line for line in (done.stderr or "").splitlines() if line.strip()]
    for line in lines:
        log(f"{label}: stderr: {line}")
    said = next((line for line in reversed(lines) if any(text in line for text in _FULL_IN_TEXT)), None)
    if said is None:
        return None
    cause = f"the {label} process: {' '.join(said.split())[:300]}"
    return DiskFull(_message(folder, free_bytes(folder), needed, what, cause))


def last_error_line(done: subprocess.CompletedProcess) -> str:
    """What a failed child said last (its exception, after a traceback), or its exit code."""
    lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
    return lines[-1][:1000] if lines else f"no output on stderr (exit {done.returncode})"
