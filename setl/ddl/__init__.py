"""setl's one DDL model: a MySQL/MariaDB DDL statement parsed once, where it enters the pipeline,
into a typed `Statement` (kind, table names, column names and definitions, clauses) that every
later stage reads; the routing rewrites it (`rewrite`), and each target renders it in its dialect
(MariaDB: `Statement.text`; PostgreSQL: `setl.sinks.postgresql_ddl`). docs/architecture.md, "One
DDL model", says why it is hand-written rather than built on a general SQL parser."""

from setl.ddl.model import SEQUENCE_KINDS, ColumnDef, Element, Statement, TableRef
from setl.ddl.parser import ELEMENT_KEYWORDS, column_definition, expression, parse, parse_tokens, split
from setl.ddl.rewrite import TableMap, rewrite, with_table, without_sequence_defaults
from setl.ddl.tokens import Reader, Token, quote, tokenize

__all__ = ["ELEMENT_KEYWORDS", "SEQUENCE_KINDS", "ColumnDef", "Element", "Reader", "Statement", "TableMap", "TableRef",
           "Token", "column_definition", "expression", "parse", "parse_tokens", "quote", "rewrite", "split", "tokenize",
           "with_table", "without_sequence_defaults"]
