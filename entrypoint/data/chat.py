"""Chat data for causal LMs: rows in the `messages`, `sharegpt` or `alpaca` format become one conversation
shape, rendered with the model's own chat template, with the loss on assistant turns only.

    read:    {"messages": [{"role", "content"}...]} | {"conversations": [{"from", "value"}...]} |
             {"instruction", "input", "output"}  ->  {"messages", "prompt", "response", "label"}
    encode:  the whole conversation rendered once and tokenized once; a token counts in the loss only if it
             lies inside an assistant turn's content or the end-of-turn token right after it
    prompt:  the turns before the last assistant turn, rendered with the template's generation prompt

Assistant spans come from the template itself, rendered incrementally: for assistant turn i, the rendering
of turns [0, i) with the generation prompt must be a prefix of the rendering of turns [0, i], which must be
a prefix of the whole conversation; what lies between them is the turn (its content, maybe trimmed, then
an end-of-turn special token). Each span must start and end on a token boundary, and the counted tokens
must decode exactly to the contents plus their end-of-turn tokens. A template or row for which any of
this fails is refused with the reason, never trained on with a guessed mask.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from entrypoint.data.cleaning import apply_rules
from entrypoint.data.encoding import IGNORE_INDEX, Encoded, reaches
from entrypoint.data.reading import WHERE, DataError, RawFile, a_type, cluster_of, records

__all__ = [
    "ChatTemplate",
    "TemplateError",
    "chat_rows",
    "clean_chat",
    "encode_chat",
]

ROLES = ("system", "user", "assistant")
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


class ChatTemplate:
    """A tokenizer with the chat template it renders with (the tokenizer's own, or `source`'s file)."""

    def __init__(self, tokenizer, source: str | None = None):
        if source:
            tokenizer.chat_template = Path(source.removeprefix("file://")).read_text()
        if not tokenizer.chat_template:
            raise TemplateError(
                "model: the tokenizer has no chat template; set data.chat_template to a Jinja file, or use "
                "data.format: prompt_response with data.template"
            )
        self.tokenizer = tokenizer
        self.text = tokenizer.chat_template
        self.sha256 = hashlib.sha256(self.text.encode()).hexdigest()
        # longest first, so that a special token that starts with another is matched whole
        specials = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
        self._specials = sorted((token for token in specials if token), key=len, reverse=True)
        self.end_of_turn = self._end_of_turn()

    def render(self, turns: Sequence[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(list(turns), tokenize=False, add_generation_prompt=generation_prompt)

    def _end_of_turn(self) -> str:
        """The special token the template puts right after an assistant turn's content."""
        probe = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
        return self.span(probe, 1)[2]

    def span(self, turns: Sequence[dict], i: int, whole: str | None = None) -> tuple[int, int, str]:
        """(start, end, end-of-turn token) of assistant turn `i` in the rendering of `turns` (`whole`)."""
        whole = self.render(turns, False) if whole is None else whole
        before = self.render(turns[:i], True)
        through = self.render(turns[: i + 1], False)
        if not (through.startswith(before) and whole.startswith(through)):
            raise TemplateError(
                "data.chat_template: the template renders earlier turns differently once later turns follow "
                f"(turn {i}), so its rendering cannot be split into turns; rentune will not guess a mask"
            )
        content = turns[i]["content"].strip()
        tail = through[len(before) :]
        at = tail.find(content)
        if at < 0 or tail[:at].strip():
            raise TemplateError(
                f"data.chat_template: assistant turn {i}'s content does not follow the generation prompt; "
                "the template changes the content or adds text before it"
            )
        rest = tail[at + len(content) :]
        eot = next((token for token in self._specials if rest.startswith(token)), None)
        if eot is None:
            raise TemplateError(
                f"data.chat_template: no end-of-turn special token right after assistant turn {i} "
                f"(found {rest[:20]!r}); the model could not learn where its answer ends"
            )
        start = len(before) + at
        return start, start + len(content) + len(eot), eot

    def reach(self, turns: Sequence[dict], max_length: int) -> int:
        """How many leading turns can matter at `max_length` tokens: the fewest whose rendering already
        holds max_length tokens (every later turn would be cut), or all of them. Found by doubling, so a
        conversation of any length costs about two renderings of what fits, never one per turn."""
        count = 1
        while count < len(turns):
            if reaches(self.tokenizer, self.render(turns[:count], False), max_length):
                return count
            count *= 2
        return len(turns)

    def trainable(self, turns: Sequence[dict], train_on: str, max_length: int) -> bool:
        """Whether the first counted assistant turn starts within max_length tokens, so that the row
        trains (and is scored) on something once cut to max_length."""
        first = _targets(turns, train_on)[0]
        return not reaches(self.tokenizer, self.render(turns[:first], True), max_length - 1)

    def prompt(self, turns: Sequence[dict]) -> str:
        """The rendering a model answers the last assistant turn from: the turns before it, then the
        generation prompt."""
        return self.render(turns[:-1], True)


def _targets(turns: Sequence[dict], train_on: str) -> list[int]:
    """The assistant turns that count in the loss."""
    targets = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
    return targets[-1:] if train_on == "last_assistant" else targets


def encode_chat(template: ChatTemplate, turns: Sequence[dict], train_on: str, max_length: int) -> Encoded:
    """Input ids of the conversation and labels that keep only the counted assistant tokens. Only the turns
    max_length can reach are rendered (ChatTemplate.reach); for a conversation cut that way, `full_length`
    counts the tokens up to the first turn past max_length, not the whole conversation."""
    tokenizer = template.tokenizer
    targets = _targets(turns, train_on)
    turns = turns[: template.reach(turns, max_length)]
    whole = template.render(turns, False)
    spans = [template.span(turns, i, whole) for i in targets if i < len(turns)]
    encoded = tokenizer(whole, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    starts, ends = {s for s, _ in offsets}, {e for _, e in offsets}
    labels = [IGNORE_INDEX] * len(ids)
    for start, end, _ in spans:
        if start not in starts or end not in ends:
            raise TemplateError(
                f"an assistant turn ({whole[start:end][:40]!r}...) does not start and end on token boundaries; "
                "its loss mask would cut a token"
            )
        inside = [k for k, (s, e) in enumerate(offsets) if start <= s and e <= end and e > s]
        for k in inside:
            labels[k] = ids[k]
        decoded = tokenizer.decode([ids[k] for k in inside], skip_special_tokens=False)
        if decoded != whole[start:end]:
            raise TemplateError(
                f"the counted tokens of an assistant turn decode to {decoded[:60]!r}, not to its content and "
                f"end-of-turn token {whole[start:end][:60]!r}"
            )
    full = len(ids)
    ids, labels = ids[:max_length], labels[:max_length]
    features = {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}
    return Encoded(features, full, full > max_length)
