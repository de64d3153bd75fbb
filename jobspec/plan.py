"""The lease plan: the rental window cut into phase budgets and deadlines, so that the export and the
recovery margin always fit, and training stops in time whatever its step count says.

    lease start                                                                      lease end
    | data | baseline | probe | train ........... | evaluate | test | verify | report | export | margin |
                              ^ trials in order ^ training deadline

Slots are named after the runner's phases. Fixed phases get default budgets until they are measured (a
committed phase counts what it took). The train slot is what is left; each trial needs
`planned steps x step seconds x TRAIN_OVERHEAD`, with the step time estimated (`rental.step_seconds`,
default 1 s) until the probe measures it. `make_plan` is re-run at every process start, with the time
already used, and after the probe, with the measured step.
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
    "PhasePlan",
    "WINDOW_SECONDS",
    "count_split_examples",
    "count_train_examples",
    "detectable_from_size",
    "make_plan",
    "planned_steps",
    "power_lines",
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


def power_lines(spec: JobSpec, counts: dict[str, int]) -> list[str]:
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
class Slot:
    name: str
    seconds: float
    start: float  # seconds after the lease start
    end: float
    source: str  # "default", "measured", "left for training", "spec"


@dataclass(frozen=True)
class TrialBudget:
    id: str
    steps: int
    seconds: float
    fits: bool


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

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """The plan as a table a person reads (hours and minutes)."""
        lines = [
            f"lease {self.window} ({_hm(self.lease_seconds)}), {_hm(self.elapsed)} used, step time "
            f"{self.step_seconds:.3g} s ({self.step_source})",
            f"{'phase':<12} {'budget':>8} {'starts':>8} {'deadline':>9}  source",
        ]
        for slot in self.slots:
            times = f"{_hm(slot.seconds):>8} {_hm(slot.start):>8} {_hm(slot.end):>9}"
            lines.append(f"{slot.name:<12} {times}  {slot.source}")
        lines.append("")
        lines.append(f"{'trial':<20} {'steps':>8} {'needs':>8}  fits")
        for trial in self.trials:
            lines.append(f"{trial.id:<20} {trial.steps:>8} {_hm(trial.seconds):>8}  {'yes' if trial.fits else 'NO'}")
        lines.append(f"training stops by {_hm(self.train_deadline)} after the lease start, whatever its step count")
        if self.checkpoints:
            lines.append(self.checkpoints)
        return "\n".join(lines)


def _hm(seconds: float) -> str:
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}"


def make_plan(
    spec: JobSpec,
    n_train: int,
    *,
    window: str | None = None,
    elapsed: float = 0.0,
    measured: dict[str, float] | None = None,
    step_seconds: float | None = None,
    steps_done: dict[str, int] | None = None,
) -> PhasePlan:
    """Cut the lease into slots. `elapsed`: lease seconds already used; `measured`: seconds committed phases
    took; `step_seconds`: the probe's measurement; `steps_done`: optimizer steps each trial has behind it.
    Problems (what does not fit, and what to cut) are listed in `problems`; empty means the spec fits."""
    window = window or spec.rental.window
    measured, steps_done = measured or {}, steps_done or {}
    lease = float(WINDOW_SECONDS[window])
    margin = float(duration_seconds(spec.rental.margin or DEFAULT_MARGIN[window]))
    step = step_seconds or spec.rental.step_seconds or DEFAULT_STEP_SECONDS
    trials = resolve_trials(spec)
    world = spec.distribution.nproc_per_node * spec.distribution.nnodes

    def budget(name: str) -> tuple[str, float, str]:
        if name in measured:
            return name, measured[name], "measured"
        per = len(trials) if name == "evaluate" else 1
        return name, float(DEFAULT_BUDGETS[name] * per), "default"

    before = [budget(name) for name in BEFORE_TRAINING]
    after = [budget(name) for name in AFTER_TRAINING]
    before_total, after_total = sum(s for _, s, _ in before), sum(s for _, s, _ in after)
    train_deadline = lease - margin - after_total  # the reserve at the end is never given to training
    train_start = max(before_total, elapsed)
    available = max(0.0, train_deadline - train_start)

    problems, budgets, needed = [], [], 0.0
    if train_deadline <= before_total:
        problems.append(
            f"rental.window {window}: the fixed phases ({_hm(before_total + after_total)}) and the margin "
            f"({_hm(margin)}) leave no time for training; cut: a smaller rental.margin, or a longer window"
        )
    for trial in trials:
        steps = planned_steps(trial.training, n_train, world)
        seconds = max(0, steps - steps_done.get(trial.id, 0)) * step * TRAIN_OVERHEAD
        needed += seconds
        budgets.append(TrialBudget(trial.id, steps, seconds, needed <= available))
    if budgets and not budgets[0].fits and not problems:
        most = int(available / (step * TRAIN_OVERHEAD))
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
    for name, seconds, source in before:
        slots.append(Slot(name, seconds, at, at + seconds, source))
        at += seconds
    slots.append(Slot("train", available, train_start, train_start + available, "left for training"))
    at = train_deadline
    for name, seconds, source in after:
        slots.append(Slot(name, seconds, at, at + seconds, source))
        at += seconds
    slots.append(Slot("margin", margin, at, at + margin, "spec" if spec.rental.margin else "default"))
    step_source = "measured" if step_seconds else "estimate"
    return PhasePlan(
        window, lease, margin, step, step_source, elapsed, slots, budgets, train_deadline, problems,
        checkpoint_policy_text(spec.training.checkpoint),
    )  # fmt: skip
