"""`rentune fetch JOB_ID`: a job's report, export metadata and TensorBoard files to a local folder
(entrypoint/job/fetch.py does the copying)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from entrypoint.commands.exits import exits
from entrypoint.commands.options import StoreFlags, store_options
from entrypoint.job import layout
from entrypoint.job.fetch import fetch_job
from entrypoint.job.state import job_store
from entrypoint.report.markdown import summary_table


@click.command("fetch")
@click.argument("job_id")
@store_options
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Local folder (default: ./<JOB_ID>).",
)
@click.option("--with-adapter", is_flag=True, help="Also download export/adapter (the trained weights).")
@click.option("--with-merged", is_flag=True, help="Also download export/merged (the merged model: the base's size).")
def fetch(job_id: str, store: StoreFlags, dest: Path | None, with_adapter: bool, with_merged: bool) -> None:
    """Download JOB_ID's report (results.json, report.md, plots), export metadata and TensorBoard event
    files (DEST/tensorboard/<trial>/, one run per trial: `tensorboard --logdir DEST/tensorboard`) to a local
    folder. Event files come while the job still trains."""
    dest = dest or Path(job_id)
    with exits():
        fetched = fetch_job(job_store(store.open(), job_id), dest, with_adapter=with_adapter, with_merged=with_merged)
        report = f" (report: {dest / layout.REPORT_MD})" if fetched.report else ""
        click.echo(f"fetched {fetched.files} files to {dest}/{report}")
        if fetched.tensorboard:
            click.echo(f"tensorboard --logdir {dest / 'tensorboard'}")
        results = dest / layout.RESULTS
        if results.is_file():
            click.echo("\n" + summary_table(json.loads(results.read_text())))
