"""One module per phase, each `run(ctx) -> dict`, in the order runner.PHASES lists them. A phase is a
recipe that reads top to bottom and calls the library folders (data, kinds, training, evaluation,
report, store, job); it never imports another phase."""
