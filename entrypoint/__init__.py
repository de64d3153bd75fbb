"""rentune's runtime: the CLI, the phase runner, the store and the phases. Imports `jobspec`, never the reverse."""

__version__ = "0.1.0"
