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

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from entrypoint.context import PhaseContext
from entrypoint.errors import STOP_SIGNALS, Conflict, Interrupted, InvalidInput, signal_name
from entrypoint.job import layout
from entrypoint.job.attempts import StoreLog, claim_attempt, previous_attempts
from entrypoint.job.plan import current_plan, store_plan
from entrypoint.job.state import PHASE_NAMES, dumps, freeze_spec, job_store, read_json, stored_spec
from entrypoint.notices import notice_provider, watching_notices
from entrypoint.phases import baseline, data, evaluate, export, probe, report, test, train, verify
from entrypoint.store import ObjectExists, ObjectNotFound, Store, StoreError, check_conditional_writes
from entrypoint.training.device import preflight
from entrypoint.training.disk import disk_full
from entrypoint.training.environment import environment
from entrypoint.training.lifeline import process_identity, still_running
from entrypoint.training.model import match_base_model, resolve_model_dir
from entrypoint.trial.export import adapter_files, clear_merged, export_merged, finish_export, write_binding
from jobspec.compare import with_locations
from jobspec.load import LoadedSpec
from jobspec.model_limits import max_length_problem
from jobspec.urls import redact_text

__all__ = [
    "PHASES",
    "JobOutcome",
    "PlanDoesNotFit",
    "Underpowered",
    "check_base_model",
    "check_power",
    "merge_later",
    "run_job",
    "store_args",
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
assert tuple(name for name, _ in PHASES) == PHASE_NAMES  # job/state.py names them for the light commands

# A multipart upload older than this under the job's prefix belongs to a dead process: a live one finishes
# any checkpoint file far sooner, and the margin covers clock skew between this node and the server.
STALE_UPLOAD_S = 3600.0


class PlanDoesNotFit(InvalidInput):
    """The job cannot fit its lease; said before the first phase, with what to cut."""


class Underpowered(InvalidInput):
    """The eval or test split is too small to decide the hypothesis (evaluation.underpowered: fail)."""


def check_power(ctx: PhaseContext) -> None:
    """After the baseline, before any training: with `evaluation.underpowered: fail`, stop a job whose
    hypothesis its splits cannot decide (the baseline phase's power table), saying what would."""
    table = ctx.read_json(layout.phase_result("baseline")).get("power")
    if table is None:  # a baseline committed by a rentune without the power check: nothing to check
        return
    hypothesis = next(m for m in table["metrics"] if m["role"] == "hypothesis")
    if hypothesis.get("reachable") is False:
        _cannot_hold(ctx, hypothesis)
        return
    if hypothesis["decidable"] is not False:
        return
    e, t, need = hypothesis["eval"], hypothesis["test"], hypothesis.get("needed") or {}
    message = (
        f"evaluation: the hypothesis cannot be decided with these splits: a change of {hypothesis['metric']} "
        f"smaller than {e['detectable']:.3f} on eval ({e['examples']} examples) or {t['detectable']:.3f} on test "
        f"({t['examples']} examples) cannot be told from noise at {table['confidence']:.0%} confidence, and "
        f"hypothesis.min_gain is {hypothesis['asked']:.3f}. About {need.get('eval')} eval and {need.get('test')} "
        "test examples would decide it (more data, larger data.split shares, or a larger min_gain)"
    )
    if ctx.spec.evaluation.underpowered == "fail":
        raise Underpowered(
            f"{message}; stopped before training (evaluation.underpowered: fail). Job {ctx.spec.job.id!r} keeps "
            "its committed data and splits (a larger file at data.source is not read again, and a changed "
            "data.split, hypothesis.min_gain or evaluation setting is refused as a change of the job's spec): "
            "decide the hypothesis in a new job, a copy of this spec with another job.id and more data, larger "
            "data.split shares or a larger hypothesis.min_gain"
        )
    ctx.log(f"warning: {message}; going on (evaluation.underpowered: warn): expect 'inconclusive'")


def _cannot_hold(ctx: PhaseContext, hypothesis: dict) -> None:
    """The baseline already sits within min_gain of the metric's maximum: no training can show the gain."""
    metric, asked, room = hypothesis["metric"], hypothesis["asked"], hypothesis["room"]
    message = (
        f"evaluation: the hypothesis cannot hold: the untouched model's {metric} is {1.0 - room:.3f} on eval, so "
        f"a gain of hypothesis.min_gain {asked:.3f} would need {1.0 - room + asked:.3f}, above the most "
        f"{metric} can be (1.000); the baseline leaves {room:.3f}"
    )
    if ctx.spec.evaluation.underpowered == "fail":
        raise Underpowered(
            f"{message}. Stopped before training (evaluation.underpowered: fail). Job {ctx.spec.job.id!r} keeps "
            "its committed data, splits and baseline; ask for what the baseline leaves in a new job (a copy of "
            "this spec with another job.id and a hypothesis.min_gain below that, or a harder metric)"
        )
    ctx.log(f"warning: {message}; going on (evaluation.underpowered: warn): expect 'does not hold'")


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    store_uri: str
    ran: list[str]
    skipped: list[str]


def _stop_on_signals() -> dict:
    """Outside training (which finishes its step and commits first), SIGTERM or SIGINT (Ctrl-C) stops the
    current phase at once: it is not committed and runs again in the next process. Returns the previous
    handlers."""

    def stop(signum, frame):
        raise Interrupted(
            f"stopped on {signal_name(signum)} before the current phase committed; it runs again on resume", signum
        )

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}


def run_job(
    loaded: LoadedSpec,
    root: Store,
    workdir: Path,
    log: Callable[[str], None],
    until: str | None = None,
    reopen_test: str | None = None,
    clock: Callable[[], float] = time.time,
    startup_seconds: float | None = None,
) -> JobOutcome:
    """Run every phase not yet committed, in order, stopping after `until` if given. `reopen_test` is the
    reason to open a test split another spec already opened (recorded in the report). `startup_seconds`:
    how long this process took to start (a fresh `rentune run`; the plan predicts the verify phase's fresh
    process from it). Raises whatever a phase raises, after recording the attempt."""
    if until is not None and until not in PHASE_NAMES:
        raise ValueError(f"--until {until!r}: expected one of {', '.join(PHASE_NAMES)}")
    spec = loaded.spec
    store = job_store(root, spec.job.id)
    if store.head(layout.SPEC) is None:  # a new job: refuse it before anything is stored if it cannot fit
        now = clock()
        started = spec.rental.started_at.timestamp() if spec.rental.started_at else now
        fresh = current_plan(spec, store, now, start=started)
        if fresh is not None and fresh["problems"]:
            raise PlanDoesNotFit("\n".join(fresh["problems"]))
        _check_max_length(loaded, log)
    check_conditional_writes(store, layout.SCRATCH)
    continued = freeze_spec(store, loaded)  # from here on the stored spec, at this node's locations
    spec = continued.loaded.spec
    attempt = claim_attempt(store, clock, startup_seconds)
    log = StoreLog(store, layout.attempt_log(attempt), log)
    for line in continued.lines():
        log(line)
    ctx = PhaseContext(
        spec=spec,
        spec_sha256=continued.loaded.sha256,
        store=store,
        workdir=(workdir / spec.job.id).resolve(),
        log=log,
        store_args=store_args(root, spec.job.id, continued.moved),
        root=root,
        reopen_test=reopen_test,
        clock=clock,
        attempt=attempt,
    )
    _start_attempt(ctx, root, attempt)
    ran, skipped = [], []
    outcome = {"outcome": "error", "phase": None}
    previous_handlers = _stop_on_signals()
    try:
        preflight(spec.training, spec.model, spec.tracking, spec.adaptation.quantization is not None)
        model_checked = False
        with watching_notices(log):  # a provider's interruption notice takes the SIGTERM path
            for name, phase in PHASES:
                if store.head(layout.phase_result(name)) is not None:
                    log(f"{name}: already committed, skipping")
                    skipped.append(name)
                else:
                    outcome["phase"] = name
                    if name != "data" and not model_checked:  # before the first phase here that uses the model
                        check_base_model(ctx)
                        model_checked = True
                    _run_phase(ctx, name, phase)
                    ran.append(name)
                if name == "baseline":
                    check_power(ctx)
                if name == until:
                    break
        outcome = {"outcome": "completed", "phase": None}
    except BaseException as exc:
        outcome["outcome"] = "interrupted" if isinstance(exc, Interrupted) else "error"
        outcome["error"] = redact_text(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        for signum, previous in previous_handlers.items():
            signal.signal(signum, previous)
        outcome["ended_at"] = time.time()
        try:
            store.put_bytes(layout.attempt_ended(attempt), dumps(outcome))
        except StoreError as exc:  # never let the record hide the outcome it records
            log(f"store: could not record the end of attempt {attempt}: {exc}")
        log.flush()
    return JobOutcome(job_id=spec.job.id, store_uri=store.uri, ran=ran, skipped=skipped)


def store_args(root: Store, job_id: str, moved: dict | None = None) -> tuple[str, ...]:
    """How a subprocess (a torchrun rank, the recheck process) reopens this job's store: as it was opened, not as the
    spec says, and where this node keeps what the stored spec locates elsewhere (`moved`, freeze_spec's)."""
    args = ["--store", root.uri, "--job", job_id]
    for flag, value in getattr(root, "reopen_flags", {}).items():
        args += [flag, value] if value else []
    return (*args, *locations_args(moved))


def locations_args(moved: dict | None) -> tuple[str, ...]:
    """The flag that tells a subprocess where this node keeps what the stored spec locates elsewhere."""
    return ("--locations", json.dumps(moved, sort_keys=True)) if moved else ()


def _start_attempt(ctx: PhaseContext, root: Store, attempt: int) -> None:
    """Clean up after a dead process, record this one's environment, say how the last attempt ended, and
    store the plan as of now."""
    store, log = ctx.store, ctx.log
    abort_stale = getattr(root, "abort_stale_uploads", None)  # object stores with multipart uploads only
    if abort_stale is not None:
        aborted = abort_stale(layout.root_job(ctx.spec.job.id), STALE_UPLOAD_S)
        if aborted:
            log(f"store: aborted {aborted} multipart upload(s) left by an interrupted process")
    # The provider whose notice bounds the plan's notice window (jobspec.plan.notice_window).
    store.put_bytes(layout.attempt_env(attempt), dumps({**environment(), "notice_provider": notice_provider()}))
    for earlier in previous_attempts(store, attempt)[-1:]:
        if earlier["outcome"] != "completed":
            log(f"rentune: attempt {earlier['attempt']} ended {earlier['outcome']}: {earlier.get('error')}; continuing")
    if store.head(layout.phase_result(PHASE_NAMES[-1])) is None:  # a finished job keeps its last plan
        store_plan(ctx.spec, store, ctx.clock(), f"attempt {attempt} started", log)


def _run_phase(ctx: PhaseContext, name: str, phase: Callable[[PhaseContext], dict]) -> None:
    """Run one phase and commit its result last, if absent, with what it measured for the plan (`timings`);
    then re-plan from the new measurements."""
    ctx.log(f"{name}: starting")
    ctx.timings.clear()
    started = time.monotonic()
    try:
        result = phase(ctx)
    except Exception as exc:  # a full disk is named as such, whichever phase filled it
        full = disk_full(exc, ctx.workdir)
        if full is None or full is exc:
            raise
        raise full from exc
    result["seconds"] = round(time.monotonic() - started, 3)
    if ctx.timings:
        result.setdefault("timings", dict(ctx.timings))
    try:
        ctx.store.put_if_absent(layout.phase_result(name), dumps(result))
    except ObjectExists:  # another process (another node, a second queue worker) committed it first
        ctx.log(f"{name}: committed by another process meanwhile; keeping theirs")
    if name != PHASE_NAMES[-1]:  # the last phase's commit is the job's last write (but the attempt's records)
        store_plan(ctx.spec, ctx.store, ctx.clock(), f"after {name}", ctx.log)


def _check_max_length(loaded: LoadedSpec, log: Callable[[str], None]) -> None:
    """model.max_length against the model's positions (jobspec/model_limits.py), before a new job's spec is
    frozen: once stored, a corrected max_length would be refused as a change of the job. A model that
    cannot be found here is left to the phases that load it, which say why."""
    try:
        folder = resolve_model_dir(loaded.spec.model, loaded.spec.store, log)
    except Exception:  # noqa: BLE001 - reported by the phase that needs the model
        return
    found = max_length_problem(loaded.spec.model.max_length, folder)
    if found is not None and found[1]:
        raise InvalidInput(f"{loaded.source}: {found[0]}; the job was not started, nothing was stored")
    if found is not None:
        log(f"warning: {found[0]}")


def check_base_model(ctx: PhaseContext) -> None:
    """This node's copy of the base model must be the one the job started with (training/model.py: match_base_model)."""
    match_base_model(ctx.store, ctx.spec, ctx.model_dir, record=True)


def merge_later(
    root: Store,
    job_id: str,
    workdir: Path,
    log: Callable[[str], None],
    dtype: str | None = None,
    model_path: str | None = None,
    replace: bool = False,
) -> dict:
    """`rentune export JOB --merged`: the merged folder of a job that has exported, from the store alone
    (trial/export.py), then the serving files and BINDING.json rewritten. Refuses (InvalidInput) a job that
    has not exported and, unless `replace`, one that has a merged folder; ModelMismatch for a base model that
    does not hash as the one trained on. Returns BINDING.json's `merged` (its parity ok or failed)."""
    store = job_store(root, job_id)
    try:
        binding = read_json(store, layout.EXPORT_BINDING)
        read_json(store, layout.phase_result("export"))  # committed: the job has finished
    except ObjectNotFound:
        raise InvalidInput(
            f"job {job_id} has not finished its export in {store.uri}; `rentune run` continues it "
            f"(`rentune status {job_id}` says where it is)"
        ) from None
    done = binding.get("merged") or {}
    if done.get("parity") in ("ok", "failed") and not replace:
        raise InvalidInput(
            f"{store.uri}/export/merged/ exists (parity {done['parity']}, {done['dtype']}); pass --replace to "
            "write it again"
        )
    loaded = stored_spec(store)
    moved = {"model.path": model_path} if model_path else {}
    spec = with_locations(loaded.spec, moved)
    ctx = PhaseContext(spec, loaded.sha256, store, (workdir / job_id).resolve(), log, store_args(root, job_id, moved))
    match_base_model(store, spec, ctx.model_dir, record=False)  # another base: exit 3, nothing written
    if spec.adaptation.quantization is not None:  # re-quantizes the base: bitsandbytes and the device needed
        preflight(spec.training, spec.model, None, quantized=True)
    trial_id = binding["trial_id"]
    kept = adapter_files(binding["files"])
    with _merge_claim(store, log):
        write_binding(ctx, trial_id, kept)  # first no merged folder listed, then none stored, then the new one
        clear_merged(ctx)
        merged = export_merged(ctx, trial_id, dtype or spec.export.dtype)
        return finish_export(ctx, trial_id, kept, merged)["merged"]


@contextlib.contextmanager
def _merge_claim(store: Store, log: Callable[[str], None]):
    """One `export --merged` at a time per job: a claim put if absent, deleted at the end. A claim whose
    process is gone from this node is taken over; one held on another node refuses (Conflict, exit 3):
    two merges would write export/merged/ over each other, and both would report success."""
    ours = {**process_identity(), "at": time.time()}
    for _ in range(2):
        try:
            store.put_if_absent(layout.MERGE_CLAIM, dumps(ours))
            break
        except ObjectExists:
            theirs = read_json(store, layout.MERGE_CLAIM)
            if theirs.get("host") != ours["host"] or still_running(theirs):  # another node's: assumed alive
                raise Conflict(
                    f"{store.uri}/{layout.MERGE_CLAIM}: another `rentune export --merged` (process "
                    f"{theirs.get('pid')} on {theirs.get('host')}) is writing export/merged/; wait for it to end. "
                    "If it is gone, delete that object and run again"
                ) from None
            log(f"export: taking over the merge claim of process {theirs.get('pid')}, which is gone")
            store.delete(layout.MERGE_CLAIM)
    try:
        yield
    finally:
        with contextlib.suppress(StoreError):
            store.delete(layout.MERGE_CLAIM)
