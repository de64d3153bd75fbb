"""`rentune check-export DIRECTORY --base BASE`: an export is intact and belongs to this base model
(entrypoint/report/binding.py). `verify-export`, its name before, stays as a hidden alias."""

from __future__ import annotations

import copy
from pathlib import Path

import click

from entrypoint.commands.exits import Refused, exits


@click.command("check-export")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--base",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The base model folder you intend to load the adapter onto.",
)
@click.option(
    "--allow-parity-failure",
    is_flag=True,
    help="Accept a merged folder that failed its parity check against the adapter (BINDING.json: merged).",
)
@click.option(
    "--requantize",
    type=click.Choice(["cpu", "cuda"]),
    help="QLoRA exports: quantize BASE on this device as BINDING.json records and compare the quantized "
    "sha256 (it matches on the image and device kind the job trained on).",
)
def check_export(directory: Path, base: Path, allow_parity_failure: bool, requantize: str | None) -> None:
    """Check that DIRECTORY (an export: BINDING.json, adapter/, merged/, spec and report) is intact and
    belongs to the base model in BASE.

    Exit 0 when every file matches its sha256 in BINDING.json, the base model's sha256 matches and the
    merged folder (if any) passed its parity check; exit 2 naming what differs otherwise. Load an adapter
    only onto a base model this command accepts."""
    from entrypoint.report.binding import check_export as check

    with exits():
        binding, problems = check(directory, base, allow_parity_failure, requantize)
        if problems:
            raise Refused(*(f"rentune: refused: {line}" for line in problems))
        merged = binding.get("merged") or {}
        if merged.get("parity") in ("ok", "failed"):
            there = (directory / "merged").is_dir()
            state = f"merged/ parity {merged['parity']}" + ("" if there else " (merged/ not here: its files unchecked)")
        else:
            state = "no merged folder"
        quantized = binding.get("quantization")
        if quantized:
            checked = f"sha256 {quantized['sha256'][:16]}... reproduced" if requantize else "--requantize checks it"
            state += f"; trained on the base quantized to {quantized['bits']} bits ({checked})"
        click.echo(
            f"OK {directory}: {len(binding['files'])} files intact; trial {binding['trial_id']} of job "
            f"{binding['job_id']} belongs to {base} (sha256 {binding['base_model']['sha256'][:16]}...); {state}"
        )


# The same command under its old name, left out of --help ("verify" now names only the verify phase).
verify_export = copy.copy(check_export)
verify_export.name = "verify-export"
verify_export.hidden = True
