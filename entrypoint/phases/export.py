"""Export phase: the selected trial's adapter (or full weights), its tokenizer and spec, the comparison
results, and BINDING.json, which ties the adapter to the sha256 of the exact base model it was trained on.

Layout under the job prefix:
    export/adapter/...       what `PeftModel.from_pretrained(base, "export/adapter")` loads
    export/spec.yaml         the frozen spec
    export/results.json      report/results.json: every trial, the verdict on eval and test, limitations
    export/report.md         the report a person reads
    export/BINDING.json      base model hashes, the size and sha256 of every file above, revision,
                             versions, data version, trial id

`rentune verify-export` checks every file against BINDING.json, and the base model against its hash.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from entrypoint.context import PhaseContext
from entrypoint.job.state import trial_result_key
from entrypoint.store import check_key
from entrypoint.store.hashing import file_sha256
from entrypoint.store.objects import CorruptObject, StoredObject, loads_object
from entrypoint.training.environment import environment
from entrypoint.training.model import hash_base_model

__all__ = ["check_export", "run"]


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    trial_id = ctx.read_json("phases/evaluate/result.json")["selected"]
    source = f"trials/{trial_id}/final"
    copies = {f"adapter/{info.key[len(source) + 1 :]}": info.key for info in ctx.store.list(source)}
    copies |= {"spec.yaml": "spec.yaml", "results.json": "report/results.json", "report.md": "report/report.md"}
    files = {}
    for name, key in sorted(copies.items()):
        data = ctx.store.get_bytes(key)
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
        "chat_template_sha256": ctx.data_result["recipe"].get("chat_template_sha256"),
        "trial_id": trial_id,
        "job_id": spec.job.id,
        "spec_sha256": ctx.spec_sha256,
        "data_version": ctx.data_version,
        "versions": {"torch": env["torch"], **env["packages"], "rentune": env["rentune"]},
    }
    ctx.write_json("export/BINDING.json", binding)
    ctx.log(f"export: adapter and BINDING.json at {ctx.store.uri}/export/ (base sha256 {base_hash.sha256[:16]}...)")
    return {"binding": binding, "trial_id": trial_id, "verdict": verdict}


def check_export(directory: Path, base: Path) -> tuple[StoredObject, list[str]]:
    """Check an export folder against its BINDING.json: every file it lists is there with its size and
    sha256, no file under adapter/ is unlisted, and `base` hashes to the bound base model. Returns the
    binding and the problems found (none: the export is intact and belongs to `base`). Raises
    CorruptObject when BINDING.json is unreadable or lacks what this check needs."""
    where = directory / "BINDING.json"
    try:
        binding = loads_object(where.read_bytes(), str(where))
    except OSError as exc:
        raise CorruptObject(f"{where}: cannot read the binding ({exc.strerror or exc})") from None
    files, expected = binding["files"], binding["base_model"]
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
        for v in files.values()
    ):
        raise CorruptObject(f"{where}: files: expected a mapping of file name -> {{size, sha256}}")
    problems = []
    for name, info in sorted(files.items()):
        path = directory / check_key(name)
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != info["size"] or file_sha256(path) != info["sha256"]:
            problems.append(f"{path}: differs from its sha256 in BINDING.json (changed or corrupted)")
    for path in sorted((directory / "adapter").rglob("*")):
        if path.is_file() and path.relative_to(directory).as_posix() not in files:
            problems.append(f"{path}: not covered by BINDING.json (added after the export?)")
    actual = hash_base_model(base)
    if actual.sha256 != expected["sha256"]:
        names = sorted(set(expected["files"]) | set(actual.files))
        differ = [n for n in names if expected["files"].get(n) != actual.files.get(n)]
        problems.append(
            f"{base}: base model sha256 {actual.sha256[:16]} differs from BINDING.json's {expected['sha256'][:16]}; "
            f"files that differ: {', '.join(differ)}"
        )
    return binding, problems
