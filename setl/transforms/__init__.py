"""Transforms: the built-ins (`builtins`), the Spark Transform stage (`stage`) and Arrow conversion (`frames`)."""
