"""Export phase: the selected trial's adapter (or full weights) with its tokenizer, the spec, the
comparison results and BINDING.json, which ties the export to the sha256 of the exact base model; then,
with export.merged (the default for causal LMs), the adapter merged into the base, checked against the
adapter on eval in a fresh process, with the files that serve it (entrypoint/trial/export.py has the layout).

The adapter export is complete, BINDING.json included, before the merge starts; the merge is left out
(said in BINDING.json and the report) when the plan's estimate of it no longer fits before the lease's
margin. `rentune check-export` checks every file against BINDING.json, and the base model against its hash.
"""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.errors import Interrupted
from entrypoint.job import layout
from entrypoint.trial.export import (
    clear_merged,
    export_adapter,
    export_merged,
    finish_export,
    merge_fits,
    write_binding,
)

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    trial_id = ctx.result("evaluate")["selected"]
    files = export_adapter(ctx, trial_id)
    binding = write_binding(ctx, trial_id, files)
    clear_merged(ctx)  # an earlier, interrupted try's merged folder: BINDING.json no longer lists it
    base = binding["base_model"]["sha256"][:16]
    ctx.log(f"export: adapter and BINDING.json at {ctx.store.uri}/export/ (base sha256 {base}...)")
    merged = None
    if spec.merges:
        late = merge_fits(ctx)
        if late is not None:
            ctx.log(f"export: no merged folder: {late}; `rentune export {spec.job.id} --merged` writes it later")
            merged = {"skipped": late}
        else:
            try:
                merged = export_merged(ctx, trial_id, spec.export.dtype)
            except Interrupted:
                raise
            except Exception as exc:  # noqa: BLE001 - the adapter export stands; the merge is said to have failed
                why = f"{type(exc).__name__}: {str(exc)[-1000:]}"
                ctx.log(f"export: the merge failed ({why}); `rentune export {spec.job.id} --merged` retries it")
                merged = {"failed": why}
    binding = finish_export(ctx, trial_id, files, merged)
    if binding["merged"] and binding["merged"]["parity"] != "not run":
        m = binding["merged"]
        ctx.log(
            f"export: merged model parity {m['parity']}: {m['metric']} {m['merged']:.4f} merged vs "
            f"{m['adapter']:.4f} adapter; {m['equal_outputs']} eval answers identical"
        )
    verdict = ctx.read_json(layout.RESULTS)["verdict"]
    return {"binding": binding, "trial_id": trial_id, "verdict": verdict}
