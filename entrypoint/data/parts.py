"""What a data side (kinds/) reads from the spec's sources and finds between splits: values the data
phase consumes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["DataParts", "Leaks"]


@dataclass
class DataParts:
    """What a kind read from the spec's data sources: rows per source (`all`, or `train`/`eval`/`test`),
    each with a `label` (a list, or rows spooled to disk: data/spool.py), and the counts the data phase
    reports."""

    rows: dict[str, Sequence[dict]]
    read: dict[str, int]
    duplicates: int
    summary: dict = field(default_factory=dict)  # kind-specific: source hashes, cleaning counts
    spools: list = field(default_factory=list)  # data.spool.Spool files, removed when the data phase ends


@dataclass(frozen=True)
class Leaks:
    found: list  # data.leaks.LeakPair
    shown: dict[str, list[str]]  # what names each row in messages (its text, or the image's file name)
    method: str
    threshold: float
