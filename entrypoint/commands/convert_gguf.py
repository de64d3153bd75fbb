"""`rentune convert-gguf GGUF OUT`: a GGUF causal LM dequantized into a safetensors folder."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoint.commands.exits import exits


@click.command("convert-gguf")
@click.argument("gguf", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the causal LM in GGUF (weights, tokenizer, chat template) into OUT, a safetensors folder
    to use as model.path. OUT must not exist or be empty."""
    from entrypoint.training.environment import quiet_libraries
    from entrypoint.training.model import convert_gguf as convert
    from entrypoint.training.model import hash_base_model

    with exits():
        quiet_libraries()
        source = convert(gguf, out)
        digest = hash_base_model(out.resolve()).sha256
        click.echo(
            f"OK {out}: {source['architecture']}, {source['parameters']:,} parameters dequantized to float32 from "
            f"{gguf.name} (sha256 {source['gguf_sha256'][:16]}...); model sha256 {digest[:16]}...; "
            f"use model.path: {out}"
        )
