"""The `rentune` command. The only module that reads argv and the environment; every error that ends a
command goes through `_exits`, which prints it and exits with `errors.exit_code` (see entrypoint/errors.py:
0 success, 1 the job failed, 2 invalid input, 3 the store refuses, 143 stopped by SIGTERM).

`validate`, `plan`, `schema`, `status`, `logs` and `submit` import neither torch nor transformers: they
read specs and JSON, and start in a fraction of a second (tests/unit/test_light_commands.py checks it).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from entrypoint.errors import EXIT_FAILED, EXIT_INVALID, InvalidInput, exit_code
from entrypoint.job.state import PHASE_NAMES, job_store, read_json, stored_spec
from entrypoint.report.markdown import summary_table
from entrypoint.store import StoreError, open_store
from jobspec.experiments import resolve_trials
from jobspec.load import LoadedSpec, SpecError, load_spec
from jobspec.schema import JobSpec


def _log(message: str) -> None:
    click.echo(message, err=False)
    sys.stdout.flush()


_workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".rentune-work"),
    show_default=True,
    help="Local scratch folder; may be lost at any time, the store is the truth.",
)


@contextlib.contextmanager
def _exits(source: str | None = None) -> Iterator[None]:
    """Print an error that ends the command and exit with its code. Input errors say what to fix (after
    the spec's `source`, when given); anything unexpected is a failed job, with its type (the attempt
    record in the store has it too)."""
    try:
        yield
    except SpecError as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        sys.exit(EXIT_INVALID)
    except Exception as exc:
        code = exit_code(exc)
        if isinstance(exc, InvalidInput):
            what = f"{source}: {exc}" if source else str(exc)
        elif code == EXIT_FAILED and not isinstance(exc, StoreError):
            what = f"job failed: {type(exc).__name__}: {exc}"
        else:
            what = str(exc)
        click.echo(f"rentune: {what}", err=True)
        sys.exit(code)


def _load_or_exit(spec: Path) -> LoadedSpec:
    """The spec, or every problem on stderr and exit 2."""
    try:
        return load_spec(spec)
    except SpecError as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        sys.exit(EXIT_INVALID)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rentune")
def main() -> None:
    """Fine-tune a model on a rented node: a job spec in, a verified adapter out."""
    # tracking.mlflow: an unreachable server costs seconds, not MLflow's default of 7 retries with backoff.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
def validate(spec: Path) -> None:
    """Check SPEC and print OK or every problem found (exit 2)."""
    loaded = _load_or_exit(spec)
    click.echo(f"OK {spec} (job {loaded.spec.job.id}, sha256 {loaded.sha256[:12]})")


@main.command()
def schema() -> None:
    """Print the job spec's JSON Schema (for editor autocompletion)."""
    click.echo(json.dumps(JobSpec.model_json_schema(), indent=2))


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--window", type=click.Choice(["3d", "7d", "30d"]), help="Plan for this lease instead of rental.window.")
@click.option("--train-examples", type=click.IntRange(min=1), help="Training examples, when the data is in s3://.")
def plan(spec: Path, window: str | None, train_examples: int | None) -> None:
    """Print SPEC's lease plan; exit 2 with what to cut if it does not fit."""
    from jobspec.plan import count_split_examples, count_train_examples, make_plan, power_lines

    loaded = _load_or_exit(spec)
    try:
        counts = count_split_examples(loaded.spec)
        n_train = train_examples or count_train_examples(loaded.spec)
    except OSError as exc:
        click.echo(f"{spec}: data: cannot read the training data to count it ({exc})", err=True)
        sys.exit(EXIT_INVALID)
    if n_train is None:
        click.echo(f"{spec}: data: the data is in object storage; pass --train-examples N to plan", err=True)
        sys.exit(EXIT_INVALID)
    result = make_plan(loaded.spec, n_train, window=window)
    click.echo(result.table())
    for line in power_lines(loaded.spec, counts) if counts else []:
        click.echo(line)
    if result.problems:
        for line in result.problems:
            click.echo(f"{spec}: {line}", err=True)
        sys.exit(EXIT_INVALID)


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--store", "store_uri", help="Store URI (file://DIR or s3://bucket/prefix); overrides store.uri.")
@_workdir_option
@click.option(
    "--until",
    type=click.Choice(PHASE_NAMES),
    help="Stop after this phase (e.g. `--until data` checks and inspects the data only).",
)
@click.option(
    "--reopen-test",
    metavar="REASON",
    help="Open a sealed test split that another spec or trial already opened; REASON goes into the report.",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    envvar="RENTUNE_NODE_RANK",
    show_default=True,
    help="This node's rank in a multi-node job (distribution.nnodes > 1): 0 runs every phase, the others "
    "join its training launches only. Env: RENTUNE_NODE_RANK.",
)
def run(
    spec: Path, store_uri: str | None, workdir: Path, until: str | None, reopen_test: str | None, node_rank: int
) -> None:
    """Run SPEC's phases, continuing from what the store already holds."""
    from entrypoint.follower import follow_lead
    from entrypoint.runner import run_job, store_args
    from entrypoint.training.environment import quiet_libraries

    quiet_libraries()
    with _exits():
        loaded = load_spec(spec)
        options = loaded.spec.store
        root = open_store(
            store_uri or options.uri,
            endpoint_url=options.endpoint_url,
            region=options.region,
            addressing_style=options.addressing_style,
        )
    _log(f"rentune: job {loaded.spec.job.id} -> {root.uri}")
    nnodes = loaded.spec.distribution.nnodes
    if node_rank >= nnodes:
        click.echo(
            f"{loaded.source}: --node-rank {node_rank}: expected a rank below distribution.nnodes ({nnodes})", err=True
        )
        sys.exit(EXIT_INVALID)
    if node_rank > 0:
        job_id = loaded.spec.job.id
        with _exits(source=loaded.source):
            follow_lead(root, job_id, node_rank, (workdir / job_id).resolve(), store_args(root, job_id), _log)
        return
    with _exits(source=loaded.source):
        outcome = run_job(loaded, root, workdir, _log, until=until, reopen_test=reopen_test)
    if until is not None and until not in ("report", "export"):
        _log(f"\nstopped after {until}, as asked; results under {outcome.store_uri}/phases/")
        return
    results = read_json(job_store(root, outcome.job_id), "report/results.json")
    _log("\n" + summary_table(results))
    _log(f"\nreport: {outcome.store_uri}/report/report.md")
    if until != "report":
        _log(f"adapter: {outcome.store_uri}/export/adapter  binding: {outcome.store_uri}/export/BINDING.json")


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
@click.option("--with-adapter", is_flag=True, help="Also download export/adapter (the trained weights).")
def fetch(job_id: str, store_uri: str, endpoint_url: str | None, dest: Path | None, with_adapter: bool) -> None:
    """Download JOB_ID's report (results.json, report.md, plots), export metadata and TensorBoard event
    files (DEST/tensorboard/<trial>/, one run per trial: `tensorboard --logdir DEST/tensorboard`) to a local
    folder. Event files come while the job still trains."""
    dest = dest or Path(job_id)
    with _exits():
        store = job_store(open_store(store_uri, endpoint_url=endpoint_url), job_id)
        keys = [info.key for prefix in ("report", "export") for info in store.list(prefix)]
        keys = [k for k in keys if with_adapter or not k.startswith("export/adapter/")]
        trials = [trial.id for trial in resolve_trials(stored_spec(store).spec)] if store.head("spec.yaml") else []
        events = [info.key for trial in trials for info in store.list(f"trials/{trial}/tensorboard")]
        if not keys and not events:
            raise InvalidInput(f"{store.uri}: no report yet (the job has not reached its report phase)")
        targets = {key: dest / key for key in keys}
        targets.update({key: dest / "tensorboard" / key.split("/")[1] / key.split("/")[-1] for key in events})
        for key, target in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(store.get_bytes(key))
            os.replace(partial, target)  # a fetch again while the job trains replaces each file whole
    click.echo(f"fetched {len(targets)} files to {dest}/" + (f" (report: {dest / 'report/report.md'})" if keys else ""))
    if events:
        click.echo(f"tensorboard --logdir {dest / 'tensorboard'}")
    results = dest / "report/results.json"
    if results.is_file():
        click.echo("\n" + summary_table(json.loads(results.read_text())))


@main.command("verify-export")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--base",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The base model folder you intend to load the adapter onto.",
)
def verify_export(directory: Path, base: Path) -> None:
    """Check that DIRECTORY (an export: BINDING.json, adapter/, spec and report) is intact and belongs to
    the base model in BASE.

    Exit 0 when every file matches its sha256 in BINDING.json and the base model's sha256 matches; exit 2
    naming what differs otherwise. Load an adapter only onto a base model this command accepts."""
    from entrypoint.phases.export import check_export

    with _exits():
        binding, problems = check_export(directory, base)
    if problems:
        for line in problems:
            click.echo(f"rentune: refused: {line}", err=True)
        sys.exit(EXIT_INVALID)
    click.echo(
        f"OK {directory}: {len(binding['files'])} files intact; trial {binding['trial_id']} of job "
        f"{binding['job_id']} belongs to {base} (sha256 {binding['base_model']['sha256'][:16]}...)"
    )


@main.command()
@click.argument("job_id")
@click.option("--store", "store_uri", required=True, help="Store URI the job runs against.")
@click.option("--endpoint-url", help="S3-compatible endpoint (MinIO, R2, ...).")
def status(job_id: str, store_uri: str, endpoint_url: str | None) -> None:
    """Show JOB_ID's phases (plan vs actual), trials, attempts and the time left on the lease."""
    from entrypoint.job.status import render_status

    with _exits():
        click.echo(render_status(open_store(store_uri, endpoint_url=endpoint_url), job_id))


def _store_options(function):
    """--store (default: $RENTUNE_STORE), --endpoint-url, --region, --addressing-style."""
    for option in reversed(
        [
            click.option(
                "--store",
                "store_uri",
                envvar="RENTUNE_STORE",
                required=True,
                help="The bucket (s3://bucket/prefix or file://DIR); default: $RENTUNE_STORE.",
            ),
            click.option("--endpoint-url", help="S3-compatible endpoint (MinIO, R2, ...); default: $AWS_ENDPOINT_URL."),
            click.option("--region"),
            click.option("--addressing-style", type=click.Choice(["auto", "path", "virtual"])),
        ]
    ):
        function = option(function)
    return function


def _open_root(store_uri: str, endpoint_url: str | None, region: str | None, addressing_style: str | None):
    with _exits():
        return open_store(store_uri, endpoint_url=endpoint_url, region=region, addressing_style=addressing_style)


@main.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@_store_options
def submit(spec: Path, store_uri: str, endpoint_url, region, addressing_style) -> None:
    """Validate SPEC here and queue it in the bucket, for a `rentune worker` on a node to run."""
    from entrypoint.job.queue import submit as queue_spec

    loaded = _load_or_exit(spec)
    root = _open_root(store_uri, endpoint_url, region, addressing_style)
    with _exits():
        key = queue_spec(root, loaded)
    click.echo(f"queued {loaded.spec.job.id} at {root.uri}/{key}; follow it with: rentune status {loaded.spec.job.id}")


@main.command()
@_store_options
@_workdir_option
@click.option(
    "--lease-seconds",
    type=click.FloatRange(min=1.0),
    default=300.0,
    show_default=True,
    help="A claim without a heartbeat for this long belongs to a dead worker and is taken over.",
)
@click.option("--poll-seconds", type=click.FloatRange(min=0.1), default=10.0, show_default=True)
@click.option("--exit-when-idle", is_flag=True, help="Return once the queue is empty (default: wait for more).")
def worker(store_uri, endpoint_url, region, addressing_style, workdir, lease_seconds, poll_seconds, exit_when_idle):
    """Claim queued jobs from the bucket one at a time and run them (the image's default command).

    A job runs against this worker's store whatever its spec's store.uri says; its data and model
    paths must exist on this node (or be s3:// data)."""
    from dataclasses import replace

    from entrypoint.job.queue import Worker
    from entrypoint.runner import run_job
    from entrypoint.training.environment import quiet_libraries
    from jobspec.schema import Store as StoreSection

    quiet_libraries()
    root = _open_root(store_uri, endpoint_url, region, addressing_style)
    ours = StoreSection(uri=store_uri, endpoint_url=endpoint_url, region=region, addressing_style=addressing_style)

    def run(loaded, log):
        # A queued spec is untrusted: its data is read with this worker's store settings, never with an
        # endpoint the spec names (which would receive this node's credentials).
        run_job(replace(loaded, spec=loaded.spec.model_copy(update={"store": ours})), root, workdir, log)

    worker = Worker(root, run, _log, lease_seconds=lease_seconds, poll_seconds=poll_seconds)
    _log(f"worker: {worker.name} watching {root.uri}/queue/")
    with _exits():
        worker.loop(exit_when_idle=exit_when_idle)


@main.command()
@click.argument("job_id")
@_store_options
@click.option("--attempt", type=int, help="Only this attempt (default: all, oldest first).")
def logs(job_id: str, store_uri, endpoint_url, region, addressing_style, attempt: int | None) -> None:
    """Print JOB_ID's logs from the store, one section per attempt (process start)."""
    from entrypoint.job.attempts import attempt_numbers
    from entrypoint.store import ObjectNotFound

    store = job_store(_open_root(store_uri, endpoint_url, region, addressing_style), job_id)
    with _exits():
        numbers = attempt_numbers(store)
        if not numbers:
            raise InvalidInput(f"{store.uri}: no attempts yet (is {job_id!r} queued or misspelt?)")
    for n in numbers if attempt is None else [attempt]:
        click.echo(f"== attempt {n}")
        try:
            click.echo(store.get_bytes(f"attempts/{n}/log.txt").decode(), nl=False)
        except ObjectNotFound:
            click.echo("(no log saved: the process ended before its first flush)")


@main.command("convert-gguf")
@click.argument("gguf", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the causal LM in GGUF (weights, tokenizer, chat template) into OUT, a safetensors folder
    to use as model.path. OUT must not exist or be empty."""
    from entrypoint.training.environment import quiet_libraries
    from entrypoint.training.model import convert_gguf as convert
    from entrypoint.training.model import hash_base_model

    quiet_libraries()
    with _exits():
        source = convert(gguf, out)
        digest = hash_base_model(out.resolve()).sha256
    click.echo(
        f"OK {out}: {source['architecture']}, {source['parameters']:,} parameters dequantized to float32 from "
        f"{gguf.name} (sha256 {source['gguf_sha256'][:16]}...); model sha256 {digest[:16]}...; "
        f"use model.path: {out}"
    )


@main.command("push-model")
@click.argument("folder", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("uri")
@click.option("--endpoint-url", help="S3-compatible endpoint (MinIO, R2, ...); default: $AWS_ENDPOINT_URL.")
@click.option("--region")
@click.option("--addressing-style", type=click.Choice(["auto", "path", "virtual"]))
def push_model(folder: Path, uri: str, endpoint_url, region, addressing_style) -> None:
    """Upload the model FOLDER to URI (s3://bucket/prefix) with a manifest of every file's size and
    sha256 (written last), for specs to use as model.path: URI. Never overwrites another model there."""
    from entrypoint.store.models import push_model as push
    from entrypoint.store.s3 import S3Store
    from entrypoint.training.model import resolve_model_dir
    from jobspec.schema import MODEL_URI, Model

    if not MODEL_URI.fullmatch(uri):
        click.echo(f"push-model: {uri}: expected s3://bucket/prefix (a lowercase bucket name and a folder)", err=True)
        sys.exit(EXIT_INVALID)
    with _exits():
        resolve_model_dir(Model(path=str(folder.resolve())))  # a job's checks: config.json, safetensors, no code
        options = {"endpoint_url": endpoint_url, "region": region, "addressing_style": addressing_style}
        store = S3Store.from_uri(uri.rstrip("/"), **options)
        manifest = push(store, folder.resolve(), _log)
    click.echo(f"OK {uri}: base model sha256 {manifest['base_model_sha256'][:16]}...; use model.path: {uri}")


@main.command()
def env() -> None:
    """Print the detected backend (CUDA, ROCm or CPU) and the versions rentune would record."""
    from entrypoint.training.environment import environment

    click.echo(json.dumps(environment(), indent=2, sort_keys=True))
