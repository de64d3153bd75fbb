"""report.md and the plain-text summary `rentune run` and `rentune fetch` print, both from results.json."""

from __future__ import annotations

from entrypoint.job.lease import lease_lines
from entrypoint.report.results import bar_family

__all__ = ["render_markdown", "summary_table"]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _interval(pair) -> str:
    return "-" if not pair or any(v != v for v in pair) else f"[{pair[0]:+.3f}, {pair[1]:+.3f}]"


def _verdict_line(v: dict, metric: str, level: str) -> str:
    """e.g. "hypothesis holds: macro_f1 gain +0.146, 95% interval [+0.080, +0.210] (min_gain 0.050);
    guardrails pass"."""
    return (
        f"hypothesis {v['hypothesis']}: {metric} gain {v['gain']:+.3f}, {level} interval {_interval(v['interval'])} "
        f"(min_gain {v['min_gain']:.3f}); guardrails {v['guardrails']}"
    )


def render_markdown(results: dict) -> str:
    """report.md: verdict first, then the evidence, limitations last."""
    h, sel = results["hypothesis"], results["selected"]["trial_id"]
    metric = h["metric"]
    level = f"{results['intervals']['confidence']:.0%}"
    ev, te = results["verdict"]["eval"], results["verdict"]["test"]
    iv = results["intervals"]
    lines = [
        f"# rentune report: {results['job']['id']}",
        "",
        f"**Hypothesis** ({h['task']}): {h['statement']}",
        "",
        f"- Primary metric `{metric}`, minimum gain {h['min_gain']:.3f} over the untouched base model.",
        f"- Selected trial: **{sel}** ({results['selected']['why']}).",
        f"- Eval: **{_verdict_line(ev, metric, level)}**.",
        f"- Sealed test (opened once): **{_verdict_line(te, metric, level)}**.",
        "",
        f"Every interval is a {level} {iv['method']} interval over {iv['resamples']:,} resamples of each "
        f"{iv['unit']} (seed {iv['seed']}), the baseline and the trial resampled together. Rules: {results['rules']}.",
        "",
        "## Trials (eval split)",
        "",
        f"| trial | reference | change | status | {metric} | gain | {level} interval | hypothesis | guardrails "
        "| budget |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base_value = results["baseline"]["metrics"][metric]
    lines.append(f"| baseline | - | untouched base model | - | {base_value:.3f} | - | - | - | - | - |")
    for t in results["trials"]:
        value = t["metrics"][metric] if t["metrics"] else None
        gain = "-" if value is None else f"{value - base_value:+.3f}"
        hyp = t["hypothesis"] or {}
        status = t["status"] if not t["reason"] else f"{t['status']}: {t['reason']}"
        change = ", ".join(t["changes"]) or "spec settings"
        lines.append(
            f"| {t['id']}{' (selected)' if t['id'] == sel else ''} | {t['reference'] or '-'} | {change} | "
            f"{status.replace('|', '/')} | {_fmt(value)} | {gain} | {_interval(hyp.get('interval'))} | "
            f"{hyp.get('result', '-')} | {t['guardrails_result'] or '-'} | {t['budget']['status']} |"
        )
    runner_up = results["selected"].get("runner_up")
    if runner_up:
        lines += [
            "",
            f"{sel} against the runner-up {runner_up['trial_id']} on eval: {metric} {runner_up['change']:+.3f}, "
            f"{level} interval {_interval(runner_up['interval'])}: "
            + ("the choice is decided." if runner_up["decided"] else "**not decided** (the interval includes 0)."),
        ]
    completed = [t for t in results["trials"] if t["metrics"]]
    family, names = bar_family(h.get("breakdown"), results["baseline"]["metrics"])
    lines += [
        "",
        f"## Per category: `{family}` on eval",
        "",
        "| metric | baseline | " + " | ".join(f"{t['id']} | change [{level}]" for t in completed) + " |",
    ]
    lines.append("|---|---|" + "---|---|" * len(completed))
    for name in names:
        row = [_fmt(results["baseline"]["metrics"].get(name))]
        for t in completed:
            c = (t["comparison"] or {}).get(name)
            row += [
                _fmt(t["metrics"].get(name)),
                "-" if c is None else f"{c['change']:+.3f} {_interval(c['interval'])}",
            ]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    test = results["test"]
    lines += [
        "",
        f"## Sealed test split ({test['examples']} examples, sha256 {test['test_sha256'][:16]})",
        "",
        f"| metric | baseline | {sel} | change | {level} interval |",
        "|---|---|---|---|---|",
    ]
    for name in [metric, *[n for n in names if n != metric]]:
        c = test["comparison"].get(name)
        if c is None:
            continue
        lines.append(
            f"| {name} | {_fmt(c['before'])} | {_fmt(c['after'])} | {c['change']:+.3f} | {_interval(c['interval'])} |"
        )
    if test["override"]:
        lines += ["", f"**The test split was reopened on request:** {test['override']['reason']}"]
    selected = next(t for t in results["trials"] if t["id"] == sel)
    lines += ["", f"## Guardrails for {sel}", ""]
    if not results["guardrails"]:
        lines.append("No guardrails were declared in the spec.")
    else:
        lines += [
            f"| split | metric | baseline | trial | change | {level} interval | tolerance | result |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for split, checks in (("eval", selected["guardrails"]), ("test", test["guardrails"])):
            for g in checks:
                lines.append(
                    f"| {split} | {g['metric']} | {g['baseline']:.3f} | {g['trial']:.3f} | {g['change']:+.3f} | "
                    f"{_interval(g['interval'])} | {g['tolerance']:.3f} | {g['result']} |"
                )
    lines += ["", "## Power: the smallest change each split can show", "", *_power_lines(results["power"])]
    lines += ["", "## What changed", "", *_changed_lines(results, completed)]
    if results.get("quantization"):
        lines += ["", "## Quantized base (QLoRA)", "", *_quantization_lines(results["quantization"])]
    lines += ["", "## Throughput", "", *_throughput_lines(results["trials"])]
    lines += ["", "## Checkpoints", "", *_checkpoint_lines(results["trials"])]
    if results.get("lease"):
        lines += ["", "## Lease: planned against actual", "", *_lease_lines(results["lease"])]
    attempts = _attempt_lines(results)
    if attempts:
        lines += ["", "## Attempts: interruptions and resumes", "", *attempts]
    lines += [
        "",
        "## Plots",
        "",
        "![loss per trial](loss_curves.png)",
        "",
        f"![{family} per category](per_category.png)",
        "",
        "## Observed limitations",
        "",
        *[f"- {note}" for note in results["limitations"]],
        "",
    ]
    return "\n".join(lines)


def _attempt_lines(results: dict) -> list[str]:
    """Every process that ran the job, how each ended, and where each trial's training resumed; nothing
    when one process ran it all."""
    attempts = results.get("attempts") or []
    resumes = [(t["id"], i) for t in results["trials"] for i in t.get("interruptions", [])]
    if len(attempts) <= 1 and not resumes:
        return []
    lines = ["| attempt | ended | in phase | why |", "|---|---|---|---|"]
    for a in attempts:
        why = (a.get("error") or "-").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {a['attempt']} | {a.get('outcome', '-')} | {a.get('phase') or '-'} | {why} |")
    lines.append("")
    for trial_id, i in resumes:
        lines.append(
            f"- Trial {trial_id}: a process had reached step {i['reached_step']}; the next resumed from committed "
            f"step {i['resumed_from_step']}: {i['lost_steps']} steps lost (dotted on the loss plot)."
        )
    return lines


def _lease_lines(lease: dict) -> list[str]:
    largest = lease["largest_error"]
    return [
        "Each phase and trial as the plan predicted it (phases before training: the first plan, from defaults; "
        "the rest: the plan made right after the probe measured a typical step) against the seconds it took. "
        "The report and export phases run after this report: `rentune status` shows them.",
        "",
        "```",
        *lease_lines(lease),
        "```",
        "",
        f"Largest error after the probe: {largest['name']} {largest['error']:+.0%}."
        if largest
        else "No phase after the probe has finished yet.",
    ]


def _power_lines(power: dict) -> list[str]:
    """The baseline phase's power table: what the splits could decide before any training."""
    lines = [
        f"Estimated after the baseline, before training: {power['method']} ({power['confidence']:.0%}). A "
        "verdict metric is decidable when both splits can show a change as small as the one asked for.",
        "",
        "| metric | role | eval examples | detectable on eval | test examples | detectable on test | asked "
        "| decidable |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in power["metrics"]:
        decided = {True: "yes", False: "**no**", None: "-"}[m["decidable"]]
        if m.get("needed") and m["needed"]["eval"]:
            decided += f" (about {m['needed']['eval']} eval / {m['needed']['test']} test examples in all)"
        e, t = m["eval"], m["test"]
        lines.append(
            f"| {m['metric']} | {m['role']} | {e['examples']} | {e['detectable']:.3f} | {t['examples']} | "
            f"{t['detectable']:.3f} | {m['asked']:.3f} | {decided} |"
        )
    return lines


def _changed_lines(results: dict, completed: list[dict]) -> list[str]:
    """Per trial on eval and for the test: examples fixed and broken against the baseline, per category, and
    the first ones each way."""
    lines = [
        "Examples whose own score rose (fixed) or fell (broken) against the baseline: correct or not for a "
        "classifier, valid or not for a format, the share of fields right for an extraction.",
    ]
    blocks = [(f"{t['id']} on eval", t["changed"]) for t in completed if t.get("changed")]
    blocks.append((f"{results['selected']['trial_id']} on the sealed test", results["test"]["changed"]))
    for title, changed in blocks:
        groups = changed["per_group"]
        lines += ["", f"### {title}: {changed['concentration']}", ""]
        if len(groups) > 1:
            lines += ["| group | fixed | broken |", "|---|---|---|"]
            lines += [f"| {g} | {c['fixed']} | {c['broken']} |" for g, c in groups.items()]
            lines.append("")
        for way in ("fixed", "broken"):
            shown = changed["examples"][way][:10]
            if shown:
                lines.append(f"First {len(shown)} {way} (of {changed[way]}):")
                lines += [
                    f"- row {e['row']} ({e['group']}, {e['before']:.2f} -> {e['after']:.2f}): "
                    f"{e['excerpt'].replace('|', '/')}"
                    for e in shown
                ]
                lines.append("")
    return lines


def summary_table(results: dict) -> str:
    """The verdict and the trial table, as printed at the end of `rentune run` and by `rentune fetch`."""
    metric = results["hypothesis"]["metric"]
    level = f"{results['intervals']['confidence']:.0%}"
    base = results["baseline"]["metrics"][metric]
    head = (
        f"{'trial':<14} {'status':<10} {metric:>10} {'gain':>7}  {level + ' interval':<18} {'hypothesis':<14} "
        "guardrails"
    )
    lines = [head, f"{'baseline':<14} {'-':<10} {base:>10.3f} {'-':>7}  {'-':<18} {'-':<14} -"]
    for t in results["trials"]:
        value = t["metrics"][metric] if t["metrics"] else None
        shown = f"{value:>10.3f} {value - base:>+7.3f}" if value is not None else f"{'-':>10} {'-':>7}"
        hyp = t["hypothesis"] or {}
        mark = "*" if t["id"] == results["selected"]["trial_id"] else " "
        lines.append(
            f"{mark}{t['id']:<13} {t['status']:<10} {shown}  {_interval(hyp.get('interval')):<18} "
            f"{hyp.get('result', '-'):<14} {t['guardrails_result'] or '-'}"
        )
        if t["reason"]:
            lines.append(f"{'':<15}{t['reason'][:200]}")
    selected = next(t for t in results["trials"] if t["id"] == results["selected"]["trial_id"])
    family, names = bar_family(results["hypothesis"].get("breakdown"), results["baseline"]["metrics"])
    width = max(len(n) for n in [*names, "metric"])
    lines += [
        "",
        f"{family} on eval: baseline vs {selected['id']}",
        f"{'metric':<{width}}  baseline  {'trial':>8}  change  {level + ' interval':<18} guardrail",
    ]
    checks = {g["metric"]: g["result"] for g in selected["guardrails"]}
    for name in names:
        c = selected["comparison"][name]
        lines.append(
            f"{name:<{width}}  {c['before']:>8.3f}  {c['after']:>8.3f}  {c['change']:>+6.3f}  "
            f"{_interval(c['interval']):<18} {checks.get(name, '-')}"
        )
    lines.append("")
    for split in ("eval", "test"):
        lines.append(
            f"{split}: {_verdict_line(results['verdict'][split], metric, level)}"
            + ("  (sealed test split, opened once)" if split == "test" else "")
        )
    return "\n".join(lines)


def _throughput_lines(trials: list[dict]) -> list[str]:
    """Per trial: tokens/s (non-padding), the padding share, MFU, and the settings that decide them."""
    lines = [
        "Non-padding tokens per second after the first logging window (warm-up), for the process that finished "
        "each trial; MFU is model FLOPs per token (6 per trainable and 4 per frozen weight, plus attention) times "
        "tokens/s per device over the device's dense bf16 peak.",
        "",
        "| trial | precision | attention | packing | tokens/s | per device | padding | MFU | peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in trials:
        p = t.get("throughput")
        if not p:
            continue
        rate, device = _or_dash(p["tokens_per_s"], ",.0f"), _or_dash(p["tokens_per_s_per_device"], ",.0f")
        padding, mfu = _or_dash(p["padding_share"], ".1%"), _or_dash(p["mfu"], ".1%")
        attention = (p["attn_implementation"] or "-") + (" + liger" if p["liger"] else "")
        lines.append(
            f"| {t['id']} | {p['precision'] or '-'} | {attention} | {'yes' if p['packing'] else 'no'} | {rate} | "
            f"{device} | {padding} | {mfu} | {p['peak_source'] or '-'} |"
        )
    return lines


def _quantization_lines(quantization: dict) -> list[str]:
    """What the base was quantized to, its hash, and the probe's memory with and without quantization."""
    base, memory = quantization["base"] or {}, quantization.get("memory") or {}
    kind = f"{base.get('bits')}-bit" + (
        f" {base['quant_type']}{', double quantization' if base.get('double_quant') else ''}, compute in "
        f"{base['compute_dtype']}"
        if base.get("bits") == 4
        else " LLM.int8()"
    )
    lines = [
        f"Trained, evaluated, verified and tested on the base quantized to {kind} by bitsandbytes "
        f"{base.get('bitsandbytes')} (torch {base.get('torch')}); quantized weights sha256 "
        f"`{str(base.get('sha256'))[:16]}...`, the same on every load of this job.",
    ]
    if memory:
        cells = []
        for name in ("quantized", "unquantized"):
            m = memory.get(name, {})
            if "peak_bytes" in m:
                cells.append(f"{m['peak_bytes'] / 2**20:,.0f} MiB (weights {m['weights_bytes'] / 2**20:,.1f} MiB)")
            else:
                cells.append("did not fit" if m.get("oom") else m.get("skipped", "-"))
        share = memory.get("saved_share")
        change = "" if share is None else f"; {share:.0%} less" if share >= 0 else f"; {-share:.0%} more"
        lines += [
            "",
            f"Probe, one step at the spec's microbatch ({memory['measure']}): quantized {cells[0]}; unquantized "
            f"{cells[1]}{change}.",
        ]
    return lines


def _or_dash(value: float | None, form: str, unit: str = "") -> str:
    """`value` in format `form` with its unit, or "-" when it was not measured."""
    return "-" if value is None else f"{value:{form}}{unit}"


def _checkpoint_lines(trials: list[dict]) -> list[str]:
    """Per trial: commits, size, how long training waited per checkpoint, how long a commit took."""
    lines = [
        'Committed in the background while training went on, except the last; "blocked" is the training '
        "loop's wait per checkpoint (local save, then any wait for the commit before it). Counted for the "
        "process that finished each trial.",
        "",
        "| trial | committed | size | blocked (median) | commit (median) | failed | interval |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in trials:
        c = t.get("checkpoints")
        if not c:
            continue
        size = _or_dash(None if c["bytes"] is None else c["bytes"] / 1e6, ".1f", " MB")
        blocked, commit = _or_dash(c["blocked_s_median"], ".2f", " s"), _or_dash(c["commit_s_median"], ".2f", " s")
        interval = "as the spec says"
        if c["interval"] and c["interval"].get("minutes"):
            i = c["interval"]
            interval = (
                f"auto: {i['minutes']:.1f} min = sqrt(2 x {i['commit_cost_s']:.1f} s x {i['mtbf_hours']:g} h MTBF)"
            )
        elif c["interval"]:
            interval = "auto: no commit measured before the end"
        lines.append(f"| {t['id']} | {c['committed']} | {size} | {blocked} | {commit} | {c['failed']} | {interval} |")
    return lines
