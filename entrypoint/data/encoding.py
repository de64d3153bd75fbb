"""The exact preprocessing the trainer uses, in one place, so the data inspection shows what training sees.
Each kind (entrypoint/kinds/) encodes its rows with one of these.

Classification: `tokenizer(text, truncation=True, max_length)`; the loss is on the sequence's label.
Causal LM: `[bos] + tokens(template.format(prompt)) + tokens(response) + [eos]`, each part tokenized
without special tokens, cut to `max_length` from the right (the response's end goes first); labels are
the input ids with every prompt position set to -100, so only response tokens (and eos) count in the loss.
Images: the file decoded with Pillow (modes outside `data.image_modes` refused), converted to RGB, then
the base model's own image processor (`AutoImageProcessor`): resize, crop, rescale, normalise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "IGNORE_INDEX",
    "PREPROCESS_VERSION",
    "Encoded",
    "encode_causals",
    "encode_classifications",
    "encode_image",
    "prepare_tokenizer",
    "processor_sha256",
    "reaches",
]

PREPROCESS_VERSION = "preprocess-1"
IGNORE_INDEX = -100  # label value the loss skips (torch.nn.CrossEntropyLoss ignore_index)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "added_tokens.json",
    "preprocessor_config.json",  # image processors
    "chat_template.jinja",  # transformers 5 saves a tokenizer's chat template beside it
)


def processor_sha256(folder: Path) -> str:
    """sha256 over the tokenizer or image processor files present in `folder` (name and bytes, sorted by name)."""
    digest = hashlib.sha256()
    for name in sorted(n for n in _TOKENIZER_FILES if (Path(folder) / n).is_file()):
        digest.update(f"{name}\n".encode())
        digest.update((Path(folder) / name).read_bytes())
    return digest.hexdigest()


def prepare_tokenizer(tokenizer):
    """A causal LM tokenizer without a pad token pads with eos (padding never counts in the loss)."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("model: the tokenizer has neither a pad nor an eos token; a causal LM needs one")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def reaches(tokenizer, text: str, max_length: int) -> bool:
    """Whether `text` tokenizes (without special tokens) to at least `max_length` tokens. A token holds at
    least one byte (plus one for a tokenizer's leading marker), so shorter text needs no tokenizing."""
    if len(text.encode()) + 1 < max_length:
        return False
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= max_length


@dataclass(frozen=True)
class Encoded:
    features: dict  # what the collator receives
    full_length: int  # tokens before truncation
    truncated: bool


def encode_classifications(tokenizer, texts: Sequence[str], label_ids: Sequence[int], max_length: int) -> list[Encoded]:
    """Each text as `tokenizer(text, truncation=True, max_length=max_length)` gives it, with its length
    before truncation. A fast tokenizer whose post-processor adds fixed ids around the text (BERT's
    [CLS]/[SEP], RoBERTa's <s>/</s>, none) tokenizes each text once (`_classifications_in_one_pass`).
    Otherwise two tokenizer calls for the whole batch: every text untruncated (its full length, and its
    features when it fits, where truncation changes nothing), then only the texts longer than max_length
    again, truncated by the tokenizer itself (its special tokens and strategy kept)."""
    if not texts:
        return []
    once = _classifications_in_one_pass(tokenizer, texts, label_ids, max_length)
    if once is not None:
        return once
    whole = tokenizer(list(texts), truncation=False)
    keys = list(whole.keys())
    lengths = [len(ids) for ids in whole["input_ids"]]
    long = [i for i, n in enumerate(lengths) if n > max_length]
    cut = tokenizer([texts[i] for i in long], truncation=True, max_length=max_length) if long else {}
    cut_row = {i: k for k, i in enumerate(long)}
    encoded = []
    for i, label_id in enumerate(label_ids):
        source, row = (cut, cut_row[i]) if i in cut_row else (whole, i)
        features = {key: source[key][row] for key in keys}
        features["labels"] = label_id
        encoded.append(Encoded(features, lengths[i], lengths[i] > max_length))
    return encoded


_ENCODING_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}


@dataclass(frozen=True)
class _Template:
    """What a fast tokenizer's post-processor does to one sequence: ids (and type ids) before and after it,
    and the type id of its own tokens."""

    prefix: list[int]
    suffix: list[int]
    prefix_types: list[int]
    suffix_types: list[int]
    type_id: int


def _template(backend, raw) -> _Template | None:
    """The post-processor's template, read from what it does to `raw` (an encoding without special tokens,
    not empty): its ids must appear unchanged and in one piece, with one type id and a mask of ones."""
    done = backend.post_process(raw, None, add_special_tokens=True)
    ids, types, n = done.ids, done.type_ids, len(raw)
    if set(done.attention_mask) != {1}:
        return None
    for p in range(len(ids) - n + 1):
        if ids[p : p + n] == raw.ids and len(set(types[p : p + n])) == 1:
            return _Template(ids[:p], ids[p + n :], types[:p], types[p + n :], types[p])
    return None


def _classifications_in_one_pass(tokenizer, texts, label_ids, max_length) -> list[Encoded] | None:
    """encode_classifications with one tokenization per text, as the fast tokenizer truncates internally:
    each text encoded without special tokens, cut to max_length less the special tokens its post-processor
    adds, then given the post-processor's ids before and after it. None (the caller tokenizes the usual
    way) for a tokenizer without a Rust backend, with features beyond ids, type ids and mask, that cuts
    from the left, or whose post-processor is not such a template; also None when the batch's first text,
    or its first cut one, differs from the tokenizer's own call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    reference = dict(tokenizer(texts[0], truncation=True, max_length=max_length))
    if backend is None or not set(reference) <= set(_ENCODING_FIELDS):
        return None
    if getattr(tokenizer, "truncation_side", "right") != "right":
        return None
    backend.no_truncation()
    backend.no_padding()
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # fast: without character offsets
    raws = encode(list(texts), add_special_tokens=False)
    sample = next((raw for raw in raws if len(raw)), None)
    template = _template(backend, sample) if sample is not None else None
    if template is None:
        return None
    special = len(template.prefix) + len(template.suffix)
    if max_length <= special:
        return None
    keep = max_length - special
    encoded, checked_cut = [], False
    for i, (label_id, raw) in enumerate(zip(label_ids, raws, strict=True)):
        full = len(raw) + special
        ids = raw.ids if full <= max_length else raw.ids[:keep]
        features = {"input_ids": template.prefix + ids + template.suffix}
        if "token_type_ids" in reference:
            features["token_type_ids"] = template.prefix_types + [template.type_id] * len(ids) + template.suffix_types
        if "attention_mask" in reference:
            features["attention_mask"] = [1] * len(features["input_ids"])
        if i == 0 or (full > max_length and not checked_cut):
            expected = reference if i == 0 else dict(tokenizer(texts[i], truncation=True, max_length=max_length))
            if features != {key: expected[key] for key in features} or len(features) != len(expected):
                return None
            checked_cut = checked_cut or full > max_length
        features["labels"] = label_id
        encoded.append(Encoded(features, full, full > max_length))
    return encoded


def encode_causals(
    tokenizer, prompts: Sequence[str], responses: Sequence[str], template: str, max_length: int
) -> list[Encoded]:
    """Each (prompt, response) as the module docstring says, with two tokenizer calls for the whole batch
    (the prompts in their template, the responses)."""
    if not prompts:
        return []
    prompt_ids = tokenizer([template.format(prompt=p) for p in prompts], add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    encoded = []
    for prompt, response in zip(prompt_ids, response_ids, strict=True):
        ids = bos + prompt + response + eos
        labels = [IGNORE_INDEX] * (len(bos) + len(prompt)) + response + eos
        full = len(ids)
        ids, labels = ids[:max_length], labels[:max_length]
        features = {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}
        encoded.append(Encoded(features, full, full > max_length))
    return encoded


def encode_image(processor, path: str, label_id: int, modes: Sequence[str]) -> Encoded:
    from entrypoint.data.images import load_image

    image, _, _ = load_image(path, modes)
    pixels = processor(images=image, return_tensors="pt")["pixel_values"][0]
    return Encoded({"pixel_values": pixels, "labels": label_id}, 0, False)
