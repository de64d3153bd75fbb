"""Leak-check benchmark: `find_leaks` (MinHash LSH + exact confirmation) vs naive all-pairs comparison,
in the same run, on seeded synthetic texts with planted exact and near duplicates.

    .venv/bin/python bench/data.py [--train 100000] [--test 10000] [--sample 2000] [--threshold 0.8]

The naive baseline compares every (train, test) pair: normalised strings for the exact check, exact
Jaccard of the word 3-gram sets for the near check. It runs on a `--sample` x `--sample` subsample that
contains some planted pairs, and its time is then EXTRAPOLATED linearly in the number of pairs to the full
train x test size; its result on the subsample is the ground truth that `find_leaks` is also scored
against there. Times are wall clock without tracing; peak memory is measured in a separate traced run
(tracemalloc: Python objects and numpy arrays, which slows that run down several times).
"""

from __future__ import annotations

import argparse
import itertools
import random
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from entrypoint.data.leaks import find_leaks  # noqa: E402
from entrypoint.data.normalize import normalize_text  # noqa: E402

SEED = 20240611
PLANTED = 200  # of each kind
SYLLABLES = "ka lo mi ne ru ta shi po de va en or al is um an ber cor dan fel gan hol tri sun".split()
FUNCTION_WORDS = "the a to and of i my is it for in on you this that with was have not but can".split()
OPENERS = [  # shared templates: they make texts share 3-grams, which is what stresses the LSH
    "hi there i have a question about",
    "please help me with",
    "hello support team",
    "i am writing to complain that",
    "could you tell me whether",
    "as discussed on the phone yesterday",
    "this is the third time i ask about",
    "urgent request regarding",
]


def _vocabulary(rng: random.Random, n: int) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))))
    return FUNCTION_WORDS + sorted(words - set(FUNCTION_WORDS))


class Corpus:
    """Seeded texts: Zipf-distributed global words, 30% topic words, 20% start with a shared opener,
    commas and sentence punctuation, 6-80 words (median ~25) plus the opener."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.vocab = _vocabulary(self.rng, 30_000)
        self.cum = list(itertools.accumulate(1.0 / (rank + 1) ** 1.05 for rank in range(len(self.vocab))))
        self.topics = [self.rng.sample(self.vocab[200:], 150) for _ in range(40)]

    def text(self, min_words: int = 6) -> str:
        rng = self.rng
        n = min(80, max(min_words, int(rng.lognormvariate(3.2, 0.5))))
        words = rng.choices(self.vocab, cum_weights=self.cum, k=n)
        topic = rng.choice(self.topics)
        for pos in rng.sample(range(n), n * 3 // 10):
            words[pos] = rng.choice(topic)
        for pos in rng.sample(range(n), n // 10):
            words[pos] += ","
        if rng.random() < 0.2:
            words = rng.choice(OPENERS).split() + words
        words[0] = words[0].capitalize()
        return " ".join(words) + rng.choice(".?!")

    def exact_copy(self, text: str) -> str:
        """Same text up to case, whitespace and punctuation at word edges."""
        rng = self.rng
        case = rng.choice([str.upper, str.lower, str.title, str.swapcase])
        words = [w + rng.choice(["", "", ",", "!", "..."]) for w in case(text).split()]
        return (
            rng.choice(["", '"', "(", "  "])
            + rng.choice([" ", "  ", "\n", " \t "]).join(words)
            + rng.choice(["", "?!", '"'])
        )

    def near_copy(self, text: str) -> str:
        """One edit: substitute one word, insert one, delete one, or substitute two adjacent words."""
        rng = self.rng
        words = text.split()
        pos = rng.randrange(1, len(words) - 2)
        edit = rng.choice(["sub", "ins", "del", "sub2"])
        new = [rng.choice(self.vocab[100:]) for _ in range(2)]
        if edit == "sub":
            words[pos] = new[0]
        elif edit == "ins":
            words.insert(pos, new[0])
        elif edit == "del":
            del words[pos]
        else:
            words[pos : pos + 2] = new
        return " ".join(words)


def make_data(
    n_train: int, n_test: int, seed: int
) -> tuple[list[str], list[str], list[tuple[int, int]], list[tuple[int, int]]]:
    """Train and test texts; (train_index, test_index) of the planted exact and near duplicates."""
    corpus = Corpus(seed)
    train = [corpus.text() for _ in range(n_train)]
    test = [corpus.text() for _ in range(n_test)]
    rng = corpus.rng
    long_enough = [i for i, t in enumerate(train) if len(t.split()) >= 45]  # one edit keeps Jaccard >= ~0.8
    near_src = rng.sample(long_enough, PLANTED)
    exact_src = rng.sample(sorted(set(range(n_train)) - set(near_src)), PLANTED)
    slots = rng.sample(range(n_test), 2 * PLANTED)
    exact = list(zip(exact_src, slots[:PLANTED], strict=True))
    near = list(zip(near_src, slots[PLANTED:], strict=True))
    for i, j in exact:
        test[j] = corpus.exact_copy(train[i])
    for i, j in near:
        test[j] = corpus.near_copy(train[i])
    return train, test, exact, near


def shingles(normalized: str, k: int = 3) -> set[str]:
    words = normalized.split()
    return {" ".join(words[i : i + k]) for i in range(len(words) - k + 1)} if len(words) >= k else set(words)


def _jaccard(x: set[str], y: set[str]) -> float:
    inter = len(x.intersection(y))
    return inter / (len(x) + len(y) - inter)


def naive_exact(train: list[str], test: list[str]) -> set[tuple[int, int]]:
    a = [normalize_text(t) for t in train]
    b = [normalize_text(t) for t in test]
    return {(i, j) for i, x in enumerate(a) if x for j, y in enumerate(b) if x == y}


def naive_near(train: list[str], test: list[str], threshold: float) -> set[tuple[int, int]]:
    a = [normalize_text(t) for t in train]
    b = [normalize_text(t) for t in test]
    sa, sb = [shingles(t) for t in a], [shingles(t) for t in b]
    found = set()
    for i, x in enumerate(sa):
        for j, y in enumerate(sb):
            if x and y and a[i] != b[j] and _jaccard(x, y) >= threshold:
                found.add((i, j))
    return found


def measure(fn: Callable[[], object]) -> tuple[object, float, float]:
    """(result, seconds of an untraced run, peak MiB allocated during a second, traced run)."""
    started = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - started
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return result, seconds, peak


def _pairs(leaks: list, kind: str) -> set[tuple[int, int]]:
    return {(x.a_index, x.b_index) for x in leaks if x.kind == kind}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--test", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=2_000)
    parser.add_argument("--threshold", type=float, default=0.8)
    args = parser.parse_args()
    threshold = args.threshold

    started = time.perf_counter()
    train, test, exact, near = make_data(args.train, args.test, SEED)
    planted_jaccard = {
        (i, j): _jaccard(shingles(normalize_text(train[i])), shingles(normalize_text(test[j]))) for i, j in near
    }
    jaccards = sorted(planted_jaccard.values())
    near_above = {pair for pair, jac in planted_jaccard.items() if jac >= threshold}
    words = sorted(len(t.split()) for t in train)
    print(
        f"data: {len(train)} train, {len(test)} test texts (words min/median/max {words[0]}/{words[len(words) // 2]}/"
        f"{words[-1]}), generated in {time.perf_counter() - started:.1f} s; planted {len(exact)} exact, {len(near)} "
        f"near (exact Jaccard min/median/max {jaccards[0]:.3f}/{jaccards[len(jaccards) // 2]:.3f}/{jaccards[-1]:.3f}; "
        f"{len(near_above)} >= threshold {threshold})"
    )

    print("\n== find_leaks, full size")
    splits = {"train": train, "test": test}
    leaks, t_full, m_full = measure(lambda: find_leaks(splits, [("train", "test")], threshold))
    found_exact, found_near = _pairs(leaks, "exact"), _pairs(leaks, "near")
    print(
        f"{len(train)} x {len(test)}: {t_full:.1f} s, peak {m_full:.0f} MiB traced; "
        f"{len(found_exact)} exact, {len(found_near)} near"
    )
    print(f"recall planted exact: {len(found_exact & set(exact))}/{len(exact)}")
    print(f"recall planted near (Jaccard >= {threshold}): {len(found_near & near_above)}/{len(near_above)}")
    print(f"reported but not planted: {len(found_exact - set(exact))} exact, {len(found_near - set(near))} near")

    print("\n== find_leaks, scaling (test fixed)")
    for n in sorted({min(n, len(train)) for n in (25_000, 50_000, len(train))}):
        if n == len(train):
            seconds = t_full
        else:
            sub = {"train": train[:n], "test": test}
            started = time.perf_counter()
            find_leaks(sub, [("train", "test")], threshold)
            seconds = time.perf_counter() - started
        print(f"train {n:>7} x test {len(test)}: {seconds:6.1f} s  ({seconds / n * 1e6:.0f} us per train text)")

    print(f"\n== naive all-pairs on a {args.sample} x {args.sample} subsample")
    rng = random.Random(SEED + 1)
    keep = exact[:50] + near[:50]
    s_train_idx = [i for i, _ in keep] + rng.sample(
        sorted(set(range(len(train))) - {i for i, _ in keep}), args.sample - len(keep)
    )
    s_test_idx = [j for _, j in keep] + rng.sample(
        sorted(set(range(len(test))) - {j for _, j in keep}), args.sample - len(keep)
    )
    s_train, s_test = [train[i] for i in s_train_idx], [test[j] for j in s_test_idx]
    truth_exact, t_ne, m_ne = measure(lambda: naive_exact(s_train, s_test))
    truth_near, t_nn, m_nn = measure(lambda: naive_near(s_train, s_test, threshold))
    sample_leaks, t_fs, m_fs = measure(
        lambda: find_leaks({"train": s_train, "test": s_test}, [("train", "test")], threshold)
    )
    got_exact, got_near = _pairs(sample_leaks, "exact"), _pairs(sample_leaks, "near")
    print(f"naive exact   : {t_ne:6.2f} s, peak {m_ne:5.1f} MiB traced; {len(truth_exact)} pairs")
    print(f"naive Jaccard : {t_nn:6.2f} s, peak {m_nn:5.1f} MiB traced; {len(truth_near)} pairs >= {threshold}")
    print(f"find_leaks    : {t_fs:6.2f} s, peak {m_fs:5.1f} MiB traced; {len(got_exact)} exact, {len(got_near)} near")
    print(
        f"find_leaks vs naive ground truth: exact {len(got_exact & truth_exact)}/{len(truth_exact)} "
        f"(+{len(got_exact - truth_exact)} extra), near {len(got_near & truth_near)}/{len(truth_near)} "
        f"(+{len(got_near - truth_near)} extra)"
    )

    scale = (len(train) * len(test)) / (args.sample * args.sample)
    t_naive = (t_ne + t_nn) * scale
    print(f"\n== ratios at {len(train)} x {len(test)} (naive time EXTRAPOLATED x{scale:.0f} from the subsample)")
    print(f"naive exact   (extrapolated): {t_ne * scale:8.0f} s")
    print(f"naive Jaccard (extrapolated): {t_nn * scale:8.0f} s")
    print(f"naive total   (extrapolated): {t_naive:8.0f} s = {t_naive / 60:.0f} min")
    print(f"find_leaks    (measured)    : {t_full:8.1f} s")
    print(f"speed-up naive/find_leaks   : {t_naive / t_full:8.0f} x")
    texts_ratio = (len(train) + len(test)) / (2 * args.sample)
    m_naive = max(m_ne, m_nn) * texts_ratio
    print(
        f"peak memory: find_leaks {m_full:.0f} MiB measured; naive {max(m_ne, m_nn):.1f} MiB on the subsample, "
        f"~{m_naive:.0f} MiB EXTRAPOLATED linearly in texts (it holds every shingle set); ratio find_leaks/naive "
        f"{m_full / m_naive:.2f}"
    )
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"process max RSS (everything above, incl. the data): {max_rss:.0f} MiB")


if __name__ == "__main__":
    main()
