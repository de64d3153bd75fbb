"""One `rentune export --merged` at a time per job (runner._merge_claim): two at once both exited 0, the
last writer's merged folder winning silently."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import psutil
import pytest

from entrypoint.errors import Conflict
from entrypoint.job import layout
from entrypoint.runner import _merge_claim
from entrypoint.store import FileStore


def _claim(pid: int, host: str | None = None) -> bytes:
    started = psutil.Process(pid).create_time() if psutil.pid_exists(pid) else 0.0
    return json.dumps({"host": host or socket.gethostname(), "pid": pid, "started": started, "at": 0}).encode()


def test_a_merge_claim_is_held_while_merging_refuses_a_live_one_and_takes_over_a_dead_one(tmp_path):
    store, lines = FileStore(tmp_path / "job"), []
    with _merge_claim(store, lines.append):
        held = json.loads(store.get_bytes(layout.MERGE_CLAIM))
        assert held["pid"] == psutil.Process().pid
        with pytest.raises(Conflict, match=r"another `rentune export --merged` \(process \d+ on .*\) is writing"):
            with _merge_claim(store, lines.append):
                pass
    assert store.head(layout.MERGE_CLAIM) is None  # released

    store.put_bytes(layout.MERGE_CLAIM, _claim(psutil.Process().pid, "another-node"))
    with pytest.raises(Conflict, match="on another-node"):
        with _merge_claim(store, lines.append):
            pass

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store.put_bytes(layout.MERGE_CLAIM, _claim(gone.pid))
    with _merge_claim(store, lines.append):
        assert json.loads(store.get_bytes(layout.MERGE_CLAIM))["pid"] == psutil.Process().pid
    assert lines == [f"export: taking over the merge claim of process {gone.pid}, which is gone"]
