"""`rentune run SPEC`: the job's phases on this node, continuing from what the store already holds."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from entrypoint.commands.exits import Refused, exits
from entrypoint.commands.options import StoreFlags, log, store_options, workdir_option
from entrypoint.errors import Interrupted
from entrypoint.job import layout
from entrypoint.job.state import PHASE_NAMES, job_store, read_json
from entrypoint.report.markdown import summary_table
from jobspec.load import load_spec


@click.command("run")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@store_options(from_spec=True)
@workdir_option
@click.option(
    "--until",
    type=click.Choice(PHASE_NAMES),
    help="Stop after this phase (e.g. `--until data` checks and inspects the data only).",
)
@click.option(
    "--reopen-test",
    metavar="REASON",
    help="Open a sealed test split that another spec or trial already opened; REASON goes into the report.",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    envvar="RENTUNE_NODE_RANK",
    show_default=True,
    help="This node's rank in a multi-node job (distribution.nnodes > 1): 0 runs every phase, the others "
    "join its training launches only. Env: RENTUNE_NODE_RANK.",
)
def run(
    spec: Path, store: StoreFlags, workdir: Path, until: str | None, reopen_test: str | None, node_rank: int
) -> None:
    """Run SPEC's phases, continuing from what the store already holds."""
    from entrypoint.follower import follow_lead
    from entrypoint.job.heartbeat import heartbeat_seconds
    from entrypoint.notices import notice_settings
    from entrypoint.runner import run_job, store_args
    from entrypoint.training.environment import process_age, quiet_libraries

    startup = process_age()  # interpreter and imports: what the verify phase's fresh process will take too

    with exits():
        notice_settings()  # a bad RENTUNE_INTERRUPTION_NOTICE & co. stops here (exit 2), before any attempt
        heartbeat_seconds()  # and a bad RENTUNE_HEARTBEAT_SECONDS
        quiet_libraries()
        loaded = load_spec(spec)
        root = store.over(loaded.spec.store).open()
        log(f"rentune: job {loaded.spec.job.id} -> {root.uri}")
        nnodes = loaded.spec.distribution.nnodes
        if node_rank >= nnodes:
            raise Refused(
                f"{loaded.source}: --node-rank {node_rank}: expected a rank below distribution.nnodes ({nnodes})"
            )
        if node_rank > 0:
            job_id = loaded.spec.job.id
            with exits(source=loaded.source):
                follow_lead(
                    root, job_id, node_rank, (workdir / job_id).resolve(), store_args(root, job_id), log, loaded=loaded
                )
            return
        with exits(source=loaded.source):
            try:
                outcome = run_job(
                    loaded, root, workdir, log, until=until, reopen_test=reopen_test, startup_seconds=startup
                )
            except Interrupted as exc:  # SIGTERM or Ctrl-C: what was committed stays; say how to go on
                again = shlex.join(["rentune", *sys.argv[1:]])
                raise Interrupted(f"{exc}\nto continue, run the same command again: {again}", exc.signum) from None
        if until is not None and until not in ("report", "export"):
            log(f"\nstopped after {until}, as asked; results under {outcome.store_uri}/phases/")
            return
        results = read_json(job_store(root, outcome.job_id), layout.RESULTS)
        log("\n" + summary_table(results))
        log(f"\nreport: {outcome.store_uri}/report/report.md")
        if until != "report":
            log(f"adapter: {outcome.store_uri}/export/adapter  binding: {outcome.store_uri}/export/BINDING.json")
