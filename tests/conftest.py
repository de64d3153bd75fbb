"""Settings for the parallel run of `make test` (pytest-xdist: two workers, a whole test file per worker, so
that a module-scoped fixture, such as a job whose result several tests read, runs once), and for every
rentune process the tests start."""

from __future__ import annotations

import os

# Hermetic on a cloud machine too: no rentune process the tests start polls a real provider's metadata
# endpoint for interruption notices (the notice tests set their own endpoint on 127.0.0.1).
os.environ.setdefault("RENTUNE_INTERRUPTION_NOTICE", "off")

if os.environ.get("PYTEST_XDIST_WORKER"):  # set by xdist before any conftest or test module is imported
    # Two workers share two cores: one OpenMP/torch thread per process, in this worker and in every rentune,
    # torchrun rank and tokenizer process it starts (they inherit the environment). Two threads each would
    # oversubscribe the cores; the tiny test models gain nothing from a second thread anyway.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

# The longest files first (measured with --durations on 2 cores), so that the two workers start on them and
# the many short files fill the end (the Makefile passes --no-loadscope-reorder, which keeps this order).
# Files not listed follow in their usual order.
LONGEST_FIRST = (
    "integration/test_docker.py",
    "integration/test_smollm2.py",
    "integration/test_multinode.py",
    "integration/test_distributed.py",
    "integration/test_model_in_bucket.py",
    "integration/test_end_to_end.py",
    "integration/test_resume.py",
    "integration/test_qlora.py",
    "integration/test_kill_every_phase.py",
    "integration/test_trials_and_report.py",
    "integration/test_background_commits.py",
    "integration/test_tracking.py",
    "integration/test_seaweedfs_job.py",
    "integration/test_worker.py",
    "integration/test_stored_tokens.py",
    "integration/test_data_identity.py",
    "integration/test_chat_job.py",
    "integration/test_probe_and_params.py",
    "integration/test_image_job.py",
    "integration/test_lease.py",
    "integration/test_tini.py",
    "integration/test_data_memory.py",
    "integration/test_causal_job.py",
    "integration/test_checkpoint_protocol.py",
    "integration/test_store_contract.py",
    "integration/test_divergence.py",
)


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a plain pytest run keeps the usual order
    rank = {f"tests/{name}": i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: in-file order kept


# -- the e2e marker ------------------------------------------------------------------------------------------
# A test is `e2e` when it starts a rentune process, torchrun or a Docker engine: its own code does, a helper of
# its module it calls does, or a fixture it uses (directly or through other fixtures) does. Decided here from
# the source, so that no test can be left unmarked: `make test-fast` runs `-m "not e2e"`.
# tests/unit/test_e2e_marker.py checks the rule on planted tests.
# tests/processes.py's helpers, a whole job in-process (its verify phase starts a fresh rentune process), docker
E2E_NAMES = frozenset({"rentune", "RENTUNE", "start_run", "run_job", "DockerEngine", "_host"})
E2E_TEXT = ("torchrun", "entrypoint.processes")  # a command line written out; or the console script's name


def _starts_processes(function, seen: set) -> bool:
    """Whether `function`'s source, or a function or class of its module that it names (recursively), names
    one of E2E_NAMES, calls `.docker(` or writes out an E2E_TEXT command."""
    import ast
    import inspect
    import sys
    import textwrap

    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    module = sys.modules.get(function.__module__)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in E2E_NAMES:
            return True
        if isinstance(node, ast.Attribute) and node.attr == "docker":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value == "rentune" or any(text in node.value for text in E2E_TEXT):
                return True
        if isinstance(node, ast.Name) and module is not None:
            helper = getattr(module, node.id, None)
            if getattr(helper, "__module__", None) != module.__name__:
                continue
            methods = [m for m in vars(helper).values() if inspect.isfunction(m)] if inspect.isclass(helper) else []
            if any(_starts_processes(f, seen) for f in [helper, *methods] if inspect.isfunction(f)):
                return True
    return False


def is_e2e(item) -> bool:
    """The rule above, for a collected test."""
    functions = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for definition in info.name2fixturedefs.get(name, ()) if info else ():
            functions.append(definition.func)
    return any(function is not None and _top_level(function) for function in functions)


_DECIDED: dict = {}  # a test function's or fixture's answer, by its code: the same fixtures serve many tests


def _top_level(function) -> bool:
    code = getattr(function, "__code__", None)
    if code not in _DECIDED:
        _DECIDED[code] = _starts_processes(function, set())
    return _DECIDED[code]


def pytest_itemcollected(item):
    if is_e2e(item):
        item.add_marker("e2e")
