"""The sealed test split: opened once, for one trial of one spec.

The split is sealed by its content: `<root>/sealed-tests/<sha256 of test.jsonl>/opened.json` is written
with a conditional put the first time, naming the job, spec sha256 and trial. A later opening of the same
test data by another spec or another trial is refused: measuring several candidates on the test split and
keeping the best turns it into a second eval split. `rentune run --reopen-test REASON` overrides the
refusal; the reason and the earlier opening go into the store and the report.
"""

from __future__ import annotations

import time

from entrypoint.errors import Conflict
from entrypoint.job import layout
from entrypoint.job.state import dumps, read_json
from entrypoint.store import ObjectExists, ObjectNotFound

__all__ = ["TestSealed", "check_seal", "open_seal", "seal_key"]


class TestSealed(Conflict):
    """The test split was already opened by another spec or trial, and no override was given."""


def seal_key(test_sha256: str) -> str:
    return layout.seal_opened(test_sha256)


def _refusal(test_sha256: str, first: dict) -> TestSealed:
    return TestSealed(
        f"the sealed test split (sha256 {test_sha256[:16]}) was already opened by job {first['job_id']!r} "
        f"(spec {first['spec_sha256'][:12]}, trial {first['trial_id']!r}); opening it again for another spec or "
        "trial makes it a second eval split. Use new test data, or pass --reopen-test 'REASON' (the reason "
        "is written into the report)"
    )


def _root(ctx):
    """The whole store: another job's opening of the same test data must be seen."""
    return ctx.root if ctx.root is not None else ctx.store


def check_seal(ctx, test_sha256: str) -> None:
    """Called by the data phase: refuse early, before any training, a job whose test split another job
    already opened (unless the user gave a reason to reopen it)."""
    root = _root(ctx)
    try:
        first = read_json(root, seal_key(test_sha256))
    except ObjectNotFound:
        return
    if (first["job_id"], first["spec_sha256"]) != (ctx.spec.job.id, ctx.spec_sha256) and ctx.reopen_test is None:
        raise _refusal(test_sha256, first)


def open_seal(ctx, test_sha256: str, trial_id: str) -> dict | None:
    """Record this opening; returns the override record when an earlier opening was overridden."""
    root = _root(ctx)
    opening = {
        "job_id": ctx.spec.job.id,
        "spec_sha256": ctx.spec_sha256,
        "trial_id": trial_id,
        "test_sha256": test_sha256,
        "opened_at": time.time(),
    }
    try:
        root.put_if_absent(seal_key(test_sha256), dumps(opening))
        return None
    except ObjectExists:
        first = read_json(root, seal_key(test_sha256))
    if (first["job_id"], first["spec_sha256"], first["trial_id"]) == (
        opening["job_id"],
        opening["spec_sha256"],
        trial_id,
    ):
        return None  # this job's own opening, by a process that stopped before the phase committed
    if ctx.reopen_test is None:
        raise _refusal(test_sha256, first)
    override = {"reason": ctx.reopen_test, "earlier_opening": first, "this_opening": opening}
    root.put_bytes(layout.seal_reopened(test_sha256, opening["job_id"], int(opening["opened_at"])), dumps(override))
    ctx.log(f"test: reopening the sealed test split on request: {ctx.reopen_test}")
    return override
