"""Leaks between data splits: exact duplicates after normalisation, near duplicates by MinHash LSH.

Takes already-extracted strings, so it does not care which field or modality they came from. Near
duplicates are found with datasketch's `MinHash` / `MinHashLSH` over word shingles and then confirmed by
the exact Jaccard similarity of the shingle sets, so the LSH only decides which pairs get looked at.
`LEAKCHECK_VERSION` is recorded in reports; bump it when the method changes.

Cost: every text is normalised and MinHashed once, whatever the number of pairs it takes part in. Splits
are processed from smallest to largest; each split is queried against the LSH indexes of the smaller
splits it is paired with, then (if a larger split is paired with it) inserted into its own index. Only
the indexes are kept, never the sketches of the side that is queried.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from datasketch import MinHash, MinHashLSH

from entrypoint.data.normalize import normalize_text

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


def _exact(norm_a: list[str], norm_b: list[str]) -> Iterator[tuple[int, int]]:
    """(i, j) with norm_a[i] == norm_b[j] != ""; a dict on the smaller side, a scan of the larger."""
    small, large, swapped = (norm_a, norm_b, False) if len(norm_a) <= len(norm_b) else (norm_b, norm_a, True)
    index: dict[str, list[int]] = {}
    for i, text in enumerate(small):
        if text:
            index.setdefault(text, []).append(i)
    for j, text in enumerate(large):
        for i in index.get(text, ()) if text else ():
            yield (j, i) if swapped else (i, j)


def _near(
    norm: dict[str, list[str]],
    wanted: list[tuple[str, str]],
    names: list[str],
    threshold: float,
    num_perm: int,
    shingle: int,
    seed: int,
) -> list[LeakPair]:
    """Near (not exact) duplicates of the wanted pairs. `names` go smallest first: each split is queried
    against the indexes of the smaller splits it is paired with (built earlier), then inserted into its
    own index if a larger split is paired with it; its sketches are computed once, in one stream."""
    rank = {name: i for i, name in enumerate(names)}
    bands, rows = _lsh_params(threshold, num_perm)
    indexes: dict[str, MinHashLSH] = {}
    found: list[LeakPair] = []
    for name in names:
        query_into = sorted({other for pair in wanted if name in pair for other in pair if rank[other] < rank[name]})
        build_index = any(name in pair and rank[other] > rank[name] for pair in wanted for other in pair)
        texts = norm[name]
        todo = [i for i, text in enumerate(texts) if text]
        sketches = MinHash.generator(
            ([s.encode("utf-8") for s in _shingles(texts[i], shingle)] for i in todo),
            num_perm=num_perm,
            seed=seed,
            hashfunc=zlib.crc32,  # fast, stable across processes (Python's `hash` is salted), 32-bit
            scheme="affine32",
        )
        index = MinHashLSH(num_perm=num_perm, params=(bands, rows)) if build_index else None
        with index.insertion_session() if index is not None else contextlib.nullcontext() as session:
            for i, sketch in zip(todo, sketches, strict=True):
                mine: set[str] | None = None
                for other in query_into:
                    for j in indexes[other].query(sketch):
                        theirs = norm[other][j]
                        if theirs == texts[i]:
                            continue  # reported as exact
                        mine = _shingles(texts[i], shingle) if mine is None else mine
                        similarity = _jaccard(mine, _shingles(theirs, shingle))
                        if similarity < threshold:
                            continue
                        if (name, other) in wanted:
                            found.append(LeakPair("near", name, i, other, j, similarity))
                        else:
                            found.append(LeakPair("near", other, j, name, i, similarity))
                if session is not None:
                    session.insert(i, sketch, check_duplication=False)
        if index is not None:
            indexes[name] = index
    return found


def find_leaks(
    splits: dict[str, Sequence[str]],
    pairs: Sequence[tuple[str, str]],
    threshold: float,
    num_perm: int = 128,
    shingle: int = 3,
    seed: int = 1,
) -> list[LeakPair]:
    """Leaks between the given split pairs, e.g. [("train","eval"),("train","test"),("eval","test")].

    Exact duplicates after `normalize_text`, and near duplicates by MinHash LSH (datasketch) over word
    `shingle`-grams (texts shorter than `shingle` words use the word set) with exact Jaccard confirmation
    >= threshold. A pair that is an exact duplicate is reported once, as exact. Texts that normalise to ""
    (blank, punctuation only) are never reported. Deterministic for the same input, whatever the order of
    `pairs`; a pair repeated in the same orientation counts once. Sorted by (a_split, a_index, b_split,
    b_index). The LSH is tuned for recall (about 99% of pairs at exactly the threshold become candidates,
    more above it), so a near duplicate is missed only rarely and only when close to the threshold.

    Raises ValueError, listing every problem, for threshold outside (0, 1], num_perm < 16, shingle < 1,
    unknown split names in `pairs`, a split paired with itself, or a pair given in both orientations.
    Raises TypeError if a text is not a str.
    """
    wanted = _validate(splits, pairs, threshold, num_perm, shingle)
    names = sorted({name for pair in wanted for name in pair}, key=lambda name: (len(splits[name]), name))
    norm = {name: [normalize_text(text) for text in splits[name]] for name in names}

    leaks = [LeakPair("exact", a, i, b, j, 1.0) for a, b in wanted for i, j in _exact(norm[a], norm[b])]

    leaks += _near(norm, wanted, names, threshold, num_perm, shingle, seed)
    leaks.sort(key=lambda leak: (leak.a_split, leak.a_index, leak.b_split, leak.b_index))
    return leaks
