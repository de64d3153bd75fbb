"""`rentune validate SPEC`: OK, or every problem found in the spec (exit 2)."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoint.commands.exits import exits
from jobspec.load import load_spec


@click.command("validate")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
def validate(spec: Path) -> None:
    """Check SPEC and print OK or every problem found (exit 2)."""
    with exits():
        loaded = load_spec(spec)
        click.echo(f"OK {spec} (job {loaded.spec.job.id}, sha256 {loaded.sha256[:12]})")
