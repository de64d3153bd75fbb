"""`rentune push-model FOLDER URI`: a base model uploaded to a bucket, for specs to use as model.path."""

from __future__ import annotations

from pathlib import Path

import click

from entrypoint.commands.exits import Refused, exits
from entrypoint.commands.options import log, s3_options


@click.command("push-model")
@click.argument("folder", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("uri")
@s3_options
@click.option(
    "--follow-links", is_flag=True, help="Upload what symbolic links leading out of FOLDER point to (default: refuse)."
)
def push_model(
    folder: Path,
    uri: str,
    endpoint_url: str | None,
    region: str | None,
    addressing_style: str | None,
    follow_links: bool,
):
    """Upload the model FOLDER to URI (s3://bucket/prefix) with a manifest of every file's size and
    sha256 (written last), for specs to use as model.path: URI. The prefix is claimed for FOLDER's files
    (MODEL_CLAIM.json, written only if absent) before any upload: a push of another model there, earlier
    or at the same time, is refused (exit 3) with nothing uploaded; the same FOLDER again finishes an
    interrupted push. Never overwrites another model there."""
    from entrypoint.store.models import push_model as push
    from entrypoint.store.s3 import S3Store
    from entrypoint.training.model import resolve_model_dir
    from jobspec.schema import MODEL_URI, Model

    with exits():
        if not MODEL_URI.fullmatch(uri):
            raise Refused(f"push-model: {uri}: expected s3://bucket/prefix (a lowercase bucket name and a folder)")
        resolve_model_dir(Model(path=str(folder.resolve())))  # a job's checks: config.json, safetensors, no code
        options = {"endpoint_url": endpoint_url, "region": region, "addressing_style": addressing_style}
        store = S3Store.from_uri(uri.rstrip("/"), **options)
        manifest = push(store, folder.absolute(), log, follow_links=follow_links)
        click.echo(f"OK {uri}: base model sha256 {manifest['base_model_sha256'][:16]}...; use model.path: {uri}")
