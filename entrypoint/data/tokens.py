"""Tokenized splits, computed once. The data phase encodes every split of a text job with the kind's own
`encode` and commits the result as Arrow IPC files beside the splits:

    phases/data/tokens/<key>/<split>.arrow     one column per feature (input_ids, attention_mask, labels,
                                               ...) plus _full_length and _truncated; one record batch
                                               per CHUNK examples

`key` is the sha256 of the data version (examples, rules, tokenizer and template hashes) and the settings
that change what `encode` returns (max_length, the label order, this format), so files of another
tokenizer, template or length are never read as these. Every later phase, on any node, downloads a split
once into `<workdir>/tokens/<key>/` (sha256 checked against the data phase's result) and memory-maps it:
`TokenizedSplit` reads an example's ids from the mapped file when it is asked for, not before.

Image jobs keep encoding in each phase (their features are pixel tensors, decoded from the image files).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from entrypoint.data.encoding import Encoded
from entrypoint.data.pool import Processes, process_pool, processes_for
from entrypoint.job import layout
from entrypoint.store.hashing import file_sha256

__all__ = [
    "CHUNK",
    "TOKENS_FORMAT",
    "TokenizedSplit",
    "encoder_pool",
    "tokenize_processes",
    "features_of",
    "full_lengths",
    "token_counts",
    "open_tokens",
    "record_batch",
    "tokenize",
    "tokens_key",
    "tokens_store_key",
    "write_tokens",
]

TOKENS_FORMAT = "arrow-ipc-1"
CHUNK = 10_000  # examples encoded (and written) at a time: a progress line each, bounded Python lists


def tokens_key(data_version: str, max_length: int, labels: Sequence[str]) -> str:
    settings = {"data_version": data_version, "max_length": max_length, "labels": list(labels), "format": TOKENS_FORMAT}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def tokens_store_key(key: str, split: str) -> str:
    return layout.data_tokens(key, split)


def open_tokens(store, record: dict, split: str, workdir: Path, log: Callable[[str], None]) -> TokenizedSplit:
    """The data phase's tokens of `split` (`record`: its result's `tokens`), memory-mapped from this node's
    copy under `workdir`; downloaded first if this node has none (or a copy of another size), and its
    sha256 checked against the record."""
    from entrypoint.store.objects import CorruptObject

    entry = record["files"][split]
    key = tokens_store_key(record["key"], split)
    path = workdir / "tokens" / record["key"] / f"{split}.arrow"
    if not (path.is_file() and path.stat().st_size == entry["bytes"]):
        path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        got = store.get_file(key, path)  # the sha256 of what it wrote
        if got != entry["sha256"]:
            path.unlink()
            raise CorruptObject(
                f"{store.uri}/{key}: sha256 {got[:16]} differs from the data phase's record "
                f"({entry['sha256'][:16]}); expected the tokens the data phase committed"
            )
        log(
            f"data: {split} tokens fetched to this node in {time.monotonic() - started:.1f} s "
            f"({entry['rows']:,} examples, {entry['bytes'] / 1e6:.1f} MB), memory-mapped from {path}"
        )
    return TokenizedSplit(path)


def tokenize_processes(rows: int, in_tokenizer: bool = False) -> int:
    """Processes that tokenize `rows` examples: RENTUNE_TOKENIZE_PROCESSES if set (its earlier name
    RENTUNE_TOKENIZE_WORKERS is still read); else one when the encoding runs `in_tokenizer` (the fast
    tokenizer's threads use every core, without the processes' start and transfers: 1.3x faster on
    bench/data_scale.py); else data/pool.py's processes_for: one below 50,000 rows, else one per core
    up to 8."""
    chosen = os.environ.get("RENTUNE_TOKENIZE_PROCESSES") or os.environ.get("RENTUNE_TOKENIZE_WORKERS")
    if chosen:
        return max(1, int(chosen))
    return 1 if in_tokenizer else processes_for(rows)


def _tokens_encoder(make_encoder: Callable[..., Callable[[Sequence[dict]], list[Encoded]]], *args):
    """In each process: the kind's encoder, its results as a record batch (Arrow buffers travel back, not
    millions of Python ints)."""
    encode = make_encoder(*args)
    return lambda rows: record_batch(encode(rows))


@contextmanager
def encoder_pool(
    make_encoder: Callable[..., Callable[[Sequence[dict]], list[Encoded]]], args: tuple, processes: int
) -> Iterator[Processes | None]:
    """`processes` processes (data/pool.py) that each build their encoder once (`make_encoder(*args)`: a
    module-level function; it loads the processor) and encode chunks of rows into record batches (None for
    one process: the caller encodes in its own process)."""
    with process_pool(_tokens_encoder, (make_encoder, *args), processes) as pool:
        yield pool


def tokenize(
    encode: Callable[[Sequence[dict]], list[Encoded]],
    rows: Sequence[dict],
    name: str,
    log: Callable[[str], None],
    pool: Processes | None = None,
) -> Iterator:
    """`rows` encoded CHUNK at a time, in order, as Arrow record batches (`record_batch`), by `pool`'s
    processes when given, else by `encode` here, with a progress line (rows tokenized, rate) after each
    chunk once the work takes longer than a few seconds."""
    started, last = time.monotonic(), time.monotonic()
    parts = (rows[start : start + CHUNK] for start in range(0, len(rows), CHUNK))
    done = 0
    here = (record_batch(encode(part)) for part in parts)
    for batch in pool.map(parts) if pool is not None else here:
        yield batch
        done, now = done + len(batch), time.monotonic()
        if now - last > 5 or (done == len(rows) and now - started > 5):
            rate = done / max(now - started, 1e-9)
            log(f"data: tokenized {done:,}/{len(rows):,} {name} rows ({rate:,.0f} rows/s)")
            last = now


def record_batch(encoded: Sequence[Encoded]):
    """Encoded examples as one Arrow record batch: a column per feature (lists of ids int32, scalar
    features such as a classifier's label int64), then _full_length and _truncated. Lists are flattened
    with numpy (a Python list of lists given to pyarrow costs over ten times more)."""
    import numpy as np
    import pyarrow as pa

    columns = {}
    for key in encoded[0].features:
        values = [e.features[key] for e in encoded]
        if isinstance(values[0], list):
            lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
            offsets = np.zeros(len(values) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.fromiter(itertools.chain.from_iterable(values), dtype=np.int32, count=int(offsets[-1]))
            columns[key] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
        else:
            columns[key] = pa.array(values, type=pa.int64())
    columns["_full_length"] = pa.array([e.full_length for e in encoded], type=pa.int64())
    columns["_truncated"] = pa.array([e.truncated for e in encoded], type=pa.bool_())
    return pa.record_batch(columns)


def write_tokens(batches: Iterator, path: Path) -> dict:
    """Write record batches (`record_batch`) to one Arrow IPC file at `path`; returns {rows, bytes,
    sha256}."""
    import pyarrow as pa

    writer, rows = None, 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if writer is None:
                writer = pa.ipc.new_file(str(path), batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ValueError(f"{path.name}: no examples to write")
    return {"rows": rows, "bytes": path.stat().st_size, "sha256": file_sha256(path)}


class TokenizedSplit(Sequence):
    """A split's encoded examples, memory-mapped from its Arrow file: `split[i]` is the `Encoded` the
    kind's `encode` returned for row i (ids as Python lists), `split.features` the same as the feature
    dicts a collator takes, `split.lengths` every example's token count without reading the ids."""

    def __init__(self, path: Path):
        import pyarrow as pa

        self.path = path
        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()  # zero-copy views of the mapped file
        self._keys = [n for n in table.column_names if not n.startswith("_")]
        self._batches = table.to_batches()
        self._starts = [0]
        for batch in self._batches:
            self._starts.append(self._starts[-1] + batch.num_rows)
        # per batch and list column: (offsets, values) as numpy views of the mapped buffers
        self._columns = [
            {
                key: _list_views(batch.column(key)) if pa.types.is_list(batch.column(key).type) else batch.column(key)
                for key in [*self._keys, "_full_length", "_truncated"]
            }
            for batch in self._batches
        ]

    def __len__(self) -> int:
        return self._starts[-1]

    def _locate(self, index: int) -> tuple[dict, int]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        b = bisect.bisect_right(self._starts, index) - 1
        return self._columns[b], index - self._starts[b]

    def feature(self, index: int) -> dict:
        columns, i = self._locate(index)
        return {key: _value(columns[key], i) for key in self._keys}

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        columns, i = self._locate(index)
        return Encoded(
            {key: _value(columns[key], i) for key in self._keys},
            columns["_full_length"][i].as_py(),
            columns["_truncated"][i].as_py(),
        )

    @property
    def features(self) -> _Features:
        return _Features(self)

    @property
    def lengths(self) -> list[int]:
        """Tokens per example (input ids), from the offsets alone."""
        out: list[int] = []
        for columns in self._columns:
            offsets, _ = columns["input_ids"]
            out += (offsets[1:] - offsets[:-1]).tolist()
        return out


def features_of(split: Sequence[Encoded]) -> Sequence[dict]:
    """The feature dicts of encoded examples: read on access from a TokenizedSplit, else from the list."""
    return split.features if isinstance(split, TokenizedSplit) else [e.features for e in split]


def full_lengths(split: Sequence[Encoded]) -> list[int]:
    """Every example's token count before truncation, without reading a TokenizedSplit's ids."""
    if isinstance(split, TokenizedSplit):
        return [n for columns in split._columns for n in columns["_full_length"].to_pylist()]
    return [e.full_length for e in split]


def truncated_flags(split: Sequence[Encoded]) -> list[bool]:
    """Whether each example was cut at max_length, without reading a TokenizedSplit's ids."""
    if isinstance(split, TokenizedSplit):
        return [flag for columns in split._columns for flag in columns["_truncated"].to_pylist()]
    return [e.truncated for e in split]


def token_counts(split: Sequence[Encoded]) -> list[int]:
    """Input ids per example (after truncation); none for examples without ids (images)."""
    if isinstance(split, TokenizedSplit):
        return split.lengths
    return [len(e.features["input_ids"]) for e in split if "input_ids" in e.features]


class _Features(Sequence):
    """The feature dicts of a TokenizedSplit, read on access (what the Trainer's dataset indexes)."""

    def __init__(self, split: TokenizedSplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self.split.feature(i) for i in range(*index.indices(len(self.split)))]
        return self.split.feature(index)


def _list_views(array):
    """(offsets, values) of an Arrow list<int32> array as numpy arrays over its buffers (no copy)."""
    offsets = array.offsets.to_numpy()
    return offsets, array.values.to_numpy(zero_copy_only=True)


def _value(column, i: int):
    if isinstance(column, tuple):
        offsets, values = column
        return values[offsets[i] : offsets[i + 1]].tolist()
    return column[i].as_py()
