"""The `rentune` command. The only module that reads argv and the environment and maps errors to exit codes.

Exit codes: 0 success; 1 the job failed while running; 2 invalid input (spec, data, model, store URI);
3 the store holds this job with another spec; 143 stopped by SIGTERM (resume by running again).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import click

from jobspec.load import SpecError, load_spec
from jobspec.schema import JobSpec

EXIT_FAILED, EXIT_INVALID, EXIT_CONFLICT = 1, 2, 3


def _log(message: str) -> None:
    click.echo(message, err=False)
    sys.stdout.flush()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rentune")
def main() -> None:
    """Fine-tune a model on a rented node: a job spec in, a verified adapter out."""


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
def validate(spec: Path) -> None:
    """Check SPEC and print OK or every problem found (exit 2)."""
    try:
        loaded = load_spec(spec)
    except SpecError as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        sys.exit(EXIT_INVALID)
    click.echo(f"OK {spec} (job {loaded.spec.job.id}, sha256 {loaded.sha256[:12]})")


@main.command()
def schema() -> None:
    """Print the job spec's JSON Schema (for editor autocompletion)."""
    click.echo(json.dumps(JobSpec.model_json_schema(), indent=2))


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--store", "store_uri", help="Store URI (file://DIR or s3://bucket/prefix); overrides store.uri.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".rentune-work"),
    show_default=True,
    help="Local scratch folder; may be lost at any time, the store is the truth.",
)
@click.option(
    "--until",
    type=click.Choice(["data", "baseline", "probe", "train", "evaluate", "export"]),
    help="Stop after this phase (e.g. `--until data` checks and inspects the data only).",
)
def run(spec: Path, store_uri: str | None, workdir: Path, until: str | None) -> None:
    """Run SPEC's phases, continuing from what the store already holds."""
    import transformers

    from entrypoint.model import ModelError

    # rentune reports what matters itself (missing weights are an error in model.py); the library's
    # load reports and progress bars would bury the per-step progress lines.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # peft still calls transformers' v4 names; the FutureWarning says nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*deprecated and will be removed in v6", category=FutureWarning)
    from entrypoint.dataio import DataError
    from entrypoint.runner import JobConflict, Unsupported, read_result, run_job
    from entrypoint.store import InvalidKey, open_store
    from entrypoint.trainer import EXIT_INTERRUPTED, Interrupted

    try:
        loaded = load_spec(spec)
        options = loaded.spec.store
        root = open_store(
            store_uri or options.uri,
            endpoint_url=options.endpoint_url,
            region=options.region,
            addressing_style=options.addressing_style,
        )
    except (SpecError, InvalidKey) as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_INVALID)
    _log(f"rentune: job {loaded.spec.job.id} -> {root.uri}")
    try:
        outcome = run_job(loaded, root, workdir, _log, until=until)
    except Interrupted as exc:
        click.echo(f"rentune: {exc}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except JobConflict as exc:
        click.echo(f"rentune: {exc}", err=True)
        sys.exit(EXIT_CONFLICT)
    except (DataError, ModelError, Unsupported) as exc:
        click.echo(f"rentune: {loaded.source}: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    except Exception as exc:  # the attempt record in the store holds the error too
        click.echo(f"rentune: job failed: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    from entrypoint.metrics import format_side_by_side
    from entrypoint.runner import job_store

    store = job_store(root, outcome.job_id)
    if until is not None and until != "export":
        _log(f"\nstopped after {until}, as asked; results under {outcome.store_uri}/phases/")
        return
    evaluated, baseline, exported = (read_result(store, p) for p in ("evaluate", "baseline", "export"))
    labels = read_result(store, "data")["labels"]
    _log("\nper-category F1 on the eval split (baseline = untouched base model, zero-shot)")
    _log(format_side_by_side(baseline["metrics"], evaluated["metrics"], labels))
    verdict = "holds" if exported["holds_on_eval"] else "does NOT hold"
    _log(f"\nhypothesis {verdict} on eval: {loaded.spec.hypothesis.metric} gain {exported['gain']:+.3f}")
    _log(f"adapter: {outcome.store_uri}/export/adapter  binding: {outcome.store_uri}/export/BINDING.json")
