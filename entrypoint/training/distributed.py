"""Multi-process training through torchrun, never a home-made launcher.

When the spec asks for more than one process and this process is not already a torchrun rank, the train
phase runs `torchrun ... -m entrypoint.processes.rank` and waits for it. Each rank rebuilds the job context
from the store (the frozen spec lives there), the HF Trainer shards the data per rank (DistributedSampler),
and only global rank 0 commits checkpoints and results. SIGTERM to this process is forwarded to torchrun,
which forwards it to the ranks, which finish their step and commit.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from entrypoint.errors import EXIT_INTERRUPTED, STOP_SIGNALS, InvalidInput, signal_name
from entrypoint.training.lifeline import dies_with_parent
from jobspec.schema import Distribution

__all__ = [
    "deepspeed_config",
    "is_rank",
    "needs_launch",
    "node_count",
    "node_rank",
    "rank",
    "rendezvous_endpoint",
    "run_torchrun",
    "torchrun_command",
]


def is_rank() -> bool:
    """True inside a process started by torchrun."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def node_rank() -> int:
    """This node's rank in the torchrun launch (GROUP_RANK): node 0 holds global rank 0."""
    return int(os.environ.get("GROUP_RANK", "0"))


def node_count() -> int:
    """Nodes in the torchrun launch (every node runs the same number of processes)."""
    return int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def needs_launch(distribution: Distribution) -> bool:
    return (distribution.nproc_per_node > 1 or distribution.nnodes > 1) and not is_rank()


def rendezvous_endpoint(distribution: Distribution) -> str:
    """host:port of the c10d rendezvous: RENTUNE_RDZV_ENDPOINT (where this launch's nodes are: it changes
    when a job resumes on other nodes, while the frozen spec cannot), else the spec's
    distribution.rdzv_endpoint, else MASTER_ADDR:MASTER_PORT."""
    endpoint = os.environ.get("RENTUNE_RDZV_ENDPOINT") or distribution.rdzv_endpoint
    if not endpoint and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    if not endpoint:
        raise InvalidInput(
            f"distribution.nnodes is {distribution.nnodes}: expected the rendezvous host:port of node 0 in "
            "RENTUNE_RDZV_ENDPOINT, distribution.rdzv_endpoint or MASTER_ADDR and MASTER_PORT"
        )
    return endpoint


def torchrun_command(distribution: Distribution, rank_args: Sequence[str], rdzv_id: str | None = None) -> list[str]:
    """`python -m torch.distributed.run` (torchrun) for this spec: standalone on one node, c10d rendezvous at
    `rdzv_endpoint` (or MASTER_ADDR:MASTER_PORT) across nodes, under `rdzv_id` (every node's agent of one
    launch passes the same)."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={distribution.nproc_per_node}"]
    if distribution.nnodes == 1:
        command.append("--standalone")
    else:
        endpoint = rendezvous_endpoint(distribution)
        command += [f"--nnodes={distribution.nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}"]
        command += [f"--rdzv_id={rdzv_id}"] if rdzv_id else []
    return [*command, "-m", "entrypoint.processes.rank", *rank_args]


def run_torchrun(command: list[str], grace_seconds: float, log) -> tuple[int, int | None]:
    """Run torchrun in the foreground; forward SIGTERM to it when this process gets SIGTERM or SIGINT
    (Ctrl-C). Returns (exit code, the signal that stopped the ranks, or None): the one this process received,
    else SIGTERM when the ranks exited as interrupted (EXIT_INTERRUPTED: the node's own notice reached them).

    torchrun kills its ranks `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` seconds (default 30) after a SIGTERM; it is
    raised above the checkpoint grace so that the ranks' own watchdog decides when to give up."""
    received: list[int] = []
    procs: list[subprocess.Popen] = []

    def forward(signum, frame):
        received.append(signum)
        log(f"train: {signal_name(signum)} received; forwarding SIGTERM to the torchrun ranks")
        for proc in procs:
            proc.send_signal(signal.SIGTERM)

    # before Popen: no window where torchrun is orphaned
    previous = {signum: signal.signal(signum, forward) for signum in STOP_SIGNALS}
    try:
        env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(math.ceil(grace_seconds) + 15)}
        # a session of its own: a Ctrl-C in the terminal reaches rentune alone, which forwards it as SIGTERM
        procs.append(subprocess.Popen(command, env=env, preexec_fn=dies_with_parent, start_new_session=True))
        if received:
            procs[0].send_signal(signal.SIGTERM)
        code = procs[0].wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        return code, received[0]
    return code, (signal.SIGTERM if code == EXIT_INTERRUPTED else None)


def deepspeed_config(distribution: Distribution, precision: str) -> dict:
    """A ZeRO config for the HF Trainer; batch sizes and optimizer settings come from TrainingArguments."""
    zero: dict = {"stage": distribution.zero_stage}
    if distribution.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if distribution.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    if distribution.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
