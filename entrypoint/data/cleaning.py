"""Named, versioned cleaning rules applied to every text before splitting, with a count per rule.

Changing what a rule does changes its version, which is part of the data version: the same raw data
cleaned differently is different data.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from jobspec.schema import MaxChars

__all__ = ["RULE_VERSIONS", "apply_rules", "rule_ids"]

RULE_VERSIONS = {"strip_html": 1, "normalize_ws": 1, "drop_empty": 1, "max_chars": 1}

_TAG = re.compile(r"<[^>]{0,1000}>")
_SPACE = re.compile(r"[ \t\r\f\v\u00a0]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")


def _strip_html(text: str) -> str:
    return html.unescape(_TAG.sub(" ", text))


def _normalize_ws(text: str) -> str:
    """Runs of spaces/tabs become one space, runs of blank lines one blank line, ends stripped.
    Single newlines stay: in prompts and structured responses they carry meaning."""
    lines = [_SPACE.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()


def rule_ids(rules: Sequence[str | MaxChars]) -> list[str]:
    """Each rule as `name@version` (with its parameter), as recorded in the data version."""
    ids = []
    for rule in rules:
        if isinstance(rule, MaxChars):
            ids.append(f"max_chars={rule.max_chars}@{RULE_VERSIONS['max_chars']}")
        else:
            ids.append(f"{rule}@{RULE_VERSIONS[rule]}")
    return ids


def apply_rules(
    rows: list[dict], fields: Sequence[str], rules: Sequence[str | MaxChars]
) -> tuple[list[dict], dict[str, int]]:
    """Apply `rules` in order to the text `fields` of every row. Returns the kept rows and, per rule id,
    how many rows it changed (or, for drop_empty, dropped). Rows are copied, never changed in place."""
    touched = {rule_id: 0 for rule_id in rule_ids(rules)}
    for rule, rule_id in zip(rules, touched, strict=True):
        if rule == "drop_empty":
            kept = [row for row in rows if all(row[f].strip() for f in fields)]
            touched[rule_id] = len(rows) - len(kept)
            rows = kept
            continue
        if isinstance(rule, MaxChars):

            def change(text: str, limit: int = rule.max_chars) -> str:
                return text[:limit]
        else:
            change = {"strip_html": _strip_html, "normalize_ws": _normalize_ws}[rule]
        out = []
        for row in rows:
            new = {**row, **{f: change(row[f]) for f in fields}}
            touched[rule_id] += any(new[f] != row[f] for f in fields)
            out.append(new)
        rows = out
    return rows, touched
