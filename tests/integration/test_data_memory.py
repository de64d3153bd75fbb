"""The data phase holds a few numbers per example, not the examples: measured with tracemalloc (Python and
numpy allocations, exact and independent of machine load) on the real phase at two sizes, so the fixed
costs (model, tokenizer, one chunk of rows) cancel and what is left is the memory each extra row costs."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import pytest

from entrypoint.data import leaks, spool, tokens
from tests.integration.test_data_phase import _run, _spec
from tests.models import build_tiny_bert

WORDS = [f"w{i}" for i in range(3000)]


def _data(path: Path, rows: int) -> int:
    """`rows` JSONL rows of about 500 characters, 3 labels; returns the file's size."""
    rng = random.Random(rows)
    with path.open("w") as out:
        for i in range(rows):
            text = f"ticket {i} " + " ".join(rng.choice(WORDS) for _ in range(100))
            out.write(json.dumps({"text": text[:500], "label": "abc"[i % 3]}) + "\n")
    return path.stat().st_size


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "m")


def _peak(tmp_path: Path, bert: Path, rows: int) -> tuple[int, int]:
    size = _data(tmp_path / f"data-{rows}.jsonl", rows)
    spec = _spec(bert, {"source": str(tmp_path / f"data-{rows}.jsonl"), "leaks": {"eval": "drop", "test": "drop"}})
    tracemalloc.start()
    try:
        result, _, _ = _run(tmp_path, spec, f"run-{rows}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result["rows_read"] == {"all": rows}
    return peak, size


def test_memory_per_example_is_a_fraction_of_the_example(tmp_path, bert, monkeypatch):
    # Work done a chunk at a time (reading, tokenizing, sketching) costs memory per chunk, not per row:
    # small chunks make both sizes pay the same for it, so the difference is the cost of the rows alone.
    monkeypatch.setattr(spool, "CHUNK", 200)
    monkeypatch.setattr(tokens, "CHUNK", 200)
    monkeypatch.setattr(leaks, "_BATCH", 200)
    _peak(tmp_path, bert, 600)  # imports and first-use caches, paid once, outside both measurements
    small, small_bytes = _peak(tmp_path, bert, 1_500)
    large, large_bytes = _peak(tmp_path, bert, 6_000)
    per_row = (large - small) / 4_500
    row_bytes = (large_bytes - small_bytes) / 4_500
    # Rows held as dicts cost about 5x their JSONL size (2.4 kB per 500-byte row, measured before the
    # spool); spooled, about 50 bytes (offsets, digests, label codes, token lengths).
    assert per_row < row_bytes / 4, f"{per_row:.0f} bytes held per {row_bytes:.0f}-byte row"
