"""The lease plan: the rental window cut into phase budgets and deadlines, so that the export and the
recovery margin always fit, and training stops in time whatever its step count says.

    lease start                                                                      lease end
    | data | baseline | probe | train ........... | evaluate | test | verify | report | export | margin |
                              ^ trials in order ^ training deadline

Slots are named after the runner's phases. Each is, in order of preference: what it took (a committed
phase), a prediction from what the job has measured (FIGURES: the probe's typical step, eval-loss pass,
model load and checkpoint cost, the baseline's prediction time per example, the store's throughput, then
each finished trial's own figures), or a default budget (`"source": "default"`). The train slot is what is
left. A trial needs its setup + steps x step + eval-loss passes + checkpoints + its weights' upload + its
predictions on eval; until those are measured, `planned steps x step seconds x TRAIN_OVERHEAD` with the
step estimated (`rental.step_seconds`, default 1 s). `make_plan` is re-run at every process start and after
every phase and trial (entrypoint/job/plan.py), with the time already used.
Pure Python: `rentune plan` runs anywhere in well under a second.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist

from jobspec.experiments import resolve_trials
from jobspec.schema import IMAGE_SUFFIXES, JobSpec, Training, duration_seconds

__all__ = [
    "DEFAULT_BUDGETS",
    "DEFAULT_MARGIN",
    "DEFAULT_STEP_SECONDS",
    "NOTICE_SECONDS",
    "NoticeWindow",
    "PhasePlan",
    "WINDOW_SECONDS",
    "count_split_examples",
    "count_train_examples",
    "detectable_from_size",
    "make_plan",
    "notice_window",
    "planned_steps",
    "split_power_lines",
]

WINDOW_SECONDS = {"3d": 3 * 86400, "7d": 7 * 86400, "30d": 30 * 86400}
# Recovery margin before the lease ends: room for one restart on a new node (pull the image, download
# the newest checkpoint, redo an unfinished phase). A longer lease meets more interruptions.
DEFAULT_MARGIN = {"3d": "2h", "7d": "6h", "30d": "24h"}
# Budgets of the fixed phases until they are measured, in seconds: generous for a GPU node, where loading
# a multi-GB model and its data dominates. `evaluate` is per trial.
DEFAULT_BUDGETS = {
    "data": 1800,
    "baseline": 1800,
    "probe": 900,
    "evaluate": 900,
    "test": 900,
    "verify": 1200,
    "report": 300,
    "export": 900,
}
BEFORE_TRAINING = ("data", "baseline", "probe")
AFTER_TRAINING = ("evaluate", "test", "verify", "report", "export")
DEFAULT_STEP_SECONDS = 1.0
# A trial takes longer than its optimizer steps: eval-loss passes, checkpoint commits, model loading.
TRAIN_OVERHEAD = 1.1
# every_minutes: auto commits first after this long (which measures the commit cost), then at Young/Daly's
# interval for the cost measured at the newest commit.
AUTO_FIRST_MINUTES = 10.0
# A spot node's warning before it goes, by the provider the notice watcher detects (entrypoint/notices.py).
NOTICE_SECONDS = {"aws": 120.0, "gcp": 30.0}


def young_daly_minutes(commit_seconds: float, mtbf_hours: float) -> float:
    """The checkpoint interval that loses the least time to checkpoints plus recomputation after an
    interruption (Young 1974, Daly 2006): sqrt(2 x C x MTBF) for a checkpoint costing C. Never shorter than
    C itself (one commit in flight at a time), and within [1, 1440] minutes."""
    seconds = math.sqrt(2.0 * commit_seconds * mtbf_hours * 3600.0)
    return min(1440.0, max(1.0, seconds / 60.0, commit_seconds / 60.0))


def checkpoint_policy_text(policy) -> str:
    """When checkpoints are committed, in a line a person reads (plan, report)."""
    when = []
    if policy.every_steps:
        when.append(f"every {policy.every_steps} steps")
    if policy.every_minutes == "auto":
        when.append(
            f"every_minutes auto: sqrt(2 x C x MTBF) with MTBF {policy.mtbf_hours:g} h and C the cost of the "
            f"newest commit ({AUTO_FIRST_MINUTES:g} min until the first measures it)"
        )
    elif policy.every_minutes:
        when.append(f"every {policy.every_minutes:g} minutes")
    return "checkpoints: " + ", ".join([*when, "on SIGTERM and at the end"]) + f"; keep {policy.keep}"


@dataclass(frozen=True)
class NoticeWindow:
    """What a stop costs (SIGTERM: docker stop, a spot notice, the lease's end), from measured figures: the
    commit that follows it, whether that fits the time the node has left, and, when it does not, what one
    interruption loses and the periodic interval that keeps the loss within training.checkpoint.max_lost_minutes."""

    commit_seconds: float  # SIGTERM to committed: the step in progress, the local save, the upload in line
    worst_seconds: float  # the same after waiting for a periodic commit in flight (at most one)
    formula: str
    limit_seconds: float  # what it must fit: grace_seconds, or the detected provider's notice when shorter
    limit: str  # "grace_seconds 90 s", "gcp's notice 30 s"
    fits: bool
    interval_minutes: float | None  # periodic commits in force (None: only on SIGTERM and at the end)
    interval_source: str  # "spec", or "plan": set here to bound the loss
    bound_minutes: float  # training.checkpoint.max_lost_minutes
    lost_minutes: float | None = None  # when it does not fit: the most one interruption loses
    lost_steps: int | None = None
    problem: str = ""  # the loss cannot be bounded: why, and what to change

    def line(self) -> str:
        """One line for `rentune plan`, `rentune status` and the report."""
        text = f"notice window: a commit on SIGTERM takes {self.commit_seconds:.3g} s ({self.formula})"
        if self.worst_seconds > self.commit_seconds:
            text += f", up to {self.worst_seconds:.3g} s with a periodic commit in flight"
        others = ", ".join(
            f"{name.upper()}'s {seconds:g} s {'fits' if self.worst_seconds <= seconds else 'does NOT fit'}"
            for name, seconds in NOTICE_SECONDS.items()
        )
        if self.fits:
            return f"{text}: fits {self.limit} ({others})"
        text += f": does NOT fit {self.limit} ({others}); "
        if self.problem:
            return text + self.problem
        if self.lost_minutes is None:  # no periodic checkpoint, and no trial length known yet
            return text + "an interruption loses everything since the trial started (no periodic checkpoint)"
        every = (
            "no periodic commits"
            if self.interval_minutes is None
            else f"periodic commits every {self.interval_minutes:.3g} min"
        )
        set_by = (
            f"set by the plan for training.checkpoint.max_lost_minutes {self.bound_minutes:g}"
            if self.interval_source == "plan"
            else "as the spec says"
        )
        return (
            f"{text}an interruption loses up to {self.lost_minutes:.3g} min ({self.lost_steps} steps) since the last "
            f"committed checkpoint; {every} ({set_by})"
        )


def _periodic_seconds(policy, step: float, commit: float) -> float | None:
    """The spec's periodic interval in seconds (the shortest of its triggers), or None without one."""
    candidates = []
    if policy.every_steps:
        candidates.append(policy.every_steps * step)
    if policy.every_minutes == "auto":
        candidates.append(young_daly_minutes(commit, policy.mtbf_hours) * 60.0)
    elif policy.every_minutes:
        candidates.append(policy.every_minutes * 60.0)
    return min(candidates) if candidates else None


def notice_window(
    spec: JobSpec, figures: dict[str, Figure], provider: str | None = None, trial_seconds: float | None = None
) -> NoticeWindow | None:
    """The notice window from the measured step, checkpoint save, checkpoint bytes and store rate (None until
    the probe has measured them). `provider`: the cloud the notice watcher detected ("aws", "gcp"), whose
    notice bounds the window when shorter than grace_seconds. `trial_seconds`: the main trial's length, what
    an interruption loses without any periodic checkpoint."""
    needed = ("step", "checkpoint_blocked", "checkpoint_bytes", "store_rate")
    if any(name not in figures for name in needed):
        return None
    f = {name: figures[name].value for name in needed}
    # On SIGTERM the last checkpoint is written in line: staged copies or not, every byte reaches the disk.
    if "checkpoint_write" in figures:
        f["checkpoint_blocked"] = max(f["checkpoint_blocked"], figures["checkpoint_write"].value)
    policy = spec.training.checkpoint
    upload = f["checkpoint_bytes"] / f["store_rate"]
    commit = f["step"] + f["checkpoint_blocked"] + upload
    formula = (
        f"step {_s(f['step'])} + save {_s(f['checkpoint_blocked'])} + upload {_s(upload)} of "
        f"{f['checkpoint_bytes'] / 1e9:.3g} GB at {f['store_rate'] / 1e6:.3g} MB/s"
    )
    periodic = _periodic_seconds(policy, f["step"], f["checkpoint_blocked"] + upload)
    worst = commit + (upload if periodic is not None else 0.0)
    limit, label = policy.grace_seconds, f"grace_seconds {policy.grace_seconds:g} s"
    if provider in NOTICE_SECONDS and NOTICE_SECONDS[provider] < limit:
        limit, label = NOTICE_SECONDS[provider], f"{provider.upper()}'s notice {NOTICE_SECONDS[provider]:g} s"
    window = dict(
        commit_seconds=commit, worst_seconds=worst, formula=formula, limit_seconds=limit, limit=label,
        bound_minutes=policy.max_lost_minutes,
    )  # fmt: skip
    interval = None if periodic is None else periodic / 60.0
    if worst <= limit:
        return NoticeWindow(**window, fits=True, interval_minutes=interval, interval_source="spec")
    # The stop's commit is cut by the node's end: what is lost is everything since the last committed
    # checkpoint, up to a periodic interval plus the commit that ends it (without one, the whole trial).
    cost = f["checkpoint_blocked"] + upload
    bound = policy.max_lost_minutes * 60.0
    since = periodic if periodic is not None else (trial_seconds if trial_seconds is not None else math.inf)
    source = "spec"
    if since + cost > bound:
        if bound - cost < cost:  # the next commit would start before this one ended: one at a time
            problem = (
                f"a checkpoint takes {_s(cost)} to save and upload, so the loss cannot be kept within "
                f"training.checkpoint.max_lost_minutes {policy.max_lost_minutes:g}; cut: raise it, checkpoint "
                "less (LoRA instead of a full fine-tune), raise grace_seconds and docker's --stop-timeout, or "
                "use a faster store"
            )
            return NoticeWindow(
                **window, fits=False, interval_minutes=interval, interval_source="spec", problem=problem
            )
        since, source = bound - cost, "plan"
    lost = since + cost
    steps = math.ceil(lost / f["step"]) if math.isfinite(lost) else None
    return NoticeWindow(
        **window, fits=False, interval_minutes=since / 60.0 if source == "plan" else interval,
        interval_source=source, lost_minutes=lost / 60.0 if math.isfinite(lost) else None, lost_steps=steps,
    )  # fmt: skip


def notice_unmeasured(spec: JobSpec) -> str:
    """The notice-window line before the probe has measured a checkpoint."""
    grace = spec.training.checkpoint.grace_seconds
    notices = ", ".join(f"{name.upper()} {seconds:g} s" for name, seconds in NOTICE_SECONDS.items())
    return (
        f"notice window: not measured yet (the probe times a checkpoint's save, its bytes and the store's rate); "
        f"a commit on SIGTERM must fit grace_seconds {grace:g} s and the provider's notice ({notices})"
    )


def planned_steps(training: Training, n_train: int, world_size: int = 1) -> int:
    """Optimizer steps for a run: `max_steps` if set, else epochs over the data at the global batch."""
    if training.max_steps is not None:
        return training.max_steps
    per_epoch = math.ceil(n_train / (training.microbatch * training.grad_accum * world_size))
    return max(1, math.ceil(training.epochs * per_epoch))


def _count(location: str) -> int | None:
    """Examples in a local JSONL file (non-empty lines) or ImageFolder (image files); None in object storage."""
    if location.startswith("s3://"):
        return None
    path = Path(location.removeprefix("file://"))
    if path.is_dir():  # an ImageFolder: one folder per category
        return sum(1 for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def count_split_examples(spec: JobSpec) -> dict[str, int] | None:
    """Examples per split (train, eval, test), counted from the local data files before the data phase runs:
    given files as they are, a single source cut by the split shares (before de-duplication). None when the
    data is in object storage."""
    data = spec.data
    if data.files:
        counts = {name: _count(getattr(data.files, name)) for name in ("train", "eval", "test")}
        return None if None in counts.values() else counts
    lines = _count(data.source)
    if lines is None:
        return None
    held = {"eval": round(lines * data.split.eval), "test": round(lines * data.split.test)}
    return {"train": max(1, round(lines * (1 - data.split.eval - data.split.test))), **held}


def split_examples_from_train(spec: JobSpec, train: int) -> dict[str, int] | None:
    """Examples per split for `train` training examples when the data cannot be counted here (object
    storage): a single source's eval and test follow from its split shares; given files, None (unknown)."""
    data = spec.data
    if data.files:
        return None
    share = 1 - data.split.eval - data.split.test
    return {
        "train": train,
        "eval": round(train * data.split.eval / share),
        "test": round(train * data.split.test / share),
    }


def count_train_examples(spec: JobSpec) -> int | None:
    """Training examples, counted from the local data files before the data phase runs (non-empty lines;
    a single source is cut by the split shares). None when the data is in object storage."""
    counts = count_split_examples(spec)
    return None if counts is None else counts["train"]


def detectable_from_size(examples: int, confidence: float) -> float:
    """The smallest change of a rate that `examples` paired examples can show before any is measured: the
    half-width of the interval of a difference of two independent rates near 0.5 (the widest case),
    z x sqrt(2 x 0.25 / n). The baseline phase replaces it with the baseline's measured spread."""
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    return z * math.sqrt(0.5 / examples) if examples else float("inf")


def split_power_lines(spec: JobSpec, counts: dict[str, int]) -> list[str]:
    """What `rentune plan` says of power: the hypothesis metric's detectable change on eval and test from the
    split sizes alone, against min_gain."""
    h, level = spec.hypothesis, spec.evaluation.confidence
    if not counts["eval"] or not counts["test"]:
        return [f"power: the eval or test split would be empty ({counts['eval']} / {counts['test']} examples)"]
    eval_h, test_h = (detectable_from_size(counts[s], level) for s in ("eval", "test"))
    lines = [
        f"power (from split sizes alone, the widest case: rates near 0.5; the baseline phase measures it): "
        f"{h.metric} changes smaller than {eval_h:.3f} on eval ({counts['eval']} examples) and {test_h:.3f} on test "
        f"({counts['test']}) cannot be told from noise at {level:.0%}; min_gain is {h.min_gain:.3f}"
    ]
    if h.min_gain > 0 and max(eval_h, test_h) > h.min_gain:
        z = NormalDist().inv_cdf(1 - (1 - level) / 2)
        need = math.ceil(0.5 * (z / h.min_gain) ** 2)  # detectable_from_size(need) <= min_gain
        lines.append(
            f"power: the hypothesis may stay inconclusive: about {need} eval and {need} test examples would decide "
            f"a gain of min_gain (evaluation.underpowered: {spec.evaluation.underpowered})"
        )
    return lines


@dataclass(frozen=True)
class Figure:
    """A quantity the job has measured, and where: every slot computed from it names it."""

    value: float
    source: str


# What make_plan reads, by name (entrypoint/job/plan.py collects them from the store). Seconds unless
# said otherwise; "per example" figures are multiplied by the split's size.
FIGURES = {
    "step": "one optimizer step as training runs it (grad_accum microbatches of real lengths)",
    "eval_loss_pass": "one eval-loss pass over the eval split (the Trainer's, about 5 per trial)",
    "trial_setup": "a trial's start before its first step (model load, stored tokens, trainer)",
    "load": "loading the model with its adaptation",
    "predict": "a trial's prediction per example (generation included)",
    "baseline_predict": "the baseline's prediction per example, its model's loading included",
    "judge": "judging one trial against the baseline (bootstrap intervals)",
    "startup": "a fresh rentune process before its first work (interpreter, imports)",
    "store_rate": "bytes per second the store takes",
    "checkpoint_blocked": "what one checkpoint costs the training loop (local save; the commit runs alongside)",
    "checkpoint_bytes": "bytes of one checkpoint (weights and optimizer state): the last one is committed in line",
    "checkpoint_write": "a checkpoint's files written to local disk (what a commit on SIGTERM waits for in line)",
    "weights_bytes": "bytes of a trial's trained weights (what is fetched, verified and exported)",
    "model_bytes": "bytes of the base model's weights (what a merged export reads, and about what it writes)",
}
# The report phase writes files only (tables, two plots): no model, no pass over the data, nothing to
# measure it by before it runs. It took 0.2-0.3 s on the quickstart and the benchmark's chat job.
REPORT_SECONDS = 2.0


@dataclass(frozen=True)
class Slot:
    name: str
    seconds: float
    start: float  # seconds after the lease start
    end: float
    source: str  # "default", "measured" (it ran), "predicted" (from figures), "left for training", "spec"
    formula: str = ""  # how a predicted slot was computed, with each figure's value


@dataclass(frozen=True)
class TrialBudget:
    id: str
    steps: int
    seconds: float
    fits: bool
    source: str = "estimate"  # "estimate" (a step time guessed), "measured step", "predicted", "done"
    formula: str = ""


@dataclass(frozen=True)
class PhasePlan:
    window: str
    lease_seconds: float
    margin_seconds: float
    step_seconds: float
    step_source: str  # "estimate" or "measured"
    elapsed: float  # seconds of the lease used when this plan was made
    slots: list[Slot]
    trials: list[TrialBudget]
    train_deadline: float  # seconds after the lease start; training stops here whatever its step count
    problems: list[str] = field(default_factory=list)
    checkpoints: str = ""  # when checkpoints are committed (checkpoint_policy_text)
    expected_end: float = 0.0  # seconds after the lease start when the job should end, as predicted now
    figures: dict = field(default_factory=dict)  # name -> {"value", "source"}: what the plan was made from
    merge_seconds: float = 0.0  # the export's merge and parity check (export.merged), within its slot
    notice: dict | None = None  # NoticeWindow as a dict, once measured
    notice_line: str = ""  # what the plan says of it

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """The plan as a table a person reads (hours and minutes)."""
        lines = [
            f"lease {self.window} ({_hm(self.lease_seconds)}), {_hm(self.elapsed)} used, step time "
            f"{self.step_seconds:.3g} s ({self.step_source}), job expected to end {_hm(self.expected_end)} "
            "after the lease start",
            f"{'phase':<12} {'budget':>8} {'starts':>8} {'deadline':>9}  source",
        ]
        for slot in self.slots:
            times = f"{_hm(slot.seconds):>8} {_hm(slot.start):>8} {_hm(slot.end):>9}"
            lines.append(f"{slot.name:<12} {times}  {slot.source}" + (f": {slot.formula}" if slot.formula else ""))
        lines.append("")
        lines.append(f"{'trial':<20} {'steps':>8} {'needs':>8}  fits  from")
        for trial in self.trials:
            fits = "yes" if trial.fits else "NO "
            lines.append(f"{trial.id:<20} {trial.steps:>8} {_hm(trial.seconds):>8}  {fits}   {trial.formula}")
        lines.append(f"training stops by {_hm(self.train_deadline)} after the lease start, whatever its step count")
        if self.checkpoints:
            lines.append(self.checkpoints)
        if self.notice_line:
            lines.append(self.notice_line)
        return "\n".join(lines)


def _hm(seconds: float) -> str:
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}"


def _s(seconds: float) -> str:
    """Seconds as a person reads them in a formula: 0.41 s, 6.2 s, 1.2 ms."""
    return f"{seconds * 1000:.3g} ms" if seconds < 0.1 else f"{seconds:.3g} s"


def _sum(parts: list[tuple[str, float]]) -> tuple[float, str]:
    return sum(v for _, v in parts), " + ".join(text for text, _ in parts)


def batch_scale(main: Training, own: Training) -> float:
    """A trial's step against main's: linear in the examples (or packed rows) a step processes. Step figures
    are kept per main's batch: a finished variant's own step is divided by this before it is stored."""
    return (own.microbatch * own.grad_accum) / (main.microbatch * main.grad_accum)


def _end_of_trial(f: dict[str, float], n_eval: int) -> list[tuple[str, float]]:
    """What a trial does after its last step, even when the deadline cut it: the final checkpoint committed
    in line, its weights put to the store, its predictions on eval."""
    return [
        (f"last checkpoint {f['checkpoint_bytes'] / 1e6:.3g} MB up", f["checkpoint_bytes"] / f["store_rate"]),
        (f"weights {f['weights_bytes'] / 1e6:.3g} MB up", f["weights_bytes"] / f["store_rate"]),
        (f"{n_eval} eval predictions x {_s(f['predict'])}", n_eval * f["predict"]),
    ]


TRIAL_FIGURES = (
    "step", "trial_setup", "eval_loss_pass", "predict", "checkpoint_blocked", "checkpoint_bytes", "weights_bytes",
    "store_rate",
)  # fmt: skip


def _trial_need(
    spec: JobSpec, trial, steps: int, left: int, step: float, figures: dict[str, Figure], n_eval: int | None
) -> tuple[float, str, str]:
    """Seconds a trial still needs, its source and how it was computed. From the measured figures when every
    one is there; else `left steps x step x TRAIN_OVERHEAD` (eval-loss passes, checkpoints, loading)."""
    scale = batch_scale(spec.training, trial.training)
    own = trial.training
    scaled = f" x {scale:.3g} (batch)" if scale != 1 else ""
    needed = TRIAL_FIGURES
    if left <= 0:
        return 0.0, "done", "trained"
    if any(name not in figures for name in needed) or n_eval is None:
        source = "measured step" if "step" in figures else "estimate"
        text = f"{left} steps x {_s(step)}{scaled} x {TRAIN_OVERHEAD} (eval-loss passes, checkpoints, loading)"
        return left * step * scale * TRAIN_OVERHEAD, source, text
    f = {name: figures[name].value for name in needed}
    loop = left * f["step"] * scale
    evals = math.ceil(steps / max(1, steps // 4)) * left / steps  # the Trainer's: every steps // 4, and at the end
    policy = own.checkpoint
    commits = math.ceil(left / policy.every_steps) if policy.every_steps else 1  # the last one at the end
    if policy.every_minutes:
        commit = f["checkpoint_blocked"] + f["checkpoint_bytes"] / f["store_rate"]
        minutes = (
            young_daly_minutes(commit, policy.mtbf_hours) if policy.every_minutes == "auto" else policy.every_minutes
        )
        commits += int(loop / (minutes * 60))
    seconds, text = _sum(
        [
            (f"setup {_s(f['trial_setup'])}", f["trial_setup"]),
            (f"{left} steps x {_s(f['step'])}{scaled}", loop),
            (f"{evals:.3g} eval-loss passes x {_s(f['eval_loss_pass'])}", evals * f["eval_loss_pass"]),
            (f"{commits} checkpoints x {_s(f['checkpoint_blocked'])}", commits * f["checkpoint_blocked"]),
            *_end_of_trial(f, n_eval),
        ]
    )  # fmt: skip
    return seconds, "predicted", text


def merge_need(figures: dict[str, Figure], counts: dict | None) -> tuple[float, str] | None:
    """What a merged export adds to the export (export.merged): reading the base as a load does, putting
    about as many bytes, and the parity check in a fresh process (the adapter and the merged model each
    loaded and run on eval). None while a figure it needs is missing."""
    f = {k: v.value for k, v in figures.items()}
    if counts is None or any(k not in f for k in ("load", "predict", "model_bytes", "store_rate", "startup")):
        return None
    n_eval = counts["eval"]
    return _sum(
        [
            (f"merge: read {_s(f['load'])}", f["load"]),
            (f"put {f['model_bytes'] / 1e6:.3g} MB", f["model_bytes"] / f["store_rate"]),
            (f"parity: a fresh process {_s(f['startup'])}", f["startup"]),
            (f"2 x (load + {n_eval} x {_s(f['predict'])})", 2 * (f["load"] + n_eval * f["predict"])),
        ]
    )


def _after_need(
    name: str, n_trials: int, figures: dict[str, Figure], counts: dict | None, merges: bool = False
) -> tuple[float, str] | None:
    """A final phase's predicted seconds and how they were computed, or None while a figure it needs is
    missing (the phase then keeps its default budget). `merges`: the export also merges (export.merged)."""
    if name == "report":
        return None
    f = {k: v.value for k, v in figures.items()}
    if counts is None or any(k not in f for k in ("load", "predict", "weights_bytes", "store_rate")):
        return None
    n_eval, n_test = counts["eval"], counts["test"]
    fetch = (f"fetch {f['weights_bytes'] / 1e6:.3g} MB", f["weights_bytes"] / f["store_rate"])
    load = (f"load {_s(f['load'])}", f["load"])
    judge = [(f"judge {_s(f['judge'])}", f["judge"])] if "judge" in f else []
    if name == "evaluate":
        one, text = _sum([fetch, load, (f"{n_eval} x {_s(f['predict'])}", n_eval * f["predict"]), *judge])
        return n_trials * one, f"{n_trials} trials x ({text})"
    if name == "test":
        if "baseline_predict" not in f:
            return None
        return _sum(
            [
                (f"baseline {n_test} x {_s(f['baseline_predict'])}", n_test * f["baseline_predict"]),
                fetch,
                load,
                (f"{n_test} x {_s(f['predict'])}", n_test * f["predict"]),
                *judge,
            ]
        )
    if name == "verify":
        if "startup" not in f:
            return None
        start = (f"a fresh process {_s(f['startup'])}", f["startup"])
        return _sum([start, fetch, load, (f"{n_eval} x {_s(f['predict'])}", n_eval * f["predict"])])
    if name == "export":
        copy = (f"copy {f['weights_bytes'] / 1e6:.3g} MB twice", 2 * f["weights_bytes"] / f["store_rate"])
        merge = merge_need(figures, counts) if merges else None
        if merges and merge is None:
            return None
        return _sum([copy, (merge[1], merge[0])] if merge else [copy])
    return None


def _most_steps(spec: JobSpec, trial, steps: int, step: float, figures, n_eval, available: float) -> int:
    """A number of optimizer steps that fits in `available` seconds, by bisection over the plan's own formula
    (not linear in steps: setup and the eval-loss passes do not shrink with them; nor quite monotone: the
    Trainer evaluates 4 or 5 times at most step counts, up to 7 below 12, so a few more steps may fit too)."""
    lo, hi = 0, steps
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _trial_need(spec, trial, mid, mid, step, figures, n_eval)[0] <= available:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _trial_end(figures: dict[str, Figure], counts: dict | None, trained: bool) -> tuple[float, str]:
    """What a trial cut by the deadline still does after its last step (_end_of_trial), reserved before the
    final phases; nothing once training is committed, or while a figure is missing (then the final phases'
    default budgets are generous enough to hold it)."""
    if trained:
        return 0.0, "training committed"
    needed = ("checkpoint_bytes", "weights_bytes", "store_rate", "predict")
    if counts is None or any(name not in figures for name in needed):
        return 0.0, "not measured yet (the final phases' defaults hold it)"
    f = {name: figures[name].value for name in needed}
    seconds, text = _sum(_end_of_trial(f, counts["eval"]))
    return seconds, text


def make_plan(
    spec: JobSpec,
    n_train: int,
    *,
    window: str | None = None,
    elapsed: float = 0.0,
    measured: dict[str, float] | None = None,
    steps_done: dict[str, int] | None = None,
    figures: dict[str, Figure] | None = None,
    counts: dict[str, int] | None = None,
    provider: str | None = None,
) -> PhasePlan:
    """Cut the lease into slots. `elapsed`: lease seconds already used; `measured`: seconds committed phases
    took; `steps_done`: optimizer steps each trial has behind it; `figures`: what the job has measured so far
    (FIGURES); `counts`: examples per split (train, eval, test), when known; `provider`: the cloud whose
    interruption notices the job watches (its notice bounds the notice window). A slot is predicted from the
    figures when every one it needs is there, else it keeps its default budget (`"source": "default"`).
    Problems (what does not fit, and what to cut) are listed in `problems`; empty means the spec fits."""
    window = window or spec.rental.window
    measured, steps_done, figures = measured or {}, steps_done or {}, figures or {}
    lease = float(WINDOW_SECONDS[window])
    margin = float(duration_seconds(spec.rental.margin or DEFAULT_MARGIN[window]))
    step = figures["step"].value if "step" in figures else spec.rental.step_seconds or DEFAULT_STEP_SECONDS
    trials = resolve_trials(spec)
    world = spec.distribution.nproc_per_node * spec.distribution.nnodes

    def budget(name: str) -> tuple[str, float, str, str]:
        if name in measured:
            return name, measured[name], "measured", ""
        predicted = _after_need(name, len(trials), figures, counts, spec.merges) if name in AFTER_TRAINING else None
        if predicted is not None:
            return name, predicted[0], "predicted", predicted[1]
        if name == "report":
            return name, REPORT_SECONDS, "default", "writes files only"
        per = len(trials) if name == "evaluate" else 1
        return name, float(DEFAULT_BUDGETS[name] * per), "default", ""

    before = [budget(name) for name in BEFORE_TRAINING]
    after = [budget(name) for name in AFTER_TRAINING]
    before_total, after_total = sum(s for _, s, _, _ in before), sum(s for _, s, _, _ in after)
    tail, tail_formula = _trial_end(figures, counts, "train" in measured)
    # The reserve at the end is never given to training: the final phases, the margin, and what a trial cut
    # by the deadline still does after its last step.
    train_deadline = lease - margin - after_total - tail
    train_start = max(before_total, elapsed)
    available = max(0.0, train_deadline - train_start)

    problems, budgets, needed = [], [], 0.0
    if train_deadline <= before_total:
        problems.append(
            f"rental.window {window}: the fixed phases ({_hm(before_total + after_total)}) and the margin "
            f"({_hm(margin)}) leave no time for training; cut: a smaller rental.margin, or a longer window"
        )
    n_eval = counts["eval"] if counts else None
    for trial in trials:
        steps = planned_steps(trial.training, n_train, world)
        left = max(0, steps - steps_done.get(trial.id, 0))
        seconds, source, formula = _trial_need(spec, trial, steps, left, step, figures, n_eval)
        needed += seconds
        budgets.append(TrialBudget(trial.id, steps, seconds, needed <= available, source, formula))
    if budgets and not budgets[0].fits and not problems:
        most = _most_steps(spec, trials[0], budgets[0].steps, step, figures, n_eval, available)
        problems.append(
            f"trial main needs {_hm(budgets[0].seconds)} of training ({budgets[0].steps} steps x {step:.3g} s) "
            f"but {_hm(available)} fit in the {window} window; cut: training.max_steps <= {most}, fewer epochs, "
            "or a longer window"
        )
    elif not all(b.fits for b in budgets) and not problems:
        late = [b.id for b in budgets if not b.fits]
        problems.append(
            f"experiments {', '.join(late)} do not fit after the trials before them ({_hm(needed)} needed, "
            f"{_hm(available)} available); cut: remove or shorten them, or use a longer window"
        )

    slots, at = [], 0.0
    for name, seconds, source, formula in before:
        slots.append(Slot(name, seconds, at, at + seconds, source, formula))
        at += seconds
    slots.append(Slot("train", available, train_start, train_start + available, "left for training"))
    end_source = "predicted" if tail_formula.startswith("last") else "none"
    slots.append(Slot("trial end", tail, train_deadline, train_deadline + tail, end_source, tail_formula))
    at = train_deadline + tail
    for name, seconds, source, formula in after:
        slots.append(Slot(name, seconds, at, at + seconds, source, formula))
        at += seconds
    slots.append(Slot("margin", margin, at, at + margin, "spec" if spec.rental.margin else "default"))
    # When the job ends as predicted now: the phases not committed, and what the trials still need, cut at
    # the deadline (with the cut trial's end) when they need more than is left.
    start = elapsed + sum(s for name, s, _, _ in before if name not in measured)
    room = max(0.0, train_deadline - start)
    trained = needed if needed <= room else room + tail
    expected_end = start + trained + sum(s for name, s, _, _ in after if name not in measured)
    merge = merge_need(figures, counts) if spec.merges else None
    main_seconds = budgets[0].steps * step if budgets else None
    notice = notice_window(spec, figures, provider, main_seconds)
    return PhasePlan(
        window, lease, margin, step, "measured" if "step" in figures else "estimate", elapsed, slots, budgets,
        train_deadline, problems, checkpoint_policy_text(spec.training.checkpoint), expected_end,
        {name: asdict(figure) for name, figure in sorted(figures.items())}, merge[0] if merge else 0.0,
        asdict(notice) if notice else None, notice.line() if notice else notice_unmeasured(spec),
    )  # fmt: skip
