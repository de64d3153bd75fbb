"""`rentune validate SPEC`: OK, or every problem found in the spec (exit 2)."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoint.commands.exits import exits
from jobspec.load import SpecError, load_spec
from jobspec.model_limits import max_length_problem


@click.command("validate")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
def validate(spec: Path) -> None:
    """Check SPEC and print OK or every problem found (exit 2). With a local model folder, also
    model.max_length against the model's position embeddings."""
    with exits():
        loaded = load_spec(spec)
        model = loaded.spec.model
        local = model.path is not None and "://" not in model.path.removeprefix("file://")
        folder = Path(model.path.removeprefix("file://")).expanduser() if local else None
        found = max_length_problem(model.max_length, folder) if folder is not None and folder.is_dir() else None
        if found is not None and found[1]:
            raise SpecError([f"{spec}: {found[0]}"])
        if found is not None:
            click.echo(f"{spec}: warning: {found[0]}", err=True)
        click.echo(f"OK {spec} (job {loaded.spec.job.id}, sha256 {loaded.sha256[:12]})")
