"""docs/cli-reference.md: every `rentune` command's help, as `rentune COMMAND --help` prints it, generated
from the click commands so that no option goes undocumented. `python -m entrypoint.cli_reference` rewrites
it; `--check` (and tests/unit/test_cli_reference.py) fails while it is stale (jobspec.reference.refresh).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

from entrypoint.cli import main as rentune
from jobspec.reference import refresh

__all__ = ["COMMAND", "DOC", "render"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli-reference.md"
COMMAND = "python -m entrypoint.cli_reference"
WIDTH = 100


def _help(command: click.Command, name: str) -> str:
    parent = click.Context(rentune, info_name="rentune", terminal_width=WIDTH, max_content_width=WIDTH)
    context = click.Context(command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)
    return command.get_help(context).rstrip() + "\n"


def render() -> str:
    """The whole page: an index, then each visible command's help in the order `rentune --help` lists them."""
    commands = {name: command for name, command in sorted(rentune.commands.items()) if not command.hidden}
    lines = [
        "# rentune's commands",
        "",
        f"Generated from the click commands by `{COMMAND}`: do not edit by hand; "
        "tests/unit/test_cli_reference.py fails while this page is stale. Exit codes: README.md.",
        "",
        *(
            f"- [`rentune {name}`](#rentune-{name}): {command.get_short_help_str(WIDTH)}"
            for name, command in commands.items()
        ),
        "",
    ]
    for name, command in commands.items():
        lines += [f"## rentune {name}", "", "```", _help(command, name).rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Render docs/cli-reference.md from the commands.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page is stale")
    args = parser.parse_args(argv)
    return refresh(DOC, render(), COMMAND, args.check, "a command or option changed")


if __name__ == "__main__":
    sys.exit(main())
