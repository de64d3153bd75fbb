"""Options more than one command takes: how to reach a store (`store_options`, `s3_options`), the local
scratch folder (`workdir_option`), and `log`, the progress line a long command prints."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from entrypoint.store import Store, open_store

__all__ = ["STORE_ENV", "StoreFlags", "log", "s3_options", "store_options", "workdir_option"]

STORE_ENV = "RENTUNE_STORE"


def log(message: str) -> None:
    click.echo(message, err=False)
    sys.stdout.flush()


workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".rentune-work"),
    show_default=True,
    help="Local scratch folder; may be lost at any time, the store is the truth.",
)


@dataclass(frozen=True)
class StoreFlags:
    """The store a command was pointed at: its URI and how to reach an s3:// one (None: the default)."""

    uri: str | None
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: str | None = None

    def over(self, section) -> StoreFlags:
        """These flags, each one not given taken from a spec's `store:` section."""
        return StoreFlags(
            uri=self.uri or section.uri,
            endpoint_url=self.endpoint_url or section.endpoint_url,
            region=self.region or section.region,
            addressing_style=self.addressing_style or section.addressing_style,
        )

    def args(self) -> list[str]:
        """These flags as a command line takes them: what a printed follow-up command repeats."""
        given = (("--store", self.uri), ("--endpoint-url", self.endpoint_url), ("--region", self.region))
        given += (("--addressing-style", self.addressing_style),)
        return [part for flag, value in given if value for part in (flag, value)]

    def open(self) -> Store:
        assert self.uri is not None, "a store URI: --store, $RENTUNE_STORE or the spec's store.uri"
        return open_store(
            self.uri, endpoint_url=self.endpoint_url, region=self.region, addressing_style=self.addressing_style
        )


def _s3_options(spec: bool) -> list:
    """The three options, each saying its default: an environment variable, after the spec's `store:`
    section when `spec`."""
    where = "the spec's store.{}, else " if spec else ""
    return [
        click.option(
            "--endpoint-url",
            help=f"S3-compatible endpoint (MinIO, R2, ...); default: {where.format('endpoint_url')}$AWS_ENDPOINT_URL.",
        ),
        click.option("--region", help=f"The bucket's region; default: {where.format('region')}$AWS_REGION."),
        click.option(
            "--addressing-style",
            type=click.Choice(["auto", "path", "virtual"]),
            help="Bucket in the path or in the host name; default: "
            f"{where.format('addressing_style')}$RENTUNE_S3_ADDRESSING_STYLE, else auto.",
        ),
    ]


def _apply(options: list, function):
    for option in reversed(options):
        function = option(function)
    return function


def s3_options(function):
    """--endpoint-url, --region, --addressing-style: how to reach an s3:// URI. Anything not given falls
    back to the standard AWS environment variables ($AWS_ENDPOINT_URL, $AWS_REGION) and, for the
    addressing style, $RENTUNE_S3_ADDRESSING_STYLE."""
    return _apply(_s3_options(spec=False), function)


def store_options(function=None, *, from_spec: bool = False):
    """--store, --endpoint-url, --region, --addressing-style, given to the command as one `store:
    StoreFlags` argument. Every command that takes a store takes these (tests/unit/test_commands.py).

    --store is required and defaults to $RENTUNE_STORE, except with `from_spec` (`rentune run`): there
    the spec's `store:` section is the default of each flag, and $RENTUNE_STORE is not read."""

    def decorate(function):
        @functools.wraps(function)
        def command(*args, store_uri, endpoint_url, region, addressing_style, **kwargs):
            flags = StoreFlags(store_uri, endpoint_url, region, addressing_style)
            return function(*args, store=flags, **kwargs)

        if from_spec:
            store = click.option(
                "--store", "store_uri", help="Store URI (file://DIR or s3://bucket/prefix); overrides store.uri."
            )
        else:
            store = click.option(
                "--store",
                "store_uri",
                envvar=STORE_ENV,
                required=True,
                help=f"The bucket (s3://bucket/prefix or file://DIR); default: ${STORE_ENV}.",
            )
        return _apply([store, *_s3_options(spec=from_spec)], command)

    return decorate if function is None else decorate(function)
