"""`model.max_length` against what the base model can take: its position embeddings (config.json).

A model with learned absolute positions (BERT, GPT-2, ...) has no position past the last one: a longer
input fails inside torch with a bare size mismatch, so a max_length above it is refused before the spec is
frozen (`rentune validate` says so when the model folder is local, `rentune run` before a new job starts).
A rotary model (Llama, Qwen, ...) runs past its trained context, worse: that is a warning.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["max_length_problem"]

_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx", "seq_length")
_ROTARY_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "rotary_dim", "rotary_pct")


def _limit(folder: Path) -> tuple[int, str, bool] | None:
    """(positions, the config key that says so, whether they are a hard limit), or None: not known."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        if not isinstance(section, dict):
            continue
        for key in _POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                rotary = any(k in section for k in _ROTARY_KEYS) or section.get("position_embedding_type") == "rotary"
                relative = str(section.get("position_embedding_type", "absolute")).startswith("relative")
                return value, key, not (rotary or relative)
    return None


def max_length_problem(max_length: int, folder: Path) -> tuple[str, bool] | None:
    """(what is wrong with `max_length` for the model in `folder`, whether it is an error), or None."""
    found = _limit(folder)
    if found is None or max_length <= found[0]:
        return None
    positions, key, hard = found
    where = folder / "config.json"
    if hard:
        return (
            f"model.max_length: {max_length} is more than the model's {positions} positions ({key} in {where}): "
            f"longer inputs cannot run; expected at most {positions}",
            True,
        )
    return (
        f"model.max_length: {max_length} is more than the {positions} positions the model was trained for "
        f"({key} in {where}); it runs, but quality past them is not what the model learned",
        False,
    )
