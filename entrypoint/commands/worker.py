"""`rentune worker`: claim queued jobs from the bucket one at a time and run them (the images' default
command)."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoint.commands.exits import exits
from entrypoint.commands.options import StoreFlags, log, store_options, workdir_option


@click.command("worker")
@store_options
@workdir_option
@click.option(
    "--claim-seconds",
    type=click.FloatRange(min=1.0),
    default=300.0,
    show_default=True,
    help="A claim without a heartbeat for this long belongs to a dead worker and is taken over.",
)
@click.option("--lease-seconds", "old_claim_seconds", type=click.FloatRange(min=1.0), hidden=True)  # the old name
@click.option("--poll-seconds", type=click.FloatRange(min=0.1), default=10.0, show_default=True)
@click.option("--exit-when-idle", is_flag=True, help="Return once the queue is empty (default: wait for more).")
def worker(
    store: StoreFlags,
    workdir: Path,
    claim_seconds: float,
    old_claim_seconds: float | None,
    poll_seconds: float,
    exit_when_idle: bool,
) -> None:
    """Claim queued jobs from the bucket one at a time and run them (the image's default command).

    A job runs against this worker's store whatever its spec's store.uri says; its data and model
    paths must exist on this node (or be s3:// data)."""
    from dataclasses import replace

    from entrypoint.job.queue import Worker
    from entrypoint.notices import notice_settings
    from entrypoint.runner import run_job
    from entrypoint.training.environment import process_age, quiet_libraries

    startup = process_age()  # a fresh rentune process: what each job's verify phase starts again
    from jobspec.schema import Store as StoreSection

    with exits():
        notice_settings()  # a bad RENTUNE_INTERRUPTION_NOTICE & co. stops here (exit 2), before any claim
        quiet_libraries()
        root = store.open()
        ours = StoreSection(
            uri=store.uri, endpoint_url=store.endpoint_url, region=store.region, addressing_style=store.addressing_style
        )

        def run_one(loaded, job_log):
            # A queued spec is untrusted: its data is read with this worker's store settings, never with an
            # endpoint the spec names (which would receive this node's credentials).
            ours_spec = replace(loaded, spec=loaded.spec.model_copy(update={"store": ours}))
            run_job(ours_spec, root, workdir, job_log, startup_seconds=startup)

        claims = Worker(root, run_one, log, claim_seconds=old_claim_seconds or claim_seconds, poll_seconds=poll_seconds)
        log(f"worker: {claims.name} watching {root.uri}/queue/")
        claims.loop(exit_when_idle=exit_when_idle)
