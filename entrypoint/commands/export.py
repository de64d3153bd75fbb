"""`rentune export JOB_ID --merged`: the merged folder of a finished job, from the store alone, on any node
(entrypoint/trial/export.py): the adapter merged into the base, checked against the adapter on eval in a
fresh process, the serving files and BINDING.json rewritten. For a job whose spec left export.merged
false, or whose merge the lease's end left out."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoint.commands.exits import Refused, exits
from entrypoint.commands.options import StoreFlags, log, store_options, workdir_option


class ParityFailed(RuntimeError):
    """The merged folder was written but failed its parity check (exit 1; BINDING.json says so)."""


@click.command("export")
@click.argument("job_id")
@store_options
@workdir_option
@click.option("--merged", is_flag=True, help="Write export/merged/ (required: the only export to redo).")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default=None,
    help="The merged weights' dtype (default: the spec's export.dtype; auto: the base model's own).",
)
@click.option(
    "--model-path",
    default=None,
    help="Where this node keeps the base model, when not where the spec says (it must hash the same).",
)
@click.option("--replace", is_flag=True, help="Replace a merged folder the export already has.")
def export(
    job_id: str,
    store: StoreFlags,
    workdir: Path,
    merged: bool,
    dtype: str | None,
    model_path: str | None,
    replace: bool,
) -> None:
    """Merge JOB_ID's exported adapter into its base model and check it (export/merged/, export/parity.json,
    Modelfile, SERVING.md, BINDING.json), from the store alone. The job must have exported; the base model
    must hash to the one it trained on.

    Exit 0 when the merged folder passed its parity check, 1 when it failed it (the folder is kept and
    BINDING.json says so), 2 for refused input, 3 for a base model that differs."""
    from entrypoint.runner import merge_later
    from entrypoint.training.environment import quiet_libraries

    with exits():
        if not merged:
            raise Refused("rentune: refused: expected --merged (the merged folder is the only export rentune redoes)")
        quiet_libraries()  # transformers' load report of a classifier's new head reads as an error mid-merge
        root = store.open()
        result = merge_later(root, job_id, workdir, log, dtype, model_path, replace)
        click.echo(
            f"{root.uri}/jobs/{job_id}/export/merged/ ({result['dtype']}): parity {result['parity']}: "
            f"{result['metric']} {result['merged']:.4f} merged vs {result['adapter']:.4f} adapter; "
            f"{result['equal_outputs']} eval answers identical; BINDING.json, SERVING.md and report.md rewritten"
        )
        if result["parity"] != "ok":  # the folder is kept, marked failed: check-export refuses it
            raise ParityFailed(f"the merged folder failed its parity check: {'; '.join(result['reasons'])}")
