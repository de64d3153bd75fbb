"""The store layout in one place (entrypoint/job/layout.py): no store key is written out anywhere else in the
package, the check sees one when it is planted, and docs/run.md's layout is the one layout.py generates."""

from __future__ import annotations

import ast
from pathlib import Path

from entrypoint.job import layout

ROOT = Path(__file__).resolve().parents[2]
# The store layer sits below job/ and keeps its own protocol's keys (checkpoints' MANIFEST.json and
# NODE-<k>.json, a pushed model's manifest): entrypoint/store/ is not checked.
EXEMPT = ("entrypoint/job/layout.py", "entrypoint/store/")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _is_key(text: str) -> bool:
    return text in layout.FILES or any(text.startswith(f"{folder}/") for folder in layout.FOLDERS)


def literal_keys(path: Path, root: Path = ROOT) -> list[str]:
    """Strings in `path` that spell a store key: a constant, or an f-string whose text starts like one."""
    tree = ast.parse(path.read_text())
    skip, found = _docstrings(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            skip.add(id(node.values[0]))  # judged as part of the f-string below
            if _is_key(str(node.values[0].value)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: f{ast.unparse(node)[1:]}"[:160])
        elif isinstance(node, ast.JoinedStr):
            skip.update(id(value) for value in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if _is_key(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}"[:160])
        # a folder listed by its bare name: `store.list("attempts")`
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "list" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and first.value in layout.FOLDERS:
                found.append(f"{path.relative_to(root)}:{node.lineno}: list({first.value!r})"[:160])
    return found


def test_no_store_key_is_written_out_outside_the_layout_module():
    found = [
        hit
        for path in sorted((ROOT / "entrypoint").rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(EXEMPT)
        for hit in literal_keys(path)
    ]
    assert not found, "store keys written out (use entrypoint/job/layout.py):\n" + "\n".join(found)


def test_the_check_sees_a_planted_key(tmp_path):
    path = tmp_path / "planted.py"
    path.write_text(
        '"""A docstring may say phases/data/train.jsonl."""\n'
        "def f(store, trial, n):\n"
        '    store.get_bytes("phases/data/train.jsonl")\n'
        '    store.put_bytes(f"trials/{trial}/result.json", b"")\n'
        '    store.head("spec.yaml"), store.head("train/launch.json")\n'
        '    return f"attempts/{n}/log.txt", "queue/cancelled", f"{store.uri}/export/merged/ exists", "train/loss"\n'
        "def g(store):\n"
        '    return store.list("attempts"), store.list(prefix="x"), "report"\n'
    )
    found = literal_keys(path, root=tmp_path)
    assert sorted(int(hit.split(":")[1]) for hit in found) == [3, 4, 5, 5, 6, 6, 8], found


def test_the_docs_show_the_layout_the_module_generates():
    text = (ROOT / "docs/run.md").read_text()
    start, end = "<!-- layout: python -m entrypoint.job.layout -->\n```\n", "```\n<!-- /layout -->"
    assert start in text and end in text, "docs/run.md: the layout block's markers are missing"
    shown = text.split(start, 1)[1].split(end, 1)[0]
    assert shown == layout.layout_text(), "docs/run.md's layout is stale: paste `python -m entrypoint.job.layout`"


def test_keys_are_the_ones_earlier_jobs_wrote():
    """A layout change would strand every stored job: these are the keys stores already hold."""
    assert layout.phase_result("data") == "phases/data/result.json"
    assert layout.trial_result("main") == "trials/main/result.json"
    assert layout.attempt_log(2) == "attempts/2/log.txt"
    assert layout.data_tokens("k", "train") == "phases/data/tokens/k/train.arrow"
    assert layout.plan_revision(3) == "plans/0003.json"
    assert layout.root_claim("j", 1, "heartbeat") == "jobs/j/claims/000001.heartbeat"
    assert layout.queue_entry("j", "cancelled") == "queue/cancelled/j.yaml"
    assert layout.queue_note("j", "failed", "error.txt") == "queue/failed/j.error.txt"
    assert layout.seal_reopened("ab", "j", 7) == "sealed-tests/ab/reopened/j-7.json"
    assert (layout.PARITY, layout.MERGE_CLAIM, layout.LAUNCH) == (
        "phases/export/parity.json", "export/MERGING.json", "train/launch.json"
    )  # fmt: skip
