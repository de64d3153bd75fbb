"""A child process of rentune dies with its parent: torchrun with the `rentune run` that started it, each
rank with its torchrun agent, the verify and parity processes with theirs. Without this, a SIGKILL of
rentune (the OOM killer picks one process; `kill -9` of its process group misses the ranks, which torchrun
starts in sessions of their own) left torchrun and the ranks training and committing checkpoints into the
trial, alongside any process that resumed it meanwhile.

On Linux the kernel does it: prctl(PR_SET_PDEATHSIG) sends the child SIGKILL the moment its parent exits.
Elsewhere a daemon thread checks the parent every WATCH_SECONDS and kills this process once it changed.

    Popen(..., preexec_fn=dies_with_parent)    # the child, between fork and exec (kept across exec)
    die_with_parent()                          # a process, about itself (a torchrun rank, at its start)

Records that a process holds something (a trial's progress, the merge claim) name it with
`process_identity()`; `still_running(identity)` tells, on the same node, whether that process still runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time

import psutil

__all__ = ["WATCH_SECONDS", "die_with_parent", "dies_with_parent", "process_identity", "still_running"]

PR_SET_PDEATHSIG = 1
WATCH_SECONDS = 1.0


def _prctl_death_signal() -> bool:
    """Ask the kernel for SIGKILL when the parent exits; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def dies_with_parent() -> None:
    """For `preexec_fn`: in the child, before exec. Linux only (no thread survives an exec); elsewhere the
    child calls `die_with_parent` itself where it can."""
    parent = os.getppid()
    if _prctl_death_signal() and os.getppid() != parent:  # the parent died before the request took
        os._exit(137)


def die_with_parent() -> None:
    """This process gets SIGKILL once its parent is gone (the kernel's death signal, or a watchdog)."""
    parent = os.getppid()
    if _prctl_death_signal():
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return

    def watch() -> None:
        while True:
            time.sleep(WATCH_SECONDS)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="rentune-lifeline", daemon=True).start()


def process_identity() -> dict:
    """This process, as a record names it: its node, pid and start time (a reused pid has another)."""
    me = psutil.Process()
    return {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}


def still_running(identity: dict) -> bool:
    """Whether the process `process_identity()` named on this node still runs (False for a malformed record)."""
    try:
        return psutil.Process(identity["pid"]).create_time() == identity["started"]
    except (psutil.Error, KeyError, TypeError):
        return False
