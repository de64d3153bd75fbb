"""One module per phase; each exposes `run(ctx: PhaseContext) -> dict`, the phase's committed result."""
