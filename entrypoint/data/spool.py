"""Rows spooled to a local file as they are read, so that the data phase holds a few numbers per row, not
the rows: millions of examples fit in a bounded amount of memory.

    Spool(path)        append-only JSON Lines file on the node's disk; kept in memory per row: its offset,
                       a label code, a 16-byte key (what de-duplication compares) and a 16-byte order digest
                       (what the seeded split sorts by)
    SpooledRows        a Sequence[dict] over some of a spool's rows, in a given order: `rows[i]` reads row i
                       back from disk (os.pread, so the page cache holds the file, not this process);
                       `rows[a:b]` is a list (a bounded chunk); `take`/`without` give another view

Memory: 8 + 4 + 16 + 16 = 44 bytes per row plus an 8-byte index per row of each view (88 MB for 2M rows),
against about 3.5 kB per 500-character row held as Python dicts.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CHUNK", "Mapped", "Spool", "SpooledRows", "chunked", "drop_rows", "labels_of", "order_digest"]

CHUNK = 2_000  # rows handled at once while reading, cleaning and writing (about 7 MB of 500-char rows)


def order_digest(row: dict) -> bytes:
    """A row's place before the seeded shuffle (data/split.py): blake2b of its sorted-key JSON, 16 bytes."""
    return hashlib.blake2b(json.dumps(row, sort_keys=True).encode(), digest_size=16).digest()


def chunked(items: Iterable, size: int | None = None) -> Iterator[list]:
    """`items` as lists of at most `size` (CHUNK)."""
    size = size or CHUNK
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class Spool:
    """Rows appended to the JSON Lines file `path`, fields in their order; `close()` ends writing
    and opens the file for reading. Remove the file with `remove()` when the phase is done."""

    def __init__(self, path: Path):
        self.path = path
        self._out = path.open("wb")
        self._offsets = array("q", [0])
        self._codes = array("i")
        self._keys = bytearray()
        self._order = bytearray()
        self.label_names: list[str] = []
        self._label_code: dict[str, int] = {}
        self._fd: int | None = None

    def add(self, row: dict, key: bytes) -> None:
        """Append `row` (which has a "label") with its 16-byte de-duplication `key`."""
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode()  # field order kept, as read
        self._out.write(line)
        self._offsets.append(self._offsets[-1] + len(line))
        code = self._label_code.get(row["label"])
        if code is None:
            code = self._label_code[row["label"]] = len(self.label_names)
            self.label_names.append(row["label"])
        self._codes.append(code)
        self._keys += key
        self._order += order_digest(row)

    def close(self) -> SpooledRows:
        """Stop writing; returns every row, in the order added."""
        self._out.close()
        self._fd = os.open(self.path, os.O_RDONLY)
        self.offsets = np.frombuffer(self._offsets, dtype=np.int64)
        self.codes = np.frombuffer(self._codes, dtype=np.int32)
        self.keys = np.frombuffer(bytes(self._keys), dtype=np.uint8).reshape(-1, 16)
        self.order = np.frombuffer(bytes(self._order), dtype=np.uint8).reshape(-1, 16)
        del self._keys, self._order
        return SpooledRows(self, np.arange(len(self.codes), dtype=np.int64))

    def read(self, index: int) -> dict:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return json.loads(os.pread(self._fd, end - start, start))

    def remove(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._out.close()
        self.path.unlink(missing_ok=True)


class SpooledRows(Sequence):
    """Rows `indices` of `spool`, in that order. Reads each row from disk when it is asked for."""

    def __init__(self, spool: Spool, indices: np.ndarray):
        self.spool = spool
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self.spool.read(int(i)) for i in self.indices[index]]
        return self.spool.read(int(self.indices[index]))

    def __iter__(self) -> Iterator[dict]:
        for i in self.indices:
            yield self.spool.read(int(i))

    @property
    def labels(self) -> list[str]:
        names = self.spool.label_names
        return [names[c] for c in self.spool.codes[self.indices].tolist()]

    @property
    def keys(self) -> np.ndarray:
        return self.spool.keys[self.indices]

    @property
    def order(self) -> np.ndarray:
        return self.spool.order[self.indices]

    def take(self, positions: Sequence[int] | np.ndarray) -> SpooledRows:
        """The rows at `positions` of this view, in that order."""
        return SpooledRows(self.spool, self.indices[np.asarray(positions, dtype=np.int64)])

    def without(self, positions: Iterable[int]) -> SpooledRows:
        keep = np.ones(len(self), dtype=bool)
        keep[np.fromiter(positions, dtype=np.int64)] = False
        return SpooledRows(self.spool, self.indices[keep])


class Mapped(Sequence):
    """`fn` applied to each row of `rows` when asked for (the leak check's texts, the rows' identities),
    without a copy of them."""

    def __init__(self, rows: Sequence[dict], fn: Callable[[dict], Any]):
        self.rows, self.fn = rows, fn

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self.fn(row) for row in self.rows[index]]
        return self.fn(self.rows[index])

    def __iter__(self) -> Iterator:
        return map(self.fn, self.rows)


def labels_of(rows: Sequence[dict]) -> list[str]:
    """Every row's label, without reading spooled rows back."""
    return rows.labels if isinstance(rows, SpooledRows) else [row["label"] for row in rows]


def drop_rows(rows: Sequence[dict], positions: set[int]) -> Sequence[dict]:
    """`rows` without those at `positions` (a view for spooled rows, a list otherwise)."""
    if isinstance(rows, SpooledRows):
        return rows.without(positions)
    return [row for i, row in enumerate(rows) if i not in positions]
