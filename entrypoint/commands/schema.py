"""`rentune schema`: the job spec's JSON Schema."""

from __future__ import annotations

import json

import click

from entrypoint.commands.exits import exits
from jobspec.schema import JobSpec


@click.command("schema")
def schema() -> None:
    """Print the job spec's JSON Schema (for editor autocompletion)."""
    with exits():
        click.echo(json.dumps(JobSpec.model_json_schema(), indent=2))
