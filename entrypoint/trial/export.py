"""What the export hands over, shared by the export phase and `rentune export JOB --merged`.

Layout under the job prefix (every file listed with its size and sha256 in BINDING.json):
    export/adapter/...       what `PeftModel.from_pretrained(base, "export/adapter")` loads (a full
                             fine-tune: the whole model); chat jobs: its tokenizer carries the chat
                             template trained with, and chat_template_kwargs.json the arguments every
                             rendering got (when any)
    export/merged/...        export.merged: the adapter merged into the base (training/merge.py) as
                             safetensors (shards + index for a sharded base), config.json, the tokenizer
                             and chat_template.jinja, generation_config.json whose eos are the eval's stop
                             tokens, the image processor for image models
    export/parity.json       the merged model against the adapter on eval, in a fresh process (trial/parity.py)
    export/Modelfile         causal LMs with a merged folder: for Ollama (report/serving.py)
    export/SERVING.md        the commands that serve this export (vLLM, transformers + peft, the merged
                             folder, Ollama) and whether vLLM can load the adapter
    export/spec.yaml, results.json, report.md (the job's report with the serving section), BINDING.json

The adapter export comes first and is complete on its own (its BINDING.json written) before any merge
starts, so a deadline or a crash during the merge leaves a usable export.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from entrypoint.context import PhaseContext
from entrypoint.job import layout
from entrypoint.report.binding import KWARGS_FILE
from entrypoint.report.serving import ollama_modelfile, serving_guide, vllm_readiness
from entrypoint.store import ObjectNotFound, get_tree
from entrypoint.store.hashing import file_sha256
from entrypoint.training.disk import child_failed, last_error_line
from entrypoint.training.environment import environment
from entrypoint.training.lifeline import dies_with_parent
from entrypoint.training.merge import base_dtype, merge_loaded, merge_streamed, stream_refusal
from entrypoint.training.model import SAFE_LOADING, hash_base_model, load_adapter
from entrypoint.training.quantize import dequantized, quantized_base
from entrypoint.trial.evaluate import trial_adaptation

__all__ = [
    "MergeFailed",
    "adapter_files",
    "clear_merged",
    "export_adapter",
    "export_merged",
    "finish_export",
    "write_binding",
]

SERVING_FILES = ("Modelfile", "parity.json", "SERVING.md")  # under export/, written by finish_export
LABELS_FILE = "labels.json"  # under export/, a classifier's labels in training order (finish_export)


class MergeFailed(RuntimeError):
    """The merge or its parity process failed (not a parity failure: that is recorded)."""


def _digest(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def export_adapter(ctx: PhaseContext, trial_id: str) -> dict[str, dict]:
    """Copy the selected trial's weights, the spec and the report under export/; returns the files written
    (name relative to export/ -> size, sha256)."""
    source = layout.trial_final(trial_id)
    copies = {f"adapter/{info.key[len(source) + 1 :]}": info.key for info in ctx.store.list(source)}
    copies |= {layout.SPEC: layout.SPEC, "results.json": layout.RESULTS, "report.md": layout.REPORT_MD}
    recipe = ctx.data_result["recipe"]
    written = {}
    if recipe.get("chat_template_kwargs"):  # what every rendering of the template gets, beside the template
        written[KWARGS_FILE] = (json.dumps(recipe["chat_template_kwargs"], indent=2, sort_keys=True) + "\n").encode()
    files = {}
    for name in sorted({*copies, *written}):
        data = written[name] if name in written else ctx.store.get_bytes(copies[name])
        ctx.store.put_bytes(layout.export_file(name), data)
        files[name] = _digest(data)
    return files


def adapter_files(files: dict[str, dict]) -> dict[str, dict]:
    """BINDING.json's files without the merged folder and the files written about it."""
    return {name: info for name, info in files.items() if not name.startswith("merged/") and name not in SERVING_FILES}


def clear_merged(ctx: PhaseContext) -> None:
    """Delete the merged folder, its parity record and the files written about it (an earlier try's, or the
    one `rentune export --merged --replace` replaces). Call after BINDING.json no longer lists them."""
    for info in ctx.store.list(layout.EXPORT_MERGED):
        ctx.store.delete(info.key)
    for name in SERVING_FILES:
        ctx.store.delete(layout.export_file(name))
    ctx.store.delete(layout.PARITY)


def write_binding(ctx: PhaseContext, trial_id: str, files: dict[str, dict], serving: dict | None = None) -> dict:
    """BINDING.json: the base model's hashes, every exported file's size and sha256, and (`serving`) the
    merged folder's parity and what serves the export. Returns it."""
    spec, recipe = ctx.spec, ctx.data_result["recipe"]
    base_hash = hash_base_model(ctx.model_dir)
    env = environment()
    binding = {
        "base_model": {
            "source": _base_source(spec),
            "revision": spec.model.revision,
            "sha256": base_hash.sha256,
            "files": base_hash.files,
            "hash_method": "sha256 over '<file>\\t<sha256>\\n' lines of *.safetensors, sorted by path",
        },
        "adaptation": ctx.read_json(layout.trial_result(trial_id))["settings"]["adaptation"]["method"],
        # QLoRA: the quantized base the adapter was trained and evaluated on (settings, the bitsandbytes and
        # torch that quantized it, the sha256 of the result), as base_model.json recorded it
        "quantization": ctx.recorded_quantization() if spec.adaptation.quantization is not None else None,
        "files": dict(sorted(files.items())),  # every exported file but this one, relative to export/
        # chat jobs: the template the exported tokenizer carries (adapter/chat_template.jinja), as trained
        "chat_template_sha256": recipe.get("chat_template_sha256"),
        "chat_template_kwargs": recipe.get("chat_template_kwargs"),  # passed to every rendering; in KWARGS_FILE
        # a classifier's labels, in training order: output i is labels[i] (also in export/labels.json)
        "labels": list(ctx.labels) if ctx.kind.serving.labels else None,
        "trial_id": trial_id,
        "job_id": spec.job.id,
        "spec_sha256": ctx.spec_sha256,
        "data_version": ctx.data_version,
        "versions": {"torch": env["torch"], **env["packages"], "rentune": env["rentune"]},
        **(serving or {}),
    }
    ctx.write_json(layout.EXPORT_BINDING, binding)
    return binding


def _base_source(spec) -> str:
    model = spec.model
    return f"package:{model.package}" if model.package else f"hub:{model.hub_id}" if model.hub_id else model.path


def merge_fits(ctx: PhaseContext) -> str | None:
    """None when the plan's merge estimate fits before the lease's margin; else why the merge is left out."""
    try:
        plan = ctx.read_json(layout.PLAN)
    except ObjectNotFound:
        return None
    need = plan.get("merge_seconds") or 0.0
    left = plan["lease_end_at"] - plan["margin_seconds"] - ctx.clock()
    if need > left:
        return (
            f"the merge and its parity check need about {need:.0f} s, {max(left, 0):.0f} s are left before the margin"
        )
    return None


def export_merged(ctx: PhaseContext, trial_id: str, dtype: str) -> dict:
    """Merge the exported adapter into the base, put export/merged/, and check it in a fresh process.
    Returns {"files": {merged/...: digest}, "merge": how, "parity": the parity record}. `dtype`: the merged
    weights' ("auto": the base model's own)."""
    side, labels = ctx.kind.model, ctx.labels
    work = ctx.workdir / "export"
    shutil.rmtree(work, ignore_errors=True)
    adapter, out = get_tree(ctx.store, layout.EXPORT_ADAPTER, work / "adapter"), work / "merged"
    dtype = base_dtype(ctx.model_dir) if dtype == "auto" else dtype
    adaptation = trial_adaptation(ctx.read_json(layout.trial_result(trial_id)))
    quantization = adaptation.quantization
    merge_base = (ctx.spec.export.merge_base or "dequantized") if quantization is not None else "original"
    # Why the merge cannot stream over the base's shards; None when it can
    if merge_base == "dequantized":
        in_memory = "QLoRA: merged into the quantized base dequantized (export.merge_base)"
    else:
        in_memory = stream_refusal(ctx.model_dir, adapter) if adaptation.method == "lora" else "a full fine-tune"
    with ctx.timed("merge"):
        if in_memory is None:
            how = merge_streamed(ctx.model_dir, adapter, out, dtype, ctx.log)
        else:
            if merge_base == "dequantized":  # the weights the adapter was trained against, as fp32
                base = quantized_base(
                    ctx.spec, ctx.model_dir, quantization, ctx.recorded_quantization(), **SAFE_LOADING
                )
                model = load_adapter(dequantized(base), adapter)
            else:  # the original base, never the quantized one (QLoRA with merge_base: original)
                original = adaptation.model_copy(update={"quantization": None})
                model = side.load(ctx.model_dir, labels, original, trained=adapter)
            how = {**merge_loaded(model, out, dtype), "why_in_memory": in_memory}
            del model
        if quantization is not None:
            how["merge_base"] = merge_base
        processor = side.processor(adapter)
        processor.save_pretrained(out)  # tokenizer and chat template, or the image processor
        if (adapter / "chat_template_kwargs.json").is_file():
            shutil.copy(adapter / "chat_template_kwargs.json", out / "chat_template_kwargs.json")
        stop = ctx.kind.serving.stop_tokens
        if stop is not None:  # a generative model: where the eval stopped, a server stops
            how["stop_tokens"] = _generation_config(ctx.model_dir, out, processor, stop(processor))
    ctx.log(f"export: merged ({how['method']}, {how['modules']} LoRA modules) in {dtype}; putting export/merged/")
    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        name = f"merged/{path.relative_to(out).as_posix()}"
        ctx.store.put_file(layout.export_file(name), path)
        files[name] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    shutil.rmtree(work, ignore_errors=True)
    command = [sys.executable, "-m", "entrypoint.processes.parity", *ctx.store_args]
    command += ["--workdir", str(ctx.workdir / "parity"), "--trial", trial_id]
    ctx.log("export: checking the merged model against the adapter on eval in a fresh process")
    with ctx.timed("parity"):
        done = subprocess.run(command, capture_output=True, text=True, check=False, preexec_fn=dies_with_parent)
    for line in done.stdout.splitlines():
        ctx.log(line)
    if done.returncode != 0:
        full = child_failed(done, "parity", ctx.workdir / "parity", ctx.log, what="the merged model's copy")
        if full is not None:
            raise full
        raise MergeFailed(
            f"export: the parity process failed (exit {done.returncode}): {last_error_line(done)} (its whole "
            "stderr is in the attempt's log)"
        )
    record = ctx.read_json(layout.PARITY)
    return {"files": files, "merge": {**how, "dtype": dtype}, "parity": record}


def _generation_config(base: Path, out: Path, tokenizer, stop: list[str]) -> list[str]:
    """generation_config.json in `out`: the base's own (or one from its config), its eos the eval's stop
    tokens (eos and the chat template's end of turn), so that a server stops where the eval stopped.
    Returns the stop tokens."""
    from transformers import AutoConfig, GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(base)
    except OSError:
        config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(out))
    tokens = list(dict.fromkeys([tokenizer.eos_token, *stop]))
    ids = [tokenizer.convert_tokens_to_ids(token) for token in tokens]
    config.eos_token_id = ids if len(ids) > 1 else ids[0]
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ids[0]
    if tokenizer.bos_token_id is not None:
        config.bos_token_id = tokenizer.bos_token_id
    config.save_pretrained(out)
    return tokens


def finish_export(ctx: PhaseContext, trial_id: str, files: dict[str, dict], merged: dict | None) -> dict:
    """The serving files (SERVING.md, Modelfile, parity.json, report.md with the serving section) put
    under export/, then the final BINDING.json. `merged`: export_merged's record, {"skipped": why} (the
    lease's end), {"failed": why} (the merge or its parity process failed), or None (export.merged false).
    Returns the binding."""
    spec, side = ctx.spec, ctx.kind.model
    work = ctx.workdir / "serving"
    shutil.rmtree(work, ignore_errors=True)
    adapter = get_tree(ctx.store, layout.EXPORT_ADAPTER, work / "adapter")
    processor = side.processor(adapter)
    adaptation = ctx.read_json(layout.trial_result(trial_id))["settings"]["adaptation"]
    readiness = None
    if adaptation["method"] == "lora" and ctx.kind.serving.usage.generative:  # vLLM serves generative models
        config = json.loads((adapter / "adapter_config.json").read_text())
        base_config = json.loads((ctx.model_dir / "config.json").read_text())
        architecture = (base_config.get("architectures") or [base_config.get("model_type", "?")])[0]
        readiness = vllm_readiness(config, architecture, _added_tokens(ctx, processor))
    written: dict[str, bytes] = {}
    parity = merged.get("parity") if merged else None
    modelfile = None
    if parity is not None and "stop_tokens" in merged["merge"]:  # Ollama serves generative models
        text, modelfile = ollama_modelfile(
            processor, dict(spec.data.chat_template_kwargs), merged["merge"]["stop_tokens"]
        )
        written["Modelfile"] = text.encode()
    summary = _parity_summary(merged) if merged else None
    if parity is not None:
        written["parity.json"] = ctx.store.get_bytes(layout.PARITY)
    guide = serving_guide(
        job_id=spec.job.id,
        base_source=_base_source(spec),
        usage=ctx.kind.serving.usage,
        adapter_rank=adaptation.get("rank") if adaptation["method"] == "lora" else None,
        full=adaptation["method"] == "full",
        readiness=readiness,
        merged=summary if parity is not None else None,
        modelfile=modelfile,
        chat=bool(ctx.data_result["recipe"].get("chat_template_sha256")),
    )
    written["SERVING.md"] = guide.encode()
    if ctx.kind.serving.labels:  # a classifier's outputs are indices into the labels, in this order
        written[LABELS_FILE] = _labels_file(ctx.labels)
    report = ctx.store.get_bytes(layout.REPORT_MD).decode()
    written["report.md"] = (report.rstrip("\n") + "\n\n" + _report_section(summary, readiness, modelfile)).encode()
    for name, data in written.items():
        ctx.store.put_bytes(layout.export_file(name), data)
    shutil.rmtree(work, ignore_errors=True)
    files = {**files, **(merged or {}).get("files", {}), **{name: _digest(data) for name, data in written.items()}}
    serving = {"merged": summary, "vllm": readiness, "ollama": modelfile}
    return write_binding(ctx, trial_id, files, serving)


def _labels_file(labels: list[str]) -> bytes:
    """labels.json: the labels in training order, and the id2label / label2id a config would carry."""
    record = {
        "labels": list(labels),
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
    }
    return (json.dumps(record, indent=2) + "\n").encode()


def _added_tokens(ctx: PhaseContext, processor) -> int:
    """Tokens the exported tokenizer has beyond the base model's (vLLM loads no adapter with extra ones)."""
    if not hasattr(processor, "__len__"):
        return 0  # an image processor
    return max(0, len(processor) - len(ctx.kind.model.processor(ctx.model_dir)))


def _parity_summary(merged: dict) -> dict:
    """What BINDING.json and the report say of the merged folder."""
    if "skipped" in merged or "failed" in merged:
        return {"parity": "not run", **merged}
    p, how = merged["parity"], merged["merge"]
    return {
        "parity": p["parity"],
        "reasons": p["reasons"],
        "metric": p["metric"],
        "adapter": p["adapter"],
        "merged": p["merged"],
        "tolerance": p["tolerance"],
        "equal_outputs": f"{p['equal']}/{p['examples']}",
        "largest_logit_difference": p["largest_logit_difference"],
        "dtype": how["dtype"],
        "method": how["method"],
        **({"why_in_memory": how["why_in_memory"]} if "why_in_memory" in how else {}),
        **({"merge_base": how["merge_base"]} if "merge_base" in how else {}),  # QLoRA: which base it went into
    }


def _report_section(summary: dict | None, readiness: dict | None, modelfile: dict | None) -> str:
    """The report's serving section (export/report.md only: report/report.md is committed before the merge)."""
    lines = ["## Serving", ""]
    if summary is None:
        lines.append("No merged folder (export.merged: false); `rentune export JOB --merged` writes one later.")
    elif summary["parity"] == "not run":
        why = summary.get("skipped") or f"the merge failed: {summary.get('failed')}"
        lines.append(f"No merged folder: {why}; `rentune export JOB --merged` writes it later.")
    else:
        verdict = "ok" if summary["parity"] == "ok" else "FAILED"
        base = {"dequantized": ", into the quantized base dequantized", "original": ", into the original base"}
        lines.append(
            f"- merged model (export/merged/, {summary['dtype']}{base.get(summary.get('merge_base'), '')}): "
            f"parity {verdict} against the adapter as evaluated: {summary['metric']} "
            f"{summary['merged']:.4f} merged vs {summary['adapter']:.4f} adapter (tolerance {summary['tolerance']}); "
            f"{summary['equal_outputs']} eval answers identical; largest first-token logit difference "
            f"{summary['largest_logit_difference']:.3g}"
        )
        lines += [f"  - {reason}" for reason in summary["reasons"]]
    if readiness is not None:
        state = (
            "loads the adapter"
            if readiness["loadable"]
            else "cannot load the adapter: " + "; ".join(readiness["reasons"])
        )
        lines.append(f"- vLLM {state}")
    if modelfile is not None:
        lines.append(f"- Ollama: export/Modelfile ({modelfile['note']})")
    lines.append("- how to serve it: export/SERVING.md")
    return "\n".join(lines) + "\n"
