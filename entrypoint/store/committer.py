"""Checkpoint commits in the background: the training loop hands over a folder the Trainer has written to
local disk and goes on, while one thread uploads, confirms and publishes it (commit_checkpoint: the
manifest last, put-if-absent), then rotates old steps out.

- At most one commit is in flight. The next save waits for it, so every checkpoint is committed and in
  order; when a commit takes longer than the checkpoint interval, that wait is the training loop's
  blocked time, which every record shows (choose a longer interval, or `every_minutes: auto`).
- A process killed meanwhile leaves files without a manifest: the previous checkpoint stands.
- A failed background commit is logged and recorded (`status_key`, which `rentune status` shows) and its
  folder dropped; training goes on and the next checkpoint is the retry. After `max_failures` failures in
  a row, `raise_if_failing` raises: the job stops with the store's error instead of training on with
  nothing saved. A synchronous commit (the last one, on SIGTERM or at the end) raises its error at once.
- Across nodes (`nodes`), each node's committer uploads its own ranks' files and reports them; node 0's
  writes the manifest once every node has reported, and alone rotates.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from entrypoint.store.base import Store, StoreError
from entrypoint.store.checkpoint import CheckpointError, Nodes, commit_checkpoint, rotate

__all__ = ["MAX_FAILED_COMMITS", "Committer"]

MAX_FAILED_COMMITS = 3  # background commits that may fail in a row before training stops


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class Committer:
    """Commits checkpoint folders to `prefix` in `store`, in the background or in the caller's thread.

    `records` holds one dict per checkpoint handed over: step, bytes (None until its files are written),
    background, commit_s (None until committed; the deferred writes included, written_s of them) and
    error; the caller adds how long training was blocked. `committed` lists the steps
    whose manifest is written.
    """

    def __init__(
        self,
        store: Store,
        prefix: str,
        meta: dict,
        keep: int,
        log: Callable[[str], None],
        status_key: str | None = None,
        max_failures: int = MAX_FAILED_COMMITS,
    ):
        self.store, self.prefix, self.meta, self.keep, self.log = store, prefix, meta, keep, log
        self.status_key, self.max_failures = status_key, max_failures
        self.records: list[dict] = []
        self.committed: list[int] = []
        self.failures = 0  # in a row
        self.last_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.nodes: Nodes | None = None  # set when training starts on several nodes
        self._status_cleared = status_key is None  # an earlier attempt's streak is cleared at the first commit

    def wait(self) -> float:
        """Block until the commit in flight (if any) has ended; the seconds waited."""
        if self._thread is None:
            return 0.0
        started = time.monotonic()
        self._thread.join()
        self._thread = None
        return time.monotonic() - started

    def commit(self, step: int, folder: Path, background: bool, before: Callable[[], None] | None = None) -> dict:
        """Commit `folder` as checkpoint `step`, after the commit in flight: in a background thread
        (returns at once) or here (raises what the commit raised). `before` runs first, in the same thread
        (the checkpoint's deferred writes: entrypoint/training/staging.py); its failure fails the commit.
        Returns the step's record (its bytes counted once `before` has run)."""
        self.wait()
        record = {"step": step, "bytes": None, "background": background, "commit_s": None, "error": None}
        self.records.append(record)
        if background:
            self._thread = threading.Thread(
                target=self._run, args=(step, folder, record, False, before), name=f"commit-step-{step}", daemon=True
            )
            self._thread.start()
        else:
            self._run(step, folder, record, True, before)
        return record

    @property
    def failing(self) -> bool:
        """`max_failures` background commits in a row have failed: training must stop."""
        return self.failures >= self.max_failures

    def raise_if_failing(self) -> None:
        """Raise once `max_failures` background commits in a row have failed."""
        if self.failing:
            raise CheckpointError(
                f"{self.failures} checkpoint commits in a row failed; stopping rather than training on with "
                f"nothing saved. The last error: {self.last_error}"
            ) from self.last_error

    def _run(self, step: int, folder: Path, record: dict, reraise: bool, before: Callable[[], None] | None) -> None:
        started = time.monotonic()
        try:
            if before is not None:
                before()
                record["written_s"] = round(time.monotonic() - started, 3)
            record["bytes"] = _size(folder)
            commit_checkpoint(self.store, self.prefix, step, folder, self.meta, nodes=self.nodes)
        except Exception as exc:  # noqa: BLE001 - recorded, counted, and raised by raise_if_failing
            record["error"] = f"{type(exc).__name__}: {exc}"
            self.failures += 1
            self.last_error = exc
            self.log(
                f"checkpoint: commit of step {step} failed ({self.failures} in a row): {record['error']}"
                + ("" if reraise else "; training goes on and the next checkpoint retries")
            )
            self._write_status(step, record["error"])
            if reraise:
                raise
            return
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        record["commit_s"] = round(time.monotonic() - started, 3)
        self.committed.append(step)
        where = " in the background" if record["background"] else ""
        if self.nodes is not None and not self.nodes.lead:
            self.log(
                f"checkpoint: node {self.nodes.node} uploaded its files of step {step} "
                f"({record['bytes'] / 1e6:.1f} MB in {record['commit_s']:.1f} s{where}); node 0 writes the manifest"
            )
            self.failures, self.last_error = 0, None
            return
        self.log(
            f"checkpoint: committed step {step} ({record['bytes'] / 1e6:.1f} MB in {record['commit_s']:.1f} s{where})"
        )
        if self.failures or not self._status_cleared:  # a streak ended, here or in an earlier process
            self.failures, self.last_error, self._status_cleared = 0, None, True
            self._write_status(step, None)
        try:
            rotate(self.store, self.prefix, self.keep, self.log)
        except StoreError as exc:  # the commit stands; old steps go at the next rotation
            self.log(f"checkpoints: rotation after step {step} failed ({exc}); retried after the next commit")

    def _write_status(self, step: int, error: str | None) -> None:
        """Best effort: the store may be what is failing. `rentune status` shows a failing streak."""
        if self.status_key is None:
            return
        status = {"failures_in_a_row": self.failures, "step": step, "error": error, "at": time.time()}
        with contextlib.suppress(StoreError):
            self.store.put_bytes(self.status_key, (json.dumps(status, sort_keys=True) + "\n").encode())
