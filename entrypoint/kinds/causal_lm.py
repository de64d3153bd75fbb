"""Causal LM: a prompt -> a generated response (format adherence, extraction). Rows are
{"prompt", "response", "label"}, the label being the row's group for per-group metrics ("all" if none).

Training: `[bos] + tokens(template.format(prompt)) + tokens(response) + [eos]`, the loss on the response
and eos only. Generation for the baseline, every trial, test and verify: the same prompt construction,
greedy (evaluation/generate.py). Baseline: the untouched model's own generations.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from entrypoint.data.encoding import (
    IGNORE_INDEX,
    encode_causal,
    prepare_tokenizer,
)
from entrypoint.data.text import read_text_parts, text_inspection, text_leaks, text_recipe
from entrypoint.kinds import Baseline, DataParts, Leaks
from entrypoint.training.model import SAFE_LOADING, adapt, load_adapter
from jobspec.schema import Adaptation, JobSpec

__all__ = ["CausalLM"]


class CausalLM:
    name = "causal_lm"
    token_loss = True  # the loss is per response token across the whole accumulated batch

    def __init__(self, spec: JobSpec):
        self.spec = spec

    # -- data phase ------------------------------------------------------------------------------------
    def read(self) -> DataParts:
        data = self.spec.data
        wanted = {"prompt": data.prompt_field, "response": data.response_field}
        return read_text_parts(self.spec, wanted, ("prompt", "response"), group_field=data.label_field)

    def find_leaks(self, splits: dict[str, list[dict]], pairs: list[tuple[str, str]]) -> Leaks:
        threshold = self.spec.data.leaks.near_threshold
        return text_leaks(splits, pairs, threshold, lambda row: f"{row['prompt']}\n{row['response']}")

    def commit_splits(self, store, splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
        return splits

    def version_rows(self, canonical: dict[str, list[dict]]) -> dict[str, list[dict]]:
        return canonical

    def recipe(self, folder: Path, processor) -> dict:
        return {**text_recipe(self.spec, folder, "causal_lm"), "template": self.spec.data.template}

    def inspect(self, processor, splits: dict[str, list[dict]], labels: list[str]) -> tuple[dict, str, dict]:
        return text_inspection(self, processor, splits, labels)

    def fetch(self, store, rows: list[dict], workdir: Path) -> list[dict]:
        return rows  # everything is in the row

    # -- model -----------------------------------------------------------------------------------------
    def processor(self, folder: Path):
        from transformers import AutoTokenizer

        return prepare_tokenizer(AutoTokenizer.from_pretrained(folder))

    def encode(self, processor, rows: Sequence[dict], labels: Sequence[str]) -> list:
        template, max_length = self.spec.data.template, self.spec.model.max_length
        return [encode_causal(processor, r["prompt"], r["response"], template, max_length) for r in rows]

    def collator(self, processor):
        from transformers import DataCollatorForSeq2Seq

        return DataCollatorForSeq2Seq(processor, label_pad_token_id=IGNORE_INDEX, padding=True)

    def build(self, folder: Path, labels: Sequence[str], adaptation: Adaptation):
        from transformers import AutoModelForCausalLM

        model, info = AutoModelForCausalLM.from_pretrained(folder, **SAFE_LOADING, output_loading_info=True)
        return adapt(model, info, folder, adaptation, task_type="CAUSAL_LM")

    def reload(self, base: Path, weights: Path, labels: Sequence[str], method: str):
        from transformers import AutoModelForCausalLM

        if method == "full":
            return AutoModelForCausalLM.from_pretrained(weights, **SAFE_LOADING)
        return load_adapter(AutoModelForCausalLM.from_pretrained(base, **SAFE_LOADING), weights)

    def predict(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device) -> list[str]:
        from entrypoint.evaluation.generate import generate_responses

        spec = self.spec
        return generate_responses(
            model,
            processor,
            [r["prompt"] for r in rows],
            spec.data.template,
            spec.model.max_length,
            spec.model.max_new_tokens,
            spec.training.eval_batch,
            device,
        )

    def baseline(self, folder: Path, processor, rows: Sequence[dict], labels: Sequence[str], device, train) -> Baseline:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, **SAFE_LOADING).eval()
        return Baseline(self.predict(model, processor, rows, labels, device), {"method": "untouched_model_generation"})

    def eval_settings(self) -> dict:
        from entrypoint.evaluation.generate import decoding

        return {"decoding": decoding(self.spec.model.max_new_tokens), "template": self.spec.data.template}
