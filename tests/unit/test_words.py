"""One word, one meaning (docs/architecture.md#words), where a test can hold it: "worker" is the queue's
consumer (`rentune worker`, job/queue.py's Worker) and nothing else. The tokenizing processes are a process
pool (data/pool.py), an upload's part senders are threads."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER_MODULES = {"entrypoint/job/queue.py", "entrypoint/commands/worker.py", "entrypoint/cli.py"}


def identifiers(path: Path) -> list[tuple[int, str]]:
    """Every name `path` defines or uses: functions, classes, arguments, variables, attributes, imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.append((node.lineno, node.name))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.arg):
            found.append((node.lineno, node.arg))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
    return found


def test_worker_names_the_queue_consumer_only():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted((ROOT / "entrypoint").rglob("*.py"))
        if str(path.relative_to(ROOT)) not in WORKER_MODULES
        for line, name in identifiers(path)
        if "worker" in name.lower() and name != "max_workers"  # concurrent.futures' own argument
    ]
    assert not found, f"'worker' means the queue's consumer; call these processes or threads: {found}"


def test_the_check_sees_a_planted_worker(tmp_path):
    path = tmp_path / "pool.py"
    path.write_text("def worker_pool(workers):\n    return [w.worker for w in workers]\n")
    assert {name for _, name in identifiers(path) if "worker" in name.lower()} == {"worker_pool", "workers", "worker"}
