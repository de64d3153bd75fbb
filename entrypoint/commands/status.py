"""`rentune status JOB_ID`: phases (plan vs actual), trials, attempts and the time left on the lease."""

from __future__ import annotations

import click

from entrypoint.commands.exits import exits
from entrypoint.commands.options import StoreFlags, store_options


@click.command("status")
@click.argument("job_id")
@store_options
def status(job_id: str, store: StoreFlags) -> None:
    """Show JOB_ID's phases (plan vs actual), trials, attempts and the time left on the lease."""
    from entrypoint.job.status import render_status

    with exits():
        click.echo(render_status(store.open(), job_id))
