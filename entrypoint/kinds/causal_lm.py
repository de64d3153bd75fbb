"""The model side of a causal LM: a prompt -> a generated response (format adherence, extraction). Rows are
{"prompt", "response", "label"} (chat formats add "messages"), the label being the row's group for
per-group metrics ("all" if none).

`data.format: prompt_response`: `[bos] + tokens(template.format(prompt)) + tokens(response) + [eos]`, the
loss on the response and eos only. Chat formats (`messages`, `sharegpt`, `alpaca`): the conversation
rendered with the model's chat template (or `data.chat_template`), the loss on assistant turns and their
end-of-turn tokens only (data/chat.py). Generation for the baseline, every trial, test and verify: the
same prompt construction, greedy (evaluation/generate.py). Baseline: the untouched model's generations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

from entrypoint.data.chat import ChatTemplate, TemplateError, chat_rows, clean_chat, finish_chat, render_chat
from entrypoint.data.encoding import (
    IGNORE_INDEX,
    encode_causals,
    prepare_tokenizer,
    reaches,
)
from entrypoint.data.packing import PackedCollator
from entrypoint.kinds.base import Baseline
from entrypoint.kinds.text import TextFields
from entrypoint.report.binding import KWARGS_FILE
from entrypoint.report.serving import Usage
from entrypoint.training.model import SAFE_LOADING, adapt, load_adapter, resolve_model_dir
from entrypoint.training.quantize import prepare_for_training, quantized_base
from jobspec.schema import Adaptation, JobSpec

__all__ = ["CausalLM"]


class CausalLM:
    """The model side of a causal LM job (format adherence, extraction)."""

    def __init__(
        self,
        spec: JobSpec,
        log: Callable[[str], None] | None = None,
        read_quantization_record: Callable[[], dict | None] | None = None,
    ):
        self.spec = spec
        # QLoRA: reads the quantized base's record in base_model.json (training/quantize.py), which every
        # quantized load must reproduce; None where no job store is at hand (nothing to compare with)
        self.read_quantization_record = read_quantization_record
        attn = spec.model.attn_implementation  # auto: transformers' own choice for the model
        self.loading = {**SAFE_LOADING, **({} if attn == "auto" else {"attn_implementation": attn})}
        self._templates: dict[int, ChatTemplate] = {}  # per tokenizer object
        self.log = log  # generation throughput goes here when set
        self._reading = None  # the tokenizer `trains` checks rows with, loaded on first use

    @property
    def chat(self) -> bool:
        return self.spec.data.format != "prompt_response"

    def fields(self) -> TextFields:
        """Prompt and response (the label a group for per-group metrics); chat formats parse whole
        conversations (data/chat.py), and the recipe records the chat template."""
        data = self.spec.data
        common = {
            "wanted": {"prompt": data.prompt_field, "response": data.response_field},
            "keys": ("prompt", "response"),
            "leak_text": lambda row: f"{row['prompt']}\n{row['response']}",
            "recipe_task": "causal_lm",
            "group_field": data.label_field,
        }
        if not self.chat:
            return TextFields(**common, recipe_extra=lambda processor: {"template": data.template}, trains=self.trains)
        return TextFields(
            **common,
            parse=lambda raw, errors: chat_rows(
                raw, data.format, data.label_field, data.train_on, errors, data.cluster_field
            ),
            clean=lambda rows: clean_chat(rows, data.clean),
            recipe_extra=self._chat_recipe,
            trains=self.trains,
        )

    def trains(self, row: dict) -> bool:
        """Whether `row` keeps a counted token within model.max_length: the tokens before the response (a
        prompt_response row's bos and rendered prompt; a conversation's turns before its first counted
        assistant turn) must leave room for it. Reads the base model's tokenizer the first time."""
        if self._reading is None:
            self._reading = self.processor(resolve_model_dir(self.spec.model, self.spec.store, self.log or print))
        data, max_length = self.spec.data, self.spec.model.max_length
        if self.chat:
            return self.template(self._reading).trainable(row["messages"], data.train_on, max_length)
        prompt = data.template.format(prompt=row["prompt"])
        bos = self._reading.bos_token_id is not None
        return not reaches(self._reading, prompt, max_length - bos)

    def _chat_recipe(self, processor) -> dict:
        template = self.template(processor)
        data = self.spec.data
        return {
            "format": data.format,
            "train_on": data.train_on,
            "train_on_reasoning": data.train_on_reasoning,
            "chat_template_sha256": template.sha256,
            "chat_template_kwargs": dict(data.chat_template_kwargs),
            "end_of_turn": template.end_of_turn,
            "generation_prompt": template.generation_prompt,
            "mask": "generation markers" if template.markers else "spans in the rendering",
            "notes": template.notes,
        }

    def processor(self, folder: Path):
        """The tokenizer; for chat formats it carries the chat template trained with (data.chat_template,
        if given, replaces its own), so every saved copy (checkpoints, final, export) renders the same."""
        from transformers import AutoTokenizer

        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(folder))
        if self.chat:
            self._templates[id(tokenizer)] = self._chat_template(tokenizer)
        return tokenizer

    def template(self, processor) -> ChatTemplate:
        if id(processor) not in self._templates:
            self._templates[id(processor)] = self._chat_template(processor)
        return self._templates[id(processor)]

    def _chat_template(self, tokenizer) -> ChatTemplate:
        return ChatTemplate(tokenizer, self.spec.data.chat_template, self.spec.data.chat_template_kwargs)

    def encode(self, processor, rows: Sequence[dict], labels: Sequence[str]) -> list:
        data, max_length = self.spec.data, self.spec.model.max_length
        if self.chat:  # each conversation rendered, the renderings tokenized in one call, each finished
            template, rendered = self.template(processor), []
            for row in rows:
                with _naming(row):
                    rendered.append(render_chat(template, row["messages"], data.train_on, max_length))
            if not rendered:
                return []
            tokens = processor([r.whole for r in rendered], add_special_tokens=False, return_offsets_mapping=True)
            encoded = []
            for k, row in enumerate(rows):
                with _naming(row):
                    ids, offsets = tokens["input_ids"][k], tokens["offset_mapping"][k]
                    encoded.append(
                        finish_chat(template, rendered[k], ids, offsets, max_length, data.train_on_reasoning)
                    )
            return encoded
        prompts, responses = [r["prompt"] for r in rows], [r["response"] for r in rows]
        return encode_causals(processor, prompts, responses, data.template, max_length)

    def collator(self, processor):
        """Batches of examples padded to the longest, or with `training.packing` batches of packed rows
        (data/packing.py; the phases pack the features first)."""
        from transformers import DataCollatorForSeq2Seq

        if self.spec.training.packing:
            return PackedCollator(processor.pad_token_id)
        return DataCollatorForSeq2Seq(processor, label_pad_token_id=IGNORE_INDEX, padding=True)

    def load(self, folder: Path, labels: Sequence[str], adaptation: Adaptation, trained: Path | None = None):
        from transformers import AutoModelForCausalLM

        if trained is not None and adaptation.method == "full":
            return AutoModelForCausalLM.from_pretrained(trained, **self.loading)
        if trained is not None:
            return load_adapter(self._base(folder, adaptation), trained)
        if adaptation.quantization is None:
            model, info = AutoModelForCausalLM.from_pretrained(folder, **self.loading, output_loading_info=True)
        else:
            model = self._base(folder, adaptation)
            info = model.rentune_loading_info
        return adapt(model, info, folder, adaptation, task_type="CAUSAL_LM")

    def _base(self, folder: Path, adaptation: Adaptation):
        """The base model as the job trains on it: as saved, or (QLoRA) quantized on the job's device to the
        bytes recorded at the job's first use of it and prepared as training prepares it (norms and
        embeddings in fp32), for training and evaluation alike."""
        from transformers import AutoModelForCausalLM

        if adaptation.quantization is None:
            return AutoModelForCausalLM.from_pretrained(folder, **self.loading)
        recorded = self.read_quantization_record() if self.read_quantization_record is not None else None
        model = quantized_base(self.spec, folder, adaptation.quantization, recorded, **self.loading)
        return prepare_for_training(model)

    def predict(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device) -> list[str]:
        from entrypoint.evaluation.generate import generate_responses

        spec = self.spec
        prompts, add_bos = self._prompts(processor, rows)
        answers = generate_responses(
            model,
            processor,
            prompts,
            spec.model.max_length,
            spec.model.max_new_tokens,
            spec.training.eval_batch,
            device,
            add_bos=add_bos,
            stop=self.stop_tokens(processor),
            log=self.log,
        )
        return [answer_after_reasoning(answer) for answer in answers] if self.chat else answers

    def _prompts(self, processor, rows: Sequence[dict]) -> tuple[list[str], bool]:
        """Each row's prompt as generation renders it, and whether a bos goes before it."""
        if self.chat:
            return [self.template(processor).prompt(r["messages"]) for r in rows], False
        return [self.spec.data.template.format(prompt=r["prompt"]) for r in rows], True

    def stop_tokens(self, processor) -> list[str]:
        """The tokens that end an answer besides eos: the chat template's end of turn."""
        return [self.template(processor).end_of_turn] if self.chat else []

    def scores(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device):
        from entrypoint.evaluation.generate import first_token_logits

        prompts, add_bos = self._prompts(processor, rows)
        model_spec = self.spec.model
        return first_token_logits(
            model,
            processor,
            prompts,
            model_spec.max_length,
            model_spec.max_new_tokens,
            self.spec.training.eval_batch,
            device,
            add_bos,
        )

    def baseline(self, folder: Path, processor, rows: Sequence[dict], labels: Sequence[str], device, train) -> Baseline:

        model = self._base(folder, self.spec.adaptation).eval()
        method = {"method": "untouched_model_generation"}
        if self.spec.adaptation.quantization is not None:  # the base every trial adapts, quantized the same
            method["base"] = "quantized as trained (adaptation.quantization)"
        return Baseline(self.predict(model, processor, rows, labels, device), method)

    def settings(self) -> dict:
        """What besides the task decides a measurement: decoding and prompt (_settings), and with QLoRA the
        model that answers."""
        quantization = self.spec.adaptation.quantization
        if quantization is None:
            return self._settings()
        model = f"the {quantization.bits}-bit quantized base + the adapter, as trained (adaptation.quantization)"
        return {**self._settings(), "model": model}

    def _settings(self) -> dict:
        from entrypoint.evaluation.generate import decoding

        data, max_new_tokens = self.spec.data, self.spec.model.max_new_tokens
        if not self.chat:
            return {"decoding": decoding(max_new_tokens), "template": data.template}
        template = next(iter(self._templates.values()), None)
        if template is None:  # eval settings are asked before any tokenizer was loaded in this process
            from transformers import AutoTokenizer

            from entrypoint.training.model import resolve_model_dir

            folder = resolve_model_dir(self.spec.model, self.spec.store, self.log or print)
            template = self._chat_template(prepare_tokenizer(AutoTokenizer.from_pretrained(folder)))
        return {
            "decoding": decoding(max_new_tokens, [template.end_of_turn]),
            "format": data.format,
            "chat_template_sha256": template.sha256,
            "chat_template_kwargs": dict(data.chat_template_kwargs),
            "prompt": "the turns before the last assistant turn, rendered with the generation prompt",
            "scored": "the answer after any reasoning (a leading <think>...</think> block is not scored)",
        }


def answer_after_reasoning(answer: str) -> str:
    """A generated answer without the reasoning a thinking model writes first (`<think>...</think>`, the
    opening tag in the answer or already in the generation prompt, as R1 distills have it): what is scored."""
    _, closed, after = answer.partition("</think>")
    return after.strip() if closed else answer


@contextlib.contextmanager
def _naming(row: dict):
    """A template error names the conversation: rows no longer know their line."""
    try:
        yield
    except TemplateError as exc:
        raise TemplateError(f"{exc}; in the conversation starting {row['prompt'][:80]!r}") from None


def _call(base: str, folder: str, chat: bool) -> list[str]:
    """SERVING.md: the tokenizer, a prompt rendered as in training (the chat template with the arguments
    trained with), one greedy generation."""
    lines = [f'tokenizer = AutoTokenizer.from_pretrained("{folder}")']
    if chat:
        lines += [
            f'kwargs_file = Path("{KWARGS_FILE}")  # the chat template arguments trained with, when any',
            "kwargs = json.loads(kwargs_file.read_text()) if kwargs_file.exists() else {}",
            'messages = [{"role": "user", "content": "Hello"}]',
            "inputs = tokenizer.apply_chat_template(",
            '    messages, add_generation_prompt=True, return_dict=True, return_tensors="pt", **kwargs',
            ")",
        ]
    else:
        lines += ['inputs = tokenizer("A prompt written as in training", return_tensors="pt")']
    return [
        *lines,
        "output = model.generate(**inputs, max_new_tokens=128)",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))',
    ]


USAGE = Usage("AutoModelForCausalLM", "AutoTokenizer", generative=True, call=_call)
