"""Padding-free packing (entrypoint/data/packing.py): rows hold whole examples, positions restart per
example, and, through the real transformers attention code, no example attends to another."""

from __future__ import annotations

import random

import pytest
import torch

from entrypoint.data.encoding import IGNORE_INDEX
from entrypoint.data.packing import PackedCollator, pack, row_boundaries
from tests.models import tiny_llama


def _examples(n: int, seed: int = 0, vocab: int = 500, longest: int = 40) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(3, longest)
        ids = [rng.randrange(5, vocab) for _ in range(length)]
        prompt = rng.randint(1, length - 1)
        out.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]})
    return out


def test_rows_hold_every_example_once_within_max_length():
    examples = _examples(200)
    rows = pack(examples, 64)
    assert all(len(r["input_ids"]) <= 64 for r in rows)
    seen = []
    for row in rows:
        assert len(row["input_ids"]) == len(row["labels"]) == len(row["position_ids"]) == sum(row["lengths"])
        for start, end in row_boundaries(row):
            assert row["position_ids"][start:end] == list(range(end - start))  # positions restart per example
            assert row["labels"][start] == IGNORE_INDEX  # never predicted from the previous example
            seen.append(tuple(row["input_ids"][start:end]))
    assert sorted(seen) == sorted(tuple(e["input_ids"]) for e in examples)
    tokens = sum(len(e["input_ids"]) for e in examples)
    assert tokens / (len(rows) * 64) > 0.9  # best-fit decreasing leaves rows nearly full
    assert pack(examples, 64) == rows  # deterministic


def test_labels_are_kept_except_each_examples_first():
    examples = _examples(30, seed=3)
    for row in pack(examples, 50):
        for (start, end), n in zip(row_boundaries(row), row["lengths"], strict=True):
            original = next(e for e in examples if e["input_ids"] == row["input_ids"][start:end])
            assert row["labels"][start + 1 : end] == original["labels"][1:n]


def test_an_example_longer_than_a_row_is_refused():
    with pytest.raises(ValueError, match="longer than model.max_length 8"):
        pack([{"input_ids": list(range(9)), "labels": list(range(9))}], 8)


def test_collator_pads_rows_as_a_separate_sequence():
    rows = pack(_examples(10, seed=1), 48)
    batch = PackedCollator(pad_token_id=0)(rows[:3])
    # no attention mask: the positions define it; no cache, or transformers would not look at them
    assert set(batch) == {"input_ids", "labels", "position_ids", "use_cache"} and batch["use_cache"] is False
    width = batch["input_ids"].shape[1]
    for i, row in enumerate(rows[:3]):
        n = len(row["input_ids"])
        assert batch["position_ids"][i, n:].tolist() == list(range(width - n))
        assert (batch["labels"][i, n:] == IGNORE_INDEX).all()


def _tiny_llama(attn: str):
    return tiny_llama(500, 128, heads=4, attn=attn).eval()


def _token_losses(logits: torch.Tensor, labels: list[int]) -> torch.Tensor:
    """Per-token cross entropy of next-token predictions, as the model's loss computes it (shifted)."""
    target = torch.tensor(labels[1:])
    return torch.nn.functional.cross_entropy(logits[:-1], target, ignore_index=IGNORE_INDEX, reduction="none")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packing_leaks_no_attention_between_examples(attn):
    model = _tiny_llama(attn)
    examples = _examples(12, seed=7)
    rows = pack(examples, 96)
    assert any(len(r["lengths"]) > 2 for r in rows)  # the test is about rows holding several examples
    batch = PackedCollator(pad_token_id=0)(rows)
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits  # the batch the Trainer passes
        alone = {tuple(e["input_ids"]): model(input_ids=torch.tensor([e["input_ids"]])).logits[0] for e in examples}
    total, count = 0.0, 0
    for i, row in enumerate(rows):
        for start, end in row_boundaries(row):
            ids = tuple(row["input_ids"][start:end])
            # the same logits as the example run on its own, token for token
            torch.testing.assert_close(packed[i, start:end], alone[ids], rtol=1e-4, atol=1e-5)
            example = next(e for e in examples if tuple(e["input_ids"]) == ids)
            losses = _token_losses(alone[ids], example["labels"])
            torch.testing.assert_close(
                _token_losses(packed[i, start:end], row["labels"][start:end]).sum(), losses.sum(), rtol=1e-4, atol=1e-5
            )
            total, count = total + losses.sum().item(), count + int((torch.tensor(example["labels"][1:]) != -100).sum())

    # The model's own loss over the packed batch (what the Trainer optimises) is the per-token mean over all
    # examples, exactly as unpacked.
    with torch.no_grad():
        loss = model(**batch).loss.item()
    assert loss == pytest.approx(total / count, rel=1e-4)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_changing_one_example_leaves_the_others_logits_unchanged(attn):
    model = _tiny_llama(attn)
    examples = _examples(6, seed=11, longest=20)
    rows = pack(examples, 128)
    assert len(rows) == 1 and len(rows[0]["lengths"]) == 6
    changed = [dict(e) for e in examples]
    target = rows[0]["input_ids"][: rows[0]["lengths"][0]]
    index = next(i for i, e in enumerate(examples) if e["input_ids"] == target)  # the row's first example
    changed[index] = {**examples[index], "input_ids": [(t + 17) % 500 for t in examples[index]["input_ids"]]}
    with torch.no_grad():
        before = model(**{k: v for k, v in PackedCollator(0)(rows).items() if k != "labels"}).logits[0]
        after_rows = pack(changed, 128)
        after = model(**{k: v for k, v in PackedCollator(0)(after_rows).items() if k != "labels"}).logits[0]
    bounds = row_boundaries(rows[0])
    assert after_rows[0]["lengths"] == rows[0]["lengths"]  # same lengths: same places in the row
    first = bounds[0]
    assert not torch.allclose(before[first[0] : first[1]], after[first[0] : first[1]])
    for start, end in bounds[1:]:  # the later examples see nothing of the changed one before them
        torch.testing.assert_close(before[start:end], after[start:end], rtol=0, atol=0)
