"""`rentune submit SPEC`: validate here, queue in the bucket for a `rentune worker`."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from entrypoint.commands.exits import exits
from entrypoint.commands.options import StoreFlags, store_options
from jobspec.load import load_spec


@click.command("submit")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@store_options
def submit(spec: Path, store: StoreFlags) -> None:
    """Validate SPEC here and queue it in the bucket, for a `rentune worker` on a node to run."""
    from entrypoint.job.queue import submit as queue_spec

    with exits():
        loaded = load_spec(spec)
        root = store.open()
        key = queue_spec(root, loaded)
        job_id = loaded.spec.job.id
        flags = store.args()
        click.echo(f"queued {job_id} at {root.uri}/{key}")
        click.echo(f"follow it with: {shlex.join(['rentune', 'status', job_id, *flags])}")
        unqueue = shlex.join(["rentune", "cancel", job_id, *flags])
        click.echo(f"take it off the queue before a worker starts it: {unqueue}")
