"""`rentune submit SPEC`: validate here, queue in the bucket for a `rentune worker`."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from entrypoint.commands.exits import exits
from entrypoint.commands.options import StoreFlags, store_options
from jobspec.load import SpecError, load_spec
from jobspec.local_inputs import node_paths_problems


@click.command("submit")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@store_options
@click.option(
    "--node-paths",
    is_flag=True,
    help="The spec's local paths (model.path, data.source, ...) are the worker node's own, e.g. a mounted volume: "
    "queue it anyway. Without it, a local path is refused for an s3:// store.",
)
def submit(spec: Path, store: StoreFlags, node_paths: bool) -> None:
    """Validate SPEC here and queue it in the bucket, for a `rentune worker` on a node to run. A local path
    in the spec is refused (exit 2) unless the store is file:// (the worker shares this file system) or
    --node-paths says the node has it."""
    from entrypoint.job.queue import submit as queue_spec

    with exits():
        loaded = load_spec(spec)
        root = store.open()
        problems = [] if node_paths or root.uri.startswith("file://") else node_paths_problems(loaded.spec)
        if problems:
            raise SpecError([f"{spec}: {problem}" for problem in problems])
        key = queue_spec(root, loaded)
        job_id = loaded.spec.job.id
        flags = store.args()
        click.echo(f"queued {job_id} at {root.uri}/{key}")
        click.echo(f"follow it with: {shlex.join(['rentune', 'status', job_id, *flags])}")
        unqueue = shlex.join(["rentune", "cancel", job_id, *flags])
        click.echo(f"take it off the queue before a worker starts it: {unqueue}")
