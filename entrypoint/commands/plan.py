"""`rentune plan SPEC`: the lease plan, and what to cut when the job does not fit."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoint.commands.exits import Refused, exits
from jobspec.load import load_spec


@click.command("plan")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--window", type=click.Choice(["3d", "7d", "30d"]), help="Plan for this lease instead of rental.window.")
@click.option("--train-examples", type=click.IntRange(min=1), help="Training examples, when the data is in s3://.")
def plan(spec: Path, window: str | None, train_examples: int | None) -> None:
    """Print SPEC's lease plan; exit 2 with what to cut if it does not fit."""
    from jobspec.plan import (
        count_split_examples,
        count_train_examples,
        make_plan,
        split_examples_from_train,
        split_power_lines,
    )

    with exits():
        loaded = load_spec(spec)
        try:
            counts = count_split_examples(loaded.spec)
            n_train = train_examples or count_train_examples(loaded.spec)
        except OSError as exc:
            raise Refused(f"{spec}: data: cannot read the training data to count it ({exc})") from None
        if n_train is None:
            raise Refused(f"{spec}: data: the data is in object storage; pass --train-examples N to plan")
        result = make_plan(loaded.spec, n_train, window=window)
        click.echo(result.table())
        if counts is None:  # in object storage: the eval and test sizes from --train-examples and the split shares
            counts = split_examples_from_train(loaded.spec, n_train)
            if counts is not None:
                click.echo(f"power: eval and test sizes from --train-examples {n_train} and data.split's shares")
            else:
                click.echo("power: not computed: data.files are in object storage, their eval and test sizes unknown")
        for line in split_power_lines(loaded.spec, counts) if counts else []:
            click.echo(line)
        if result.problems:
            raise Refused(*(f"{spec}: {line}" for line in result.problems))
