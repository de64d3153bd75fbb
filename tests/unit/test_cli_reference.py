"""docs/cli-reference.md is generated from the click commands (entrypoint/cli_reference.py) and kept current:
every visible command and every option of each is on the page."""

from __future__ import annotations

from entrypoint import cli_reference
from entrypoint.cli import main


def test_committed_reference_is_current():
    committed = cli_reference.DOC.read_text(encoding="utf-8") if cli_reference.DOC.is_file() else ""
    assert committed == cli_reference.render(), (
        f"{cli_reference.DOC.name} is stale: run `{cli_reference.COMMAND}` and commit docs/cli-reference.md"
    )


def test_every_command_and_option_is_on_the_page():
    text = cli_reference.render()
    shown = [name for name, command in main.commands.items() if not command.hidden]
    assert len(shown) >= 15
    for name in shown:
        section = text.split(f"\n## rentune {name}\n", 1)[1].split("\n## ", 1)[0]
        for param in main.commands[name].params:
            for flag in getattr(param, "opts", []):
                if flag.startswith("-") and not param.hidden:
                    assert flag in section, f"rentune {name}: {flag} is not on the page"
    for flag in ("--dest", "--attempt", "--workdir", "--node-paths", "--check-store"):  # once in no page
        assert flag in text
    assert "## rentune verify-export" not in text  # hidden: the old name of check-export
