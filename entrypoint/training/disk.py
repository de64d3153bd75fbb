"""The node's disk: room for a checkpoint before it is written, and a full disk named as such wherever it
shows (an OSError with ENOSPC, or torch's `PytorchStreamWriter failed writing file` / `unexpected pos`
when `torch.save` hits a full disk).

    check_room(folder, needed, what)   DiskFull before writing, when the filesystem has less than needed
    disk_full(exc, folder)             the DiskFull an error really is, or None
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from entrypoint.errors import DiskFull

__all__ = ["HEADROOM", "check_room", "disk_full", "folder_bytes", "free_bytes"]

HEADROOM = 1.2  # a checkpoint may be a little larger than the last one (trainer state, logs)
# What torch's zip writer says when a write comes up short (a full disk), in the torch versions we use.
_TORCH_SHORT_WRITE = ("unexpected pos", "PytorchStreamWriter failed writing", "No space left on device")


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
