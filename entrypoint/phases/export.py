"""Export phase: the trained adapter (or full weights), its tokenizer and spec, the comparison with the
baseline, and BINDING.json, which ties the adapter to the sha256 of the exact base model it was trained on.

Layout under the job prefix:
    export/adapter/...       what `PeftModel.from_pretrained(base, "export/adapter")` loads
    export/spec.yaml         the frozen spec
    export/results.json      baseline vs adapted, per category, and the hypothesis verdict
    export/BINDING.json      base model hashes, revision, versions, data version, trial id
"""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.envinfo import environment
from entrypoint.model import hash_base_model, resolve_model_dir
from entrypoint.phases.train import TRIAL_ID

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    source = f"trials/{TRIAL_ID}/final"
    files = []
    for info in ctx.store.list(source):
        relative = info.key[len(source) + 1 :]
        ctx.store.put_bytes(f"export/adapter/{relative}", ctx.store.get_bytes(info.key))
        files.append(relative)
    ctx.store.put_bytes("export/spec.yaml", ctx.store.get_bytes("spec.yaml"))

    base_hash = hash_base_model(resolve_model_dir(spec.model))
    baseline = ctx.read_json("phases/baseline/result.json")["metrics"]
    adapted = ctx.read_json("phases/evaluate/result.json")["metrics"]
    metric = spec.hypothesis.metric
    gain = adapted[metric] - baseline[metric]
    results = {
        "hypothesis": spec.hypothesis.statement,
        "metric": metric,
        "split": "eval",
        "baseline": baseline,
        "adapted": adapted,
        "gain": gain,
        "min_gain": spec.hypothesis.min_gain,
        "holds_on_eval": gain >= spec.hypothesis.min_gain and gain > 0,
        "limitations": [
            "Measured on the eval split only; the sealed test split is not opened by this version.",
            "The baseline is zero-shot similarity to the category descriptions, not a trained head.",
        ],
    }
    env = environment()
    binding = {
        "base_model": {
            "source": spec.model.package and f"package:{spec.model.package}" or spec.model.path,
            "revision": spec.model.revision,
            "sha256": base_hash.sha256,
            "files": base_hash.files,
            "hash_method": "sha256 over '<file>\\t<sha256>\\n' lines of *.safetensors, sorted by path",
        },
        "adaptation": spec.adaptation.method,
        "adapter_files": sorted(files),
        "trial_id": TRIAL_ID,
        "job_id": spec.job.id,
        "spec_sha256": ctx.spec_sha256,
        "data_version": ctx.read_json("phases/data/result.json")["data_version"],
        "versions": {"torch": env["torch"], **env["packages"], "rentune": env["rentune"]},
    }
    ctx.write_json("export/results.json", results)
    ctx.write_json("export/BINDING.json", binding)
    ctx.log(f"export: adapter and BINDING.json at {ctx.store.uri}/export/ (base sha256 {base_hash.sha256[:16]}...)")
    return {"binding": binding, "gain": gain, "holds_on_eval": results["holds_on_eval"]}
