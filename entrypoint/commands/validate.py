"""`rentune validate SPEC`: OK, or every problem found in the spec (exit 2)."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoint.commands.exits import exits
from entrypoint.commands.options import StoreFlags
from entrypoint.job import layout
from entrypoint.store import check_conditional_writes
from jobspec.load import SpecError, load_spec
from jobspec.local_inputs import model_folder_check


@click.command("validate")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--check-store",
    is_flag=True,
    help="Also check that the spec's store is reachable and honours conditional writes (writes a few small "
    "objects under scratch/).",
)
@click.option(
    "--skip-files",
    is_flag=True,
    help="The spec runs on another machine (its model and data paths are the node's): skip the checks of local "
    "model and data files.",
)
def validate(spec: Path, check_store: bool, skip_files: bool) -> None:
    """Check SPEC and print OK or every problem found (exit 2): the spec itself; a local model folder (its
    weights, config, and model.max_length against its position embeddings); the first rows of local data
    files (unless --skip-files); with --check-store, the store. Imports no model library: a second or two."""
    from entrypoint.data.reading import first_rows_problems

    with exits():
        loaded = load_spec(spec)
        problems, warnings = [], []
        if not skip_files:
            problems, warnings = model_folder_check(loaded.spec)
            problems += first_rows_problems(loaded.spec)
        if problems:
            raise SpecError([f"{spec}: {problem}" for problem in problems])
        for warning in warnings:
            click.echo(f"{spec}: warning: {warning}", err=True)
        if check_store:
            root = StoreFlags(None).over(loaded.spec.store).open()
            check_conditional_writes(root, layout.SCRATCH)
            click.echo(f"store {root.uri}: reachable, writable, conditional writes honoured")
        click.echo(f"OK {spec} (job {loaded.spec.job.id}, sha256 {loaded.sha256[:12]})")
