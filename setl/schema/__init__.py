"""Target schema creation (``pipeline.create_tables``, ``setl schema``): the target table each
routed source table needs (`plan`), its DDL per target (`mysql`, `postgresql`, `sqlite`, declared
by the target's connector as ``TargetConnector.schema``), and creating missing tables before their
first row (`create`). See docs/schema.md."""

from setl.schema.create import CreateTablesLoad, TableCreator, check_tables, find_creator
from setl.schema.plan import SchemaPlanner, TargetColumn, TargetTable, target_table
from setl.schema.target import ExistingColumn, SchemaTarget

__all__ = ["CreateTablesLoad", "ExistingColumn", "SchemaPlanner", "SchemaTarget", "TableCreator", "TargetColumn",
           "TargetTable", "check_tables", "find_creator", "target_table"]
