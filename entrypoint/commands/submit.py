"""`rentune submit SPEC`: validate here, queue in the bucket for a `rentune worker`."""

from __future__ import annotations

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
        click.echo(f"queued {job_id} at {root.uri}/{key}; follow it with: rentune status {job_id}")
