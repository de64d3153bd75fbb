"""Reads what W&B's offline mode wrote: the records of a `run-<id>.wandb` file (W&B's transaction log, the
LevelDB log format: 32 KiB blocks of CRC-checked chunks, after a 7-byte `:W&B` header), as W&B's own
protobuf `Record`s. The wandb package no longer ships a reader for them; tests need one to check that a
resumed job logged each step once."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

from wandb.proto import wandb_internal_pb2

__all__ = ["history", "records"]

_BLOCK = 32 * 1024
_HEADER = 7  # crc32 (4 bytes), length (2), chunk type (1)
_FULL, _LAST = 1, 4  # chunk types; FIRST (2) and MIDDLE (3) only accumulate


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    if ident != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log (header {ident!r})")
    pos, pending = 7, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left
            continue
        pending += data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history(path: Path) -> list[dict]:
    """The history rows (`run.log` calls) of one offline run file, in order, values decoded from JSON."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows
