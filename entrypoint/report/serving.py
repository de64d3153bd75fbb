"""How an exported model is served, stated and checked: vLLM's rules for a LoRA adapter, an Ollama Modelfile for
the merged causal LM, and SERVING.md with the exact commands.

A user's first hour after the export is spent finding out whether `vllm serve --enable-lora` takes the adapter
and which chat template Ollama needs. Both are decidable here, from what the export holds:

    vllm_readiness:   adapter_config.json + the base architecture -> loadable, and every reason it is not
    ollama_modelfile: the trained chat template, proven equal to Ollama's ChatML or Llama-3 template by
                      rendering probe conversations both ways -> Modelfile text (or no TEMPLATE, said so)
    serving_guide:    the above + the merge's parity figures -> SERVING.md

Exactness over coverage: a template is translated only when every probe renders byte for byte as Ollama
would render it; an adapter is called loadable only when every rule below passes. Pure functions: the export
phase reads the files and writes the results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from entrypoint.report.binding import KWARGS_FILE
from jobspec.local_inputs import local_path

__all__ = [
    "LABEL_LINE",
    "VLLM_LORA_ARCHITECTURES",
    "VLLM_LORA_RANKS",
    "Usage",
    "ollama_modelfile",
    "serving_guide",
    "vllm_readiness",
]

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's --max-lora-rank choices (vllm#2847)

_DECODER = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
# Architectures vLLM serves LoRA adapters for, and the modules its LoRA layers cover: vLLM's "Supported Models"
# docs page (LoRA column) and the packed-modules mapping of each model under vllm/model_executor/models/ that
# vllm/lora/ applies (q/k/v_proj pack into qkv_proj, gate/up_proj into gate_up_proj; Phi-3 checkpoints are
# packed already). An architecture not listed is refused: vLLM's LoRA support covers decoders, not encoder
# classifiers.
VLLM_LORA_ARCHITECTURES: dict[str, frozenset[str]] = {
    "LlamaForCausalLM": _DECODER,
    "MistralForCausalLM": _DECODER,
    "Qwen2ForCausalLM": _DECODER,
    "Qwen3ForCausalLM": _DECODER,
    "GemmaForCausalLM": _DECODER,
    "Gemma2ForCausalLM": _DECODER,
    "Gemma3ForCausalLM": _DECODER,
    "Phi3ForCausalLM": frozenset({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),
}
_SOURCE = (
    "rentune's rules for vLLM: rank among --max-lora-rank choices (vllm#2847), modules_to_save None (vllm#9280), "
    "no DoRA, bias none, no added vocabulary, architecture and modules from vLLM's Supported Models (LoRA)"
)
_MERGED = "serve the merged folder export/merged/ instead"

# Ollama's legacy (prompt/response) templates, as (open, close) around System, Prompt and Response. The TEMPLATE
# text and the Python rendering below are both built from these, so what is compared is what is written.
_FAMILIES = {
    "chatml": {
        "blocks": (
            ("<|im_start|>system\n", "<|im_end|>\n"),
            ("<|im_start|>user\n", "<|im_end|>\n"),
            ("<|im_start|>assistant\n", "<|im_end|>\n"),
        ),
        "stop": ("<|im_start|>", "<|im_end|>"),
    },
    "llama3": {
        "blocks": (
            ("<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>"),
            ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>"),
            ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
        ),
        "stop": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    },
}
# Probe turns: no outer whitespace, no markup, distinct so that a misplaced turn shows.
_SYSTEM, _USER, _ANSWER, _USER2 = "Probe system prompt.", "First probe question?", "Probe answer.", "Second question?"
_REASONING = "Probe reasoning."
_NO_CHAT_TEMPLATE = (
    "the tokenizer has no chat template (a prompt/response job): no TEMPLATE, so Ollama passes each prompt "
    "through as written ({{ .Prompt }}); write prompts as the job's prompts were written"
)


# -- vLLM ----------------------------------------------------------------------------------------------


def vllm_readiness(adapter_config: dict, architecture: str, added_tokens: int) -> dict:
    """Whether `vllm serve BASE --enable-lora` loads this adapter: {"loadable", "reasons" (empty when
    loadable), "max_lora_rank" (the smallest --max-lora-rank choice >= every rank; None when none is), "source"}.

    `adapter_config` is peft's adapter_config.json, `architecture` the base config's architectures[0],
    `added_tokens` how many tokens the exported tokenizer has beyond the base's. The rank rule is conservative:
    vLLM releases before the choices were loosened refused an adapter whose rank was not itself one of
    VLLM_LORA_RANKS (vllm#2847), so a rank of 24 is refused here although a newer vLLM may load it with
    --max-lora-rank 32. Each reason names the value, what vLLM accepts, and points to export/merged/.
    """
    reasons = []
    peft_type = adapter_config.get("peft_type") or "LORA"
    if str(peft_type).upper() != "LORA":
        reasons.append(f"peft_type is {peft_type}; vLLM loads LoRA adapters only: {_MERGED}")
    ranks = _ranks(adapter_config)
    for rank in ranks:
        if rank not in VLLM_LORA_RANKS:
            choices = ", ".join(map(str, VLLM_LORA_RANKS))
            reasons.append(f"rank {rank} is not one of vLLM's --max-lora-rank choices {choices}: {_MERGED}")
    saved = adapter_config.get("modules_to_save")
    if saved:
        reasons.append(
            f"modules_to_save is {list(saved)} (modules saved in full); vLLM only supports modules_to_save "
            f"being None (vllm#9280): {_MERGED}"
        )
    if adapter_config.get("use_dora"):
        reasons.append(f"use_dora is true; vLLM does not load DoRA adapters: {_MERGED}")
    bias = adapter_config.get("bias") or "none"
    if bias != "none":
        reasons.append(f"bias is {bias!r}; vLLM loads LoRA adapters with bias 'none' only: {_MERGED}")
    if added_tokens > 0:
        reasons.append(
            f"the tokenizer has {added_tokens} tokens beyond the base's; vLLM no longer loads adapters with "
            f"extra vocabulary: {_MERGED}"
        )
    reasons += _module_reasons(adapter_config.get("target_modules"), architecture)
    allowed = [choice for choice in VLLM_LORA_RANKS if ranks and choice >= max(ranks)]
    return {
        "loadable": not reasons,
        "reasons": reasons,
        "max_lora_rank": allowed[0] if allowed else None,
        "source": _SOURCE,
    }


def _ranks(adapter_config: dict) -> list[int]:
    """Every rank the adapter uses: r and the per-module ranks of rank_pattern, in order, once each."""
    found = [adapter_config.get("r"), *(adapter_config.get("rank_pattern") or {}).values()]
    return list(dict.fromkeys(rank for rank in found if isinstance(rank, int)))


def _module_reasons(targets: list[str] | str | None, architecture: str) -> list[str]:
    """Why vLLM's LoRA layers do not cover the adapter's target modules on `architecture` (none: they do)."""
    covered = VLLM_LORA_ARCHITECTURES.get(architecture)
    if covered is None:
        known = ", ".join(VLLM_LORA_ARCHITECTURES)
        return [f"architecture {architecture} is not one vLLM serves LoRA adapters for ({known}): {_MERGED}"]
    if isinstance(targets, str):
        return [
            f"target_modules is the pattern {targets!r}, which rentune cannot check against the modules vLLM's "
            f"LoRA covers for {architecture} ({', '.join(sorted(covered))}): {_MERGED}, or try the adapter yourself"
        ]
    names = [str(target).rsplit(".", 1)[-1] for target in targets or ()]  # peft matches names by suffix
    outside = [name for name in dict.fromkeys(names) if name not in covered]
    if not outside:
        return []
    return [
        f"target modules {', '.join(outside)} are not among those vLLM's LoRA covers for {architecture} "
        f"({', '.join(sorted(covered))}): {_MERGED}"
    ]


# -- Ollama --------------------------------------------------------------------------------------------


def ollama_modelfile(
    tokenizer, chat_template_kwargs: dict, stop_tokens: list[str], model_folder: str = "./merged"
) -> tuple[str, dict]:
    """The Modelfile for the merged model in `model_folder` (relative to the Modelfile) and what it decided:
    {"template": "chatml" | "llama3" | None, "system": default system prompt | None, "stop": [...], "note"}.

    The tokenizer's chat template (rendered with `chat_template_kwargs`, as in training) is translated to
    Ollama's template of a family only when four probe conversations ([user], [system, user], [system, user,
    assistant, user], the same with a <think> block in the answer) render exactly as Ollama's legacy template
    renders them, turn pair by turn pair with the system prompt on the first. A system block the template
    adds to a bare [user] conversation becomes the Modelfile's SYSTEM, as Ollama prepends it then.
    `stop_tokens` (the eval's end-of-sequence and end-of-turn) come first among the PARAMETER stop lines,
    then the family's own; a token holding a double quote is left out (a Modelfile value cannot hold it)."""
    family, system, why = _translate(tokenizer, chat_template_kwargs)
    stops = [*stop_tokens, *(_FAMILIES[family]["stop"] if family else ())]
    stops = [stop for stop in dict.fromkeys(stops) if stop]
    unquotable = [stop for stop in stops if '"' in stop]  # the Modelfile parser cannot hold them in quotes
    stops = [stop for stop in stops if stop not in unquotable]
    folder = model_folder.removeprefix("./").rstrip("/")
    lines = ["# Ollama Modelfile for export/merged/ (ollama create NAME -f Modelfile)", f"FROM {model_folder}"]
    if family:
        name = {"chatml": "ChatML", "llama3": "Llama-3"}[family]
        note = f"TEMPLATE translated from the chat template: Ollama's {name} template, proven exact on probe turns"
        note += "; SYSTEM is the template's default system prompt" if system else ""
        if system:
            lines.append(f'SYSTEM """{system}"""')
        lines.append(f'TEMPLATE """{_ollama_template(family)}"""')
    else:
        note = why or (
            "the chat template is not one rentune translates exactly (ChatML, Llama-3): write TEMPLATE by hand "
            f"from {folder}/chat_template.jinja (without one, ollama create may pick a built-in template that "
            "renders differently)"
        )
        lines.append(f"# No TEMPLATE: {note}")
    if unquotable:
        note += f"; stop tokens left out (a double quote cannot be written in a Modelfile value): {unquotable}"
    lines += [f'PARAMETER stop "{stop}"' for stop in stops]
    return "\n".join(lines) + "\n", {"template": family, "system": system, "stop": stops, "note": note}


def _translate(tokenizer, kwargs: dict) -> tuple[str | None, str | None, str | None]:
    """(family, default system prompt, None) when the chat template is exactly a family's; else (None, None,
    why not, or None for the generic note)."""
    if not getattr(tokenizer, "chat_template", None):
        return None, None, _NO_CHAT_TEMPLATE
    probes = (
        [{"role": "user", "content": _USER}],
        [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}],
        [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _USER},
            {"role": "assistant", "content": _ANSWER},
            {"role": "user", "content": _USER2},
        ],
        [  # Ollama keeps an answer's reasoning in the history; a template that drops it (Qwen3) differs
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _USER},
            {"role": "assistant", "content": f"<think>\n{_REASONING}\n</think>\n\n{_ANSWER}"},
            {"role": "user", "content": _USER2},
        ],
    )
    try:
        rendered = [
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
            for messages in probes
        ]
    except Exception as exc:  # whatever the template raises (a role it refuses): Ollama's cannot stand for it
        why = f"the chat template does not render the probe conversations ({type(exc).__name__}: {exc}); it is "
        return None, None, why + "not one rentune translates exactly (ChatML, Llama-3): write TEMPLATE by hand"
    bos = getattr(tokenizer, "bos_token", None)
    for family in _FAMILIES:
        # Ollama adds the bos itself (Llama-3: <|begin_of_text|>), so a bos the template writes first may be the
        # one Ollama adds; ChatML's bos is often <|im_start|>, which the template writes as text: try both.
        for prefix in dict.fromkeys(("", bos or "")):
            if not all(text.startswith(prefix) for text in rendered):
                continue
            texts = [text[len(prefix) :] for text in rendered]
            system = _default_system(family, texts[0])
            if system is not None and '"""' in system:
                continue  # a SYSTEM value cannot hold it
            bare = [{"role": "system", "content": system}, *probes[0]] if system is not None else probes[0]
            if all(_render_ollama(family, m) == t for m, t in zip((bare, *probes[1:]), texts, strict=True)):
                return family, system, None
    return None, None, None


def _default_system(family: str, rendered: str) -> str | None:
    """The system prompt the template wrote into a conversation that had none, or None."""
    (open_, close), _, _ = _FAMILIES[family]["blocks"]
    if not rendered.startswith(open_) or close not in rendered[len(open_) :]:
        return None
    return rendered[len(open_) :].split(close, 1)[0]


def _ollama_template(family: str) -> str:
    """Ollama's legacy TEMPLATE text of `family`."""
    (s0, s1), (u0, u1), (a0, a1) = _FAMILIES[family]["blocks"]
    return (
        f"{{{{ if .System }}}}{s0}{{{{ .System }}}}{s1}{{{{ end }}}}"
        f"{{{{ if .Prompt }}}}{u0}{{{{ .Prompt }}}}{u1}{{{{ end }}}}{a0}{{{{ .Response }}}}{a1}"
    )


def _render_ollama(family: str, messages: list[dict]) -> str:
    """What Ollama renders from its legacy template (ollama/template/template.go, Execute): one execution per
    (system, prompt, response) group, a group closed by the next user turn after a response or the next
    system turn; the last group is rendered with the template cut after {{ .Response }} (the generation
    prompt). Empty fields skip their `if` block."""
    (s0, s1), (u0, u1), (a0, a1) = _FAMILIES[family]["blocks"]

    def group(system: str, prompt: str, response: str, last: bool) -> str:
        head = (f"{s0}{system}{s1}" if system else "") + (f"{u0}{prompt}{u1}" if prompt else "") + a0
        return head + response + ("" if last else a1)

    out, system, prompt, response = [], "", "", ""
    for message in messages:
        role, content = message["role"], message["content"]
        if (role == "system" and (prompt or response)) or (role == "user" and response):
            out.append(group(system, prompt, response, last=False))
            system, prompt, response = "", "", ""
        if role == "system":
            system = content
        elif role == "user":
            prompt = content
        elif role == "assistant":
            response = content
    out.append(group(system, prompt, response, last=True))
    return "".join(out)


# -- SERVING.md ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """How user code loads and calls an export of one model family: what SERVING.md's snippets say. Each
    kind gives its own (entrypoint/kinds/, the `Serving` record); nothing here names a kind."""

    model_class: str  # the transformers Auto class, e.g. "AutoModelForCausalLM"
    processor_class: str  # "AutoTokenizer" or "AutoImageProcessor"
    generative: bool  # vLLM (and Ollama) serve it; a classifier's base instead loads with the job's labels
    # (base, folder, chat) -> the lines after `model = ...from_pretrained(folder)`: the processor, one call
    call: Callable[[str, str, bool], list[str]]


# A classifier's answer: its last line in SERVING.md's snippets.
LABEL_LINE = "print(model.config.id2label[model(**inputs).logits.argmax(-1).item()])"


def serving_guide(
    *,
    job_id: str,
    base_source: str,
    usage: Usage,
    adapter_rank: int | None,
    readiness: dict | None,
    merged: dict | None,
    modelfile: dict | None,
    chat: bool,
    full: bool = False,
) -> str:
    """SERVING.md for export/: the exact commands to serve the adapter and the merged folder (vLLM, transformers
    with peft, transformers alone, Ollama), each run from export/, with the merge's parity figures and, when
    parity failed, that first. `readiness` is vllm_readiness's dict (None: not checked), `merged` the merge's
    {"dtype", "parity": "ok" | "failed", "metric", "adapter", "merged", "equal_outputs"} (None: no merged
    folder), `modelfile` ollama_modelfile's dict (None: no Modelfile), `usage` the kind's snippets."""
    base = _base_argument(base_source)
    parts = [f"# Serving {job_id}", ""]
    if merged and merged.get("parity") == "failed":
        parts += [
            f"> **{_parity(merged)}.** The merged folder does not reproduce the adapter's results: serve the "
            "adapter (base + adapter/) rather than merged/.",
            "",
        ]
    parts += [
        f"Base model: `{base_source}`" + (f"; LoRA rank {adapter_rank}" if adapter_rank else "") + ".",
        "Commands run from this folder (export/). Check the export first: "
        "`rentune check-export . --base BASE_FOLDER` (BASE_FOLDER: your copy of the base model"
        + (f", e.g. `aws s3 sync {base_source} BASE_FOLDER`" if base_source.startswith("s3://") else "")
        + ").",
        "",
    ]
    if merged and merged.get("parity") != "failed":
        parts += [f"Merged folder ({merged.get('dtype')}): {_parity(merged)}.", ""]
    if full:  # a full fine-tune: adapter/ holds the whole model
        if usage.generative:
            parts += ["## vLLM (the fully fine-tuned model)", "", *_fence("bash", "vllm serve ./adapter")]
        parts += _merged_section(usage, base, chat, "adapter")
    else:
        if usage.generative or readiness is not None:
            parts += _vllm_section(job_id, base, readiness, merged if usage.generative else None, chat)
        parts += _peft_section(usage, base, chat)
    if merged:
        parts += _merged_section(usage, base, chat)
    if modelfile is not None:
        parts += _ollama_section(job_id, modelfile)
    return "\n".join(parts).rstrip("\n") + "\n"


def _base_argument(base_source: str) -> str:
    """What to pass for the base model: a hub id, a folder; a package's model folder has no name to print."""
    if base_source.startswith("hub:"):
        return base_source.removeprefix("hub:")
    if base_source.startswith("package:") or local_path(base_source) is None:
        return "BASE_FOLDER"  # a package's folder has no name to print; a bucket's must be fetched first
    return base_source.removeprefix("file://")


def _parity(merged: dict) -> str:
    return (
        f"parity: {merged.get('parity')}: {merged.get('metric')} merged {merged.get('merged')} vs adapter "
        f"{merged.get('adapter')}; {merged.get('equal_outputs')} eval outputs identical"
    )


def _fence(language: str, text: str) -> list[str]:
    return [f"```{language}", text.rstrip("\n"), "```", ""]


def _vllm_section(job_id: str, base: str, readiness: dict | None, merged: dict | None, chat: bool) -> list[str]:
    parts = ["## vLLM with the adapter", ""]
    if readiness is None:
        parts += ["Not checked for this export.", ""]
    elif readiness["loadable"]:
        command = f"vllm serve {base} --enable-lora --lora-modules {job_id}=./adapter"
        parts += _fence("bash", f"{command} --max-lora-rank {readiness['max_lora_rank']}")
        parts += [f"Requests name the model `{job_id}`; those naming `{base}` get the base model.", ""]
    else:
        parts += ["vLLM cannot load this adapter:", "", *(f"- {reason}" for reason in readiness["reasons"]), ""]
    if merged:
        parts += ["## vLLM with the merged folder", "", *_fence("bash", "vllm serve ./merged")]
    if chat:
        parts += [
            f"When {KWARGS_FILE} exists, send its contents as `chat_template_kwargs` in every chat request "
            "(vLLM's OpenAI-compatible server takes that field): the template rendered with them in training.",
            "",
        ]
    return parts


def _peft_section(usage: Usage, base: str, chat: bool) -> list[str]:
    cls = usage.model_class
    lines = []
    if usage.generative and chat:
        lines += ["import json", "from pathlib import Path", ""]
    lines += ["from peft import PeftModel", f"from transformers import {cls}, {usage.processor_class}", ""]
    if usage.generative:
        lines += [f'base = {cls}.from_pretrained("{base}")']
    else:
        lines = ["import json", "from pathlib import Path", "", *lines]
        lines += [
            'LABELS = json.loads(Path("labels.json").read_text())["labels"]  # the job\'s labels, in training order',
            f'base = {cls}.from_pretrained("{base}", num_labels=len(LABELS), id2label=dict(enumerate(LABELS)))',
        ]
    lines += ['model = PeftModel.from_pretrained(base, "adapter").eval()', *usage.call(base, "adapter", chat)]
    return ["## transformers + peft (the adapter)", "", *_fence("python", "\n".join(lines))]


def _merged_section(usage: Usage, base: str, chat: bool, folder: str = "merged") -> list[str]:
    cls = usage.model_class
    lines = []
    if usage.generative and chat:
        lines += ["import json", "from pathlib import Path", ""]
    lines += [f"from transformers import {cls}, {usage.processor_class}", ""]
    lines += [f'model = {cls}.from_pretrained("{folder}").eval()', *usage.call(base, folder, chat)]
    title = "the merged folder" if folder == "merged" else "the fully fine-tuned model"
    return [f"## transformers alone ({title})", "", *_fence("python", "\n".join(lines))]


def _ollama_section(job_id: str, modelfile: dict) -> list[str]:
    if modelfile.get("template"):
        said = f"Its TEMPLATE is translated from the chat template ({modelfile['template']}), proven exact."
    else:
        said = f"Its chat template is not translated: {modelfile.get('note')}."
    return [
        "## Ollama (the merged folder)",
        "",
        *_fence("bash", f"ollama create {job_id} -f Modelfile\nollama run {job_id}"),
        said,
        "",
    ]
