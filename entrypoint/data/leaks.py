"""Leaks between data splits: exact duplicates after normalisation, near duplicates by MinHash LSH.

Takes already-extracted strings, so it does not care which field or modality they came from. Near
duplicates are found with MinHash over word shingles (computed here with numpy, a batch of texts and every
permutation at once, equal value for value to datasketch's `MinHash` with crc32 and scheme "affine32";
tests/unit/test_leakcheck.py holds it to that), banded (LSH) in `BandIndex`, and then confirmed by the
exact Jaccard similarity of the shingle sets, so the LSH only decides which pairs get looked at.
`LEAKCHECK_VERSION` is recorded in reports; bump it when the method changes.

Cost: every text is MinHashed once, whatever the number of pairs it takes part in. Splits are processed
from smallest to largest; each split is queried against the LSH indexes of the smaller splits it is
paired with, then (if a larger split is paired with it) inserted into its own index. Memory: a 16-byte
digest per text (the exact check) and 8 bytes per band for indexed texts; no normalised copy of a split
and no sketch of the side that is queried is kept (a candidate's text is normalised again to confirm it).
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from entrypoint.data.normalize import normalize_text
from entrypoint.data.pool import process_pool, processes_for
from entrypoint.data.spool import chunked

__all__ = ["LEAKCHECK_VERSION", "LeakPair", "find_leaks"]

LEAKCHECK_VERSION = "leak-1"

# Probability that a pair whose Jaccard is exactly `threshold` becomes an LSH candidate (higher above it).
# Candidates are confirmed exactly, so a false positive costs one set intersection; a false negative is a
# missed leak. datasketch's own (b, r) optimiser weighs both equally and gives ~0.4 at the threshold.
_RECALL_AT_THRESHOLD = 0.99
_MIN_NUM_PERM = 16


@dataclass(frozen=True)
class LeakPair:
    """One leak: text `a_index` of split `a_split` duplicates text `b_index` of split `b_split`.

    Indexes point into the sequences given to `find_leaks`. `a_split` is the first name of the requested
    pair. `similarity` is 1.0 for `exact`; for `near` it is the exact Jaccard similarity of the two
    word-shingle sets (>= the threshold; 1.0 is possible when only repeated phrases differ).
    """

    kind: Literal["exact", "near"]
    a_split: str
    a_index: int
    b_split: str
    b_index: int
    similarity: float


def _shingles(normalized: str, k: int) -> set[str]:
    """Word k-grams of a normalised text; the word set if it has fewer than k words; empty for ""."""
    words = normalized.split(" ") if normalized else []
    if len(words) < k:
        return set(words)
    return {" ".join(words[i : i + k]) for i in range(len(words) - k + 1)}


def _jaccard(a: set[str], b: set[str]) -> float:
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def _lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) with b * r <= num_perm, b >= 2 (datasketch's minimum), candidate probability at
    `threshold` >= _RECALL_AT_THRESHOLD, and the fewest expected candidates below the threshold.
    Falls back to the highest recall when no (b, r) reaches the target (few permutations, low threshold)."""
    grid = np.linspace(0.0, threshold, 256)
    best: tuple[float, int, int] | None = None
    for r in range(1, num_perm // 2 + 1):
        p = threshold**r
        if p >= 1.0:
            bands = 2
        elif p <= 0.0:
            continue
        else:
            bands = max(2, math.ceil(math.log(1.0 - _RECALL_AT_THRESHOLD) / math.log1p(-p)))
        if bands * r > num_perm:
            continue
        false_positive_area = float(np.mean(1.0 - (1.0 - grid**r) ** bands)) * threshold
        if best is None or false_positive_area < best[0]:
            best = (false_positive_area, bands, r)
    if best is None:
        return num_perm, 1
    return best[1], best[2]


def _validate(
    splits: dict[str, Sequence[str]], pairs: Sequence[tuple[str, str]], threshold: float, num_perm: int, shingle: int
) -> list[tuple[str, str]]:
    """All problems in one ValueError; returns the distinct pairs."""
    problems: list[str] = []
    if not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
        problems.append(f"threshold: must be in (0, 1], got {threshold!r}")
    if not isinstance(num_perm, int) or num_perm < _MIN_NUM_PERM:
        problems.append(f"num_perm: must be an int >= {_MIN_NUM_PERM}, got {num_perm!r}; 128 is a good default")
    if not isinstance(shingle, int) or shingle < 1:
        problems.append(f"shingle: must be an int >= 1, got {shingle!r}")
    distinct: list[tuple[str, str]] = []
    for pair in pairs:
        if len(pair) != 2:
            problems.append(f"pairs: {pair!r} is not a pair of split names")
            continue
        a, b = pair
        unknown = [name for name in (a, b) if name not in splits]
        if unknown:
            problems.append(
                f"pairs: unknown split {', '.join(map(repr, unknown))} in {pair!r}; known: {sorted(splits)}"
            )
        elif a == b:
            problems.append(f"pairs: {pair!r} pairs a split with itself; deduplicate within a split elsewhere")
        elif (b, a) in distinct:
            problems.append(f"pairs: {pair!r} and {(b, a)!r} both given; keep one orientation")
        elif (a, b) not in distinct:
            distinct.append((a, b))
    if problems:
        raise ValueError("find_leaks: " + "; ".join(problems))
    return distinct


def _digest(normalized: str) -> bytes | None:
    """16 bytes that stand for a normalised text (None for ""): what the exact check compares."""
    return hashlib.blake2b(normalized.encode(), digest_size=16).digest() if normalized else None


def _exact(digests_a: list[bytes | None], digests_b: list[bytes | None]) -> Iterator[tuple[int, int]]:
    """(i, j) with digests_a[i] == digests_b[j] (not None); a dict on the smaller side, a scan of the larger."""
    small, large, swapped = (
        (digests_a, digests_b, False) if len(digests_a) <= len(digests_b) else (digests_b, digests_a, True)
    )
    index: dict[bytes, list[int]] = {}
    for i, digest in enumerate(small):
        if digest is not None:
            index.setdefault(digest, []).append(i)
    for j, digest in enumerate(large):
        for i in index.get(digest, ()) if digest is not None else ():
            yield (j, i) if swapped else (i, j)


class BandIndex:
    """The LSH index of one split: for each of `bands` bands of `rows` MinHash values, an 8-byte hash of
    the band per text, sorted once in a numpy array. A query's candidates are the texts that share all
    values of at least one band with it (what datasketch's MinHashLSH answers; a 63-bit hash of a band
    stands for its values, so only a 2^-63 collision could add a candidate, and candidates are confirmed
    by exact Jaccard anyway). About 16 bytes per band and text, where MinHashLSH keeps a bytes key per
    band in a dict and a list of them per text, over ten times more."""

    def __init__(self, bands: int):
        self.bands = bands
        self._hashes, self._keys = bytearray(), []
        self.sorted: list[np.ndarray] = []
        self.keys: list[np.ndarray] = []

    def insert(self, keys: Sequence[int], table: np.ndarray) -> None:
        """Texts `keys` with their (len(keys), bands) band hashes."""
        self._hashes += np.ascontiguousarray(table, dtype=np.uint64).tobytes()
        self._keys += keys

    def freeze(self) -> None:
        """Sort each band once all texts are in; queries come after."""
        table = np.frombuffer(bytes(self._hashes), dtype=np.uint64).reshape(len(self._keys), self.bands)
        keys = np.array(self._keys, dtype=np.int64)
        self._hashes, self._keys = bytearray(), []
        for band in range(self.bands):
            order = np.argsort(table[:, band], kind="stable")
            self.sorted.append(table[order, band])
            self.keys.append(keys[order])

    def query(self, table: np.ndarray) -> list[set[int]]:
        """The candidates of each row of a (texts, bands) table of band hashes, one search per band."""
        found: list[set[int]] = [set() for _ in range(len(table))]
        for band in range(self.bands):
            lo = np.searchsorted(self.sorted[band], table[:, band], side="left")
            hi = np.searchsorted(self.sorted[band], table[:, band], side="right")
            for row in np.nonzero(hi > lo)[0]:
                found[row].update(self.keys[band][lo[row] : hi[row]].tolist())
        return found


_MULTIPLIERS = np.random.default_rng(20240611).integers(1, 2**63, size=512, dtype=np.uint64) | np.uint64(1)


def _band_hashes(values: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(texts, bands) 64-bit hashes of each band's `rows` MinHash values, for a (texts, num_perm) array of
    sketches: a sum of the values times fixed odd multipliers (mod 2^64), then mixed. Equal bands always
    give equal hashes; unequal ones collide with probability about 2^-64."""
    x = values[:, : bands * rows].reshape(len(values), bands, rows).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = (x * _MULTIPLIERS[:rows]).sum(axis=2, dtype=np.uint64)
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
    return h


_BATCH = 2048  # texts whose band hashes are computed and looked up together


def _permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The (a, b) of the affine permutations h -> a*h + b mod 2^32, drawn as datasketch's MinHash draws
    them for scheme "affine32" (a odd): the same seed gives the same sketches, so candidates are the same."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer (datasketch's pre-mix of every input hash), on a uint32 array."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> np.uint32(1)) ^ np.uint32(0xEDB88320), table >> np.uint32(1))
    return table.astype(np.uint32)


_CRC_TABLE = _crc_table()


def _crc32_ranges(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """zlib.crc32 of every byte range buf[start : start + length] (lengths >= 1), all ranges at once: one
    table step per byte position, over the ranges at least that long (sorted longest first, they are a
    prefix)."""
    order = np.argsort(-lengths, kind="stable")
    position, longest_first = starts[order].astype(np.int64), lengths[order]
    active = np.searchsorted(-longest_first, -np.arange(int(longest_first[0])), side="left")
    crc = np.full(len(order), 0xFFFFFFFF, dtype=np.uint32)
    for m in active:
        c = crc[:m]
        crc[:m] = _CRC_TABLE[(c ^ buf[position[:m]]) & np.uint32(0xFF)] ^ (c >> np.uint32(8))
        position[:m] += 1
    out = np.empty_like(crc)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    return out


def _shingle_ranges(normalized: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The bytes of normalised texts (none empty) joined by spaces, and each text's word k-grams (or its
    words, if it has fewer than k) as byte ranges of them: (bytes, starts, lengths, ranges per text). A
    normalised text's words are separated by single spaces, so "w1 w2 w3", the shingle `_shingles` makes,
    is exactly the bytes from w1's start to w3's end. Repeated shingles stay (a minimum does not mind)."""
    data = [text.encode() for text in normalized]
    buf = np.frombuffer(b" ".join(data), dtype=np.uint8)
    sizes = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
    text_start = np.cumsum(sizes + 1) - (sizes + 1)
    spaces = np.flatnonzero(buf == 32)
    word_start = np.concatenate(([0], spaces + 1))
    word_end = np.concatenate((spaces, [len(buf)]))
    word_text = np.searchsorted(text_start, word_start, side="right") - 1
    words = np.bincount(word_text, minlength=len(data))
    index_in_text = np.arange(len(word_start)) - (np.cumsum(words) - words)[word_text]
    short = words[word_text] < k
    first = np.flatnonzero(short | (index_in_text <= words[word_text] - k))
    last = np.where(short[first], first, first + k - 1)
    starts = word_start[first]
    return buf, starts, word_end[last] - starts, np.bincount(word_text[first], minlength=len(data))


def _sketch(normalized: Sequence[str], k: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(texts, num_perm) uint32 MinHash values of normalised texts' word k-gram sets (texts not empty): the
    crc32 of each shingle's UTF-8 bytes (computed on byte ranges of the batch, no shingle string made),
    pre-mixed, then for each permutation all the batch's shingles at once and the minimum per text (a 1-D
    reduceat per permutation: contiguous, several times faster than one 2-D reduction). Equal to
    datasketch's MinHash(num_perm, seed, hashfunc=zlib.crc32, scheme="affine32") of `_shingles(text, k)`."""
    buf, starts, lengths, counts = _shingle_ranges(normalized, k)
    hashes = _fmix32(_crc32_ranges(buf, starts, lengths))
    offsets = np.cumsum(counts) - counts
    out = np.empty((len(a), len(normalized)), dtype=np.uint32)
    permuted = np.empty_like(hashes)
    for p in range(len(a)):
        np.multiply(hashes, a[p], out=permuted)  # uint32: the wraparound is the mod 2^32
        np.add(permuted, b[p], out=permuted)
        out[p] = np.minimum.reduceat(permuted, offsets)
    return out.T


def _sketcher(shingle: int, num_perm: int, seed: int):
    """What sketches a part of a split, here or in each process of a pool (data/pool.py): each text
    normalised once, its digest, and the MinHash values of those not blank."""
    a, b = _permutations(num_perm, seed)

    def sketch(texts: Sequence[str]) -> tuple[list[bytes | None], np.ndarray | None]:
        normalized = [normalize_text(text) for text in texts]
        kept = [text for text in normalized if text]
        return [_digest(text) for text in normalized], (_sketch(kept, shingle, a, b) if kept else None)

    return sketch


def _batches(texts: Sequence[str], digests: list[bytes | None], sketch, pool, size: int) -> Iterator[list[tuple]]:
    """(index, text, MinHash values) of the texts that are not blank, `size` texts at a time, sketched by
    `pool` when given (in order), else here by `sketch`; each text's digest is appended to `digests`."""
    sent: collections.deque = collections.deque()

    def parts() -> Iterator[list[str]]:
        for part in chunked(texts, size):
            sent.append(part)
            yield part

    start = 0
    for part_digests, values in pool.map(parts()) if pool is not None else map(sketch, parts()):
        part = sent.popleft()
        digests.extend(part_digests)
        kept = [(start + k, text) for k, (text, digest) in enumerate(zip(part, part_digests, strict=True)) if digest]
        start += len(part)
        if kept:
            yield [(i, text, row) for (i, text), row in zip(kept, values, strict=True)]


def _near(
    splits: dict[str, Sequence[str]],
    digests: dict[str, list[bytes | None]],
    wanted: list[tuple[str, str]],
    names: list[str],
    threshold: float,
    num_perm: int,
    shingle: int,
    seed: int,
    processes: int | None = None,
) -> list[LeakPair]:
    """Near (not exact) duplicates of the wanted pairs; fills `digests` (empty lists) on the way. `names`
    go smallest first: each split is queried against the indexes of the smaller splits it is paired with
    (built earlier), then inserted into its own index if a larger split is paired with it; its digests and
    sketches are computed once, in one stream, from texts normalised as they are reached (no normalised
    copy of a split is kept), by `processes` pooled processes (data/pool.py; default: one per core from
    50,000 texts in all) while this one queries and indexes."""
    rank = {name: i for i, name in enumerate(names)}
    bands, rows = _lsh_params(threshold, num_perm)
    sketch = _sketcher(shingle, num_perm, seed)
    indexes: dict[str, BandIndex] = {}
    found: list[LeakPair] = []
    processes = processes if processes is not None else processes_for(sum(len(splits[name]) for name in names))
    with process_pool(_sketcher, (shingle, num_perm, seed), processes) as pool:
        for name in names:
            found += _near_split(
                splits, digests, wanted, rank, name, indexes, sketch, pool, bands, rows, threshold, shingle
            )
    return found


def _near_split(
    splits, digests, wanted, rank, name: str, indexes, sketch, pool, bands: int, rows: int, threshold, shingle
) -> list[LeakPair]:
    """_near's work for split `name`: its texts queried against the smaller paired splits' indexes, then
    inserted into its own index if a larger split is paired with it."""
    found: list[LeakPair] = []
    query_into = sorted({other for pair in wanted if name in pair for other in pair if rank[other] < rank[name]})
    build_index = any(name in pair and rank[other] > rank[name] for pair in wanted for other in pair)
    mine = digests[name]
    index = BandIndex(bands) if build_index else None
    for batch in _batches(splits[name], mine, sketch, pool, _BATCH):
        keys = [i for i, _, _ in batch]
        table = _band_hashes(np.stack([values for _, _, values in batch]), bands, rows)
        for other in query_into:
            for (i, text, _), candidates in zip(batch, indexes[other].query(table), strict=True):
                grams = _shingles(normalize_text(text), shingle) if candidates else set()
                for j in sorted(candidates):
                    if digests[other][j] == mine[i]:
                        continue  # reported as exact
                    similarity = _jaccard(grams, _shingles(normalize_text(splits[other][j]), shingle))
                    if similarity < threshold:
                        continue
                    if (name, other) in wanted:
                        found.append(LeakPair("near", name, i, other, j, similarity))
                    else:
                        found.append(LeakPair("near", other, j, name, i, similarity))
        if index is not None:
            index.insert(keys, table)
    if index is not None:
        index.freeze()
        indexes[name] = index
    return found


def find_leaks(
    splits: dict[str, Sequence[str]],
    pairs: Sequence[tuple[str, str]],
    threshold: float,
    num_perm: int = 128,
    shingle: int = 3,
    seed: int = 1,
    processes: int | None = None,
) -> list[LeakPair]:
    """Leaks between the given split pairs, e.g. [("train","eval"),("train","test"),("eval","test")].

    Exact duplicates after `normalize_text`, and near duplicates by MinHash LSH over word
    `shingle`-grams (texts shorter than `shingle` words use the word set) with exact Jaccard confirmation
    >= threshold. A pair that is an exact duplicate is reported once, as exact. Texts that normalise to ""
    (blank, punctuation only) are never reported. Deterministic for the same input, whatever the order of
    `pairs`; a pair repeated in the same orientation counts once. Sorted by (a_split, a_index, b_split,
    b_index). The LSH is tuned for recall (about 99% of pairs at exactly the threshold become candidates,
    more above it), so a near duplicate is missed only rarely and only when close to the threshold.

    `processes`: how many processes normalise and sketch (default: data/pool.py's processes_for the texts
    in all); the result does not depend on it.

    Raises ValueError, listing every problem, for threshold outside (0, 1], num_perm < 16, shingle < 1,
    unknown split names in `pairs`, a split paired with itself, or a pair given in both orientations.
    Raises TypeError if a text is not a str.
    """
    wanted = _validate(splits, pairs, threshold, num_perm, shingle)
    names = sorted({name for pair in wanted for name in pair}, key=lambda name: (len(splits[name]), name))
    digests: dict[str, list[bytes | None]] = {name: [] for name in names}
    near = _near(splits, digests, wanted, names, threshold, num_perm, shingle, seed, processes)
    leaks = [LeakPair("exact", a, i, b, j, 1.0) for a, b in wanted for i, j in _exact(digests[a], digests[b])]
    leaks += near
    leaks.sort(key=lambda leak: (leak.a_split, leak.a_index, leak.b_split, leak.b_index))
    return leaks
