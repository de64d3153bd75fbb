"""Read a job spec from YAML or JSON into a frozen `JobSpec`, reporting every problem at once.

Each error names the file, the dotted field path and what was expected, for example
`spec.yaml: adaptation.rank: expected a number greater than 0, got -4`.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from jobspec.schema import CREDENTIAL_ERROR, JobSpec

__all__ = ["LoadedSpec", "SpecError", "load_spec", "parse_spec"]

# Credentials come from the environment or the instance role, never from a spec that may sit in a queue,
# a bucket or a git history. Keys that look like one are refused outright.
_SECRET_KEY = re.compile(r"secret|passw(or)?d|access_key|credential|api_?key|session_token|auth_token", re.I)
_SECRET_VALUE = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b|-----BEGIN [A-Z ]*PRIVATE KEY-----")


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader without anchors and aliases: a spec never needs them, and a few nested aliases expand
    into billions of nodes (a "billion laughs" spec from a queue would hang validation)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a job spec", event.start_mark
            )
        return super().compose_node(parent, index)


class SpecError(ValueError):
    """A spec that cannot be used. `errors` holds one line per problem, each naming file and field."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


@dataclass(frozen=True)
class LoadedSpec:
    spec: JobSpec
    text: str  # the exact bytes the user wrote, decoded; frozen into the store
    sha256: str  # of `text`: identifies this spec in every record
    source: str  # file name used in messages


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate the spec at `path`. Raises `SpecError` listing every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([f"{path}: file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([f"{path}: cannot read the spec ({exc})"]) from None
    return parse_spec(text, source=str(path))


def parse_spec(text: str, source: str = "<spec>") -> LoadedSpec:
    """Validate spec `text` (YAML or JSON); `source` names it in messages. Raises `SpecError`."""
    try:
        raw = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader that also refuses aliases
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([f"{source}{where}: not valid YAML ({problem})"]) from None
    if not isinstance(raw, dict):
        raise SpecError([f"{source}: expected a mapping with sections job, hypothesis, model, data, ..."])

    errors = [f"{source}: {path}: {why}" for path, why in _secret_findings(raw)]
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        errors += [f"{source}: {_format_error(err, raw)}" for err in exc.errors()]
        spec = None
    if errors or spec is None:
        raise SpecError(errors)
    spec = _cross_checks(spec, source)
    return LoadedSpec(spec=spec, text=text, sha256=hashlib.sha256(text.encode()).hexdigest(), source=source)


def _secret_findings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}" if path else str(key)
            if _SECRET_KEY.search(str(key)):
                yield (
                    here,
                    (
                        "looks like a credential; a spec never holds secrets. Set them in the node's "
                        "environment (e.g. AWS_SECRET_ACCESS_KEY) or use an instance role"
                    ),
                )
            else:
                yield from _secret_findings(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _secret_findings(value, f"{path}[{i}]")
    elif isinstance(node, str) and _SECRET_VALUE.search(node):
        yield path, "holds what looks like an access key or private key; remove it from the spec"


def _format_error(err: Any, raw: dict) -> str:
    loc = [str(part) for part in err["loc"] if not str(part).startswith("function-")]
    field = ".".join(loc) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(loc[-1], allowed, n=1, cutoff=0.6) if loc else []
        guess = f"did you mean {'.'.join([*loc[:-1], close[0]])}? " if close else ""
        return f"{field}: unknown key; {guess}expected one of: {', '.join(allowed)}"
    if kind == "missing":
        return f"{field}: missing; this field is required"
    message = err["msg"]
    message = re.sub(r"^(Value error, |Input should be |expected )+", "", message)
    got = err.get("input")
    shown = "" if isinstance(got, dict) or kind == CREDENTIAL_ERROR else f", got {_short(repr(got))}"  # no secret shown
    return f"{field}: expected {message[0].lower()}{message[1:]}{shown}"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _allowed_keys(loc: list[str]) -> list[str]:
    model: type[BaseModel] = JobSpec
    for part in loc:
        annotation = model.model_fields[part].annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return sorted(model.model_fields)


def _cross_checks(spec: JobSpec, source: str) -> JobSpec:
    from jobspec.experiments import trial_errors

    errors = []
    if spec.adaptation.method == "full" and spec.adaptation.modules_to_save:
        errors.append(f"{source}: adaptation.modules_to_save: expected empty with method 'full' (all train)")
    errors += [f"{source}: {line}" for line in trial_errors(spec)]
    errors += [f"{source}: {line}" for line in _quantization_errors(spec)]
    if spec.data.modality == "image" and spec.hypothesis.task != "classification":
        errors.append(f"{source}: data.modality: expected text for task {spec.hypothesis.task}; images are classified")
    chat = spec.data.format != "prompt_response"
    if chat and spec.hypothesis.task == "classification":
        errors.append(
            f"{source}: data.format: expected prompt_response for task classification ({spec.data.format} "
            "is for causal LMs: tasks format and extraction)"
        )
    if not chat and spec.data.chat_template:
        errors.append(f"{source}: data.chat_template: expected data.format messages, sharegpt or alpaca")
    if not chat and spec.data.chat_template_kwargs:
        errors.append(f"{source}: data.chat_template_kwargs: expected data.format messages, sharegpt or alpaca")
    template_file = spec.data.chat_template
    if template_file and (
        template_file.startswith("s3://") or not Path(template_file.removeprefix("file://")).is_file()
    ):
        errors.append(f"{source}: data.chat_template: expected a local Jinja file, got {template_file!r} (not found)")
    if spec.training.packing and spec.hypothesis.task == "classification":
        errors.append(
            f"{source}: training.packing: expected false for task classification (packing is for causal LMs: "
            "tasks format and extraction)"
        )
    if "truncation" in spec.data.model_fields_set and spec.hypothesis.task == "classification":
        errors.append(
            f"{source}: data.truncation: expected unset for task classification (it says what to do with a causal "
            "LM's row whose counted tokens all lie past model.max_length; a classifier reads every row's start)"
        )
    if spec.model.attn_implementation != "auto" and spec.hypothesis.task == "classification":
        errors.append(
            f"{source}: model.attn_implementation: expected auto for task classification (it is for causal LMs)"
        )
    labels = spec.data.labels
    for i, guardrail in enumerate(spec.guardrails):
        name, _, part = guardrail.metric.partition("/")
        known = GUARDRAIL_METRICS[spec.hypothesis.task]
        if name not in known:
            errors.append(
                f"{source}: guardrails.{i}.metric: expected one of {', '.join(sorted(known))} (optionally /<name> or "
                f"/*) for task {spec.hypothesis.task}, got {guardrail.metric!r}"
            )
        elif part and part != "*" and name in ("f1", "precision", "recall") and labels and part not in labels:
            errors.append(f"{source}: guardrails.{i}.metric: expected a category of data.labels, got {part!r}")
    if errors:
        raise SpecError(errors)
    return spec


def _quantization_errors(spec: JobSpec) -> list[str]:
    """What QLoRA works with (docs/qlora.md): LoRA on a causal LM, without ZeRO-3, the same quantized base
    for every trial."""
    if spec.adaptation.quantization is None:
        if spec.export.merge_base is not None:
            return [
                "export.merge_base: expected adaptation.quantization (it chooses the base a QLoRA adapter merges into)"
            ]
        return []
    errors = []
    if spec.adaptation.method != "lora":
        errors.append(
            "adaptation.quantization: expected adaptation.method lora (a quantized base cannot be trained in full)"
        )
    if not spec.generates:
        errors.append(
            "adaptation.quantization: expected a causal LM job (tasks format and extraction on text); "
            f"task {spec.hypothesis.task} on {spec.data.modality} is trained unquantized"
        )
    if spec.distribution.strategy == "deepspeed" and spec.distribution.zero_stage == 3:
        errors.append(
            "adaptation.quantization: expected distribution.zero_stage 2 or strategy ddp (ZeRO-3 partitions "
            "parameters, and bitsandbytes' quantized weights cannot be partitioned)"
        )
    for i, experiment in enumerate(spec.experiments):
        if experiment.adaptation.get("method", "lora") != "lora":
            errors.append(
                f"experiments.{i}.adaptation.method: expected lora with adaptation.quantization (a quantized base "
                "cannot be trained in full)"
            )
        if "quantization" in experiment.adaptation:
            errors.append(
                f"experiments.{i}.adaptation.quantization: expected the spec's own (every trial and the baseline "
                "run on the same quantized base)"
            )
    return errors


# Metric families a guardrail may name, per task; `family/<name>` picks one category or field, `family/*` all.
GUARDRAIL_METRICS = {
    "classification": {"accuracy", "macro_f1", "micro_f1", "f1", "precision", "recall"},
    "format": {"format_valid_rate", "json_valid_rate", "schema_valid_rate", "regex_match_rate"},
    "extraction": {
        "json_valid_rate",
        "required_present_rate",
        "field_accuracy",
        "field_accuracy_normalized",
        "extra_field_rate",
        "type_error_rate",
    },
}
