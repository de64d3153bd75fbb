"""What a rentune job does: the spec schema, its loader and the lease plan. Pure Python: no torch here."""

from jobspec.load import LoadedSpec, SpecError, load_spec, parse_spec
from jobspec.schema import JobSpec

__all__ = ["JobSpec", "LoadedSpec", "SpecError", "load_spec", "parse_spec"]
