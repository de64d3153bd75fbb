"""report.md and the plain-text summary `rentune run` and `rentune fetch` print, both from results.json."""

from __future__ import annotations

from entrypoint.report.results import bar_family

__all__ = ["render_markdown", "summary_table"]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_markdown(results: dict) -> str:
    """report.md: verdict first, then the evidence, limitations last."""
    h, sel = results["hypothesis"], results["selected"]["trial_id"]
    metric = h["metric"]
    ev, te = results["verdict"]["eval"], results["verdict"]["test"]
    lines = [
        f"# rentune report: {results['job']['id']}",
        "",
        f"**Hypothesis** ({h['task']}): {h['statement']}",
        "",
        f"- Primary metric `{metric}`, minimum gain {h['min_gain']:.3f} over the untouched base model.",
        f"- Selected trial: **{sel}** ({results['selected']['why']}).",
        f"- Eval: hypothesis **{'holds' if ev['hypothesis_holds'] else 'does not hold'}** (gain {ev['gain']:+.3f}); "
        f"guardrails **{'pass' if ev['guardrails_passed'] else 'FAIL'}**.",
        f"- Sealed test (opened once): hypothesis **{'holds' if te['hypothesis_holds'] else 'does not hold'}** "
        f"(gain {te['gain']:+.3f}); guardrails **{'pass' if te['guardrails_passed'] else 'FAIL'}**.",
        "",
        "## Trials (eval split)",
        "",
        f"| trial | reference | change | status | {metric} | gain | guardrails | budget |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base_value = results["baseline"]["metrics"][metric]
    lines.append(f"| baseline | - | untouched base model | - | {base_value:.3f} | - | - | - |")
    for t in results["trials"]:
        value = t["metrics"][metric] if t["metrics"] else None
        gain = "-" if value is None else f"{value - base_value:+.3f}"
        guard = "-" if t["guardrails_passed"] is None else ("pass" if t["guardrails_passed"] else "FAIL")
        status = t["status"] if not t["reason"] else f"{t['status']}: {t['reason']}"
        change = ", ".join(t["changes"]) or "spec settings"
        lines.append(
            f"| {t['id']}{' (selected)' if t['id'] == sel else ''} | {t['reference'] or '-'} | {change} | "
            f"{status.replace('|', '/')} | {_fmt(value)} | {gain} | {guard} | {t['budget']['status']} |"
        )
    completed = [t for t in results["trials"] if t["metrics"]]
    family, names = bar_family(h["task"], results["baseline"]["metrics"])
    lines += [
        "",
        f"## Per category: `{family}` on eval",
        "",
        "| metric | baseline | " + " | ".join(t["id"] for t in completed) + " |",
    ]
    lines.append("|---|---|" + "---|" * len(completed))
    for name in names:
        row = [_fmt(results["baseline"]["metrics"].get(name))] + [_fmt(t["metrics"].get(name)) for t in completed]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    test = results["test"]
    lines += [
        "",
        f"## Sealed test split ({test['examples']} examples, sha256 {test['test_sha256'][:16]})",
        "",
        f"| metric | baseline | {sel} | change |",
        "|---|---|---|---|",
    ]
    for name in [metric, *[n for n in names if n != metric]]:
        before, after = test["baseline"].get(name), test["trial"].get(name)
        change = "-" if before is None or after is None else f"{after - before:+.3f}"
        lines.append(f"| {name} | {_fmt(before)} | {_fmt(after)} | {change} |")
    if test["override"]:
        lines += ["", f"**The test split was reopened on request:** {test['override']['reason']}"]
    selected = next(t for t in results["trials"] if t["id"] == sel)
    lines += ["", f"## Guardrails for {sel}", ""]
    if not results["guardrails"]:
        lines.append("No guardrails were declared in the spec.")
    else:
        lines += [
            "| split | metric | baseline | trial | change | tolerance | result |",
            "|---|---|---|---|---|---|---|",
        ]
        for split, checks in (("eval", selected["guardrails"]), ("test", test["guardrails"])):
            for g in checks:
                lines.append(
                    f"| {split} | {g['metric']} | {g['baseline']:.3f} | {g['trial']:.3f} | {g['change']:+.3f} | "
                    f"{g['tolerance']:.3f} | {'pass' if g['passed'] else 'FAIL'} |"
                )
    lines += ["", "## Throughput", "", *_throughput_lines(results["trials"])]
    lines += ["", "## Checkpoints", "", *_checkpoint_lines(results["trials"])]
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


def summary_table(results: dict) -> str:
    """The verdict and the trial table, as printed at the end of `rentune run` and by `rentune fetch`."""
    metric = results["hypothesis"]["metric"]
    base = results["baseline"]["metrics"][metric]
    lines = [f"{'trial':<20} {'status':<10} {metric:>12} {'gain':>8}  guardrails  budget"]
    lines.append(f"{'baseline':<20} {'-':<10} {base:>12.3f} {'-':>8}  -           -")
    for t in results["trials"]:
        value = t["metrics"][metric] if t["metrics"] else None
        shown = f"{value:>12.3f} {value - base:>+8.3f}" if value is not None else f"{'-':>12} {'-':>8}"
        guard = "-" if t["guardrails_passed"] is None else "pass" if t["guardrails_passed"] else "FAIL"
        mark = "*" if t["id"] == results["selected"]["trial_id"] else " "
        lines.append(f"{mark}{t['id']:<19} {t['status']:<10} {shown}  {guard:<10}  {t['budget']['status']}")
        if t["reason"]:
            lines.append(f"{'':<21}{t['reason'][:200]}")
    selected = next(t for t in results["trials"] if t["id"] == results["selected"]["trial_id"])
    family, names = bar_family(results["hypothesis"]["task"], results["baseline"]["metrics"])
    width = max(len(n) for n in [*names, "metric"])
    lines += [
        "",
        f"{family} on eval: baseline vs {selected['id']}",
        f"{'metric':<{width}}  baseline  {'trial':>8}  change",
    ]
    for name in names:
        before, after = results["baseline"]["metrics"][name], selected["metrics"][name]
        lines.append(f"{name:<{width}}  {before:>8.3f}  {after:>8.3f}  {after - before:>+6.3f}")
    lines.append("")
    for split in ("eval", "test"):
        v = results["verdict"][split]
        lines.append(
            f"{split}: hypothesis {'holds' if v['hypothesis_holds'] else 'does NOT hold'} ({metric} gain "
            f"{v['gain']:+.3f}); guardrails {'pass' if v['guardrails_passed'] else 'FAIL'}"
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
