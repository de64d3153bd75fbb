"""Export phase: the selected trial's adapter (or full weights), its tokenizer and spec, the comparison
results, and BINDING.json, which ties the adapter to the sha256 of the exact base model it was trained on.

Layout under the job prefix:
    export/adapter/...       what `PeftModel.from_pretrained(base, "export/adapter")` loads; for chat jobs
                             its tokenizer carries the chat template trained with (chat_template.jinja), and
                             chat_template_kwargs.json the arguments every rendering got (when any)
    export/spec.yaml         the frozen spec
    export/results.json      report/results.json: every trial, the verdict on eval and test, limitations
    export/report.md         the report a person reads
    export/BINDING.json      base model hashes, the size and sha256 of every file above, revision,
                             versions, data version, trial id

`rentune check-export` checks every file against BINDING.json, and the base model against its hash.
"""

from __future__ import annotations

import hashlib
import json

from entrypoint.context import PhaseContext
from entrypoint.job.state import trial_result_key
from entrypoint.report.binding import KWARGS_FILE
from entrypoint.training.environment import environment
from entrypoint.training.model import hash_base_model

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    trial_id = ctx.result("evaluate")["selected"]
    source = f"trials/{trial_id}/final"
    copies = {f"adapter/{info.key[len(source) + 1 :]}": info.key for info in ctx.store.list(source)}
    copies |= {"spec.yaml": "spec.yaml", "results.json": "report/results.json", "report.md": "report/report.md"}
    recipe = ctx.data_result["recipe"]
    written = {}
    if recipe.get("chat_template_kwargs"):  # what every rendering of the template gets, beside the template
        written[KWARGS_FILE] = (json.dumps(recipe["chat_template_kwargs"], indent=2, sort_keys=True) + "\n").encode()
    files = {}
    for name in sorted({*copies, *written}):
        data = written[name] if name in written else ctx.store.get_bytes(copies[name])
        ctx.store.put_bytes(f"export/{name}", data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    base_hash = hash_base_model(ctx.model_dir)
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
        "files": files,  # every exported file but this one, relative to export/
        # chat jobs: the template the exported tokenizer carries (adapter/chat_template.jinja), as trained
        "chat_template_sha256": recipe.get("chat_template_sha256"),
        "chat_template_kwargs": recipe.get("chat_template_kwargs"),  # passed to every rendering; in KWARGS_FILE
        "trial_id": trial_id,
        "job_id": spec.job.id,
        "spec_sha256": ctx.spec_sha256,
        "data_version": ctx.data_version,
        "versions": {"torch": env["torch"], **env["packages"], "rentune": env["rentune"]},
    }
    ctx.write_json("export/BINDING.json", binding)
    ctx.log(f"export: adapter and BINDING.json at {ctx.store.uri}/export/ (base sha256 {base_hash.sha256[:16]}...)")
    return {"binding": binding, "trial_id": trial_id, "verdict": verdict}
