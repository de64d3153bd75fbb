"""`rentune cancel JOB_ID`: take a submitted job off the queue before a worker starts it."""

from __future__ import annotations

import click

from entrypoint.commands.exits import exits
from entrypoint.commands.options import StoreFlags, store_options


@click.command("cancel")
@click.argument("job_id")
@store_options
def cancel(job_id: str, store: StoreFlags) -> None:
    """Take JOB_ID off the queue before a worker starts it; its spec moves to queue/cancelled/. A job a worker
    holds is refused (exit 3); stop that worker first."""
    from entrypoint.job.queue import cancel as unqueue

    with exits():
        root = store.open()
        moved = unqueue(root, job_id)
        click.echo(f"cancelled {job_id}: no worker will start it; its spec is kept at {root.uri}/{moved}")
