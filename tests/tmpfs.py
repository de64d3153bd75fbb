"""A small real filesystem for tests that need a full disk: a tmpfs mounted for the test (root only), filled
on purpose. Unmounted afterwards whatever happens."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["fill", "small_tmpfs"]


@contextlib.contextmanager
def small_tmpfs(folder: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of `megabytes` mounted at `folder`; the test is skipped, saying why, where mounting is not
    allowed (not root, or no mount in this container)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}); a full disk needs one")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path, leave_bytes: int) -> Path:
    """Fill the filesystem of `folder` until about `leave_bytes` are free; returns the filler file."""
    filler = folder / "filler.bin"
    free = shutil.disk_usage(folder).free - leave_bytes
    with filler.open("wb") as out:
        chunk = b"\0" * (1 << 20)
        while free > 0:
            out.write(chunk[: min(len(chunk), free)])
            free -= len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return filler
