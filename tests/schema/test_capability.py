"""Schema creation is a declared connector capability (`TargetConnector.schema`), not an isinstance check."""

from __future__ import annotations

from setl.connectors import registry


def test_builtin_targets_declare_schema_creation() -> None:
    """The SQL targets declare a schema builder, Parquet none; `setl plugins list` shows it."""
    from setl.connectors import format_connector_table

    targets = registry()
    assert all(targets.target(name).schema is not None for name in ("mysql", "postgresql", "sqlite"))
    assert targets.target("parquet").schema is None
    listing = format_connector_table("target")
    parquet = listing.split("parquet", 1)[1].split("keys:", 1)[0]
    assert "schema" in listing.split("postgresql", 1)[1].split("keys:", 1)[0] and "schema" not in parquet
