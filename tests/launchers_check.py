"""Loads launch templates with SkyPilot's and dstack's own parsers and prints what they understood, as JSON.

Runs with .venv-launchers/bin/python (`make setup`), never inside the suite's .venv, and needs no cloud
credentials or network (tests/integration/test_launchers.py points HOME at a temporary folder):

    python tests/launchers_check.py skypilot deploy/skypilot/worker.yaml ...
    python tests/launchers_check.py dstack deploy/dstack/worker.dstack.yml ...

The last line of stdout is `RESULT {path: {...}}`; SkyPilot logs to stdout on its own, above it. A file the
engine refuses gets {"ok": false, "error": ...}.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys

# rentune's exit codes (entrypoint/errors.py) and 137, what SIGKILL leaves; each alone, then multi-node
# combinations: SkyPilot reports one code per node and kills the rest with 137 once one node fails.
EXIT_CODE_CASES = [[1], [2], [3], [137], [143], [2, 137], [143, 137], [143, 143]]
CALLS = 5  # recovery on 143 must not use up max_restarts_on_errors


def skypilot(path: str) -> dict:
    import asyncio

    import sky
    from sky import backends
    from sky.jobs import recovery_strategy

    task = sky.Task.from_yaml(path)  # the schema check, as `sky jobs launch` makes it first
    (resources,) = task.resources
    job_recovery = resources.job_recovery
    result = {
        "ok": True,
        "name": task.name,
        "num_nodes": task.num_nodes,
        "run": task.run,
        "envs": task.envs,
        "secrets": sorted(ref.name for ref in task.managed_secret_refs),
        "file_mounts": task.file_mounts,
        "image_id": resources.image_id,
        "accelerators": resources.accelerators,
        "use_spot": resources.use_spot,
        "job_recovery": job_recovery,
        "config_overrides": resources.cluster_config_overrides,
    }

    # The managed-jobs controller's own executor, built by StrategyExecutor.make from the parsed task (no
    # cluster is touched). make pops the job_recovery keys it knows and hands the rest to
    # set_strategy_config, where an unknown key (a typo) would only be logged: record them.
    leftover: list[list[str]] = []
    record = recovery_strategy.StrategyExecutor.set_strategy_config

    def set_strategy_config(self, config):
        leftover.append(sorted(config))
        record(self, config)

    recovery_strategy.StrategyExecutor.set_strategy_config = set_strategy_config
    decisions = {}
    for codes in EXIT_CODE_CASES:
        executor = recovery_strategy.StrategyExecutor.make(
            cluster_name="rentune-check",
            backend=backends.CloudVmRayBackend(),
            task=sky.Task.from_yaml(path),
            job_id=1,
            task_id=0,
            pool=None,
            starting=set(),
            starting_lock=asyncio.Lock(),
            starting_signal=asyncio.Condition(),
        )
        result["strategy"] = type(executor).__name__
        # What the controller calls when the job failed with the cluster still UP (sky/jobs/controller.py).
        decisions[",".join(map(str, codes))] = [
            executor.should_restart_on_failure(exit_codes=codes) for _ in range(CALLS)
        ]
    result["restart"] = decisions
    result["unknown_job_recovery_keys"] = leftover[0]
    return result


def module_function(package: str, module_path: str, name: str):
    """A top-level function of a module, compiled from its source file without importing the module or its
    packages (dstack's server modules need the server's extra packages, which the CLI install lacks)."""
    origin = os.path.join(os.path.dirname(importlib.util.find_spec(package).origin), module_path)
    with open(origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    namespace = {"List": list}
    exec(compile(ast.Module([node], type_ignores=[]), origin, "exec"), namespace)
    return namespace[name]


def dstack(path: str) -> dict:
    import yaml
    from dstack._internal.core.models.configurations import parse_run_configuration
    from dstack._internal.core.models.envs import EnvSentinel
    from dstack._internal.core.models.runs import JobTerminationReason

    join_shell_commands = module_function(
        "dstack", "_internal/server/services/jobs/configurators/base.py", "_join_shell_commands"
    )

    with open(path, encoding="utf-8") as f:
        conf = parse_run_configuration(yaml.safe_load(f))
    retry = conf.retry
    on_events = [] if retry in (None, False) else [e.value for e in (retry.on_events or [])]
    return {
        "ok": True,
        "type": conf.type,
        "name": conf.name,
        "nodes": conf.nodes,
        "image": conf.image,
        "shell": conf.shell,
        "user": conf.user,
        "env": {k: None if isinstance(v, EnvSentinel) else v for k, v in conf.env.items()},
        "commands": list(conf.commands),
        # What the runner executes: dstack's own joining of `commands` (JobConfigurator._commands).
        "command_line": join_shell_commands(list(conf.commands)),
        "files": [[f.local_path, f.path] for f in conf.files],
        "gpu": conf.resources.gpu.model_dump(mode="json") if conf.resources.gpu else None,
        "spot_policy": conf.spot_policy.value if conf.spot_policy else None,
        "on_events": on_events,
        "retry_duration": None if retry in (None, False) else retry.duration,
        "max_duration": conf.max_duration,
        # The server resubmits a job when its termination reason's retry event is listed
        # (runs/active.py, _should_retry_job).
        "retried": {
            reason.name: (event := reason.to_retry_event()) is not None and event.value in on_events
            for reason in JobTerminationReason
        },
    }


def main() -> None:
    engine, *paths = sys.argv[1:]
    check = {"skypilot": skypilot, "dstack": dstack}[engine]
    results = {}
    for path in paths:
        try:
            results[path] = check(path)
        except Exception as e:  # the engine's refusal, whatever its type
            results[path] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    sys.stdout.flush()
    print("RESULT " + json.dumps(results, default=str), flush=True)


if __name__ == "__main__":
    main()
