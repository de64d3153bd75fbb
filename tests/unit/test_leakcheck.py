from __future__ import annotations

import collections
import random

import numpy as np
import pytest

import entrypoint.data.leaks as leakcheck
from entrypoint.data.leaks import LEAKCHECK_VERSION, LeakPair, find_leaks
from entrypoint.data.normalize import normalize_text

# ~20-word sentences on one topic (support tickets): they share words and a few 3-grams, not whole phrases.
TICKETS = [
    "my order arrived two weeks late and the box was damaged so i would like a refund for the shipping cost",
    "i was charged twice for the same order last month and nobody answered my emails about the duplicate payment",
    "the app logs me out every time i open the settings page and i cannot change my delivery address anymore",
    "can you tell me why the refund for my cancelled order has not appeared on my card after ten days",
    "the discount code from your newsletter is rejected at checkout even though it says it is valid until friday",
    "i would like to change the delivery address for my order because i am moving to a new flat next week",
    "the tracking number you sent me does not work on the courier website and the order status says processing",
    "please close my account and delete my personal data as i no longer want to receive emails from your shop",
]
# One ticket, edited: exact Jaccard of the word 3-gram sets is computed by hand next to each edit.
BASE = TICKETS[0]  # 21 words -> 19 shingles
ONE_WORD = BASE.replace("two weeks", "three weeks")  # 3 shingles change: 16 / 22
TWO_WORDS = BASE.replace("two weeks", "three weeks").replace(" so i ", " so we ")  # 6 change: 13 / 25
INSERTED = BASE.replace("box was", "box was badly")  # 2 shingles lost, 3 new: 17 / 22


def _by_kind(leaks: list[LeakPair], kind: str) -> set[tuple[str, int, str, int]]:
    return {(x.a_split, x.a_index, x.b_split, x.b_index) for x in leaks if x.kind == kind}


def test_normalize_case_space_and_edge_punctuation():
    assert normalize_text("  Hello,\tWORLD!!\n(yes) ") == "hello world yes"
    assert normalize_text("Don't stop: e.g. 3.5 -- ok...") == "don't stop e.g 3.5 ok"
    assert normalize_text("ＡＢＣ ﬁne Straße") == "abc fine strasse"  # NFKC + casefold
    assert normalize_text("(+) costs $5.") == "+ costs $5"  # symbols are not punctuation
    assert normalize_text(" ... !! ") == ""
    for text in ["«Quoted»  — ℌello", "a)b (c", BASE, "__init__ x_y"]:
        once = normalize_text(text)
        assert normalize_text(once) == once
    with pytest.raises(TypeError):
        normalize_text(b"bytes")  # type: ignore[arg-type]


def test_planted_exact_duplicates_differ_only_in_case_space_punctuation():
    train = TICKETS[:6]
    test = ["Totally unrelated words here about cats", f"  {TICKETS[2].upper()}!!  ", TICKETS[4].replace(" ", "\n  ")]
    test.append('"' + TICKETS[5].replace(" order ", ", order, ") + '."')
    leaks = find_leaks({"train": train, "test": test}, [("train", "test")], threshold=0.8)
    assert _by_kind(leaks, "exact") == {("train", 2, "test", 1), ("train", 4, "test", 2), ("train", 5, "test", 3)}
    assert all(x.similarity == 1.0 for x in leaks if x.kind == "exact")
    assert _by_kind(leaks, "near") == set()  # an exact duplicate is reported once, as exact


@pytest.mark.parametrize(
    ("edited", "jaccard"), [(ONE_WORD, 16 / 22), (TWO_WORDS, 13 / 25), (INSERTED, 17 / 22)], ids=["1sub", "2sub", "ins"]
)
def test_planted_near_duplicate_found_with_exact_jaccard(edited, jaccard):
    train = TICKETS[1:] + [BASE]
    test = ["unrelated words about cats and dogs playing in the park all afternoon", edited]
    leaks = find_leaks({"train": train, "test": test}, [("train", "test")], threshold=0.5)
    assert leaks == [LeakPair("near", "train", len(train) - 1, "test", 1, pytest.approx(jaccard))]
    assert 0.5 <= leaks[0].similarity < 1.0


def test_threshold_cuts_at_exact_jaccard():
    splits = {"train": [BASE], "test": [ONE_WORD, TWO_WORDS]}
    assert _by_kind(find_leaks(splits, [("train", "test")], threshold=0.7), "near") == {("train", 0, "test", 0)}
    assert find_leaks(splits, [("train", "test")], threshold=0.75) == []


def test_unrelated_texts_on_the_same_topic_are_not_reported():
    leaks = find_leaks({"train": TICKETS[:4], "test": TICKETS[4:]}, [("train", "test")], threshold=0.3)
    assert leaks == []


def test_short_texts_use_the_word_set():
    splits = {"train": ["password reset", "refund", "where is my order"], "test": ["Reset password!", "REFUND."]}
    leaks = find_leaks(splits, [("train", "test")], threshold=0.9)
    assert leaks == [LeakPair("near", "train", 0, "test", 0, 1.0), LeakPair("exact", "train", 1, "test", 1, 1.0)]


def test_blank_and_punctuation_only_texts_are_never_leaks():
    splits = {"train": ["", "  ", "...", "ok then"], "test": ["", "!!", "OK, then"]}
    assert find_leaks(splits, [("train", "test")], threshold=0.5) == [LeakPair("exact", "train", 3, "test", 2, 1.0)]


def _three_splits() -> dict[str, list[str]]:
    return {
        "train": TICKETS[1:6] + [BASE.upper()],  # [5] is an exact duplicate of eval[0]
        "eval": [BASE, TICKETS[6]],
        "test": [TICKETS[7], ONE_WORD, TICKETS[6] + "!"],  # near of eval[0] and train[5], exact of eval[1]
    }


def test_only_requested_pairs_and_their_orientation():
    splits = _three_splits()
    leaks = find_leaks(splits, [("train", "eval")], threshold=0.6)
    assert leaks == [LeakPair("exact", "train", 5, "eval", 0, 1.0)]
    leaks = find_leaks(splits, [("test", "eval")], threshold=0.6)
    assert _by_kind(leaks, "exact") == {("test", 2, "eval", 1)}
    assert _by_kind(leaks, "near") == {("test", 1, "eval", 0)}


def test_deterministic_sorted_and_independent_of_pair_order():
    splits = _three_splits()
    pairs = [("train", "eval"), ("train", "test"), ("eval", "test")]
    first = find_leaks(splits, pairs, threshold=0.6)
    assert first == find_leaks(splits, pairs, threshold=0.6)
    assert first == find_leaks(splits, list(reversed(pairs)) + [pairs[0]], threshold=0.6)
    assert first == sorted(first, key=lambda x: (x.a_split, x.a_index, x.b_split, x.b_index))
    assert _by_kind(first, "exact") == {("train", 5, "eval", 0), ("eval", 1, "test", 2)}
    assert _by_kind(first, "near") == {("train", 5, "test", 1), ("eval", 0, "test", 1)}


def test_matches_brute_force_on_random_texts():
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(300)]
    weights = [1 / (i + 1) for i in range(len(vocab))]  # Zipf-like: common words shared across texts

    def text() -> str:
        return " ".join(rng.choices(vocab, weights, k=rng.randint(8, 40)))

    train = [text() for _ in range(300)]
    test = [text() for _ in range(120)]
    for k in range(40):  # near duplicates: one word replaced, inserted or deleted
        words = train[k * 7].split()
        pos = rng.randrange(len(words))
        edit = k % 3
        words[pos : pos + (edit != 1)] = [] if edit == 2 else ["zz"]
        test[k] = " ".join(words)
    threshold = 0.6
    leaks = find_leaks({"train": train, "test": test}, [("train", "test")], threshold=threshold)

    def shingles(t: str) -> set[str]:
        w = t.split()
        return {" ".join(w[i : i + 3]) for i in range(len(w) - 2)} if len(w) >= 3 else set(w)

    truth = set()
    for i, a in enumerate(train):
        for j, b in enumerate(test):
            sa, sb = shingles(a), shingles(b)
            if a != b and len(sa & sb) / len(sa | sb) >= threshold:
                truth.add(("train", i, "test", j))
    assert len(truth) >= 30  # the plant worked: most edits keep Jaccard above 0.6
    assert _by_kind(leaks, "near") == truth
    assert _by_kind(leaks, "exact") == set()


def test_each_text_sketched_once_and_only_the_smaller_side_indexed(monkeypatch):
    sketched, indexes, inserted = [], [], []
    real_sketch = leakcheck._sketch

    def counting_sketch(texts, k, a, b):
        sketched.extend(texts)
        return real_sketch(texts, k, a, b)

    class RecordingIndex(leakcheck.BandIndex):
        def __init__(self, bands):
            super().__init__(bands)
            indexes.append(self)

        def insert(self, keys, table):
            inserted.extend(keys)
            super().insert(keys, table)

    monkeypatch.setattr(leakcheck, "_sketch", counting_sketch)
    monkeypatch.setattr(leakcheck, "BandIndex", RecordingIndex)
    splits = {
        "train": [f"{TICKETS[k % 8]} case {k}" for k in range(60)] + [""],
        "eval": [f"{TICKETS[k % 8]} case {k}" for k in range(100, 110)],
        "test": [f"{TICKETS[k % 8]} case {k}" for k in range(200, 220)],
    }
    leaks = find_leaks(splits, [("train", "eval"), ("train", "test"), ("eval", "test")], threshold=0.8)
    assert len(sketched) == 60 + 10 + 20  # the blank train text is skipped
    assert len(indexes) == 2 and len(inserted) == 10 + 20  # eval and test are indexed, train only queries
    assert leaks and {x.kind for x in leaks} == {"near"}  # same ticket, different case number
    assert all(len(index.sorted) == index.bands and len(index.sorted[0]) in (10, 20) for index in indexes)


def test_worker_processes_find_what_one_process_finds():
    """Sketches made by two worker processes (spawned, as on a large split) give the same leaks, pair for
    pair and similarity for similarity, as this process alone; blank texts and parts of several batches
    included."""
    rng = random.Random(8)
    words = [f"w{k}" for k in range(400)]
    base = [" ".join(rng.choices(words, k=rng.randint(1, 30))) for _ in range(2600)]
    test = [t if k % 3 else t + " extra" for k, t in enumerate(base[:300])] + ["", "  ", "!!"]
    splits = {"train": base[300:] + base[:40] + [""], "test": test}
    one = find_leaks(splits, [("train", "test")], threshold=0.6, processes=1)
    two = find_leaks(splits, [("train", "test")], threshold=0.6, processes=2)
    assert two == one
    assert {leak.kind for leak in one} == {"exact", "near"}


@pytest.mark.parametrize("num_perm", [64, 128])
@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.8, 1.0])
def test_lsh_bands_keep_recall_at_the_threshold(threshold, num_perm):
    bands, rows = leakcheck._lsh_params(threshold, num_perm)
    assert bands >= 2 and bands * rows <= num_perm
    assert 1 - (1 - threshold**rows) ** bands >= 0.99


def test_minimum_num_perm_and_threshold_one():
    splits = {"a": [BASE, "x y z w"], "b": ["y z x w", BASE + "."]}
    assert find_leaks(splits, [("a", "b")], threshold=1.0, num_perm=16) == [LeakPair("exact", "a", 0, "b", 1, 1.0)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 0.0}, "threshold"),
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": -0.1}, "threshold"),
        ({"num_perm": 15}, "num_perm"),
        ({"shingle": 0}, "shingle"),
        ({"pairs": [("train", "dev")]}, "unknown split 'dev'"),
        ({"pairs": [("train", "train")]}, "itself"),
        ({"pairs": [("train", "test"), ("test", "train")]}, "both given"),
    ],
)
def test_bad_input_raises_value_error(kwargs, message):
    args = {"splits": {"train": ["a b c"], "test": ["a b c"]}, "pairs": [("train", "test")], "threshold": 0.8}
    with pytest.raises(ValueError, match=message):
        find_leaks(**{**args, **kwargs})


def test_all_problems_in_one_error():
    with pytest.raises(ValueError) as err:
        find_leaks({"train": []}, [("train", "test")], threshold=2, num_perm=4)
    assert all(word in str(err.value) for word in ("threshold", "num_perm", "'test'"))


def test_version_is_recorded():
    assert LEAKCHECK_VERSION == "leak-1"


def test_band_index_answers_what_datasketch_minhashlsh_answers():
    """BandIndex replaces datasketch's MinHashLSH for memory; for the same bands it must give the same
    candidates, query by query."""
    import zlib

    from datasketch import MinHash, MinHashLSH

    rng = random.Random(3)
    words = [f"w{k}" for k in range(60)]
    texts = [" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(400)]
    sketches = list(
        MinHash.generator(
            ([w.encode() for w in leakcheck._shingles(t, 1)] for t in texts),
            num_perm=64,
            seed=1,
            hashfunc=zlib.crc32,
            scheme="affine32",
        )
    )
    bands, rows = leakcheck._lsh_params(0.5, 64)
    reference, index = MinHashLSH(num_perm=64, params=(bands, rows)), leakcheck.BandIndex(bands)
    for key, sketch in enumerate(sketches[:250]):
        reference.insert(key, sketch)
    table = leakcheck._band_hashes(np.stack([s.hashvalues for s in sketches]), bands, rows)
    index.insert(list(range(250)), table[:250])
    index.freeze()
    answers = list(zip([set(reference.query(s)) for s in sketches], index.query(table), strict=True))
    assert all(theirs == ours for theirs, ours in answers)
    assert sum(len(ours) for _, ours in answers[250:]) > 0  # queries that are not in the index find candidates


def _normalize_by_runs(text: str) -> str:
    """normalize_text as it was first written (a run of non-word characters at a word edge loses its
    leading or trailing punctuation, through a regex callback): the reference its word-by-word form must
    equal."""
    import re
    import unicodedata

    def is_punct(ch: str) -> bool:
        return unicodedata.category(ch)[0] == "P"

    def strip(match: re.Match[str]) -> str:
        run, whole, start, end = match.group(), match.string, match.start(), match.end()
        if start == 0 or whole[start - 1].isspace():
            i = 0
            while i < len(run) and is_punct(run[i]):
                i += 1
            run = run[i:]
        if end == len(whole) or whole[end].isspace():
            j = len(run)
            while j > 0 and is_punct(run[j - 1]):
                j -= 1
            run = run[:j]
        return run

    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(re.sub(r"(?:[^\w\s]|_)+", strip, folded).split())


def test_normalize_equals_the_run_by_run_reference_on_random_text():
    """200,000 random strings over letters, digits, every kind of space, punctuation of many scripts,
    symbols, combining marks and compatibility forms: the word-by-word normaliser equals the reference."""
    import random
    import unicodedata

    rng = random.Random(11)
    categories = collections.defaultdict(list)
    for code in range(0x3000):
        categories[unicodedata.category(chr(code))[0]].append(chr(code))
    alphabet = (
        list("ab Z9_ \t\n\u00a0\u2003\x1c") * 20
        + categories["P"]
        + categories["S"][:400]
        + categories["M"][:200]
        + categories["Z"]
        + list("ＡＢ①ﬁ℃¼ǅ") * 5
        + ["\U0001f600", "\u061f", "\u3001", "\ufe50", "\uff01"]
    )
    for _ in range(200_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert normalize_text(text) == _normalize_by_runs(text), repr(text)


@pytest.mark.parametrize(("num_perm", "seed", "shingle"), [(128, 1, 3), (64, 7, 1), (16, 2**31 - 1, 2)])
def test_sketches_equal_datasketch_minhash_value_for_value(num_perm, seed, shingle):
    """The numpy sketches are datasketch's MinHash (crc32, scheme affine32) of the same shingles, so the
    band hashes, hence the LSH candidates, are those of datasketch."""
    import zlib

    from datasketch import MinHash

    rng = random.Random(seed)
    words = [f"w{k}" for k in range(300)] + ["ünïcödé", "日本語", "x"]
    texts = [" ".join(rng.choices(words, k=rng.randint(1, 60))) for _ in range(700)]
    grams = [leakcheck._shingles(normalize_text(t), shingle) for t in texts]
    theirs = np.stack(
        [
            m.hashvalues
            for m in MinHash.generator(
                ([g.encode() for g in gs] for gs in grams),
                num_perm=num_perm,
                seed=seed,
                hashfunc=zlib.crc32,
                scheme="affine32",
            )
        ]
    )
    a, b = leakcheck._permutations(num_perm, seed)
    normalized = [normalize_text(t) for t in texts]
    assert (leakcheck._sketch(normalized, shingle, a, b) == theirs).all()
    assert (leakcheck._sketch(normalized[5:6], shingle, a, b) == theirs[5:6]).all()  # a batch of one text


def test_crc32_of_byte_ranges_equals_zlib():
    """The vectorised crc32 gives zlib's value for every range: lengths 1 to 300, any bytes, ranges that
    overlap and repeat."""
    import zlib

    rng = np.random.default_rng(5)
    buf = rng.integers(0, 256, size=5000, dtype=np.uint8)
    lengths = np.concatenate([rng.integers(1, 40, size=2000), [1, 1, 300, 299, 17]])
    starts = rng.integers(0, len(buf) - 300, size=len(lengths))
    ours = leakcheck._crc32_ranges(buf, starts, lengths)
    data = buf.tobytes()
    assert ours.tolist() == [zlib.crc32(data[s : s + n]) for s, n in zip(starts, lengths, strict=True)]
