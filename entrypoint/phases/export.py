"""Export phase: the selected trial's adapter (or full weights), its tokenizer and spec, the comparison
results, and BINDING.json, which ties the adapter to the sha256 of the exact base model it was trained on.

Layout under the job prefix:
    export/adapter/...       what `PeftModel.from_pretrained(base, "export/adapter")` loads
    export/spec.yaml         the frozen spec
    export/results.json      report/results.json: every trial, the verdict on eval and test, limitations
    export/report.md         the report a person reads
    export/BINDING.json      base model hashes, revision, versions, data version, trial id
"""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.job.state import trial_result_key
from entrypoint.training.environment import environment
from entrypoint.training.model import hash_base_model

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    trial_id = ctx.read_json("phases/evaluate/result.json")["selected"]
    source = f"trials/{trial_id}/final"
    files = []
    for info in ctx.store.list(source):
        relative = info.key[len(source) + 1 :]
        ctx.store.put_bytes(f"export/adapter/{relative}", ctx.store.get_bytes(info.key))
        files.append(relative)
    ctx.store.put_bytes("export/spec.yaml", ctx.store.get_bytes("spec.yaml"))

    base_hash = hash_base_model(ctx.model_dir)
    for name in ("results.json", "report.md"):
        ctx.store.put_bytes(f"export/{name}", ctx.store.get_bytes(f"report/{name}"))
    verdict = ctx.read_json("report/results.json")["verdict"]
    env = environment()
    binding = {
        "base_model": {
            "source": f"package:{spec.model.package}"
            if spec.model.package
            else f"hub:{spec.model.hub_id}"
            if spec.model.hub_id
            else spec.model.path,
            "revision": spec.model.revision,
            "sha256": base_hash.sha256,
            "files": base_hash.files,
            "hash_method": "sha256 over '<file>\\t<sha256>\\n' lines of *.safetensors, sorted by path",
        },
        "adaptation": ctx.read_json(trial_result_key(trial_id))["settings"]["adaptation"]["method"],
        "adapter_files": sorted(files),
        "trial_id": trial_id,
        "job_id": spec.job.id,
        "spec_sha256": ctx.spec_sha256,
        "data_version": ctx.data_version,
        "versions": {"torch": env["torch"], **env["packages"], "rentune": env["rentune"]},
    }
    ctx.write_json("export/BINDING.json", binding)
    ctx.log(f"export: adapter and BINDING.json at {ctx.store.uri}/export/ (base sha256 {base_hash.sha256[:16]}...)")
    return {"binding": binding, "trial_id": trial_id, "verdict": verdict}
