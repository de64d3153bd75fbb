"""`rentune env`: the detected backend and the versions a job would record."""

from __future__ import annotations

import json

import click

from entrypoint.commands.exits import exits


@click.command("env")
def env() -> None:
    """Print the detected backend (CUDA, ROCm or CPU) and the versions rentune would record."""
    from entrypoint.training.environment import environment

    with exits():
        click.echo(json.dumps(environment(), indent=2, sort_keys=True))
