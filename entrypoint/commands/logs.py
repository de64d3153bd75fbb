"""`rentune logs JOB_ID`: the job's logs from the store, one section per attempt."""

from __future__ import annotations

import click

from entrypoint.commands.exits import exits
from entrypoint.commands.options import StoreFlags, store_options
from entrypoint.errors import InvalidInput
from entrypoint.job import layout
from entrypoint.job.state import job_store


@click.command("logs")
@click.argument("job_id")
@store_options
@click.option("--attempt", type=int, help="Only this attempt (default: all, oldest first).")
def logs(job_id: str, store: StoreFlags, attempt: int | None) -> None:
    """Print JOB_ID's logs from the store, one section per attempt (process start)."""
    from entrypoint.job.attempts import attempt_numbers
    from entrypoint.store import ObjectNotFound

    with exits():
        job = job_store(store.open(), job_id)
        numbers = attempt_numbers(job)
        if not numbers:
            raise InvalidInput(f"{job.uri}: no attempts yet (is {job_id!r} queued or misspelt?)")
        for n in numbers if attempt is None else [attempt]:
            click.echo(f"== attempt {n}")
            try:
                click.echo(job.get_bytes(layout.attempt_log(n)).decode(), nl=False)
            except ObjectNotFound:
                click.echo("(no log saved: the process ended before its first flush)")
