"""The report a person reads after a job: results.json and its published schema, the limitations it
observed, report.md, and the PNG plots (loss curves, per-category bars)."""
