"""Generation for causal-LM evaluation, with fixed decoding so that the baseline, every trial and the sealed
test generate the same way. The prompt is built exactly as the trainer builds it (preprocess.py):
`[bos] + tokens(template.format(prompt))`, so the model is asked what it was trained to answer."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["decoding", "generate_responses"]


def decoding(max_new_tokens: int) -> dict:
    """The decoding settings, recorded in every eval config. Greedy: deterministic and seed-free."""
    return {"strategy": "greedy", "do_sample": False, "num_beams": 1, "max_new_tokens": max_new_tokens}


def _prompt_ids(tokenizer, prompt: str, template: str, room: int) -> list[int]:
    ids = tokenizer(template.format(prompt=prompt), add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    ids = bos + ids
    return ids[-room:]  # a prompt longer than the room keeps its end, next to where the answer starts


@torch.no_grad()
def generate_responses(
    model,
    tokenizer,
    prompts: Sequence[str],
    template: str,
    max_length: int,
    max_new_tokens: int,
    batch: int,
    device,
) -> list[str]:
    """The decoded continuation of each prompt (special tokens removed, outer whitespace stripped), in order.
    Prompts are left-padded so every continuation starts right after its own prompt."""
    model.eval().to(device)
    room = max(1, max_length - max_new_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    outputs: list[str] = []
    for start in range(0, len(prompts), batch):
        encoded = [_prompt_ids(tokenizer, p, template, room) for p in prompts[start : start + batch]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
        generated = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=False,
            num_beams=1,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
        )
        for row in generated[:, width:]:
            outputs.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    return outputs
