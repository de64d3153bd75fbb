"""The cost of a verdict: rentune's paired bootstrap (entrypoint/evaluation/bootstrap.py) over a large eval
split, every classification metric at once (macro-F1, micro-F1, accuracy, and F1, precision and recall of
every category), against the straightforward way measured in the same run: one resample at a time, each
drawing its indices and counting a confusion matrix for the baseline and the trial with numpy.

    .venv/bin/python bench/verdict.py [--examples 10000] [--categories 20] [--resamples 10000] [--repeats 3]

Prints the best of `repeats` wall times for rentune's bootstrap (goal: <= 5 s for 10,000 resamples over
10,000 examples and 20 categories on 2 cores), the per-resample time of the loop (timed on 300 resamples)
and the ratio loop / rentune per resample.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entrypoint.evaluation.bootstrap import Bootstrap, compare  # noqa: E402
from entrypoint.evaluation.tally import classification_tally  # noqa: E402

LOOP_RESAMPLES = 300


def _data(n: int, c: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gold labels and two systems' predictions: right 60% and 80% of the time, else a random category."""
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, c, n)
    base = np.where(rng.random(n) < 0.6, gold, rng.integers(0, c, n))
    trial = np.where(rng.random(n) < 0.8, gold, rng.integers(0, c, n))
    return gold, base, trial


def _loop(gold: np.ndarray, base: np.ndarray, trial: np.ndarray, c: int, resamples: int) -> np.ndarray:
    """The macro-F1 gain per resample, one resample at a time (per-category F1, precision, recall computed too)."""
    rng = np.random.default_rng(1)
    n, gains = len(gold), np.empty(resamples)
    for r in range(resamples):
        idx = rng.integers(0, n, n)
        scores = []
        for pred in (base, trial):
            confusion = np.bincount(gold[idx] * c + pred[idx], minlength=c * c).reshape(c, c)
            tp = np.diag(confusion)
            predicted, actual = confusion.sum(0), confusion.sum(1)
            precision = np.divide(tp, predicted, out=np.zeros(c), where=predicted > 0)
            recall = np.divide(tp, actual, out=np.zeros(c), where=actual > 0)
            f1 = np.divide(2 * tp, predicted + actual, out=np.zeros(c), where=predicted + actual > 0)
            scores.append((f1.mean(), precision, recall))
        gains[r] = scores[1][0] - scores[0][0]
    return gains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--categories", type=int, default=20)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    gold, base, trial = _data(args.examples, args.categories)
    labels = [f"c{i}" for i in range(args.categories)]
    b = classification_tally([labels[i] for i in gold], [labels[i] for i in base], labels)
    t = classification_tally([labels[i] for i in gold], [labels[i] for i in trial], labels)
    names = list(b.metrics(b.counts.sum(0)))
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        result = compare(b, t, names, Bootstrap(resamples=args.resamples, seed=0))
        times.append(time.perf_counter() - started)
    best = min(times)
    started = time.perf_counter()
    _loop(gold, base, trial, args.categories, LOOP_RESAMPLES)
    per_loop = (time.perf_counter() - started) / LOOP_RESAMPLES
    per_ours = best / args.resamples
    low, high = result["macro_f1"]["interval"]
    print(
        f"{args.resamples:,} paired resamples of {args.examples:,} examples, {args.categories} categories, "
        f"{len(names)} metrics each (baseline and trial)"
    )
    every = ", ".join(f"{s:.2f}" for s in times)
    print(f"rentune bootstrap: best {best:.2f} s of {args.repeats} (all: {every}); goal <= 5 s")
    print(f"loop, one resample at a time: {per_loop * 1e3:.2f} ms per resample ({LOOP_RESAMPLES} timed)")
    print(f"ratio loop / rentune per resample: {per_loop / per_ours:.1f}x")
    print(f"macro_f1 gain {result['macro_f1']['change']:+.4f}, 95% interval [{low:+.4f}, {high:+.4f}]")


if __name__ == "__main__":
    main()
