"""The `rentune` command: the click group `main` ([project.scripts] in pyproject.toml), and the
subcommands of entrypoint/commands/ registered on it (one module each; see that package for argv, the
environment variables read, the store options and the exit codes).

Importing this module imports neither torch nor transformers (tests/unit/test_light_commands.py).
"""

from __future__ import annotations

import os

import click

from entrypoint.commands import (
    cancel,
    check_export,
    convert_gguf,
    env,
    export,
    fetch,
    logs,
    plan,
    push_model,
    run,
    schema,
    status,
    submit,
    validate,
    worker,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rentune")
def main() -> None:
    """Fine-tune a model on a rented node: a job spec in, a verified adapter out."""
    # tracking.mlflow: an unreachable server costs seconds, not MLflow's default of 7 retries with backoff.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


for command in (
    validate.validate,
    schema.schema,
    plan.plan,
    run.run,
    submit.submit,
    cancel.cancel,
    worker.worker,
    status.status,
    logs.logs,
    fetch.fetch,
    export.export,
    check_export.check_export,
    check_export.verify_export,  # hidden: the old name of check-export
    push_model.push_model,
    convert_gguf.convert_gguf,
    env.env,
):
    main.add_command(command)
