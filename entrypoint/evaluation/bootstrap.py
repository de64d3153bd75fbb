"""Paired bootstrap intervals for every metric of a comparison, vectorised with numpy.

A comparison measures two systems (the baseline and a trial, or two trials) on the same examples. One
resample draws n units with replacement, and applies those draws to both systems' per-example counts
(entrypoint/evaluation/tally.py): the difference of their metrics on that resample is one draw of the
change. The interval is the percentile interval of those draws (Koehn 2004; Miller 2024): for confidence
0.95, the 2.5th and 97.5th percentiles, as `scipy.stats.bootstrap(..., paired=True,
method="percentile")` gives (a unit test compares the two).

    units     examples, or whole clusters (data.cluster_field: rows sharing a document or conversation)
    profiles  the distinct per-unit count rows; a resample is how often each profile was drawn
    sums      resample counts @ profiles: each resample's column sums, exact (integers in float64)

Everything is deterministic for a seed: with the same numpy (recorded), the same draws give the same
interval bit for bit on any machine (integer sums below 2**53 are exact in float64 whatever order BLAS
adds them in).
Binary-outcome rates (accuracy, json_valid_rate, ...) also get the exact McNemar p-value: the two-sided
binomial test of the discordant pairs (examples one system got right and the other wrong).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entrypoint.evaluation.tally import Tally

__all__ = ["MIN_CLUSTERS", "Bootstrap", "compare", "mcnemar_p", "percentile_interval", "resample_sums", "spread"]

METHOD = "paired-bootstrap-percentile"
# Fewer clusters than this cannot be resampled into a meaningful interval (with 1 cluster every resample is
# the data itself): the interval is left undefined (NaN), which every verdict reads as inconclusive.
MIN_CLUSTERS = 20
_CHUNK_DRAWS = 1 << 21  # unit draws generated at once (16 MiB of int64): bounded memory at any size


@dataclass(frozen=True)
class Bootstrap:
    """How intervals are computed: `evaluation.resamples`, `evaluation.confidence`, `evaluation.seed`."""

    resamples: int = 10_000
    confidence: float = 0.95
    seed: int = 0

    def describe(self, cluster_field: str | None) -> dict:
        """What the eval config records: the method and everything that decides its numbers."""
        return {
            "method": METHOD,
            "resamples": self.resamples,
            "confidence": self.confidence,
            "seed": self.seed,
            "unit": f"cluster ({cluster_field})" if cluster_field else "example",
            "numpy": np.__version__,  # the draws of a seed are numpy's: the same intervals with the same numpy
        }


def _units(counts: np.ndarray, clusters: Sequence[str] | None) -> np.ndarray:
    """Per-unit count rows: the examples themselves, or each cluster's rows summed (clusters in name order)."""
    if clusters is None:
        return counts
    _, inverse = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    inverse = inverse.reshape(-1)
    units = np.zeros((int(inverse.max()) + 1, counts.shape[1]), dtype=np.int64)
    np.add.at(units, inverse, counts)
    return units


def resample_sums(counts: np.ndarray, clusters: Sequence[str] | None, resamples: int, seed: int) -> np.ndarray:
    """(resamples, m) column sums of `counts` (n, m) over `resamples` bootstrap resamples of its units."""
    units = _units(np.asarray(counts, dtype=np.int64), clusters)
    profiles, inverse = np.unique(units, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    g, k = len(units), len(profiles)
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _CHUNK_DRAWS // g)
    profiles = profiles.astype(np.float64)
    out = np.empty((resamples, profiles.shape[1]), dtype=np.float64)
    for start in range(0, resamples, per_chunk):
        b = min(per_chunk, resamples - start)
        drawn = inverse[rng.integers(0, g, size=(b, g))]
        drawn += (np.arange(b) * k)[:, None]
        times = np.bincount(drawn.reshape(-1), minlength=b * k).reshape(b, k)
        out[start : start + b] = times.astype(np.float64) @ profiles
    return out


def percentile_interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    """The percentile interval of `draws` (NaN draws, from resamples that held no example of a group,
    left out); (nan, nan) if every draw is NaN."""
    draws = draws[~np.isnan(draws)]
    if draws.size == 0:
        return float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    low, high = np.percentile(draws, [100 * alpha, 100 * (1 - alpha)])
    return float(low), float(high)


def spread(draws: np.ndarray, confidence: float) -> float:
    """Half the width of the percentile interval of `draws`."""
    low, high = percentile_interval(draws, confidence)
    return (high - low) / 2


def mcnemar_p(first: np.ndarray, second: np.ndarray) -> tuple[int, int, float]:
    """(first only, second only, exact two-sided p) for paired 0/1 outcomes."""
    only_first = int(np.sum((first == 1) & (second == 0)))
    only_second = int(np.sum((first == 0) & (second == 1)))
    discordant = only_first + only_second
    if discordant == 0:
        return only_first, only_second, 1.0
    from scipy.stats import binomtest  # 0.7 s to import: not on the path of a process that only trains

    p = float(binomtest(min(only_first, only_second), discordant, 0.5).pvalue)
    return only_first, only_second, p


def compare(
    before: Tally,
    after: Tally,
    names: Sequence[str],
    settings: Bootstrap,
    clusters: Sequence[str] | None = None,
) -> dict[str, dict]:
    """For each metric in `names`: `before`, `after` (the values on all examples), `change` (after - before)
    and its `interval` (NaN with fewer than MIN_CLUSTERS clusters); for binary-outcome rates of independent
    examples (no clusters) also `mcnemar` (discordant counts and exact p). Both tallies must be of the same
    examples in the same order."""
    if before.counts.shape[0] != after.counts.shape[0]:
        raise ValueError(
            f"a paired comparison needs the same examples: {before.counts.shape[0]} vs {after.counts.shape[0]}"
        )
    m = before.counts.shape[1]
    sums = resample_sums(
        np.concatenate([before.counts, after.counts], axis=1), clusters, settings.resamples, settings.seed
    )
    drawn_before, drawn_after = before.metrics(sums[:, :m], resampled=True), after.metrics(sums[:, m:], resampled=True)
    too_few = clusters is not None and len(set(clusters)) < MIN_CLUSTERS
    point_before, point_after = before.metrics(before.counts.sum(0)), after.metrics(after.counts.sum(0))
    out = {}
    for name in names:
        low, high = percentile_interval(drawn_after[name] - drawn_before[name], settings.confidence)
        if too_few:
            low = high = float("nan")
        entry = {
            "before": float(point_before[name]),
            "after": float(point_after[name]),
            "change": float(point_after[name] - point_before[name]),
            "interval": [low, high],
        }
        if name in before.outcomes and clusters is None:  # McNemar counts examples as independent pairs
            col, member = before.outcomes[name]
            keep = slice(None) if member is None else before.counts[:, member] == 1
            only_before, only_after, p = mcnemar_p(before.counts[keep, col], after.counts[keep, col])
            entry["mcnemar"] = {"only_before": only_before, "only_after": only_after, "p": p}
        out[name] = entry
    return out
