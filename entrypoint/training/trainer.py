"""The HF `Trainer`, configured from the spec, with rentune's callbacks. No hand-written training loop.

What rentune adds to the Trainer's loop, as callback events:

    on_step_end:  every_minutes elapsed, SIGTERM seen, deadline passed, or last step -> ask the Trainer to save
                  SIGTERM seen or the plan's training deadline passed -> also ask it to stop after this step
    on_save:      the Trainer wrote checkpoint-N/ locally -> commit it to the store (manifest last),
                  rotate old checkpoints, remove the local copy
    on_log:       one progress line per logging step, loss history kept
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

from entrypoint.errors import STOP_SIGNALS, DiskFull, signal_name
from entrypoint.job.heartbeat import Heartbeat
from entrypoint.store import Store, StoreError
from entrypoint.store.checkpoint import CheckpointError, Nodes
from entrypoint.store.committer import Committer
from entrypoint.training.disk import check_room
from entrypoint.training.distributed import node_count, node_rank
from entrypoint.training.memory import PeakMemory
from entrypoint.training.paramcheck import ParameterCheck
from entrypoint.training.staging import Stager
from entrypoint.training.throughput import ThroughputMeter
from jobspec.plan import AUTO_FIRST_MINUTES, planned_steps, young_daly_minutes
from jobspec.schema import CheckpointPolicy, Training

__all__ = [
    "DivergenceCallback",
    "FirstStepsCallback",
    "NonFiniteLoss",
    "PROGRESS_EVERY_S",
    "ProgressCallback",
    "StepClock",
    "StagingTrainer",
    "StoreCheckpointCallback",
    "build_trainer",
    "graceful_sigterm",
    "log_every",
    "loss_history",
    "mean_train_loss",
    "reproducible_files",
    "step_losses",
    "throughput_text",
]

PROGRESS_EVERY_S = 10.0  # how often the step reached is recorded (one small PUT): what a resume can tell was lost

# Files the Trainer writes that rentune does not keep: training_args.bin is a pickle holding the work
# directory (so its bytes differ per run), and the spec already says everything it holds.
_NOT_COMMITTED = ("training_args.bin",)


def reproducible_files(folder: Path) -> None:
    """Make what `save_model` wrote in `folder` depend on the weights and settings alone, so the same
    trained weights give byte-identical files: drop `_NOT_COMMITTED`, and rewrite adapter_config.json with
    its lists sorted (peft keeps target_modules as a set, whose order changes with each process's hash
    seed)."""
    for name in _NOT_COMMITTED:
        (folder / name).unlink(missing_ok=True)
    config_path = folder / "adapter_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        for key in ("target_modules", "modules_to_save", "exclude_modules"):
            if isinstance(config.get(key), list):
                config[key] = sorted(config[key])
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite: the trial diverged and is recorded as invalid."""


class DivergenceCallback(TrainerCallback):
    """Stops training at the first logged loss that is NaN or infinite (the Trainer's NaN filter is off, so
    the logged loss is the real one; under DDP it is the mean over ranks, so every rank stops together)."""

    def __init__(self):
        self.bad_step: int | None = None
        self.bad_loss: float | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss) and self.bad_step is None:
            self.bad_step, self.bad_loss = state.global_step, loss
            control.should_training_stop = True
        return control

    def raise_if_diverged(self) -> None:
        if self.bad_step is not None:
            raise NonFiniteLoss(f"training loss became {self.bad_loss} at step {self.bad_step}")


def step_losses(log_history: list[dict]) -> dict[int, float]:
    """Step -> training loss of that optimizer step. The Trainer logs every step (`logging_steps=1`) and
    keeps its log in each checkpoint's trainer_state.json, so after a resume this covers the whole run,
    every attempt included."""
    return {entry["step"]: entry["loss"] for entry in log_history if "loss" in entry}


def log_every(every_steps: int | None, max_steps: int) -> int:
    """The spec's `training.log_every_steps`, or about 20 lines a run."""
    return every_steps or max(1, max_steps // 20)


def loss_history(log_history: list[dict], every: int) -> list[dict]:
    """The mean training loss of each window of `every` steps (steps 1..every, every+1..2*every, ..., the
    last window possibly shorter), labelled with its last step. The windows are fixed by step numbers, not
    by where a process started, so a resumed run logs what an uninterrupted one does."""
    windows: dict[int, list[float]] = {}
    losses = step_losses(log_history)
    last = max(losses, default=0)
    for step, loss in sorted(losses.items()):
        windows.setdefault(min(-(-step // every) * every, last), []).append(loss)
    return [{"step": end, "loss": sum(values) / len(values)} for end, values in sorted(windows.items())]


def mean_train_loss(log_history: list[dict]) -> float | None:
    """The mean training loss over every step of the run (the Trainer's own `training_loss` counts only
    the steps of the current process but divides by all of them, so it is wrong after a resume)."""
    losses = list(step_losses(log_history).values())
    return sum(losses) / len(losses) if losses else None


class ProgressCallback(TrainerCallback):
    """One line per `every` steps (`train: step 20/60  loss 0.812  12.4 s`): the mean loss of the window
    (`every=None`: about 20 lines a run); during an eval-loss pass, a line at least every HEARTBEAT_SECONDS
    (`eval-loss: 12/40 batches in 31 s (0.39 batches/s)`)."""

    def __init__(self, log: Callable[[str], None], every: int | None = None, meter: ThroughputMeter | None = None):
        self.log = log
        self.every = every
        self.meter = meter  # registered before this callback, so it has counted the step being logged
        self.started = time.monotonic()
        self._eval: Heartbeat | None = None  # the eval-loss pass under way

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if self._eval is None:
            total = len(eval_dataloader) if eval_dataloader is not None else 0
            self._eval = Heartbeat(self.log, "eval-loss", total=total, unit="batches").start()
        self._eval.advance()

    def _eval_ended(self) -> None:
        if self._eval is not None:
            self._eval.stop()
            self._eval = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._eval_ended()

    def on_train_end(self, args, state, control, **kwargs):
        self._eval_ended()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not (logs and "loss" in logs):
            return
        every = log_every(self.every, state.max_steps)
        if state.global_step % every == 0 or state.global_step == state.max_steps:
            loss = loss_history(state.log_history, every)[-1]["loss"]
            elapsed = time.monotonic() - self.started
            line = f"train: step {state.global_step}/{state.max_steps}  loss {loss:.4f}  {elapsed:.1f} s"
            if self.meter is not None:
                line += throughput_text(self.meter.window())
            self.log(line)


def throughput_text(figures: dict) -> str:
    """`  2,410 tok/s  pad 38%  MFU 41.2%` (the parts measured)."""
    if figures.get("padding_share") is None:  # nothing tokenised (images)
        return ""
    text = f"  {figures['tokens_per_s']:,.0f} tok/s  pad {figures['padding_share']:.0%}"
    return text + (f"  MFU {figures['mfu']:.1%}" if figures.get("mfu") is not None else "")


class graceful_sigterm:
    """Context manager: while active, SIGTERM or SIGINT (Ctrl-C) sets `requested` instead of killing the
    process (`signum` says which came first), and starts a watchdog that ends the process with 128 + signum
    once `grace_seconds` have passed, whatever it is doing. A checkpoint whose manifest is not written by
    then simply does not exist. A second Ctrl-C ends the process at once, without that checkpoint."""

    def __init__(self, grace_seconds: float, log: Callable[[str], None]):
        self.grace_seconds = grace_seconds
        self.log = log
        self.requested = threading.Event()
        self.received_at: float | None = None
        self.signum: int = signal.SIGTERM
        self.watchdog: threading.Timer | None = None  # armed by the first signal; never disarmed in a run
        self.steps_done: int | None = None  # optimizer steps completed, kept by the checkpoint callback
        self._previous: dict[int, object] = {}

    @property
    def name(self) -> str:
        return signal_name(self.signum)

    def _handle(self, signum, frame) -> None:
        if self.requested.is_set():
            if signum == signal.SIGINT:
                self.log("train: a second Ctrl-C; exiting now, without the checkpoint of this step")
                os._exit(128 + signum)
            return
        self.received_at = time.monotonic()
        self.signum = signum
        self.requested.set()
        during = f" during step {self.steps_done + 1}" if self.steps_done is not None else ""
        again = " (Ctrl-C again to exit without it)" if signum == signal.SIGINT else ""
        self.log(
            f"train: {self.name} received{during}; finishing it and committing within {self.grace_seconds:.0f} s"
            + again
        )
        self.watchdog = threading.Timer(self.grace_seconds, self._expire)
        self.watchdog.daemon = True
        self.watchdog.start()

    def _expire(self) -> None:
        self.log("train: grace period over before the checkpoint committed; exiting without it")
        os._exit(128 + self.signum)

    def __enter__(self) -> graceful_sigterm:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _collective_device() -> torch.device:
    """Where a small tensor must live for the process group's backend (NCCL/RCCL: the GPU; gloo: CPU)."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class StoreCheckpointCallback(TrainerCallback):
    """Commits each checkpoint the Trainer writes to the store with the manifest-last protocol: in the
    background while training goes on (entrypoint/store/committer.py), except the last one (SIGTERM, the
    plan's deadline, the end of training), which is committed before training returns. `records` has,
    per checkpoint, its bytes, the training loop's blocked time (local save, then any wait for the commit
    before it) and the commit's own time."""

    def __init__(
        self,
        store: Store,
        prefix: str,
        meta: dict,
        policy: CheckpointPolicy,
        sigterm: graceful_sigterm,
        log: Callable[[str], None],
        deadline: float | None = None,
        clock: Callable[[], float] = time.time,
        status_key: str | None = None,
        background: bool = True,
        cap_minutes: float | None = None,
        progress: dict | None = None,
    ):
        self.policy, self.sigterm, self.log, self.background = policy, sigterm, log, background
        self.committer = Committer(store, prefix, meta, policy.keep, log, status_key=status_key)
        self.deadline, self.clock = deadline, clock  # the plan's training deadline (wall clock)
        self.last_commit = time.monotonic()
        auto = policy.every_minutes == "auto"
        # {"key": where, **what to record beside the step}: the step reached, every PROGRESS_EVERY_S and at
        # SIGTERM, so that a process resuming the trial knows what an interruption lost (best effort).
        self.progress, self._progress_at = progress, -math.inf
        # The plan's notice window: a commit on SIGTERM cannot finish before the node goes, so periodic
        # commits at least this often keep what an interruption loses within max_lost_minutes.
        self.cap_minutes = cap_minutes
        self.interval_minutes: float | None = self._capped(AUTO_FIRST_MINUTES if auto else policy.every_minutes)
        if cap_minutes is not None:
            log(
                f"checkpoint: committing at least every {cap_minutes:.3g} min: the plan's notice window (a commit on "
                f"SIGTERM would not finish in time; training.checkpoint.max_lost_minutes {policy.max_lost_minutes:g})"
            )
        # with every_minutes: auto, the interval chosen from the newest measured commit, and why
        self.interval: dict | None = {"policy": "auto", "mtbf_hours": policy.mtbf_hours} if auto else None
        self.deadline_hit_at: int | None = None
        self._final = False  # the save the Trainer is about to make is the last of this process
        self._save_asked_at: float | None = None
        self.estimate_bytes = 0  # a first checkpoint's size before any was written: 12 bytes per trainable
        # A full fine-tune's weights and optimizer state, copied aside by the trainer (StagingTrainer) and
        # written to disk by the commit's thread instead of the training loop's.
        self.stager = Stager(log)

    @property
    def committed(self) -> list[int]:
        return self.committer.committed

    @property
    def records(self) -> list[dict]:
        return self.committer.records

    def _retune(self) -> None:
        """every_minutes: auto: Young/Daly's interval for the newest commit's cost (blocked + commit time)."""
        done = [r for r in self.records if r["commit_s"] is not None and "blocked_s" in r]
        if not done or self.interval.get("step") == done[-1]["step"]:
            return
        cost = done[-1]["blocked_s"] + done[-1]["commit_s"]
        self.interval_minutes = self._capped(young_daly_minutes(cost, self.policy.mtbf_hours))
        self.interval.update(step=done[-1]["step"], commit_cost_s=round(cost, 3), minutes=self.interval_minutes)
        self.log(
            f"checkpoint: every_minutes auto: a commit costs {cost:.1f} s, MTBF {self.policy.mtbf_hours:g} h "
            f"-> every {self.interval_minutes:.1f} min (sqrt(2 x C x MTBF))"
        )

    def _capped(self, minutes: float | None) -> float | None:
        """`minutes`, or the plan's cap when that is shorter (or the only interval)."""
        if self.cap_minutes is None:
            return minutes
        return self.cap_minutes if minutes is None else min(minutes, self.cap_minutes)

    def checkpoint_bytes(self) -> int:
        """What the next checkpoint will take on disk: the last one's size, else the estimate."""
        sizes = [r["bytes"] for r in self.records if r["bytes"] is not None]  # the one in flight: not yet
        return sizes[-1] if sizes else self.estimate_bytes

    def _room_problem(self, args, step: int) -> str | None:
        """Why the work dir cannot hold the next checkpoint, or None (training/disk.py's check)."""
        try:
            check_room(Path(args.output_dir), self.checkpoint_bytes(), f"the checkpoint of step {step}")
        except DiskFull as exc:
            return str(exc)
        return None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:  # weights and two Adam moments in fp32, plus the trainer's small files
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            self.estimate_bytes = 12 * trainable + 1_000_000
        if _distributed() and node_count() > 1:
            # One id per launch, from rank 0: a node's report of a step is told apart from one an earlier
            # launch left in the same step folder. A collective, so here in the main thread, never in a
            # commit's background thread.
            launch = [uuid.uuid4().hex if state.is_world_process_zero else None]
            torch.distributed.broadcast_object_list(launch, src=0)
            self.committer.nodes = Nodes(node=node_rank(), count=node_count(), launch_id=launch[0])
            # Each node chose its resume point from the store on its own: they must agree, or the ranks
            # would train on from different steps. Every rank sees the same values, so all stop together.
            steps = torch.tensor([state.global_step, -state.global_step], device=_collective_device())
            torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MAX)
            if int(steps[0]) != -int(steps[1]):
                raise CheckpointError(
                    f"the nodes resumed from different checkpoints (steps {-int(steps[1])} to {int(steps[0])}): a "
                    "checkpoint failed to verify on some node; start every node again"
                )

    def on_step_end(self, args, state, control, **kwargs):
        if self.interval is not None:
            self._retune()
        minutes = self.interval_minutes
        save = minutes is not None and time.monotonic() - self.last_commit >= minutes * 60
        end = state.global_step >= state.max_steps
        late = self.deadline is not None and self.clock() >= self.deadline
        stop = self.sigterm.requested.is_set() or late
        # After the read above: a SIGTERM from here on is logged "during step N+1" and stops after step N+1.
        self.sigterm.steps_done = state.global_step
        failing = self.committer.failing
        save = save or end or stop  # a stop always commits first
        full = self._room_problem(args, state.global_step) if save else None  # before torch writes a byte
        if _distributed():
            # Ranks must agree, or one waits in the save barrier while another runs the next all-reduce
            # (clocks and signal arrival differ per rank). This is a CPU-GPU sync point, once per step.
            flags = [float(save), float(stop), float(failing), float(full is not None)]
            flags = torch.tensor(flags, device=_collective_device())
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            save, stop, failing = bool(flags[0]), bool(flags[1]), bool(flags[2])
            if flags[3] and full is None:
                full = "another node's work dir cannot hold the next checkpoint (its log says how much is free)"
        if full is not None:
            raise DiskFull(f"train: {full}")
        if failing:
            self.committer.raise_if_failing()  # the committing rank, with the store's error
            raise CheckpointError("checkpoint commits keep failing on another rank; stopping with it")
        if save:
            control.should_save = True
        if stop:
            control.should_training_stop = True
            if late and self.deadline_hit_at is None and state.global_step < state.max_steps:
                self.deadline_hit_at = state.global_step
                self.log(f"train: the plan's training deadline has passed; stopping at step {state.global_step}")
        self._final = end or stop
        self._save_asked_at = time.monotonic() if control.should_save else None
        self._record_progress(state, stop)
        return control

    def _record_progress(self, state, stop: bool) -> None:
        now = time.monotonic()
        if self.progress is None or not state.is_world_process_zero:
            return
        if not stop and now - self._progress_at < PROGRESS_EVERY_S:
            return
        self._progress_at = now
        record = {**self.progress, "step": state.global_step, "at": time.time()}
        key = record.pop("key")
        with contextlib.suppress(StoreError):  # the store may be what is failing; the step goes on
            self.committer.store.put_bytes(key, (json.dumps(record, sort_keys=True) + "\n").encode())

    def on_evaluate(self, args, state, control, **kwargs):
        # At a step that both evaluates and saves, the Trainer evaluates first: the save starts now. Counted
        # from the step's end, an eval-loss pass would pass for checkpoint cost (and for the plan's notice
        # window, which adds the save to every commit on SIGTERM).
        if self._save_asked_at is not None:
            self._save_asked_at = time.monotonic()

    def on_save(self, args, state, control, **kwargs):
        saved_at = time.monotonic()
        self.last_commit = saved_at  # on every rank, so the minutes interval stays in step
        if _distributed():
            torch.distributed.barrier()  # every rank has written its files (e.g. rng_state_<rank>.pth)
        if not state.is_local_process_zero:  # one committer per node: its ranks' files share its disk
            return
        asked_at = self._save_asked_at or saved_at
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        made_in_line = self.stager.made_in_line  # staging buffers this save had to make (none once reserved)
        writes, staged_wait = self.stager.take()  # this checkpoint's staged tensors, written by its commit
        waited = self.committer.wait() + staged_wait  # at most one commit in flight
        if self.committer.failing:  # that one completed a failing streak: start no other commit
            self.stager.drop(writes)
            if not _distributed():
                self.committer.raise_if_failing()
            # Under torchrun this rank alone must not raise (the others would wait for it in the next
            # collective): the next step's all-reduce of `failing` stops every rank together.
            self.log(f"checkpoint: not committing step {state.global_step}: commits keep failing; stopping")
            return
        if waited > 0.05:
            self.log(f"checkpoint: waited {waited:.1f} s for the commit before step {state.global_step}'s")
        background = self.background and not self._final

        def write() -> None:  # in the commit's thread, before its upload
            self.stager.run(writes)
            reproducible_files(folder)

        record = self.committer.commit(state.global_step, folder, background=background, before=write)
        record["staged"] = bool(writes)
        record["background"] = background  # the last save of a process commits in line: training is over
        record["staging_made_bytes"] = made_in_line
        record["local_save_s"] = round(saved_at - asked_at, 3)
        record["waited_s"] = round(waited, 3)
        record["blocked_s"] = round(time.monotonic() - asked_at, 3)
        if self.sigterm.received_at is not None and not background:
            self.log(
                f"checkpoint: committed {time.monotonic() - self.sigterm.received_at:.1f} s after {self.sigterm.name}"
            )
        self.last_commit = time.monotonic()

    def on_train_end(self, args, state, control, **kwargs):
        self.finish()

    def finish(self) -> None:
        """Wait for the commit in flight; called at the end of training, and when training fails."""
        self.committer.wait()


class StepClock(TrainerCallback):
    """When training began, when each optimizer step ended and what each eval-loss pass took, in this
    process: the trial's own figures for the plan (entrypoint/job/plan.py). A step's time is the interval
    between two step ends; their median leaves out the steps that also evaluated or saved."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter):
        self.timer = timer  # tests inject a fake one
        self.began: float | None = None
        self.ends: list[float] = []
        self.eval_seconds: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.began = self.timer()

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(self.timer())

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_runtime" in metrics:
            self.eval_seconds.append(float(metrics["eval_runtime"]))

    def median_step(self) -> float | None:
        """The median interval between step ends (the first step, from the start of training, left out)."""
        gaps = [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]
        return statistics.median(gaps) if gaps else None


class FirstStepsCallback(TrainerCallback):
    """Over the first `steps` optimizer steps of this process: the parameter check after each update (a
    violation stops training) and the peak memory, to compare with the probe's prediction."""

    def __init__(self, method: str, device, steps: int = 10):
        self.method, self.device, self.steps = method, device, steps
        self.check: ParameterCheck | None = None
        self.peak: PeakMemory | None = None
        self.seen = 0
        self.updates = 0  # of them, those with a learning rate above 0
        self.lr: float | None = None
        self.peak_bytes: int | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.check = ParameterCheck(model, self.method)
        self.peak = PeakMemory(self.device).__enter__()

    def on_step_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        try:
            self.lr = float(lr_scheduler.get_last_lr()[0])  # the rate this step's update uses
        except (AttributeError, IndexError, TypeError):
            self.lr = None  # unknown: count the update

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.seen += 1
        # A warmup starting at 0 makes the first update a no-op, and LoRA's A matrices get no gradient
        # until B has moved once: only updates with a learning rate above 0 count towards the grace.
        self.updates += self.lr is None or self.lr > 0
        if self.check is not None:
            self.check.after_update(model, self.updates)
        if self.seen == self.steps:
            self._stop_measuring()

    def on_train_end(self, args, state, control, **kwargs):
        self._stop_measuring()

    def _stop_measuring(self) -> None:
        if self.peak is not None and self.peak_bytes is None:
            self.peak.__exit__(None, None, None)
            self.peak_bytes = self.peak.peak


class StagingTrainer(Trainer):
    """The HF Trainer, except that at a checkpoint of a full fine-tune it copies the weights and the
    optimizer state aside (entrypoint/training/staging.py) and defers their writing to the checkpoint's
    commit, so training goes on after a copy in memory rather than after the disk took every byte. The
    calls that write them are the Trainer's own (save_pretrained, torch.save), on the copy.

    And it never steps past max_steps: resumed from a checkpoint at max_steps, the HF loop re-enters the
    epoch it was in (unless max_steps ends an epoch) and checks for the end only after a step, so it
    trained step max_steps + 1 and saved it."""

    stager: Stager | None = None  # StoreCheckpointCallback's, set by build_trainer
    _in_checkpoint = False
    _reserved = False

    def training_step(self, model, inputs, num_items_in_batch=None):
        # From the second step on the optimizer has its state: the staging buffers are made now, in the
        # background, rather than by the first checkpoint while training waits (staging.py).
        if not self._reserved and self.optimizer is not None and self.optimizer.state:
            self._reserved = True
            unwrapped = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
            if self._can_stage() and not type(unwrapped).__module__.startswith("peft"):
                self.stager.reserve({"model": unwrapped.state_dict(), "optimizer": self.optimizer.state_dict()})
        return super().training_step(model, inputs, num_items_in_batch)

    def _run_epoch(self, *args, **kwargs):
        if self.state.global_step >= self.state.max_steps:  # resumed from the last step: nothing to train
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def _save_checkpoint(self, model, trial):
        self._in_checkpoint = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._in_checkpoint = False

    def _stages(self) -> bool:
        return self._in_checkpoint and self._can_stage()

    def _can_stage(self) -> bool:
        return (
            self.stager is not None
            and self.args.should_save
            and not self.is_deepspeed_enabled
            and not self.is_fsdp_enabled
        )

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        unwrapped = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if not self._stages() or type(unwrapped).__module__.startswith("peft"):  # an adapter: small
            return super()._save(output_dir, state_dict)
        state = state_dict if state_dict is not None else unwrapped.state_dict()
        if self.stager.decline("model", state) is not None:
            return super()._save(output_dir, state_dict)
        staged = self.stager.stage("model", state)
        os.makedirs(output_dir, exist_ok=True)  # the rest of the checkpoint is written there meanwhile
        self.stager.defer(lambda: Trainer._save(self, output_dir, state_dict=staged))
        return None

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self._stages():
            return super()._save_optimizer_and_scheduler(output_dir)
        state = self.optimizer.state_dict()
        if self.stager.decline("optimizer", state) is not None:
            return super()._save_optimizer_and_scheduler(output_dir)
        staged = self.stager.stage("optimizer", state)
        self.stager.defer(lambda: torch.save(staged, os.path.join(output_dir, OPTIMIZER_NAME)))
        with warnings.catch_warnings():  # the scheduler's few bytes, in line as the Trainer writes them
            warnings.simplefilter("ignore")
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))
        return None


def build_trainer(
    model,
    data_collator,
    train_features: Sequence[dict],
    training: Training,
    *,
    output_dir: Path,
    device: torch.device,
    loss_per: str,
    callbacks: Sequence[TrainerCallback] = (),
    deepspeed: dict | None = None,
    eval_features: Sequence[dict] | None = None,
    precision: str = "fp32",
) -> Trainer:
    """A Trainer whose checkpoints go through StoreCheckpointCallback. Its own tracker integrations stay off
    (`report_to="none"`: they start a new W&B run per attempt); entrypoint/tracking continues one run instead.
    `loss_per` "token": the model's loss is normalised per token across the accumulated batch (causal LMs),
    so the Trainer must not divide it again; "example": one label per sequence (kinds' TaskSide.loss).
    `precision`: training.precision resolved for the device (device.resolve_precision). With
    `eval_features`, the eval loss is measured about 4 times during the run (for the loss curves)."""
    # Under torchrun each optimizer step consumes world_size microbatches x grad_accum.
    steps = planned_steps(training, len(train_features), world_size=int(os.environ.get("WORLD_SIZE", "1")))
    every = training.checkpoint.every_steps
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=training.microbatch,
        gradient_accumulation_steps=training.grad_accum,
        max_steps=steps,
        learning_rate=training.learning_rate,
        optim=training.optimizer,
        max_grad_norm=training.max_grad_norm,
        weight_decay=training.weight_decay,
        warmup_steps=int(training.warmup_ratio * steps),
        lr_scheduler_type="linear",
        seed=training.seed,
        data_seed=training.seed,
        full_determinism=training.deterministic,
        activation_checkpointing=training.activation_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if training.activation_checkpointing else None,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_liger_kernel=training.liger,
        use_cpu=device.type == "cpu",
        logging_strategy="steps",
        logging_steps=1,  # every step's loss is kept (step_losses); ProgressCallback prints windows of them
        # Saves happen every `every` steps, and whenever StoreCheckpointCallback asks (minutes, SIGTERM, end).
        save_strategy="steps",
        save_steps=every or steps + 1,
        save_total_limit=None,
        eval_strategy="steps" if eval_features else "no",
        eval_steps=max(1, steps // 4),
        per_device_eval_batch_size=training.eval_batch,
        prediction_loss_only=True,
        logging_nan_inf_filter=False,  # a NaN loss must show, not be averaged away (DivergenceCallback)
        report_to="none",
        disable_tqdm=True,
        label_names=["labels"],
        dataloader_num_workers=0,
        deepspeed=deepspeed,
        ddp_find_unused_parameters=False,  # LoRA leaves frozen parameters without gradients by design
    )
    trainer = StagingTrainer(
        model=model,
        args=args,
        train_dataset=train_features,
        eval_dataset=eval_features,
        data_collator=data_collator,
        callbacks=list(callbacks),
    )
    savers = [c for c in callbacks if isinstance(c, StoreCheckpointCallback)]
    trainer.stager = savers[0].stager if savers else None
    trainer.remove_callback(PrinterCallback)  # ProgressCallback prints one readable line per log instead
    # Gradient accumulation must average, not sum. The Trainer divides each microbatch loss by the number of
    # accumulated steps unless it believes the model normalises by `num_items_in_batch` itself. Causal LM
    # losses do (per token across the whole accumulated batch); a sequence classifier's loss ignores it but
    # its forward takes **kwargs, which the Trainer mistakes for support, and the gradient came out summed
    # (tests/integration/test_probe_and_params.py measures it).
    trainer.model_accepts_loss_kwargs = loss_per == "token"
    return trainer
