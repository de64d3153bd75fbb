"""The `rentune` command. The only module that reads argv and the environment and maps errors to exit codes.

Exit codes: 0 success; 1 the job failed while running; 2 invalid input (spec, data, model, store URI);
3 the store refuses: it holds this job with another spec, or the sealed test split was opened by another
spec or trial; 143 stopped by SIGTERM (resume by running again).
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
    type=click.Choice(["data", "baseline", "probe", "train", "evaluate", "test", "report", "export"]),
    help="Stop after this phase (e.g. `--until data` checks and inspects the data only).",
)
@click.option(
    "--reopen-test",
    metavar="REASON",
    help="Open a sealed test split that another spec or trial already opened; REASON goes into the report.",
)
def run(spec: Path, store_uri: str | None, workdir: Path, until: str | None, reopen_test: str | None) -> None:
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
    from entrypoint.phases.test import TestSealed
    from entrypoint.runner import JobConflict, Unsupported, run_job
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
        outcome = run_job(loaded, root, workdir, _log, until=until, reopen_test=reopen_test)
    except Interrupted as exc:
        click.echo(f"rentune: {exc}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except (JobConflict, TestSealed) as exc:
        click.echo(f"rentune: {exc}", err=True)
        sys.exit(EXIT_CONFLICT)
    except (DataError, ModelError, Unsupported) as exc:
        click.echo(f"rentune: {loaded.source}: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    except Exception as exc:  # the attempt record in the store holds the error too
        click.echo(f"rentune: job failed: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    from entrypoint.runner import job_store

    store = job_store(root, outcome.job_id)
    if until is not None and until not in ("report", "export"):
        _log(f"\nstopped after {until}, as asked; results under {outcome.store_uri}/phases/")
        return
    results = json.loads(store.get_bytes("report/results.json"))
    _log("\n" + summary(results))
    _log(f"\nreport: {outcome.store_uri}/report/report.md")
    if until != "report":
        _log(f"adapter: {outcome.store_uri}/export/adapter  binding: {outcome.store_uri}/export/BINDING.json")


def summary(results: dict) -> str:
    """The verdict and the trial table, as printed at the end of `rentune run` and by `rentune fetch`."""
    metric = results["hypothesis"]["metric"]
    base = results["baseline"]["metrics"][metric]
    lines = [f"{'trial':<20} {'status':<10} {metric:>12} {'gain':>8}  guardrails  budget"]
    lines.append(f"{'baseline':<20} {'-':<10} {base:>12.3f} {'-':>8}  -           -")
    for t in results["trials"]:
        value = t["metrics"][metric] if t["metrics"] else None
        shown = f"{value:>12.3f} {value - base:>+8.3f}" if value is not None else f"{'-':>12} {'-':>8}"
        guard = "-" if t["guardrails_passed"] is None else "pass" if t["guardrails_passed"] else "FAIL"
        mark = "*" if t["id"] == results["selected"]["trial_id"] else " "
        lines.append(f"{mark}{t['id']:<19} {t['status']:<10} {shown}  {guard:<10}  {t['budget']['status']}")
        if t["reason"]:
            lines.append(f"{'':<21}{t['reason'][:200]}")
    from entrypoint.report import bar_family

    selected = next(t for t in results["trials"] if t["id"] == results["selected"]["trial_id"])
    family, names = bar_family(results["hypothesis"]["task"], results["baseline"]["metrics"])
    width = max(len(n) for n in [*names, "metric"])
    lines += [
        "",
        f"{family} on eval: baseline vs {selected['id']}",
        f"{'metric':<{width}}  baseline  {'trial':>8}  change",
    ]
    for name in names:
        before, after = results["baseline"]["metrics"][name], selected["metrics"][name]
        lines.append(f"{name:<{width}}  {before:>8.3f}  {after:>8.3f}  {after - before:>+6.3f}")
    lines.append("")
    for split in ("eval", "test"):
        v = results["verdict"][split]
        lines.append(
            f"{split}: hypothesis {'holds' if v['hypothesis_holds'] else 'does NOT hold'} ({metric} gain "
            f"{v['gain']:+.3f}); guardrails {'pass' if v['guardrails_passed'] else 'FAIL'}"
            + ("  (sealed test split, opened once)" if split == "test" else "")
        )
    return "\n".join(lines)


@main.command()
@click.argument("job_id")
@click.option("--store", "store_uri", required=True, help="Store URI the job ran against.")
@click.option("--endpoint-url", help="S3-compatible endpoint (MinIO, R2, ...).")
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Local folder (default: ./<JOB_ID>).",
)
def fetch(job_id: str, store_uri: str, endpoint_url: str | None, dest: Path | None) -> None:
    """Download JOB_ID's report (results.json, report.md, plots) and export metadata to a local folder."""
    from entrypoint.runner import job_store
    from entrypoint.store import InvalidKey, ObjectNotFound, StoreError, open_store

    dest = dest or Path(job_id)
    try:
        store = job_store(open_store(store_uri, endpoint_url=endpoint_url), job_id)
        keys = [info.key for prefix in ("report", "export") for info in store.list(prefix)]
        keys = [k for k in keys if k.startswith("report/") or not k.startswith("export/adapter/")]
        if not keys:
            raise ObjectNotFound(f"{store.uri}: no report yet (the job has not reached its report phase)")
        for key in keys:
            target = dest / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(store.get_bytes(key))
    except (InvalidKey, ObjectNotFound) as exc:
        click.echo(f"rentune: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    except StoreError as exc:
        click.echo(f"rentune: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(f"fetched {len(keys)} files to {dest}/ (report: {dest / 'report/report.md'})")
    results = dest / "report/results.json"
    if results.is_file():
        click.echo("\n" + summary(json.loads(results.read_text())))
