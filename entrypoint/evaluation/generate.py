"""Generation for causal-LM evaluation, with fixed decoding so that the baseline, every trial and the sealed
test generate the same way. The prompt is built exactly as the trainer builds it (data/encoding.py and
data/chat.py): `[bos] + tokens(template.format(prompt))`, or the chat template's rendering of the turns
before the answer with its generation prompt, so the model is asked what it was trained to answer.
Greedy, batched, with the KV cache; generation stops at eos or the chat template's end-of-turn token."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import torch

from entrypoint.job.heartbeat import Heartbeat

__all__ = ["decoding", "first_token_logits", "generate_responses"]


def decoding(max_new_tokens: int, stop: Sequence[str] = ()) -> dict:
    """The decoding settings, recorded in every eval config. Greedy: deterministic and seed-free."""
    settings = {"strategy": "greedy", "do_sample": False, "num_beams": 1, "max_new_tokens": max_new_tokens}
    return {**settings, "use_cache": True, "stop": ["eos", *stop]}


def _prompt_ids(tokenizer, text: str, add_bos: bool, room: int) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if add_bos and tokenizer.bos_token_id is not None else []
    ids = bos + ids
    return ids[-room:]  # a prompt longer than the room keeps its end, next to where the answer starts


@torch.no_grad()
def generate_responses(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_length: int,
    max_new_tokens: int,
    batch: int,
    device,
    add_bos: bool = True,
    stop: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """The decoded continuation of each rendered prompt (special tokens removed, outer whitespace stripped),
    in order. Prompts are left-padded so every continuation starts right after its own prompt. `stop`:
    tokens that end an answer besides eos (a chat template's end of turn). `log` gets the throughput, and
    a progress line every HEARTBEAT_SECONDS."""
    model.eval().to(device)
    room = max(1, max_length - max_new_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stop_ids = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list(stop))]
    outputs: list[str] = []
    started, new_tokens = time.monotonic(), 0
    beat = Heartbeat(log, "generation", len(prompts), "answers") if log is not None else None
    with beat or contextlib.nullcontext():
        for start in range(0, len(prompts), batch):
            encoded = [_prompt_ids(tokenizer, p, add_bos, room) for p in prompts[start : start + batch]]
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
                eos_token_id=sorted({i for i in stop_ids if i is not None}),
                use_cache=True,
            )
            for row in generated[:, width:]:
                new_tokens += int((row != pad).sum())
                outputs.append(tokenizer.decode(row, skip_special_tokens=True).strip())
            if beat is not None:
                beat.advance(len(encoded))
    if log is not None and prompts:
        took = time.monotonic() - started
        rate = new_tokens / took if took > 0 else 0.0
        log(f"generation: {len(prompts)} answers, {new_tokens} new tokens in {took:.1f} s ({rate:.1f} tokens/s)")
    return outputs


@torch.no_grad()
def first_token_logits(
    model, tokenizer, prompts: Sequence[str], max_length: int, max_new_tokens: int, batch: int, device, add_bos: bool
) -> torch.Tensor:
    """The logits of the first generated token of each prompt (float32, on the CPU): what greedy decoding
    picks its first token from, with the prompts built and left-padded as generate_responses builds them."""
    model.eval().to(device)
    room = max(1, max_length - max_new_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = []
    for start in range(0, len(prompts), batch):
        encoded = [_prompt_ids(tokenizer, p, add_bos, room) for p in prompts[start : start + batch]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # as generate() derives them for left padding
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions).logits
        out.append(logits[:, -1].float().cpu())
    return torch.cat(out)
