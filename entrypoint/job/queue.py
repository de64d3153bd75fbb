"""Remote submission through the bucket: the node needs no open port.

    laptop:  rentune submit SPEC --store s3://b/p      validate locally, put queue/<job_id>.yaml (if absent)
             rentune cancel JOB_ID --store s3://b/p    before a worker runs it: a claim of its own, then the
                                                       entry moved to queue/cancelled/, then the claim released
    node:    rentune worker --store s3://b/p           loop:
               for each queue/<job_id>.yaml, oldest name first:
                   invalid spec          -> queue/rejected/<job_id>.yaml + .errors.txt, go on
                   claim it              -> jobs/<job_id>/claims/<n>.json, put if absent: one winner
                   run it (resuming from the store), heartbeat claims/<n>.heartbeat meanwhile
                   completed -> delete the queue entry; failed -> queue/failed/<job_id>.yaml + .error.txt
               a claim whose heartbeat is older than --claim-seconds belongs to a dead worker: the next
               worker takes it over by claiming n+1 (again put-if-absent), and the job resumes from its
               newest checkpoint. A worker that sees a newer claim than its own stops its job (SIGTERM path).

Claims are numbered so that a takeover is itself a conditional write: two workers racing for a stale job
both try claims/<n+1>.json and exactly one succeeds. Heartbeats carry the writer's wall clock; keep the
claim timeout well above clock skew between nodes (minutes, not seconds, in production).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from entrypoint.errors import Conflict, Interrupted, InvalidInput
from entrypoint.job import layout
from entrypoint.job.state import dumps, read_json
from entrypoint.store import ObjectExists, ObjectNotFound, Store, StoreError, check_conditional_writes
from jobspec.load import LoadedSpec, SpecError, parse_spec

__all__ = [
    "CANCELLED",
    "FAILED",
    "REJECTED",
    "Claim",
    "JobExists",
    "NewestClaim",
    "NotQueued",
    "Worker",
    "cancel",
    "newest_claim",
    "submit",
]

# Where an entry ends when it does not run to completion (a completed job's entry is deleted).
REJECTED, FAILED, CANCELLED = "rejected", "failed", "cancelled"


DEFAULT_CLAIM_SECONDS = 300.0


class JobExists(Conflict):
    """The job id is already queued or has run in this store; nothing was overwritten."""


def submit(root: Store, loaded: LoadedSpec) -> str:
    """Queue a validated spec. Raises JobExists if the job id is already queued or has run in this store."""
    job_id = loaded.spec.job.id
    if root.head(layout.root_job_spec(job_id)) is not None:
        raise JobExists(f"job {job_id!r} already exists in {root.uri}; choose a new job.id")
    key = layout.queue_entry(job_id)
    try:
        root.put_if_absent(key, loaded.text.encode())
    except ObjectExists:
        raise JobExists(f"job {job_id!r} is already queued in {root.uri}") from None
    return key


class NotQueued(InvalidInput):
    """`rentune cancel` of a job that is not in the queue (exit 2)."""


def cancel(root: Store, job_id: str) -> str:
    """Take a queued job off the queue before a worker runs it; returns where its spec went
    (queue/cancelled/<job_id>.yaml). A claim of its own first, so that no worker can claim the job between the
    check and the move; a worker that claims it after the release finds no queue entry and lets it be.
    Raises NotQueued when there is no such entry, Conflict when a worker holds the job (a dead worker's stale
    claim does not count: see newest_claim). A job cancelled before keeps that spec; this one goes beside it as
    queue/cancelled/<job_id>.<claim>.yaml."""
    key = layout.queue_entry(job_id)
    try:
        text = root.get_bytes(key)
    except ObjectNotFound:
        ran = root.head(layout.root_job_spec(job_id)) is not None
        raise NotQueued(
            f"job {job_id!r} is not queued in {root.uri}: "
            + ("it has run or runs there (see `rentune status`)" if ran else "no such job was submitted there")
        ) from None
    newest = newest_claim(root, job_id, time.time())
    if newest.held(DEFAULT_CLAIM_SECONDS):
        raise Conflict(
            f"job {job_id!r} is held by worker {newest.worker} (claim {newest.number}): it runs. Stop that worker "
            "(`docker stop` of its container: the job commits, stays queued and can be cancelled then)"
        )
    claim = Claim(job_id, newest.number + 1, "rentune cancel")
    record = {"worker": f"rentune cancel on {socket.gethostname()}", "at": time.time(), "cancelled": True}
    try:
        root.put_if_absent(claim.key(), dumps(record))
    except ObjectExists:
        raise Conflict(f"job {job_id!r} was claimed by a worker just now; it runs") from None
    moved = layout.queue_entry(job_id, CANCELLED)
    try:
        root.put_if_absent(moved, text)
    except ObjectExists:  # cancelled before, submitted again: the earlier spec stays as it was
        moved = layout.queue_note(job_id, CANCELLED, f"{claim.number}.yaml")
        root.put_bytes(moved, text)
    root.delete(key)
    root.put_bytes(claim.key("released"), dumps(record))
    return moved


@dataclass
class Claim:
    job_id: str
    number: int
    worker: str

    def key(self, suffix: str = "json") -> str:
        return layout.root_claim(self.job_id, self.number, suffix)


@dataclass(frozen=True)
class NewestClaim:
    """The newest claim on a job: who wrote it, whether it was released, how old its heartbeat is."""

    number: int  # 0: never claimed
    worker: str
    released: bool
    age: float  # seconds since its last heartbeat (or since the claim, before the first)

    def held(self, claim_seconds: float) -> bool:
        """A worker holds the job: claimed, not released, heartbeat within claim_seconds (a dead worker's is
        stale)."""
        return self.number > 0 and not self.released and self.age <= claim_seconds


def newest_claim(root: Store, job_id: str, now: float) -> NewestClaim:
    """Who holds the job, as the queue's every reader sees it (the worker before claiming, `rentune cancel`)."""
    numbers = _claims(root, job_id)
    if not numbers:
        return NewestClaim(0, "", released=True, age=0.0)
    claim = Claim(job_id, numbers[-1], "")
    at, worker = 0.0, "(unnamed)"
    for suffix in ("heartbeat", "json"):
        try:
            record = read_json(root, claim.key(suffix))
        except ObjectNotFound:
            continue
        at, worker = float(record.get("at", 0.0)), str(record.get("worker", worker))
        break
    return NewestClaim(claim.number, worker, root.head(claim.key("released")) is not None, now - at)


def _claims(root: Store, job_id: str) -> list[int]:
    numbers = []
    for info in root.list(layout.root_claims(job_id)):
        name = info.key.rsplit("/", 1)[-1]
        if name.endswith(".json") and name[:-5].isdigit():
            numbers.append(int(name[:-5]))
    return sorted(numbers)


class Worker:
    """Claims queued jobs one at a time and runs them with `run` (rentune's run_job, bound to the store)."""

    def __init__(
        self,
        root: Store,
        run: Callable[[LoadedSpec, Callable[[str], None]], None],
        log: Callable[[str], None],
        claim_seconds: float = DEFAULT_CLAIM_SECONDS,
        poll_seconds: float = 10.0,
        clock: Callable[[], float] = time.time,
    ):
        self.root, self.run, self.log = root, run, log
        self.claim_seconds, self.poll_seconds, self.clock = claim_seconds, poll_seconds, clock
        self.name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.lost: str | None = None  # the job another worker took over from this one

    # -- queue -------------------------------------------------------------------------------------------
    def queued(self) -> list[str]:
        ids = []
        for info in self.root.list(layout.ROOT_QUEUE):
            rest = info.key[len(layout.ROOT_QUEUE) + 1 :]
            if "/" not in rest and rest.endswith(".yaml"):
                ids.append(rest[: -len(".yaml")])
        return sorted(ids)

    def _move(self, job_id: str, folder: str, text: bytes, why: str, suffix: str) -> None:
        self.root.put_bytes(layout.queue_entry(job_id, folder), text)
        self.root.put_bytes(layout.queue_note(job_id, folder, f"{suffix}.txt"), why.encode())
        self.root.delete(layout.queue_entry(job_id))

    def try_claim(self, job_id: str) -> Claim | None:
        """Claim the job if nobody holds a live claim on it; None otherwise."""
        newest = newest_claim(self.root, job_id, self.clock())
        if newest.held(self.claim_seconds):
            return None
        if newest.number and not newest.released:
            self.log(f"worker: claim {newest.number} on {job_id} is stale ({newest.age:.0f} s without heartbeat)")
        claim = Claim(job_id, newest.number + 1, self.name)
        try:
            self.root.put_if_absent(claim.key(), dumps({"worker": self.name, "at": self.clock()}))
        except ObjectExists:
            return None  # another worker won this claim
        return claim

    # -- one job -----------------------------------------------------------------------------------------
    def _beat(self, claim: Claim, stop: threading.Event) -> None:
        """Refresh the heartbeat; if another worker took the job over, stop ours through the SIGTERM path."""
        while not stop.wait(self.claim_seconds / 4):
            try:
                if _claims(self.root, claim.job_id)[-1] != claim.number:
                    self.log(f"worker: {claim.job_id} was taken over by another worker; stopping here")
                    self.lost = claim.job_id
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                self.root.put_bytes(claim.key("heartbeat"), dumps({"worker": self.name, "at": self.clock()}))
            except StoreError as exc:  # keep beating: a dead heartbeat thread would let a second node take over
                self.log(f"worker: heartbeat for {claim.job_id} failed ({exc}); retrying")

    def run_one(self, job_id: str) -> bool:
        """Validate, claim and run one queued job. True if this worker ran (or rejected) it."""
        key = layout.queue_entry(job_id)
        try:
            text = self.root.get_bytes(key)
        except ObjectNotFound:
            return False  # taken off the queue meanwhile
        try:
            loaded = parse_spec(text.decode(), source=f"{self.root.uri}/{key}")
            if loaded.spec.job.id != job_id:
                got = loaded.spec.job.id
                raise SpecError([f"{key}: job.id: expected {job_id!r} (the queue entry's name), got {got!r}"])
        except (SpecError, UnicodeDecodeError) as exc:
            errors = exc.errors if isinstance(exc, SpecError) else [f"{key}: not UTF-8 text"]
            self._move(job_id, REJECTED, text, "\n".join(errors) + "\n", "errors")
            self.log(f"worker: rejected {job_id}: {errors[0]}")
            return True
        claim = self.try_claim(job_id)
        if claim is None:
            return False
        if self.root.head(key) is None:  # cancelled between the read and the claim: let it be
            self.root.put_bytes(claim.key("released"), dumps({"worker": self.name, "at": self.clock()}))
            return False
        self.log(f"worker: {self.name} runs {job_id} (claim {claim.number})")
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(claim, stop), daemon=True)
        beat.start()
        stopped: Interrupted | None = None
        try:
            self.run(loaded, self.log)
        except Interrupted as exc:
            if self.lost == job_id:
                self.log(f"worker: stopped {job_id}; its new owner continues it")
                return True
            # SIGTERM to this worker (docker stop, a spot notice): the job has committed what it could, so
            # the claim is released below and the next worker, here or on another node, resumes the job at
            # once instead of after the lease timeout. The queue entry stays.
            stopped = exc
        except Exception as exc:  # the job failed; the attempt record in the store holds the details
            self._move(job_id, FAILED, text, f"{type(exc).__name__}: {exc}\n", "error")
            self.log(f"worker: {job_id} failed: {type(exc).__name__}: {exc}")
        else:
            self.root.delete(key)
            self.log(f"worker: {job_id} completed")
        finally:
            stop.set()
            beat.join()
        self.root.put_bytes(claim.key("released"), dumps({"worker": self.name, "at": self.clock()}))
        if stopped is not None:
            self.log(f"worker: stopped; {job_id} stays queued and resumes at the next worker's start")
            raise stopped
        return True

    def loop(self, exit_when_idle: bool = False) -> None:
        """Run queued jobs until stopped; with `exit_when_idle`, return once the queue is empty. Refuses
        (StoreUnusable) a store whose conditional writes, on which every claim relies, do not hold."""
        check_conditional_writes(self.root, "workers")
        while True:
            ran = any(self.run_one(job_id) for job_id in self.queued())
            if not ran:
                if exit_when_idle and not self.queued():
                    return
                time.sleep(self.poll_seconds)
