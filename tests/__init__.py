"""rentune's tests: `unit/` (no server, seconds) and `integration/` (real S3 server on loopback)."""
