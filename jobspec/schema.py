"""The job spec: what a rentune job does, as frozen pydantic models.

One class per spec section, every class `extra="forbid"` so that a misspelt key is an error rather than
a silently ignored setting. Numbers are bounded: a spec may come from a queue and is untrusted.
This module imports no torch, so `rentune validate` and `rentune schema` run anywhere, fast.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

from jobspec.urls import credential_in

__all__ = [
    "JOB_ID_PATTERN",
    "Adaptation",
    "CheckpointPolicy",
    "Data",
    "Distribution",
    "Evaluation",
    "Experiment",
    "Guardrail",
    "Hypothesis",
    "Job",
    "JobSpec",
    "LeakPolicy",
    "MaxChars",
    "Model",
    "OutputFormat",
    "Rental",
    "SplitFiles",
    "SplitPolicy",
    "Store",
    "TASK_METRICS",
    "Tracking",
    "Training",
]

JOB_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"  # job and trial ids: safe as a store key segment
_DURATION = re.compile(r"^(\d+)(m|h|d)$")
DURATION_SECONDS = {"m": 60, "h": 3600, "d": 86400}
# Files an image job reads from an ImageFolder (case-insensitive).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


# A model folder in a bucket: S3 bucket naming rules, then a non-empty prefix (a trailing / allowed).
MODEL_URI = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^/\s][^\s]*?/?")


CREDENTIAL_ERROR = "credential_in_url"  # its messages never repeat the value (jobspec/load.py)
AWS_CREDENTIALS = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment"


def no_credentials(value: str, instead: str = AWS_CREDENTIALS) -> str:
    """`value` if it is a URL without credentials in it (jobspec/urls.py: no `user[:password]@`, no
    parameter named like one in its query, fragment or path). The spec is stored with the job, copied into
    its exports and shown in reports, so a credential in it would leak; `instead` says where it goes."""
    found = credential_in(value)
    if found == "user[:password]@":
        raise PydanticCustomError(
            CREDENTIAL_ERROR,
            "expected a URL without user[:password]@ (the spec is stored with the job and its exports); "
            f"set the credentials as {instead}",
        )
    if found:
        raise PydanticCustomError(
            CREDENTIAL_ERROR,
            f"expected a URL without {found}: it looks like a credential, and the spec is stored with the job "
            f"and its exports; set the credentials as {instead}",
        )
    return value


def _local_or_store_path(value: str) -> str:
    """A data or model location: a local path without `..` segments, or an s3:// URI."""
    no_credentials(value)
    if not value.strip():
        raise ValueError("expected a non-empty path")
    if "\x00" in value:
        raise ValueError("expected a path without NUL bytes")
    parts = re.split(r"[\\/]+", value.split("://", 1)[-1])
    if ".." in parts:
        raise ValueError("expected a path without '..' segments (paths may not climb out of their folder)")
    if "://" in value and not value.startswith(("s3://", "file://")):
        raise ValueError("expected a local path, file:// or s3:// URI")
    return value


def _duration(value: str) -> str:
    if not _DURATION.match(value):
        raise ValueError("expected a duration such as 30m, 2h or 1d")
    return value


PathStr = Annotated[str, AfterValidator(_local_or_store_path)]
TemplateArgument = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=64)]
Duration = Annotated[str, AfterValidator(_duration)]


def duration_seconds(value: str) -> int:
    """Seconds in a validated duration string such as `2h`."""
    match = _DURATION.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r}")
    return int(match.group(1)) * DURATION_SECONDS[match.group(2)]


def _takes_numbers_not_bools(annotation) -> bool:
    """Whether a field of this type takes a number but not true/false (pydantic reads `true` as 1)."""
    args, flat = [annotation], []
    while args:
        arg = args.pop()
        inner = get_args(arg)
        if inner and get_origin(arg) is not Literal:
            args.extend(inner)
        else:
            flat.append(arg)
    return bool not in flat and any(arg in (int, float) for arg in flat)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_true_or_false_for_a_number(cls, value, info):
        """`resamples: true` is a mistake, not 1: a YAML true/false where a number goes is refused."""
        if isinstance(value, bool) and _takes_numbers_not_bools(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("bool_for_number", "a number")
        return value


class Job(_Section):
    id: str = Field(pattern=JOB_ID_PATTERN, description="Job id: lowercase letters, digits, '-' and '_'.")
    description: str = Field("", max_length=2000)


# The primary metrics a hypothesis may name, per task (every other computed metric can be a guardrail).
TASK_METRICS = {
    "classification": ("macro_f1", "micro_f1", "accuracy"),
    "format": ("format_valid_rate", "json_valid_rate", "schema_valid_rate", "regex_match_rate"),
    "extraction": ("field_accuracy", "field_accuracy_normalized", "required_present_rate", "json_valid_rate"),
}


class OutputFormat(_Section):
    """Format adherence: what a valid response looks like. Every check given must pass."""

    expect_json: bool = Field(True, description="The whole response must parse as JSON.")
    json_schema: dict | None = Field(None, description="A JSON Schema the parsed response must match.")
    regex: str | None = Field(None, max_length=2000, description="A regular expression the whole response matches.")

    @model_validator(mode="after")
    def _checkable(self) -> OutputFormat:
        if self.json_schema is not None and not self.expect_json:
            raise ValueError("expected expect_json: true with a json_schema (the schema applies to the parsed JSON)")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"expected regex to be a valid regular expression ({exc})") from None
        if self.json_schema is not None:
            from jsonschema import SchemaError
            from jsonschema.validators import validator_for

            try:
                validator_for(self.json_schema).check_schema(self.json_schema)
            except SchemaError as exc:
                raise ValueError(f"expected json_schema to be a valid JSON Schema ({exc.message})") from None
        if not self.expect_json and self.regex is None:
            raise ValueError("expected at least one check: expect_json: true or a regex")
        return self


class Hypothesis(_Section):
    task: Literal["classification", "format", "extraction"] = Field(
        description="The behaviour to improve: domain classification, response-format adherence or "
        "structured extraction."
    )
    statement: str = Field(min_length=1, max_length=2000, description="The claim, in one sentence.")
    metric: str | None = Field(
        None,
        description="The primary metric (default: macro_f1, format_valid_rate or field_accuracy by task). "
        + "; ".join(f"{task}: {', '.join(names)}" for task, names in TASK_METRICS.items()),
    )
    min_gain: float = Field(0.0, ge=0.0, le=1.0, description="Smallest gain of `metric` over the baseline that counts.")
    label_descriptions: dict[str, str] = Field(
        default_factory=dict,
        description="Optional words per category; the zero-shot baseline compares texts to these "
        "(default: the label name itself).",
    )
    format: OutputFormat | None = Field(None, description="task format: what a valid response looks like.")
    required_fields: list[str] = Field(
        default_factory=list, description="task extraction: fields every response must contain."
    )
    fields: list[str] | None = Field(
        None, description="task extraction: fields scored for accuracy (default: every field in the gold responses)."
    )

    @model_validator(mode="before")
    @classmethod
    def _default_metric(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("metric") is None and data.get("task") in TASK_METRICS:
            return {**data, "metric": TASK_METRICS[data["task"]][0]}
        return data

    @model_validator(mode="after")
    def _fits_task(self) -> Hypothesis:
        if self.metric not in TASK_METRICS[self.task]:
            raise ValueError(f"expected metric to be one of {', '.join(TASK_METRICS[self.task])} for task {self.task}")
        if self.task == "format" and self.format is None:
            raise ValueError("expected a `format:` section (expect_json, json_schema and/or regex) for task format")
        if self.task != "format" and self.format is not None:
            raise ValueError(f"expected no `format:` section for task {self.task}")
        if self.task == "extraction" and not self.required_fields:
            raise ValueError("expected required_fields (at least one) for task extraction")
        if self.task != "extraction" and (self.required_fields or self.fields):
            raise ValueError(f"expected no required_fields/fields for task {self.task}")
        return self


class Guardrail(_Section):
    """What must not degrade: the trial's value may be at most `tolerance` worse than the baseline's."""

    metric: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9_]+(/[^/\s]+)?$",
        description="A computed metric, e.g. f1/* (every category on its own), f1/billing, format_valid_rate, "
        "required_present_rate, field_accuracy/<field>. `/*` expands to every category or field.",
    )
    tolerance: float = Field(0.0, ge=0.0, le=1.0, description="How much worse than the baseline is still a pass.")


class Evaluation(_Section):
    """How verdicts are decided: paired bootstrap intervals over the eval and test examples."""

    resamples: int = Field(
        10_000, ge=1000, le=1_000_000, description="Bootstrap resamples per interval (1,000 or more, Koehn 2004)."
    )
    confidence: float = Field(0.95, ge=0.5, le=0.999, description="Confidence level of every interval.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the resamples: the same seed, the same intervals.")
    underpowered: Literal["warn", "fail"] = Field(
        "warn",
        description="When the eval or test split is too small to decide the hypothesis (the smallest change it can "
        "show exceeds min_gain): warn and go on, or fail after the baseline, before any training (exit 2).",
    )


class Experiment(_Section):
    """A variant: one explained change against a reference trial (`main` is the spec's own settings)."""

    id: str = Field(pattern=JOB_ID_PATTERN, description="Trial id, used in the store under trials/<id>/.")
    reference: str = Field("main", description="The trial this variant is compared with: main or an earlier id.")
    changes: list[str] = Field(
        min_length=1,
        description="The parameters this variant changes, e.g. [training.learning_rate]; nothing else "
        "may differ from the reference.",
    )
    rationale: str = Field(min_length=1, max_length=300, pattern=r"^[^\n]+$", description="Why, in one line.")
    training: dict[str, Any] = Field(default_factory=dict, description="Training settings that differ.")
    adaptation: dict[str, Any] = Field(default_factory=dict, description="Adaptation settings that differ.")


class Model(_Section):
    path: PathStr | None = Field(
        None,
        description="Local folder with config.json and *.safetensors, or s3://bucket/prefix: a folder uploaded "
        "with `rentune push-model`, downloaded and checked against its manifest's sha256 on each node.",
    )
    package: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="An installed Python package that ships the model in its `model/` folder.",
    )
    hub_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="A Hugging Face hub id at `revision` (its pinned 40-hex commit): downloaded into the hub cache "
        "unless HF_HUB_OFFLINE is set, else (or when the hub cannot be reached) read from the cache.",
    )
    revision: str = Field(
        "local", max_length=200, description="Recorded in BINDING.json; with hub_id, the pinned 40-hex commit."
    )
    max_length: int = Field(128, ge=8, le=32768, description="Tokens per example; longer is truncated.")
    max_new_tokens: int = Field(
        128, ge=1, le=8192, description="Causal LM: tokens generated per eval example (greedy decoding)."
    )
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = Field(
        "auto",
        description="The attention kernel: auto is what transformers picks for the model (sdpa where supported). "
        "flash_attention_2 needs the flash-attn package and a GPU; it is refused before any phase where missing. "
        "The implementation used is recorded.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Model:
        if sum(source is not None for source in (self.path, self.package, self.hub_id)) != 1:
            raise ValueError("expected exactly one of model.path, model.package or model.hub_id")
        if self.hub_id is not None and not re.fullmatch(r"[0-9a-f]{40}", self.revision):
            raise ValueError("expected model.revision to be the 40-hex commit the hub_id is pinned to")
        if self.path is not None and self.path.startswith("s3:") and not MODEL_URI.fullmatch(self.path):
            raise ValueError(
                f"model.path: {self.path}: expected s3://bucket/prefix (a lowercase bucket name and a folder "
                "in it, as `rentune push-model DIR s3://bucket/prefix` wrote it)"
            )
        return self


class SplitPolicy(_Section):
    eval: float = Field(0.2, gt=0.0, lt=0.5, description="Share of each category held out for evaluation.")
    test: float = Field(0.2, gt=0.0, lt=0.5, description="Share of each category sealed for the final test.")
    seed: int = Field(13, ge=0, le=2**31 - 1)


class SplitFiles(_Section):
    train: PathStr
    eval: PathStr
    test: PathStr


class MaxChars(_Section):
    max_chars: int = Field(gt=0, le=10_000_000, description="Cut texts longer than this many characters.")


CleanRule = Annotated[
    Literal["strip_html", "normalize_ws", "drop_empty"] | MaxChars,
    Field(description="strip_html, normalize_ws, drop_empty, or {max_chars: N}"),
]
LeakAction = Literal["fail", "drop", "warn"]


class LeakPolicy(_Section):
    near_threshold: float = Field(
        0.7,
        gt=0.0,
        le=1.0,
        description="Jaccard similarity of word 3-grams from which two examples are near duplicates. One word "
        "changed in a 20-word text scores about 0.73, in a 40-word text about 0.86.",
    )
    image_max_distance: int = Field(
        4,
        ge=0,
        le=32,
        description="Images: Hamming distance between 64-bit perceptual hashes (pHash) at or below which two "
        "different files are near duplicates (a re-encoded or slightly resized copy is usually within 4).",
    )
    eval: LeakAction = Field("drop", description="Leaks between train and eval: drop them from train, warn or fail.")
    test: LeakAction = Field(
        "fail",
        description="Leaks into the sealed test split (from train or eval): fail, drop from the other side, warn.",
    )


class Data(_Section):
    modality: Literal["text", "image"] = Field(
        "text",
        description="text: JSONL or Parquet rows, or a datasets save_to_disk folder; image: an ImageFolder (a folder "
        "per category) or JSONL rows with paths.",
    )
    source: PathStr | None = Field(
        None,
        description="One JSONL or Parquet file or save_to_disk folder (local or s3://), or for images a folder or "
        "JSONL, that rentune splits.",
    )
    files: SplitFiles | None = Field(None, description="Or the three splits as given files.")
    text_field: str = Field("text", min_length=1, max_length=100, description="Classification: the input text.")
    image_field: str = Field(
        "image", min_length=1, max_length=100, description="Images in JSONL: the image path (relative to the file)."
    )
    image_modes: list[str] = Field(
        default_factory=lambda: ["RGB", "L"],
        min_length=1,
        description="Image modes accepted (each converted to RGB); an image in any other mode is an error naming "
        "the file.",
    )
    label_field: str = Field(
        "label", min_length=1, max_length=100, description="The category (for causal LMs: optional group name)."
    )
    prompt_field: str = Field("prompt", min_length=1, max_length=100, description="Causal LM: the prompt.")
    response_field: str = Field("response", min_length=1, max_length=100, description="Causal LM: the target.")
    format: Literal["prompt_response", "messages", "sharegpt", "alpaca"] = Field(
        "prompt_response",
        description="Causal LM rows: prompt_response (prompt_field/response_field with data.template), or chat: "
        'messages ({"messages": [{"role": "system"|"user"|"assistant", "content": ...}]}), sharegpt '
        '({"conversations": [{"from": "system"|"human"|"gpt", "value": ...}]}), alpaca (instruction, input, '
        "output). Chat rows are rendered with the model's chat template.",
    )
    chat_template: PathStr | None = Field(
        None,
        description="Chat formats: a Jinja chat template file to use instead of the tokenizer's own; the exported "
        "tokenizer carries it, so serving renders prompts as training did.",
    )
    train_on: Literal["all_assistant", "last_assistant"] = Field(
        "all_assistant",
        description="Chat formats: the assistant turns that count in the loss (each with its end-of-turn token); "
        "everything else is masked.",
    )
    chat_template_kwargs: dict[TemplateArgument, str | int | float | bool] = Field(
        default_factory=dict,
        description="Chat formats: arguments every rendering of the chat template gets (training, eval prompts, "
        "generation, the export), e.g. {enable_thinking: false} for Qwen3; recorded in the data version, every "
        "eval config and BINDING.json.",
    )
    train_on_reasoning: bool = Field(
        True,
        description="Chat formats: whether the text a template writes before an answer's content (the reasoning of "
        "a `reasoning_content` field, an empty think block) counts in the loss; false: only the content and its "
        "end-of-turn token.",
    )
    truncation: Literal["drop", "fail"] = Field(
        "drop",
        description="Causal LMs: a row whose counted tokens all lie past model.max_length (a prompt or the turns "
        "before the first counted assistant turn fill it) trains on nothing. drop: leave such rows out, counted, "
        "the first named by file and line; fail: refuse the data, naming each.",
    )
    template: str = Field(
        "{prompt}\n",
        max_length=10_000,
        description="Causal LM, format prompt_response: the text before the response; `{prompt}` is replaced. Its "
        "tokens get no loss.",
    )
    labels: list[str] | None = Field(
        None, min_length=2, description="Declared categories; a row with another label is an error."
    )
    clean: list[CleanRule] = Field(
        default_factory=lambda: ["normalize_ws", "drop_empty"], description="Applied in order to every text."
    )
    split: SplitPolicy = Field(default_factory=SplitPolicy)
    leaks: LeakPolicy = Field(default_factory=LeakPolicy)
    inspect_per_category: int = Field(2, ge=1, le=50, description="Examples per category in the inspection.")
    cluster_field: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="Text rows: a field shared by rows that belong together (a source document, a conversation); "
        "intervals resample whole clusters instead of single rows. Every row must have it.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Data:
        if (self.source is None) == (self.files is None):
            raise ValueError("expected exactly one of data.source (rentune splits it) or data.files (given splits)")
        if "{prompt}" not in self.template:
            raise ValueError("expected data.template to contain {prompt}")
        if self.cluster_field is not None and self.modality == "image":
            raise ValueError("expected no data.cluster_field for images (it names a field of text rows)")
        return self


class Quantization(_Section):
    """QLoRA: the frozen base loaded quantized by bitsandbytes, LoRA trained on top (docs/qlora.md)."""

    bits: Literal[4, 8] = Field(4, description="4: NF4 or FP4 weights (QLoRA); 8: LLM.int8() weights.")
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit only: the 4-bit data type.")
    double_quant: bool = Field(True, description="4-bit only: quantize the quantization constants too.")
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="4-bit only: the dtype the matmuls run in; auto: bfloat16 when training.precision resolves "
        "to bf16 (a GPU that has it), else float32.",
    )

    @model_validator(mode="after")
    def _four_bit_fields(self) -> Quantization:
        if self.bits == 8:
            given = sorted(self.model_fields_set & {"quant_type", "double_quant", "compute_dtype"})
            if given:
                raise ValueError(f"expected no {', '.join(given)} with bits 8 (they are 4-bit settings)")
        return self


class Adaptation(_Section):
    method: Literal["lora", "full"] = "lora"
    rank: int = Field(8, gt=0, le=1024)
    alpha: float = Field(16.0, gt=0.0, le=4096.0)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] | None = Field(
        None,
        min_length=1,
        description="Module names LoRA wraps (default: peft's choice for the architecture, e.g. the attention "
        "query and value projections). The resolved list is recorded.",
    )
    modules_to_save: list[str] = Field(
        default_factory=list, description="Extra modules trained in full and saved with the adapter."
    )
    quantization: Quantization | None = Field(
        None,
        description="QLoRA: load the frozen base quantized (bitsandbytes) and train LoRA on top; method lora, "
        "causal LMs (tasks format and extraction), not with DeepSpeed ZeRO-3.",
    )


class CheckpointPolicy(_Section):
    every_steps: int | None = Field(None, gt=0, le=10_000_000, description="Commit every N optimizer steps.")
    every_minutes: float | Literal["auto"] | None = Field(
        None,
        description="Commit at least this often (minutes, up to 1440), or `auto`: Young/Daly's interval "
        "sqrt(2 x C x MTBF) from each commit's measured cost C and `mtbf_hours`.",
    )
    mtbf_hours: float = Field(
        24.0, gt=0.0, le=10_000.0, description="With every_minutes: auto, the expected hours between interruptions."
    )
    keep: int = Field(3, ge=1, le=100, description="Valid checkpoints kept after rotation.")
    grace_seconds: float = Field(
        90.0,
        gt=0.0,
        le=3600.0,
        description="After SIGTERM: time to finish the step and commit. Match docker's --stop-timeout.",
    )
    max_lost_minutes: float = Field(
        30.0,
        gt=0.0,
        le=1440.0,
        description="What one interruption may cost at most, when the commit on SIGTERM cannot finish within "
        "grace_seconds or the provider's notice (AWS 120 s, GCP 30 s): the plan then commits periodically often "
        "enough that the work since the last committed checkpoint stays within these minutes.",
    )

    @field_validator("every_minutes")
    @classmethod
    def _minutes_in_range(cls, value):
        if isinstance(value, float | int) and not 0.0 < value <= 1440.0:
            raise ValueError("expected minutes in (0, 1440], or auto")
        return value


class Training(_Section):
    epochs: float = Field(3.0, gt=0.0, le=1000.0)
    max_steps: int | None = Field(None, gt=0, le=10_000_000, description="Overrides epochs when set.")
    learning_rate: float = Field(2e-4, gt=0.0, le=1.0)
    microbatch: int = Field(16, gt=0, le=4096, description="Examples per device per forward pass.")
    grad_accum: int = Field(1, gt=0, le=1024)
    optimizer: Literal["adamw_torch", "sgd", "adafactor"] = Field(
        "adamw_torch", description="As the HF Trainer names it."
    )
    max_grad_norm: float = Field(1.0, ge=0.0, le=1e6, description="Gradient clipping; 0 disables it.")
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    eval_batch: int = Field(64, gt=0, le=4096)
    log_every_steps: int | None = Field(None, gt=0, le=1_000_000, description="Default: about 20 lines a run.")
    deterministic: bool = Field(False, description="Deterministic algorithms: bit-exact resume, slower on GPU.")
    activation_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory, about a third more time."
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: Literal["any", "cuda", "rocm", "cpu"] = Field(
        "any",
        description="The accelerator stack this job expects (a CUDA or a ROCm image); a mismatch fails before any "
        "phase runs. `rentune env` prints what an image has.",
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="auto: bf16 mixed precision on a GPU that supports it, else fp32 (the CPU); what was chosen is "
        "recorded in the probe and every trial result.",
    )
    packing: bool = Field(
        False,
        description="Causal LMs: pack examples into rows of model.max_length tokens, position ids restarting per "
        "example so no example attends to another (no padding inside a row). A step then trains on rows, not "
        "examples; the loss stays normalised per token.",
    )
    liger: bool = Field(
        False,
        description="Liger's Triton kernels for the model's layers and loss (GPU images with liger-kernel "
        "installed); refused before any phase where they are not installed.",
    )
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)


class Distribution(_Section):
    strategy: Literal["none", "ddp", "deepspeed"] = Field(
        "none", description="none: one process; ddp: torch DistributedDataParallel; deepspeed: ZeRO."
    )
    nproc_per_node: int = Field(1, ge=1, le=64, description="Processes per node (one per GPU); launched by torchrun.")
    nnodes: int = Field(1, ge=1, le=1024)
    rdzv_endpoint: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+:\d{1,5}$",
        description="host:port of the rendezvous for multi-node runs, on node 0 (RENTUNE_RDZV_ENDPOINT overrides "
        "it on resume elsewhere; default: MASTER_ADDR:MASTER_PORT).",
    )
    zero_stage: Literal[2, 3] = Field(2, description="DeepSpeed ZeRO stage.")
    offload: bool = Field(False, description="DeepSpeed: offload optimizer state (and stage 3 parameters) to CPU.")

    @model_validator(mode="after")
    def _consistent(self) -> Distribution:
        if self.strategy == "none" and (self.nproc_per_node > 1 or self.nnodes > 1):
            raise ValueError("expected distribution.strategy ddp or deepspeed when more than one process is used")
        return self


class Rental(_Section):
    window: Literal["3d", "7d", "30d"] = Field("3d", description="Length of the node lease.")
    started_at: datetime | None = Field(
        None,
        description="When the lease started (ISO 8601 with a timezone, e.g. 2026-12-02T09:00:00Z). "
        "Default: when this job first started.",
    )
    margin: Duration | None = Field(
        None, description="Time kept free for recovery before the lease ends (default: 2h, 6h or 24h by window)."
    )
    step_seconds: float | None = Field(
        None,
        gt=0.0,
        le=86400.0,
        description="Your estimate of one optimizer step, used until the probe measures it (default: 1 s).",
    )

    @model_validator(mode="after")
    def _aware(self) -> Rental:
        if self.started_at is not None and self.started_at.tzinfo is None:
            raise ValueError("expected rental.started_at with a timezone, e.g. 2026-12-02T09:00:00Z")
        return self


class Export(_Section):
    """What the export hands over besides the adapter (docs/serving.md)."""

    merged: bool | None = Field(
        None,
        description="Also write export/merged/: the adapter merged into the base (in fp32, then cast to "
        "`dtype`), with every serving file, checked against the adapter on eval in a fresh process. "
        "Default: true for LoRA on causal LMs (format, extraction), false for classifiers and full fine-tunes.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The merged weights' dtype; auto: the base model's own (config.json dtype)."
    )
    parity_tolerance: float = Field(
        0.01,
        ge=0.0,
        le=1.0,
        description="The merged model passes when its primary metric on eval is within this of the adapter's "
        "(classifiers also need equal predictions on at least 99% of eval examples).",
    )
    merge_base: Literal["dequantized", "original"] | None = Field(
        None,
        description="With adaptation.quantization: merge into the dequantized quantized weights the adapter was "
        "trained against (dequantized, the default: reproduces the evaluated outputs) or into the original "
        "full-precision base (original; the parity check reports the difference).",
    )


class Store(_Section):
    uri: PathStr = Field(
        "file://./runs",
        pattern=r"^(file|s3)://\S+$",
        description="Where state, checkpoints and exports go: file://DIR or s3://bucket/prefix.",
    )
    endpoint_url: str | None = Field(None, pattern=r"^https?://\S+$", description="S3-compatible endpoint.")
    region: str | None = Field(None, max_length=64)
    addressing_style: Literal["auto", "path", "virtual"] | None = None

    @field_validator("endpoint_url")
    @classmethod
    def _no_credentials(cls, value):
        return value and no_credentials(value)


_CREDENTIAL_WORDS = ("key", "token", "password", "secret")


class _TrackerSection(_Section):
    @model_validator(mode="before")
    @classmethod
    def _no_credentials(cls, data):
        """A misplaced credential gets its own message (not just `extra field`): specs are stored in the
        bucket, copied into exports and shown in reports."""
        if isinstance(data, dict):
            for name in data:
                if any(word in str(name).lower() for word in _CREDENTIAL_WORDS):
                    raise ValueError(
                        f"{name}: credentials never go in the spec (it is stored with the job and its exports); "
                        f"set them in the environment instead ({cls._credentials_env})"
                    )
        return data


class MlflowTracking(_TrackerSection):
    _credentials_env: ClassVar[str] = "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN"
    tracking_uri: str | None = Field(
        None,
        max_length=2000,
        pattern=r"^(databricks(-uc)?(://\S*)?|(https?|file|sqlite|postgresql|mysql|mssql)[:+]\S*)$",
        description="The MLflow tracking server (http(s)://, databricks, a database or file: URI); default: "
        "MLFLOW_TRACKING_URI from the environment.",
    )
    experiment: str | None = Field(
        None, min_length=1, max_length=500, description="Experiment name; default: rentune/<job id>."
    )

    @field_validator("tracking_uri")
    @classmethod
    def _no_userinfo(cls, value):
        return value and no_credentials(value, f"{cls._credentials_env} in the environment")


class WandbTracking(_TrackerSection):
    _credentials_env: ClassVar[str] = "WANDB_API_KEY"
    project: str = Field(min_length=1, max_length=128, pattern=r"^[^/\\#?%:]+$", description="W&B project.")
    entity: str | None = Field(None, min_length=1, max_length=128, description="W&B team or user; default: yours.")


class Tracking(_Section):
    """Where training is followed besides rentune's own report. Each trial is one run in each tracker,
    continued (same id, no repeated steps) after a resume on any node. A tracker that cannot be reached is
    a warning in the log, never a failed job."""

    tensorboard: bool = Field(
        False, description="Event files under trials/<id>/tensorboard/ in the store (`rentune fetch` brings them)."
    )
    mlflow: MlflowTracking | None = Field(None, description="An MLflow run per trial.")
    wandb: WandbTracking | None = Field(
        None, description="A W&B run per trial (WANDB_API_KEY, WANDB_MODE=offline from the environment)."
    )

    @property
    def enabled(self) -> list[str]:
        return [name for name in ("tensorboard", "mlflow", "wandb") if getattr(self, name)]


class JobSpec(_Section):
    """A whole job. `rentune schema` prints this model's JSON Schema."""

    job: Job
    hypothesis: Hypothesis
    guardrails: list[Guardrail] = Field(
        default_factory=list, description="What must not degrade against the baseline, each with its tolerance."
    )
    model: Model
    data: Data
    adaptation: Adaptation = Field(default_factory=Adaptation)
    training: Training = Field(default_factory=Training)
    distribution: Distribution = Field(default_factory=Distribution)
    rental: Rental = Field(default_factory=Rental)
    store: Store = Field(default_factory=Store)
    tracking: Tracking = Field(default_factory=Tracking)
    evaluation: Evaluation = Field(default_factory=Evaluation)
    export: Export = Field(default_factory=Export)
    experiments: list[Experiment] = Field(
        default_factory=list, max_length=100, description="Variants trained after `main`, each against a reference."
    )

    @property
    def generates(self) -> bool:
        """A causal LM job (format and extraction tasks on text): it generates its answers."""
        return self.data.modality == "text" and self.hypothesis.task in ("format", "extraction")

    @property
    def merges(self) -> bool:
        """Whether the export writes export/merged/ (export.merged; by default for LoRA on causal LMs: a
        full fine-tune's adapter/ already holds the whole model)."""
        if self.export.merged is not None:
            return self.export.merged
        return self.generates and self.adaptation.method == "lora"
