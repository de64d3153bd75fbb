"""What happens to the leaks found between splits, under `data.leaks`: fail (listing the pairs), drop from
the training side, or warn. The same policy for text and images; the kind finds the leaks."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from entrypoint.data.reading import MAX_ERRORS, DataError
from entrypoint.data.spool import drop_rows
from jobspec.schema import LeakPolicy

__all__ = ["LEAK_PAIRS", "apply_leak_policy", "checked_pairs", "refuse_failing"]

# (side kept, side dropped from under `drop`, which policy applies): training data never wins over the
# splits that measure it.
LEAK_PAIRS = (("eval", "train", "eval"), ("test", "train", "test"), ("test", "eval", "test"))


def checked_pairs() -> list[tuple[str, str]]:
    """The split pairs to search, each as (side that may be dropped, side kept)."""
    return [(dropped, kept) for kept, dropped, _ in LEAK_PAIRS]


def apply_leak_policy(
    policy: LeakPolicy,
    splits: dict[str, list[dict]],
    found: list,
    shown: dict[str, list[str]],
    method: str,
    threshold: float,
    log: Callable[[str], None],
) -> tuple[dict[str, list[dict]], dict]:
    """Apply `policy` to the leaks `found`: returns the splits with `drop` leaks removed from the training
    side, and the summary for `leaks.json` (store it, then call `refuse_failing`). `shown` holds what
    identifies each row in messages (the text, or the image's file name)."""
    action_for = {(dropped, kept): getattr(policy, which) for kept, dropped, which in LEAK_PAIRS}
    records, doomed = [], defaultdict(set)
    for leak in found:
        action = action_for[(leak.a_split, leak.b_split)]
        record = {
            "kind": leak.kind,
            "similarity": round(leak.similarity, 4),
            "action": action,
            leak.a_split: shown[leak.a_split][leak.a_index],
            leak.b_split: shown[leak.b_split][leak.b_index],
            "pair": f"{leak.a_split}-{leak.b_split}",
        }
        records.append(record)
        if action == "drop":
            doomed[leak.a_split].add(leak.a_index)
        elif action == "warn":
            log(f"data: warning: {leak.kind} duplicate {leak.a_split}/{leak.b_split} ({leak.similarity:.2f})")
    summary = {
        "method": method,
        "near_threshold": threshold,
        "policy": {"eval": policy.eval, "test": policy.test},
        "pairs": records,
        "counts": dict(Counter(f"{r['pair']}:{r['kind']}" for r in records)),
        "dropped": {name: len(indices) for name, indices in doomed.items()},
    }
    for name, indices in doomed.items():
        splits[name] = drop_rows(splits[name], indices)
        log(f"data: dropped {len(indices)} leaking example(s) from {name}")
    return splits, summary


def refuse_failing(summary: dict) -> None:
    """Raise DataError listing the leaks under policy `fail` (up to MAX_ERRORS; all are in leaks.json)."""
    failing = [r for r in summary["pairs"] if r["action"] == "fail"]
    if not failing:
        return
    lines = [
        f"  {r['pair']} {r['kind']} (similarity {r['similarity']:.2f}): "
        f"{r[r['pair'].split('-')[0]][:70]!r} ~ {r[r['pair'].split('-')[1]][:70]!r}"
        for r in failing[:MAX_ERRORS]
    ]
    more = (
        f"\n  ... and {len(failing) - MAX_ERRORS} more (all in phases/data/leaks.json)"
        if len(failing) > MAX_ERRORS
        else ""
    )
    raise DataError(
        f"data.leaks: {len(failing)} duplicate(s) between splits under policy 'fail':\n"
        + "\n".join(lines)
        + more
        + "\nremove them from the data, or set data.leaks.test/eval to 'drop' to remove them from the "
        "training side"
    )
