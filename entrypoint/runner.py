"""The phase machine. A job's state lives in the store; any process, on any node, continues it.

    for phase in PHASES:                      # in plan order
        if phases/<phase>/result.json exists: # committed by an earlier process
            skip
        result = phase.run(ctx)               # writes its outputs to the store
        put phases/<phase>/result.json        # last, if absent: the commit

A phase interrupted before its result is committed runs again from the start, so phases are written to
be idempotent: they may overwrite their own uncommitted outputs and never touch committed ones.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from entrypoint.context import PhaseContext, dumps
from entrypoint.envinfo import environment
from entrypoint.phases import baseline, data, evaluate, export, probe, report, test, train, verify
from entrypoint.store import ObjectExists, ObjectNotFound, PrefixedStore, Store, StoreError, join_key
from entrypoint.trainer import Interrupted
from jobspec.load import LoadedSpec
from jobspec.plan import count_train_examples, make_plan
from jobspec.schema import JobSpec

__all__ = [
    "PHASES",
    "JobConflict",
    "PlanDoesNotFit",
    "Unsupported",
    "attempt_number",
    "attempt_numbers",
    "current_plan",
    "job_store",
    "run_job",
]

PHASES: list[tuple[str, Callable[[PhaseContext], dict]]] = [
    ("data", data.run),
    ("baseline", baseline.run),
    ("probe", probe.run),
    ("train", train.run),
    ("evaluate", evaluate.run),
    ("test", test.run),
    ("verify", verify.run),
    ("report", report.run),
    ("export", export.run),
]


# A multipart upload older than this under the job's prefix belongs to a dead process: a live one finishes
# any checkpoint file far sooner, and the margin covers clock skew between this node and the server.
STALE_UPLOAD_S = 3600.0


class Unsupported(ValueError):
    """The spec asks for something this version cannot do yet; said before any compute is spent on it."""


class _StoreLog:
    """Echo each line and keep it in the store (`attempts/<n>/log.txt`), so `rentune logs` works from any
    machine. Flushed at most every `every` seconds and at the end; a failed flush never stops the job."""

    def __init__(self, store: Store, key: str, echo: Callable[[str], None], every: float = 2.0):
        self.store, self.key, self.echo, self.every = store, key, echo, every
        self.lines: list[str] = []
        self.flushed = time.monotonic()

    def __call__(self, message: str) -> None:
        self.echo(message)
        self.lines.append(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {message}")
        if time.monotonic() - self.flushed >= self.every:
            self.flush()

    def flush(self) -> None:
        self.flushed = time.monotonic()
        try:
            self.store.put_bytes(self.key, ("\n".join(self.lines) + "\n").encode())
        except StoreError as exc:
            self.echo(f"store: could not save the log ({exc}); continuing")


class PlanDoesNotFit(ValueError):
    """The job cannot fit its lease; said before the first phase, with what to cut."""


class JobConflict(RuntimeError):
    """The store already holds this job id with a different spec; nothing was overwritten."""


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    store_uri: str
    ran: list[str]
    skipped: list[str]


def job_store(root: Store, job_id: str) -> Store:
    return PrefixedStore(root, join_key("jobs", job_id))


def _freeze_spec(store: Store, loaded: LoadedSpec) -> None:
    """Store the spec once. The same job id with another spec is refused, never overwritten."""
    try:
        store.put_if_absent("spec.yaml", loaded.text.encode())
        return
    except ObjectExists:
        pass
    stored = hashlib.sha256(store.get_bytes("spec.yaml")).hexdigest()
    if stored != loaded.sha256:
        raise JobConflict(
            f"job.id {loaded.spec.job.id!r}: {store.uri} already holds this job with another spec "
            f"(sha256 {stored[:12]}, yours {loaded.sha256[:12]}); choose a new job.id to start a new job, "
            "or run the stored spec to continue it"
        )


def attempt_numbers(store: Store) -> list[int]:
    """The attempts recorded for a job, oldest first."""
    return sorted({int(i.key.split("/")[1]) for i in store.list("attempts") if i.key.split("/")[1].isdigit()})


def attempt_number(store: Store, clock: Callable[[], float] = time.time) -> int:
    """Claim the next attempt number with a conditional write, so two processes never share one."""
    number = max(attempt_numbers(store), default=0) + 1
    while True:
        try:
            store.put_if_absent(f"attempts/{number}/started.json", dumps({"started_at": clock()}))
            return number
        except ObjectExists:
            number += 1


def _previous_attempts(store: Store, current: int) -> list[dict]:
    """Why each earlier process ended: its ended.json, or `killed` when it left none (SIGKILL, node loss)."""
    out = []
    for n in range(1, current):
        try:
            ended = json.loads(store.get_bytes(f"attempts/{n}/ended.json"))
        except ObjectNotFound:
            ended = {"outcome": "killed", "error": "no end record: SIGKILL, OOM killer or node loss"}
        out.append({"attempt": n, **ended})
    return out


def lease_start(spec: JobSpec, store: Store) -> float:
    """rental.started_at, or when this job's first attempt started."""
    if spec.rental.started_at is not None:
        return spec.rental.started_at.timestamp()
    return json.loads(store.get_bytes("attempts/1/started.json"))["started_at"]


def current_plan(spec: JobSpec, store: Store, now: float, start: float | None = None) -> dict | None:
    """The plan from what the store holds now: committed phases' measured seconds, the probe's step time,
    trials done. None before the number of training examples is known (data in s3://, data phase not run)."""
    data = read_result(store, "data")
    if data is not None:
        n_train = sum(data["counts"]["train"].values())
    else:
        try:
            n_train = count_train_examples(spec)
        except OSError:
            n_train = None
    if n_train is None:
        return None
    measured = {}
    for name, _ in PHASES:
        result = read_result(store, name)
        if result is not None and name != "train":
            measured[name] = result["seconds"]
    probe_result = read_result(store, "probe")
    step = None
    if probe_result is not None:
        step = probe_result["variants"]["plain"]["seconds"] * spec.training.grad_accum
    steps_done = {}
    for info in store.list("trials"):
        if info.key.endswith("/result.json") and info.key.count("/") == 2:
            record = json.loads(store.get_bytes(info.key))
            steps_done[record["trial_id"]] = 10**12  # finished, whatever its status: nothing left to train
    start = lease_start(spec, store) if start is None else start
    plan = make_plan(
        spec, n_train, elapsed=max(0.0, now - start), measured=measured, step_seconds=step, steps_done=steps_done
    )
    return {
        **plan.to_dict(),
        "lease_start_at": start,
        "lease_end_at": start + plan.lease_seconds,
        "train_deadline_at": start + plan.train_deadline,
        "planned_at": now,
    }


def _check_backend(wanted: str) -> None:
    """Refuse an image whose torch is built for another accelerator stack than the spec expects."""
    import torch

    have = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu"
    if wanted != "any" and wanted != have:
        built = {"rocm": f"ROCm (HIP {torch.version.hip})", "cuda": f"CUDA {torch.version.cuda}", "cpu": "CPU only"}
        raise Unsupported(
            f"training.backend: the spec expects {wanted!r} but this image's torch {torch.__version__} is built for "
            f"{built[have]}; run it on the {wanted} image (`rentune env` shows what an image has)"
        )


def _check_device(wanted: str, precision: str) -> None:
    """Refuse a device that is not there, or a precision it cannot train in, before any phase runs."""
    import torch

    if wanted == "cuda" and not torch.cuda.is_available():
        raise Unsupported("training.device: 'cuda' requested but torch sees no CUDA or ROCm device")
    device = torch.device("cuda" if wanted != "cpu" and torch.cuda.is_available() else "cpu")
    if precision == "fp16" and device.type != "cuda":
        raise Unsupported("training.precision: fp16 needs a CUDA or ROCm device; use bf16 or fp32 on CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise Unsupported(f"training.precision: bf16 is not supported by {torch.cuda.get_device_name(device)}")


def _stop_on_sigterm():
    """Outside training (which finishes its step and commits first), SIGTERM stops the current phase at
    once: it is not committed and runs again in the next process. Returns the previous handler."""

    def stop(signum, frame):
        raise Interrupted("stopped on SIGTERM before the current phase committed; it runs again on resume")

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, stop)


def run_job(
    loaded: LoadedSpec,
    root: Store,
    workdir: Path,
    log: Callable[[str], None],
    until: str | None = None,
    reopen_test: str | None = None,
    clock: Callable[[], float] = time.time,
) -> JobOutcome:
    """Run every phase not yet committed, in order, stopping after `until` if given. `reopen_test` is the
    reason to open a test split another spec already opened (recorded in the report). Raises whatever a
    phase raises, after recording the attempt."""
    if until is not None and until not in dict(PHASES):
        raise ValueError(f"--until {until!r}: expected one of {', '.join(name for name, _ in PHASES)}")
    spec = loaded.spec
    store = job_store(root, spec.job.id)
    if store.head("spec.yaml") is None:  # a new job: refuse it before anything is stored if it cannot fit
        now = clock()
        started = spec.rental.started_at.timestamp() if spec.rental.started_at else now
        fresh = current_plan(spec, store, now, start=started)
        if fresh is not None and fresh["problems"]:
            raise PlanDoesNotFit("\n".join(fresh["problems"]))
    _freeze_spec(store, loaded)
    attempt = attempt_number(store, clock)
    log = _StoreLog(store, f"attempts/{attempt}/log.txt", log)
    abort_stale = getattr(root, "abort_stale_uploads", None)  # object stores with multipart uploads only
    if abort_stale is not None:
        aborted = abort_stale(join_key("jobs", spec.job.id), STALE_UPLOAD_S)
        if aborted:
            log(f"store: aborted {aborted} multipart upload(s) left by an interrupted process")
    store.put_bytes(f"attempts/{attempt}/env.json", dumps(environment()))
    for earlier in _previous_attempts(store, attempt)[-1:]:
        if earlier["outcome"] != "completed":
            log(f"rentune: attempt {earlier['attempt']} ended {earlier['outcome']}: {earlier.get('error')}; continuing")
    finished = store.head(f"phases/{PHASES[-1][0]}/result.json") is not None
    plan = None if finished else current_plan(spec, store, clock())  # a finished job keeps its last plan
    if plan is not None:
        for problem in plan["problems"]:
            log(f"plan: {problem}")
        store.put_bytes("plan.json", dumps(plan))
    store_args = ["--store", root.uri, "--job", spec.job.id]
    for flag, value in getattr(root, "reopen_flags", {}).items():  # the store as opened, not as the spec says
        store_args += [flag, value] if value else []
    ctx = PhaseContext(
        spec=spec,
        spec_sha256=loaded.sha256,
        store=store,
        workdir=(workdir / spec.job.id).resolve(),
        log=log,
        store_args=tuple(store_args),
        root=root,
        reopen_test=reopen_test,
        clock=clock,
    )
    ran, skipped = [], []
    outcome = {"outcome": "error", "phase": None}
    previous_handler = _stop_on_sigterm()
    try:
        _check_backend(spec.training.backend)
        _check_device(spec.training.device, spec.training.precision)
        for name, phase in PHASES:
            key = f"phases/{name}/result.json"
            if store.head(key) is not None:
                log(f"{name}: already committed, skipping")
                skipped.append(name)
                if name == until:
                    break
                continue
            outcome["phase"] = name
            log(f"{name}: starting")
            started = time.monotonic()
            result = phase(ctx)
            result["seconds"] = round(time.monotonic() - started, 3)
            try:
                store.put_if_absent(key, dumps(result))
            except ObjectExists:  # another process (another node, a second worker) committed it first
                log(f"{name}: committed by another process meanwhile; keeping theirs")
            ran.append(name)
            if name in ("data", "probe"):  # new measurements: training examples, step time
                replanned = current_plan(spec, store, clock())
                if replanned is not None:
                    store.put_bytes("plan.json", dumps(replanned))
                    for problem in replanned["problems"]:
                        log(f"plan: {problem}")
            if name == until:
                break
        outcome = {"outcome": "completed", "phase": None}
    except BaseException as exc:
        outcome["outcome"] = "interrupted" if isinstance(exc, Interrupted) else "error"
        outcome["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        outcome["ended_at"] = time.time()
        try:
            store.put_bytes(f"attempts/{attempt}/ended.json", dumps(outcome))
        except StoreError as exc:  # never let the record hide the outcome it records
            log(f"store: could not record the end of attempt {attempt}: {exc}")
        log.flush()
    return JobOutcome(job_id=spec.job.id, store_uri=store.uri, ran=ran, skipped=skipped)


def read_result(store: Store, phase: str) -> dict | None:
    try:
        return json.loads(store.get_bytes(f"phases/{phase}/result.json"))
    except ObjectNotFound:
        return None
