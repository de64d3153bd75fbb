"""Where everything lies in the store: one constant or function per key, and no store key written out
anywhere else in the package (tests/unit/test_layout.py greps for one). Keys are relative to the job's own
prefix, `jobs/<job_id>/` (`job_store`), unless their name says root (`ROOT_*`, `root_*`): those are relative
to the store's root, shared by every job in it.

The checkpoint protocol's own keys (trials/<id>/checkpoints/..., MANIFEST.json, NODE-<k>.json) and a pushed
model's manifest belong to the store layer below this one (entrypoint/store/checkpoint.py and model.py);
`checkpoints` here names their folder.

docs/run.md's "Store layout" is generated from LAYOUT (`python -m entrypoint.job.layout` prints it) and
kept current by tests/unit/test_layout.py.
"""

from __future__ import annotations

__all__ = [
    "ATTEMPTS",
    "BASE_MODEL",
    "BASELINE_EVAL_CONFIG",
    "BASELINE_METRICS",
    "BASELINE_PREDICTIONS",
    "CLAIMS",
    "DATA_INSPECTION_JSON",
    "DATA_INSPECTION_MD",
    "DATA_LEAKS",
    "EXPORT",
    "EXPORT_ADAPTER",
    "EXPORT_BINDING",
    "EXPORT_MERGED",
    "FILES",
    "FOLDERS",
    "LAUNCH",
    "LAYOUT",
    "MERGE_CLAIM",
    "PARITY",
    "PLAN",
    "PLANS",
    "PROBE_STORE_CHECK",
    "REPORT",
    "REPORT_MD",
    "RESULTS",
    "ROOT_JOBS",
    "ROOT_QUEUE",
    "ROOT_SEALED_TESTS",
    "SCRATCH",
    "SPEC",
    "TEST_EVAL_CONFIG",
    "TEST_METRICS",
    "TEST_PREDICTIONS",
    "TEST_SPLIT",
    "VERIFY_FRESH_PROCESS",
    "attempt_ended",
    "attempt_env",
    "attempt_log",
    "attempt_started",
    "claim",
    "data_file",
    "data_image",
    "data_split",
    "data_tokens",
    "export_file",
    "layout_text",
    "phase_result",
    "plan_revision",
    "queue_entry",
    "queue_note",
    "report_file",
    "root_claim",
    "root_claims",
    "root_job",
    "root_job_spec",
    "seal_opened",
    "seal_reopened",
    "trial_commit_status",
    "trial_eval",
    "trial_file",
    "trial_final",
    "trial_outputs_at_end",
    "trial_progress",
    "trial_rank_result",
    "trial_result",
    "trial_tensorboard",
    "trial_tracking",
]

# -- the job's own files ----------------------------------------------------------------------------------
SPEC = "spec.yaml"  # the frozen spec, put if absent by the first attempt
PLAN = "plan.json"  # the newest lease plan
PLANS = "plans"  # every plan revision, plans/NNNN.json from 1
BASE_MODEL = "base_model.json"  # the base model's sha256 and each weight file's, from its first use
LAUNCH = "train/launch.json"  # multi-node: the lead's newest torchrun launch
SCRATCH = "scratch"  # the conditional-write check's objects (written and deleted at each start)
CLAIMS = "claims"  # the queue's claims on this job: claims/<n>.json, .heartbeat, .released
ATTEMPTS = "attempts"  # one folder per process start, attempts/<n>/


def plan_revision(number: int) -> str:
    return f"{PLANS}/{number:04d}.json"


def claim(number: int, suffix: str = "json") -> str:
    return f"{CLAIMS}/{number:06d}.{suffix}"


def _attempt(number: int, name: str) -> str:
    return f"{ATTEMPTS}/{number}/{name}"


def attempt_started(number: int) -> str:
    return _attempt(number, "started.json")


def attempt_env(number: int) -> str:
    return _attempt(number, "env.json")


def attempt_ended(number: int) -> str:
    return _attempt(number, "ended.json")


def attempt_log(number: int) -> str:
    return _attempt(number, "log.txt")


# -- phases -----------------------------------------------------------------------------------------------
def phase_result(phase: str) -> str:
    return f"phases/{phase}/result.json"


def data_file(name: str) -> str:
    """A file of the data phase (its inspection grid, ...)."""
    return f"phases/data/{name}"


def data_split(split: str) -> str:
    """One split's rows, as the data phase cleaned and cut them (train, eval, test)."""
    return data_file(f"{split}.jsonl")


def data_image(name: str) -> str:
    """An image of an image job's splits, by its content's name."""
    return data_file(f"images/{name}")


def data_tokens(key: str, split: str) -> str:
    """One split encoded for one tokenizer and max_length (`key`), memory-mapped by later phases."""
    return data_file(f"tokens/{key}/{split}.arrow")


DATA_LEAKS = data_file("leaks.json")
DATA_INSPECTION_JSON = data_file("inspection.json")
DATA_INSPECTION_MD = data_file("inspection.md")
TEST_SPLIT = data_split("test")
BASELINE_PREDICTIONS = "phases/baseline/predictions.jsonl"
BASELINE_METRICS = "phases/baseline/metrics.json"
BASELINE_EVAL_CONFIG = "phases/baseline/eval_config.json"
PROBE_STORE_CHECK = "phases/probe/store-check.bin"  # put and deleted at once: the store's throughput
TEST_PREDICTIONS = "phases/test/predictions.jsonl"
TEST_METRICS = "phases/test/metrics.json"
TEST_EVAL_CONFIG = "phases/test/eval_config.json"
VERIFY_FRESH_PROCESS = "phases/verify/fresh_process.json"  # the recheck process's record
PARITY = "phases/export/parity.json"  # the parity process's record; export/parity.json is its copy


# -- trials -----------------------------------------------------------------------------------------------
def trial_file(trial_id: str, name: str) -> str:
    return f"trials/{trial_id}/{name}"


def trial_result(trial_id: str) -> str:
    return trial_file(trial_id, "result.json")


def trial_tracking(trial_id: str) -> str:
    """The trial's run ids in each tracker of the spec's `tracking:` (entrypoint/tracking)."""
    return trial_file(trial_id, "tracking.json")


def trial_commit_status(trial_id: str) -> str:
    """A failing streak of background checkpoint commits, if any (for `rentune status`)."""
    return trial_file(trial_id, "commit-status.json")


def trial_progress(trial_id: str) -> str:
    """The step training has reached, written every PROGRESS_EVERY_S and at a stop, with the interruptions
    so far: what a resumed process counts as lost."""
    return trial_file(trial_id, "progress.json")


def trial_rank_result(trial_id: str) -> str:
    """Written by torchrun's rank 0 for the launching process."""
    return trial_file(trial_id, "train_result.json")


def trial_final(trial_id: str) -> str:
    """The folder of the trained adapter (or model) and its tokenizer."""
    return trial_file(trial_id, "final")


def trial_outputs_at_end(trial_id: str) -> str:
    return trial_file(trial_id, "eval_outputs_at_end.jsonl")


def trial_eval(trial_id: str, name: str = "") -> str:
    """The trial's evaluation folder (predictions.jsonl, metrics.json, eval_config.json), or a file in it."""
    return trial_file(trial_id, f"eval/{name}" if name else "eval")


def trial_tensorboard(trial_id: str) -> str:
    return trial_file(trial_id, "tensorboard")


# -- report and export ------------------------------------------------------------------------------------
REPORT = "report"
EXPORT = "export"


def report_file(name: str) -> str:
    return f"{REPORT}/{name}"


def export_file(name: str) -> str:
    return f"{EXPORT}/{name}"


RESULTS = report_file("results.json")
REPORT_MD = report_file("report.md")
EXPORT_ADAPTER = export_file("adapter")
EXPORT_MERGED = export_file("merged")
EXPORT_BINDING = export_file("BINDING.json")
MERGE_CLAIM = export_file("MERGING.json")  # held while `rentune export --merged` writes export/merged/


# -- the store's root: every job's ------------------------------------------------------------------------
ROOT_JOBS = "jobs"
ROOT_QUEUE = "queue"
ROOT_SEALED_TESTS = "sealed-tests"


def root_job(job_id: str) -> str:
    """The job's own prefix (what `job_store` wraps)."""
    return f"{ROOT_JOBS}/{job_id}"


def root_job_spec(job_id: str) -> str:
    return f"{root_job(job_id)}/{SPEC}"


def root_claims(job_id: str) -> str:
    return f"{root_job(job_id)}/{CLAIMS}"


def root_claim(job_id: str, number: int, suffix: str = "json") -> str:
    return f"{root_job(job_id)}/{claim(number, suffix)}"


def queue_entry(job_id: str, outcome: str | None = None) -> str:
    """queue/<job_id>.yaml, or queue/<outcome>/<job_id>.yaml once rejected, failed or cancelled."""
    return f"{ROOT_QUEUE}/{outcome}/{job_id}.yaml" if outcome else f"{ROOT_QUEUE}/{job_id}.yaml"


def queue_note(job_id: str, outcome: str, name: str) -> str:
    """A file beside an entry that did not run: queue/<outcome>/<job_id>.<name> (its errors, its copy)."""
    return f"{ROOT_QUEUE}/{outcome}/{job_id}.{name}"


def seal_opened(test_sha256: str) -> str:
    """The one opening of a test split, by its content: shared by every job in the store."""
    return f"{ROOT_SEALED_TESTS}/{test_sha256}/opened.json"


def seal_reopened(test_sha256: str, job_id: str, at: int) -> str:
    return f"{ROOT_SEALED_TESTS}/{test_sha256}/reopened/{job_id}-{at}.json"


# What tests/unit/test_layout.py treats as a store key written out: a string that starts with one of these
# folders and a slash, or is one of these files. (Not "train/", which also begins the trackers' metric
# names: LAUNCH, its one key, is matched whole.)
FOLDERS = (
    ATTEMPTS,
    "phases",
    "trials",
    PLANS,
    SCRATCH,
    CLAIMS,
    REPORT,
    EXPORT,
    ROOT_JOBS,
    ROOT_QUEUE,
    ROOT_SEALED_TESTS,
)
FILES = (SPEC, PLAN, BASE_MODEL, LAUNCH)

# (key, what it holds): docs/run.md's "Store layout", in the order a job writes them.
LAYOUT: tuple[tuple[str, str], ...] = (
    (SPEC, "the frozen spec"),
    (attempt_started(0).replace("/0/", "/<n>/") + ", env.json, ended.json, log.txt", "one per process start"),
    (f"{PLAN}, {plan_revision(1).replace('0001', 'NNNN')}", "the newest lease plan, and every revision"),
    (data_split("{train,eval,test}") + ", tokens/<key>/<split>.arrow", "the cleaned splits, encoded once"),
    (DATA_LEAKS + ", inspection.{md,json}, result.json", "leak check, inspection, the data version"),
    (BASELINE_PREDICTIONS + ", metrics.json, eval_config.json", "the untouched base model's evaluation"),
    (phase_result("baseline"), "with the power table"),
    (phase_result("probe"), "the step set-ups, gradient checks, memory estimate"),
    (BASE_MODEL, "the base model's sha256 and each weight file's, from its first use"),
    (phase_result("train"), "each trial's status, reason and budget"),
    (trial_result("<id>"), "completed | invalid, reason, settings, losses, budget, memory"),
    (trial_file("<id>", "checkpoints/step-00000100/...") + " + MANIFEST.json", "MANIFEST.json written last"),
    (trial_file("<id>", "checkpoints/step-00000100/NODE-<k>.json"), "multi-node: node k's files"),
    (trial_progress("<id>"), "the step training reached, interruptions so far"),
    (trial_commit_status("<id>"), "a failing streak of background commits, if any"),
    (trial_rank_result("<id>"), "torchrun: rank 0's result for the launching process"),
    (LAUNCH, "multi-node: the lead's newest torchrun launch (trial, id, attempt)"),
    (trial_final("<id>") + "/...", "the trained adapter (or model) and its tokenizer"),
    (trial_outputs_at_end("<id>"), "eval outputs at the end of training"),
    (trial_tracking("<id>"), "the trial's run ids in each tracker (tracking:)"),
    (trial_tensorboard("<id>") + "/events.out.tfevents.*", "one file per process (tracking.tensorboard)"),
    (trial_eval("<id>", "predictions.jsonl") + ", metrics.json, eval_config.json", "the trial's evaluation"),
    (phase_result("evaluate"), "per trial: intervals, verdicts, examples changed; the selection"),
    (TEST_PREDICTIONS + ", metrics.json, eval_config.json, result.json", "the one opening of the test split"),
    (VERIFY_FRESH_PROCESS + ", result.json", "the fresh process's recheck"),
    (RESULTS + ", results.schema.json, report.md, *.png", "the report"),
    (export_file("adapter/..., BINDING.json, labels.json, results.json, report.md, spec.yaml"), "the export"),
    (export_file("merged/..., parity.json, Modelfile, SERVING.md"), "serving (docs/serving.md)"),
    (PARITY, "the parity process's record (export/parity.json is its copy)"),
    (MERGE_CLAIM, "held while `rentune export --merged` runs"),
    (claim(1).replace("000001", "<n>") + ", .heartbeat, .released", "the queue's claims on the job"),
    (SCRATCH + "/...", "the conditional-write check at each start (deleted)"),
)
ROOT_LAYOUT: tuple[tuple[str, str], ...] = (
    (queue_entry("<job_id>"), "a submitted spec, until a worker completes it"),
    (queue_entry("<job_id>", "{rejected,failed,cancelled}"), "an entry that did not run, with a note beside it"),
    (seal_opened("<sha256 of test.jsonl>"), "the one opening of a test split"),
    (seal_reopened("<sha256>", "<job>", 0).replace("-0.json", "-<time>.json"), "overrides, with their reason"),
)


def layout_text(width: int = 56) -> str:
    """The layout as docs/run.md shows it: each key, then what it holds (on the next line after a long key)."""

    def rows(pairs: tuple[tuple[str, str], ...]) -> list[str]:
        out = []
        for key, what in pairs:
            if len(key) < width:
                out.append(f"  {key:<{width}}{what}")
            else:
                out += [f"  {key}", f"  {'':<{width}}{what}"]
        return out

    lines = [f"<store>/{root_job('<job_id>')}/", *rows(LAYOUT), "<store>/", *rows(ROOT_LAYOUT)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(layout_text(), end="")
