"""The data inspection: a few examples per category exactly as the trainer will see them (token ids and
pieces, special tokens, truncation, which positions count in the loss) and length statistics per split.

Written to `phases/data/inspection.json` (complete) and `inspection.md` (for a person to read).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from entrypoint.data.encoding import IGNORE_INDEX, Encoded
from entrypoint.data.packing import pack_plan, packed, row_boundaries
from entrypoint.data.spool import labels_of
from entrypoint.data.tokens import full_lengths, truncated_flags

__all__ = [
    "build_inspection",
    "chat_markdown",
    "labels_per_token",
    "length_stats",
    "pick_examples",
    "smoke_markdown",
    "to_markdown",
    "untrainable_markdown",
]

_MD_TOKENS = 96  # tokens shown per example in the markdown; the JSON holds all of them


def pick_examples(rows: Sequence[dict], encoded: Sequence[Encoded], per_category: int) -> dict[str, list[int]]:
    """Row indices per category, spread over the length range: the longest first (where truncation shows),
    then the others at evenly spaced length quantiles down to the shortest. Deterministic."""
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels_of(rows)):
        by_label.setdefault(label, []).append(i)
    lengths = full_lengths(encoded)
    picked = {}
    for label in sorted(by_label):
        ranked = sorted(by_label[label], key=lambda i: (-lengths[i], i))
        n = min(per_category, len(ranked))
        positions = [round(k * (len(ranked) - 1) / max(1, n - 1)) for k in range(n)]
        picked[label] = [ranked[p] for p in dict.fromkeys(positions)]
    return picked


def labels_per_token(encoded: Encoded) -> bool:
    """True when the loss is on tokens (labels per position), False when on the sequence (one label id)."""
    return isinstance(encoded.features["labels"], list)


def _tokens(tokenizer, encoded: Encoded) -> list[dict]:
    ids = encoded.features["input_ids"]
    special = set(tokenizer.all_special_ids)
    labels = encoded.features["labels"] if labels_per_token(encoded) else None
    return [
        {
            "position": position,
            "id": token_id,
            "piece": tokenizer.convert_ids_to_tokens(token_id),
            "special": token_id in special,
            "in_loss": labels is not None and labels[position] != IGNORE_INDEX,
        }
        for position, token_id in enumerate(ids)
    ]


def length_stats(encoded: Sequence[Encoded], max_length: int) -> dict:
    lengths = sorted(full_lengths(encoded))
    truncated = sum(truncated_flags(encoded))
    if not lengths:
        return {"n": 0}
    return {
        "n": len(lengths),
        "min": lengths[0],
        "median": statistics.median(lengths),
        "p95": lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))],
        "max": lengths[-1],
        "max_length": max_length,
        "truncated": truncated,
        "truncated_share": truncated / len(lengths),
    }


def build_inspection(
    tokenizer,
    rows: Sequence[dict],
    encoded: Sequence[Encoded],
    per_category: int,
    max_length: int,
    labels: Sequence[str],
) -> list[dict]:
    """One record per picked example: the row, its tokens with loss flags, truncation, and the loss target."""
    records = []
    for label, indices in pick_examples(rows, encoded, per_category).items():
        for i in indices:
            item = encoded[i]
            tokens = _tokens(tokenizer, item)
            record = {
                "category": label,
                "row": rows[i],
                "tokens": tokens,
                "length": len(tokens),
                "full_length": item.full_length,
                "truncated": item.truncated,
                "max_length": max_length,
                "special_tokens": [t["piece"] for t in tokens if t["special"]],
            }
            if labels_per_token(item):
                in_loss = [t["position"] for t in tokens if t["in_loss"]]
                record["loss"] = {
                    "kind": "tokens",
                    "positions": in_loss,
                    "count": len(in_loss),
                    "first": in_loss[0] if in_loss else None,
                    # what the loss is computed on, as text: the response (or assistant turns) and their end token
                    "decoded": tokenizer.decode([tokens[p]["id"] for p in in_loss], skip_special_tokens=False),
                    "note": "everything else is masked (-100): the prompt, system and user turns, and padding",
                }
            else:
                label_id = item.features["labels"]
                record["loss"] = {"kind": "sequence", "label": labels[label_id], "label_id": label_id}
            records.append(record)
    return records


def _render(record: dict) -> list[str]:
    shown = record["tokens"][:_MD_TOKENS]
    causal = record["loss"]["kind"] == "tokens"

    def piece(t: dict) -> str:
        text = f"⟨{t['piece']}⟩" if t["special"] else t["piece"]
        return f"[{text}]" if causal and t["in_loss"] else text

    cut = (
        f", truncated from {record['full_length']} at max_length {record['max_length']}" if record["truncated"] else ""
    )
    lines = [
        f"- row: `{_oneline(record['row'])}`",
        f"  - {record['length']} tokens{cut}; special: {', '.join(record['special_tokens']) or 'none'}",
        f"  - pieces: `{' '.join(piece(t) for t in shown)}{' …' if len(record['tokens']) > _MD_TOKENS else ''}`",
        f"  - ids: `{' '.join(str(t['id']) for t in shown)}{' …' if len(record['tokens']) > _MD_TOKENS else ''}`",
    ]
    loss = record["loss"]
    if causal:
        lines.append(f"  - loss: {loss['count']} positions from {loss['first']} (in [brackets] above); {loss['note']}")
        lines.append(f"  - counted tokens decode to: `{loss['decoded'].replace(chr(10), '⏎')}`")
    else:
        lines.append(f"  - loss: sequence-level, cross-entropy on label {loss['label']!r} (id {loss['label_id']})")
    return lines


def _oneline(row: dict) -> str:
    text = " | ".join(f"{k}={v}" for k, v in row.items())
    text = text.replace("\n", "⏎").replace("`", "'")
    return text if len(text) <= 160 else text[:157] + "..."


def to_markdown(records: Sequence[dict], stats: dict[str, dict]) -> str:
    out = ["# Data inspection", "", "Examples exactly as the trainer sees them (after cleaning and tokenization).", ""]
    out += [
        "## Lengths in tokens",
        "",
        "| split | n | min | median | p95 | max | truncated |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in stats.items():
        if s.get("n"):
            out.append(
                f"| {name} | {s['n']} | {s['min']} | {s['median']} | {s['p95']} | {s['max']} | "
                f"{s['truncated']} ({s['truncated_share']:.1%}) |"
            )
    category = None
    for record in records:
        if record["category"] != category:
            category = record["category"]
            out += ["", f"## {category}", ""]
        out += _render(record)
    return "\n".join(out) + "\n"


def packed_row(processor, features: Sequence[dict], lengths: Sequence[int], max_length: int) -> tuple[dict, str]:
    """With packing: how the train split packs (rows, fill; planned from the token `lengths` alone) and the
    row holding the most examples (the first such), each example's token span and positions, and its text
    (what the loss trains on between [[ ]])."""
    plan = pack_plan(lengths, max_length)
    most = max(range(len(plan)), key=lambda r: (len(plan[r]), -r))
    row = packed([features[i] for i in plan[most]])
    record = {
        "rows": len(plan),
        "examples": len(lengths),
        "fill": round(sum(lengths) / (len(plan) * max_length), 4),
        "shown_row": {"tokens": len(row["input_ids"]), "examples": []},
    }
    out = [
        "",
        "## A packed row",
        "",
        f"{record['examples']} train examples packed into {record['rows']} rows of up to {max_length} tokens "
        f"({record['fill']:.0%} filled). Positions restart at 0 for each example, so no example attends to another; "
        "each example's first token is not a target. The row with the most examples:",
        "",
    ]
    for k, (start, end) in enumerate(row_boundaries(row)):
        ids, labels = row["input_ids"][start:end], row["labels"][start:end]
        trained = sum(1 for label in labels if label != IGNORE_INDEX)
        record["shown_row"]["examples"].append({"start": start, "end": end, "trained_tokens": trained})
        out += [
            f"- example {k + 1}: tokens {start} to {end - 1} ({end - start} tokens, positions "
            f"{row['position_ids'][start]} to {row['position_ids'][end - 1]}, {trained} trained)",
            "",
            "  ```",
            *("  " + line for line in _marked(processor, ids, labels).splitlines()),
            "  ```",
        ]
    return record, "\n".join(out) + "\n"


def _marked(processor, ids: Sequence[int], labels: Sequence[int]) -> str:
    """The tokens decoded, the trained spans between [[ and ]]."""
    parts, span, trained = [], [], False
    for token, label in zip(ids, labels, strict=True):
        now = label != IGNORE_INDEX
        if now != trained and span:
            text = processor.decode(span)
            parts.append(f"[[{text}]]" if trained else text)
            span = []
        span.append(token)
        trained = now
    if span:
        text = processor.decode(span)
        parts.append(f"[[{text}]]" if trained else text)
    return "".join(parts)


def smoke_markdown(smoke: dict) -> str:
    """The smoke pass section of inspection.md."""
    out = ["", "## Smoke pass", "", smoke.get("note", "")]
    for name, s in smoke.get("splits", {}).items():
        out.append(f"- {name}: batch of {s['batch']}, loss {s['loss']:.4f}")
    return "\n".join(out) + "\n"


def untrainable_markdown(untrainable: dict, max_length: int) -> str:
    """What data.truncation did with rows that train on nothing at max_length."""
    dropped, first = untrainable["dropped"], untrainable["first"]
    shown = f"{dropped} dropped, the first at {first}" if dropped else "none found"
    return (
        f"\n## Rows with nothing to train on\n\nRows whose every counted token lies past model.max_length "
        f"({max_length}) (data.truncation: {untrainable['policy']}): {shown}.\n"
    )


def chat_markdown(recipe: dict) -> str:
    """How the chat template was used: the generation prompt, the mask's source, the template's arguments,
    and what it does to conversations (ChatTemplate.notes)."""
    lines = [
        "\n## Chat template\n",
        f"- sha256 {recipe['chat_template_sha256'][:16]}, arguments {recipe.get('chat_template_kwargs') or 'none'}",
        f"- generation prompt {recipe.get('generation_prompt', '')!r}, end of turn {recipe.get('end_of_turn')!r}",
        f"- loss mask from {recipe.get('mask', 'spans in the rendering')}; each trained answer from where the model "
        "starts generating through its end-of-turn token; text the template writes there (a think block) counts"
        + ("" if recipe.get("train_on_reasoning", True) else " only from the content (train_on_reasoning: false)"),
        "- turns the template renders differently once later turns follow are trained as the final rendering "
        "shows them (what the model sees at inference with that history)",
    ]
    lines += [f"- this template: {note}" for note in recipe.get("notes", [])]
    return "\n".join(lines) + "\n"
