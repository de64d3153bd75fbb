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
