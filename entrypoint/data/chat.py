"""Chat data for causal LMs: rows in the `messages`, `sharegpt` or `alpaca` format become one conversation
shape, rendered with the model's own chat template, with the loss on what the assistant generates only.

    read:    {"messages": [{"role", "content", ["reasoning_content"]}...]} | {"conversations": [{"from",
             "value"}...]} | {"instruction", "input", "output"}  ->  {"messages", "prompt", "response", "label"}
    encode:  the conversation rendered once (with data.chat_template_kwargs) and tokenized once; a token
             counts in the loss only inside a trained assistant turn's span
    prompt:  the turns before the last assistant turn, rendered with the template's generation prompt

A span runs from where the model starts generating to its end-of-turn token, inclusive, and is found in the
one rendering, turn after turn: the template's generation prompt (or, for a turn in the history, the header
it writes there, which may be shorter: Qwen3's empty think block belongs to the generation prompt only with
enable_thinking false), then the turn's content, then a special token. Text the template itself writes
between header and content (an empty think block, the reasoning it renders) lies inside the span and is
trained, because the model has to produce it; with `train_on_reasoning: false` the span starts at the
content. A template that renders history differently once later turns follow (reasoning dropped, the system
prompt moved next to the last user turn) is trained on each turn as the final rendering shows it: that is
what the model sees at inference with that history. Only what cannot be located is refused: content the
template changes, an answer no special token ends, a span that would cut a token. A template with
`{% generation %}` markers gives the mask itself (transformers' return_assistant_tokens_mask), checked to
hold every span found in the rendering.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from entrypoint.data.cleaning import apply_rules
from entrypoint.data.encoding import IGNORE_INDEX, Encoded, reaches
from entrypoint.data.reading import WHERE, DataError, RawFile, a_type, cluster_of, records

__all__ = [
    "REASONING_FIELDS",
    "ChatTemplate",
    "RenderedChat",
    "Span",
    "TemplateError",
    "chat_rows",
    "clean_chat",
    "encode_chat",
    "finish_chat",
    "render_chat",
]

ROLES = ("system", "user", "assistant")
REASONING_FIELDS = ("reasoning_content", "thinking")  # on assistant turns, passed to the template as given
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


class TemplateError(DataError):
    """The chat template cannot be split into turns (or a row renders in a way that cannot be masked)."""


# -- reading -------------------------------------------------------------------------------------------


def _turns(obj: dict, fmt: str) -> tuple[list[dict] | None, str | None]:
    """The row as [{"role", "content"}], or the problem, naming the field."""
    if fmt == "alpaca":
        parts = {}
        for name in ("instruction", "input", "output"):
            value = obj.get(name)
            if name == "input" and value is None:  # absent or null: no input, as the format allows
                value = ""
            if not isinstance(value, str):
                what = "missing" if value is None else a_type(value)
                return None, f"field {name!r} is {what}; expected text"
            parts[name] = value
        user = parts["instruction"] + (f"\n\n{parts['input']}" if parts["input"].strip() else "")
        return [{"role": "user", "content": user}, {"role": "assistant", "content": parts["output"]}], None
    field, role_key, content_key = (
        ("messages", "role", "content") if fmt == "messages" else ("conversations", "from", "value")
    )
    turns = obj.get(field)
    if not isinstance(turns, list) or not turns:
        what = "missing" if turns is None else "empty" if turns == [] else a_type(turns)
        return None, f"field {field!r} is {what}; expected a list of turns"
    out = []
    for i, turn in enumerate(turns):
        where = f"{field}[{i}]"
        if not isinstance(turn, dict):
            return None, f"{where} is {a_type(turn)}; expected an object with {role_key!r} and {content_key!r}"
        role, content = turn.get(role_key), turn.get(content_key)
        roles = ROLES if fmt == "messages" else tuple(SHAREGPT_ROLES)
        if role not in roles:
            return None, f"{where}.{role_key} is {role!r}; expected one of {', '.join(roles)}"
        if not isinstance(content, str):
            what = "missing" if content is None else a_type(content)
            return None, f"{where}.{content_key} is {what}; expected text"
        out.append({"role": role if fmt == "messages" else SHAREGPT_ROLES[role], "content": content})
        for name in REASONING_FIELDS if fmt == "messages" else ():  # passed to the template as given
            value = turn.get(name)
            if value is None:
                continue
            if role != "assistant" or not isinstance(value, str):
                what = f"on a {role} turn" if role != "assistant" else a_type(value)
                return None, f"{where}.{name} is {what}; expected text on an assistant turn"
            out[-1][name] = value
    return out, None


def _problem(turns: list[dict], train_on: str) -> str | None:
    """What makes a conversation untrainable, or None."""
    for i, turn in enumerate(turns):
        if not turn["content"].strip():
            return f"turn {i} ({turn['role']}) has empty content; expected text"
        if turn["role"] == "system" and i > 0:
            return f"turn {i} is a system turn; expected the system turn first or not at all"
    roles = [t["role"] for t in turns]
    if "assistant" not in roles:
        return "no assistant turn; expected at least one to train on"
    if "user" not in roles[: roles.index("assistant")]:
        return "an assistant turn comes before any user turn; expected the user to speak first"
    if train_on == "last_assistant" and roles[-1] != "assistant":
        return f"the last turn is from the {roles[-1]}; expected the assistant (data.train_on: last_assistant)"
    return None


def chat_row(turns: list[dict], label: str) -> dict:
    """The canonical row: the turns up to the last assistant turn (later ones carry no loss), the text of
    the turns before it (`prompt`, for de-duplication and the leak check) and its content (`response`, the
    reference the metrics compare generations with)."""
    last = max(i for i, t in enumerate(turns) if t["role"] == "assistant")
    turns = turns[: last + 1]
    prompt = "\n".join(f"{t['role']}: {t['content']}" for t in turns[:last])
    return {"messages": turns, "prompt": prompt, "response": turns[last]["content"], "label": label}


def chat_rows(
    raw: RawFile, fmt: str, group_field: str | None, train_on: str, errors: list[str], cluster_field: str | None = None
) -> Iterator[dict]:
    """Canonical chat rows one at a time; bad rows go to `errors` as file, row: why (`refuse` them after).
    With `cluster_field`, each row also carries its `cluster` (data.cluster_field)."""
    for where, obj in records(raw, errors):
        turns, problem = _turns(obj, fmt)
        problem = problem or _problem(turns, train_on)
        if problem:
            errors.append(f"{where}: {problem}")
            continue
        group = obj.get(group_field, "all") if group_field else "all"
        row = chat_row(turns, group if isinstance(group, str) else str(group))
        row[WHERE] = where
        if cluster_field is not None:
            row["cluster"] = cluster_of(obj, cluster_field, where, errors)
            if row["cluster"] is None:
                continue
        yield row


def clean_chat(rows: list[dict], rules) -> tuple[list[dict], dict[str, int]]:
    """The cleaning rules applied to every turn's content (counts are per turn); a conversation with a turn
    that `drop_empty` drops is dropped whole."""
    turns = [
        {"text": t["content"], "row": i, "turn": j} for i, r in enumerate(rows) for j, t in enumerate(r["messages"])
    ]
    cleaned, counts = apply_rules(turns, ("text",), rules)
    contents: dict[int, dict[int, str]] = {}
    for t in cleaned:
        contents.setdefault(t["row"], {})[t["turn"]] = t["text"]
    out = []
    for i, row in enumerate(rows):
        kept = contents.get(i, {})
        if len(kept) == len(row["messages"]):
            turns = [{**t, "content": kept[j]} for j, t in enumerate(row["messages"])]
            extra = {key: row[key] for key in ("cluster", WHERE) if key in row}
            out.append({**chat_row(turns, row["label"]), **extra})
    return out, counts


# -- the template -------------------------------------------------------------------------------------

# `{% generation %}` ... `{% endgeneration %}`: a template's own marking of what the assistant generates
_GENERATION_MARKER = re.compile(r"{%-?\s*generation\s*-?%}")


class Span(NamedTuple):
    """Where assistant turn `turn` lies in a rendering: the model generates from `start` (where the
    generation prompt ends; text the template inserts there, such as an empty think block, lies inside)
    through its content (from `content`) to its end-of-turn token, inclusive, ending at `end`."""

    turn: int
    start: int
    content: int
    end: int
    end_of_turn: str
    note: str | None = None  # how the template rewrote the turn (reasoning stripped), for the inspection


class ChatTemplate:
    """A tokenizer with the chat template it renders with (the tokenizer's own, or `source`'s file) and
    the arguments every rendering gets (`kwargs`: data.chat_template_kwargs, such as enable_thinking)."""

    def __init__(self, tokenizer, source: str | None = None, kwargs: dict | None = None):
        if source:
            tokenizer.chat_template = Path(source.removeprefix("file://")).read_text()
        if not tokenizer.chat_template:
            raise TemplateError(
                "model: the tokenizer has no chat template; set data.chat_template to a Jinja file, or use "
                "data.format: prompt_response with data.template"
            )
        self.tokenizer = tokenizer
        self.text = tokenizer.chat_template
        self.kwargs = dict(kwargs or {})
        self.sha256 = hashlib.sha256(self.text.encode()).hexdigest()
        self.markers = bool(_GENERATION_MARKER.search(self.text))
        # longest first, so that a special token that starts with another is matched whole
        specials = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
        self._specials = sorted((token for token in specials if token), key=len, reverse=True)
        self.generation_prompt, self.header = self._headers()
        self.role_stop = self._role_stop()
        probe = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
        self.end_of_turn = self.spans(probe)[0].end_of_turn
        self.notes = self._notes()
        if self.role_stop:
            self.notes.append(
                f"answers end where the next turn's {self.role_stop} begins (the template writes no end-of-turn "
                f"token): the model is trained to emit {self.role_stop} after its answer, generation stops on it, "
                "and the export's generation config and Modelfile list it as a stop"
            )

    def render(self, turns: Sequence[dict], generation_prompt: bool) -> str:
        """The template's rendering of `turns`. Raises TemplateError with the template's own message when
        it refuses a conversation (Gemma 2's "System role not supported")."""
        try:
            return self.tokenizer.apply_chat_template(
                list(turns), tokenize=False, add_generation_prompt=generation_prompt, **self.kwargs
            )
        except TemplateError:
            raise
        except Exception as exc:  # jinja2's TemplateError, or raise_exception() inside the template
            raise TemplateError(f"the chat template refuses this conversation: {exc}") from None

    def _headers(self) -> tuple[str, str]:
        """What the template writes before an assistant turn: its generation prompt (what a model
        answering now is given) and the header of an assistant turn in the history, which may be shorter
        (Qwen3 adds an empty think block to the generation prompt only with enable_thinking: false). A
        header of whitespace alone (Mistral's " " after [/INST]) starts at the special token before it."""
        user = [{"role": "user", "content": "Hi."}]
        plain, prompted = self.render(user, False), self.render(user, True)
        prompt = prompted[len(plain) :] if prompted.startswith(plain) else ""
        first, second = "Hello there.", "Goodbye now."
        history = [*user, {"role": "assistant", "content": first}, {"role": "user", "content": "Bye."}]
        whole = self.render([*history, {"role": "assistant", "content": second}], False)
        at = whole.find(first)
        header = whole[len(plain) : at] if at >= 0 and whole.startswith(plain) else ""
        if not header.strip() and at >= 0:
            before = whole[:at]
            special = max((before.rfind(token) for token in self._specials), default=-1)
            header = before[special:] if special >= 0 else header
        if not (prompt.strip() or header.strip()):
            raise TemplateError(
                "data.chat_template: the template writes nothing before an assistant turn (no generation prompt, "
                "no role header), so where the model starts answering cannot be found; rentune will not guess a mask"
            )
        return prompt, header

    def _role_stop(self) -> str | None:
        """The special token that ends an answer in a template that writes none after the last one (GLM:
        an answer ends where the next role's `<|user|>` begins, and GLM's generation config stops on it):
        the special token right after an answer in the history, when the last answer has nothing after
        it. None for a template that ends every answer with a token of its own."""
        user, answer = {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}
        last = self.render([user, answer], False)
        if not last.rstrip().endswith("Hello."):
            return None
        history = self.render([user, answer, {"role": "user", "content": "Bye."}], False)
        rest = history[history.find("Hello.") + len("Hello.") :].lstrip()
        return next((token for token in self._specials if rest.startswith(token)), None)

    def answered(self, turns: Sequence[dict]) -> str:
        """The rendering of `turns` that training sees: the template's, with the role stop appended when the
        conversation ends with an answer the template leaves open (`role_stop`)."""
        whole = self.render(turns, False)
        if (
            self.role_stop
            and turns
            and turns[-1]["role"] == "assistant"
            and whole.rstrip().endswith(turns[-1]["content"].strip().rpartition("</think>")[2].strip())
        ):
            return whole + self.role_stop
        return whole

    def _notes(self) -> list[str]:
        """What this template does to conversations that a user should know, found on probes: where a
        rendering of answered turns differs from the prompt the model answers from at eval."""
        notes = []
        user, answer = {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}
        marker = "Probe system prompt."
        try:
            prompted = self.render([{"role": "system", "content": marker}, user], True)
            answered = self.render([{"role": "system", "content": marker}, user, answer], False)
        except TemplateError:  # a template without system turns (Gemma 2): rows with one are refused
            prompted = answered = marker
        if marker in prompted and marker not in answered:
            notes.append(
                "the system prompt is rendered only when the conversation ends with a user turn: trained without it"
            )
        reasoning = "Probe reasoning."
        thought = {**answer, "reasoning_content": reasoning}
        last = self.render([user, thought], False)
        earlier = self.render([user, thought, {"role": "user", "content": "Bye."}, answer], False)
        if reasoning in last and reasoning not in earlier:
            notes.append("reasoning of earlier answers is left out of the rendering: they are trained as rendered")
        rendered = self.render([user, answer], False)
        if "<think>" in self.generation_prompt and "<think>" not in rendered:
            notes.append(
                "the generation prompt opens a think block that rendered answers do not have: answers are trained "
                "as rendered"
            )
        return notes

    def spans(self, turns: Sequence[dict], whole: str | None = None) -> list[Span]:
        """Every assistant turn's span in one rendering of `turns` (`whole`), found in order: its header
        (the earliest of the generation prompt and the history header after the previous turn), then its
        content (as given, or stripped, or without the reasoning a template removes from history), then an
        end-of-turn special token. A turn whose content the template changed, or that no special token
        ends, is refused (TemplateError)."""
        whole = self.answered(turns) if whole is None else whole
        headers = [h for h in dict.fromkeys((self.generation_prompt, self.header)) if h.strip()]
        found, cursor = [], 0
        for i, turn in enumerate(turns):
            if turn["role"] != "assistant":
                continue
            # at one place, the generation prompt wins: what a longer history header adds (GLM's empty think
            # block) is what the model generates after the prompt it is given
            hits = sorted(
                (at, h != self.generation_prompt, -len(h), h) for h in headers if (at := whole.find(h, cursor)) >= 0
            )
            if not hits:
                raise TemplateError(f"data.chat_template: assistant turn {i} has no assistant header in the rendering")
            at, _, _, header = hits[0]
            start = at + len(header)
            following = min((p for h in headers if (p := whole.find(h, start)) >= 0), default=len(whole))
            content, text, note = _located(whole, turn, start, following)
            if content is None:
                raise TemplateError(
                    f"data.chat_template: assistant turn {i}'s content is not in the rendering after its header; the "
                    "template changes the content, and rentune will not guess a mask"
                )
            reasoning = next((turn[f] for f in REASONING_FIELDS if isinstance(turn.get(f), str)), "").strip()
            if reasoning and reasoning not in whole[start:content]:
                note = "turn {turn}'s reasoning is not in the rendering: trained as rendered"
            rest = whole[content + len(text) :]
            gap = len(rest) - len(rest.lstrip())
            eot = next((token for token in self._specials if rest[gap:].startswith(token)), None)
            if eot is None:
                raise TemplateError(
                    f"data.chat_template: no end-of-turn special token right after assistant turn {i} "
                    f"(found {rest[:20]!r}); the model could not learn where its answer ends"
                )
            end = content + len(text) + gap + len(eot)
            found.append(Span(i, start, content, end, eot, note.format(turn=i) if note else None))
            cursor = end
        return found

    def reach(self, turns: Sequence[dict], max_length: int) -> int:
        """How many leading turns can matter at `max_length` tokens: the fewest whose rendering already
        holds max_length tokens (every later turn would be cut), or all of them. Only prefixes that end
        with an assistant turn are rendered: templates refuse others (Qwen3.5's "No user query found" for
        a system turn alone). Found by doubling the assistant turns, so a conversation of any length costs
        about two renderings of what fits, never one per turn."""
        ends = [i + 1 for i, turn in enumerate(turns) if turn["role"] == "assistant"]
        count = 1
        while count < len(ends):
            if reaches(self.tokenizer, self.render(turns[: ends[count - 1]], False), max_length):
                return ends[count - 1]
            count *= 2
        return len(turns)

    def trainable(self, turns: Sequence[dict], train_on: str, max_length: int) -> bool:
        """Whether the first counted assistant turn starts within max_length tokens, so that the row
        trains (and is scored) on something once cut to max_length."""
        first = _targets(turns, train_on)[0]
        return not reaches(self.tokenizer, self.render(turns[:first], True), max_length - 1)

    def assistant_mask(self, turns: Sequence[dict]) -> tuple[list[int], list[int]]:
        """Input ids and the template's own assistant mask (its `{% generation %}` markers, read through
        transformers' return_assistant_tokens_mask)."""
        out = self.tokenizer.apply_chat_template(
            list(turns), tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **self.kwargs
        )
        return list(out["input_ids"]), list(out["assistant_masks"])

    def prompt(self, turns: Sequence[dict]) -> str:
        """The rendering a model answers the last assistant turn from: the turns before it, then the
        generation prompt."""
        return self.render(turns[:-1], True)


def _located(whole: str, turn: dict, start: int, limit: int) -> tuple[int | None, str, str | None]:
    """Where a turn's content starts in `whole` between its header (`start`) and the next header
    (`limit`), the text found there, and a note when the template rendered it otherwise (a template that
    keeps only the answer after a `</think>` in the content)."""
    content = turn["content"].strip()
    at = whole.find(content, start)
    if 0 <= at < limit:
        return at, content, None
    answer = content.rpartition("</think>")[2].strip()
    if "</think>" in content and answer and 0 <= (at := whole.find(answer, start)) < limit:
        return at, answer, "turn {turn}'s reasoning is not in the rendering: trained as rendered"
    return None, content, None


def _targets(turns: Sequence[dict], train_on: str) -> list[int]:
    """The assistant turns that count in the loss."""
    targets = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
    return targets[-1:] if train_on == "last_assistant" else targets


def encode_chat(
    template: ChatTemplate, turns: Sequence[dict], train_on: str, max_length: int, train_on_reasoning: bool = True
) -> Encoded:
    """Input ids of the conversation and labels that keep only what the model must generate in the counted
    assistant turns: from where the generation prompt ends (template-inserted text and reasoning included,
    unless `train_on_reasoning` is false: then from the content) through the end-of-turn token. With
    `{% generation %}` markers the template's own mask decides, checked to hold those spans. Only the turns
    max_length can reach are rendered (ChatTemplate.reach); for a conversation cut that way, `full_length`
    counts the tokens up to the first turn past max_length, not the whole conversation."""
    rendered = render_chat(template, turns, train_on, max_length)
    encoded = template.tokenizer(rendered.whole, add_special_tokens=False, return_offsets_mapping=True)
    return finish_chat(
        template, rendered, encoded["input_ids"], encoded["offset_mapping"], max_length, train_on_reasoning
    )


@dataclass(frozen=True)
class RenderedChat:
    """A conversation rendered for encoding: the turns max_length can reach, their rendering, the spans of
    their assistant turns and which of those count in the loss."""

    turns: Sequence[dict]
    whole: str
    spans: list
    targets: set[int]


def render_chat(template: ChatTemplate, turns: Sequence[dict], train_on: str, max_length: int) -> RenderedChat:
    """The first half of encode_chat: everything before the rendering is tokenized (the data phase
    tokenizes a batch of renderings in one call, then finishes each with finish_chat)."""
    targets = set(_targets(turns, train_on))
    turns = turns[: template.reach(turns, max_length)]
    whole = template.answered(turns)
    return RenderedChat(turns, whole, template.spans(turns, whole), targets)


def finish_chat(
    template: ChatTemplate,
    rendered: RenderedChat,
    ids: list[int],
    offsets: Sequence[tuple[int, int]],
    max_length: int,
    train_on_reasoning: bool = True,
) -> Encoded:
    """The second half of encode_chat: the labels from the rendering's ids and offsets."""
    turns, whole, spans, targets = rendered.turns, rendered.whole, rendered.spans, rendered.targets
    counted = [_counted(whole, offsets, s, train_on_reasoning) for s in spans]
    if template.markers:
        counted = _marked(template, turns, ids, offsets, spans, counted, train_on_reasoning)
    labels = [IGNORE_INDEX] * len(ids)
    for span, positions in zip(spans, counted, strict=True):
        if span.turn in targets:
            for k in positions:
                labels[k] = ids[k]
    full = len(ids)
    ids, labels = ids[:max_length], labels[:max_length]
    features = {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}
    return Encoded(features, full, full > max_length)


def _counted(whole: str, offsets: Sequence[tuple[int, int]], span: Span, reasoning: bool) -> list[int]:
    """The token positions of `span` (from its content when not `reasoning`). A span starts on a token
    boundary, or widens over whitespace to the one before it; it ends on one; its tokens decode to it."""
    start = span.start if reasoning else span.content
    starts = {s: k for k, (s, e) in enumerate(offsets) if e > s}
    while start not in starts and start > 0 and whole[start - 1].isspace():
        start -= 1
    first = starts.get(start)
    last = next((k for k, (s, e) in enumerate(offsets) if e == span.end and e > s), None)
    if first is None or last is None:
        raise TemplateError(
            f"assistant turn {span.turn} ({whole[span.content : span.content + 40]!r}...) does not start and end on "
            "token boundaries; its loss mask would cut a token"
        )
    return list(range(first, last + 1))


def _marked(template, turns, ids, offsets, spans, counted, reasoning) -> list[list[int]]:
    """The template's `{% generation %}` mask, one run of tokens per assistant turn, each holding the
    turn's span (checked: a marked block that misses what the model must generate is refused)."""
    marked_ids, mask = template.assistant_mask(turns)
    runs, run = [], []
    for k, flag in enumerate(mask):
        if flag:
            run.append(k)
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    if marked_ids != ids or len(runs) != len(spans):
        raise TemplateError(
            f"data.chat_template: its generation markers mark {len(runs)} blocks for {len(spans)} assistant turns "
            "(or tokenize differently from the rendering); rentune will not guess which is which"
        )
    out = []
    for span, positions, marked in zip(spans, counted, runs, strict=True):
        if not set(positions) <= set(marked):
            raise TemplateError(
                f"data.chat_template: the generation markers of assistant turn {span.turn} leave out part of what "
                "the model must generate (its content or end-of-turn token)"
            )
        out.append([k for k in marked if reasoning or offsets[k][0] >= span.content])
    return out
