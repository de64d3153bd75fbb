"""The `rentune` command in real processes, as a user runs it: a job in the background (to kill it, or to
read its log line by line) and the short commands beside it (`status`, `fetch`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["RENTUNE", "rentune", "start_run"]

RENTUNE = Path(sys.executable).parent / "rentune"


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    """This process's environment, offline and unbuffered, with `env` on top."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}


def start_run(spec: Path, workdir: Path, env: dict[str, str] | None = None, *args: str) -> subprocess.Popen:
    """`rentune run SPEC --workdir WORKDIR [ARGS...]` started from WORKDIR's parent (WORKDIR is created); its
    output and errors come line by line, as text, from `proc.stdout`."""
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [RENTUNE, "run", str(spec), "--workdir", str(workdir), *args],
        cwd=workdir.parent,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def rentune(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """`rentune ARGS...` run to its end (from `cwd`, if given), output and errors captured as text."""
    return subprocess.run(
        [RENTUNE, *args], cwd=cwd, env=_environment(env), capture_output=True, text=True, timeout=timeout
    )
