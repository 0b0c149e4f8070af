"""The DDL corpus: every literal DDL statement the tests use (found in their source), and the
MariaDB-only forms (sequences, INVISIBLE, system versioning, IF [NOT] EXISTS, MariaDB types), for
`tests/test_ddl_corpus.py` and `tools/ddl_sqlglot.py`."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

_DDL = re.compile(r"^\s*(?:CREATE|ALTER|DROP|RENAME|TRUNCATE)\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?"
                  r"(?:TABLES?|SEQUENCE|INDEX|UNIQUE|ONLINE|OFFLINE|FULLTEXT|SPATIAL|IGNORE)\b", re.I | re.S)
_TEMPLATE = re.compile(r"\{\w*\}")  # a str.format template, not a statement
#: a PostgreSQL statement (an expected translation): a double-quoted name where MySQL has a table name
_POSTGRESQL = re.compile(r'^\s*\w+\s+(?:\w+\s+)*?(?:TABLE|SEQUENCE)\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?"', re.I)
_TESTS = Path(__file__).resolve().parents[1]

#: MariaDB-only DDL forms, each valid on MariaDB 10.11 (run in this order on a server by the corpus test)
MARIADB_ONLY = (
    "CREATE SEQUENCE s1 START WITH 100 INCREMENT BY 10",
    "CREATE SEQUENCE IF NOT EXISTS s2 MAXVALUE 1000 CYCLE",
    "CREATE OR REPLACE SEQUENCE s1 NOCACHE",
    "ALTER SEQUENCE s1 RESTART WITH 5",
    "ALTER SEQUENCE IF EXISTS s2 INCREMENT BY 3",
    "CREATE TABLE seq_t (id INT NOT NULL DEFAULT NEXT VALUE FOR s1 PRIMARY KEY, v INT DEFAULT (NEXTVAL(s2)))",
    "DROP SEQUENCE IF EXISTS s1, s2",
    "CREATE TABLE inv (id INT PRIMARY KEY, secret VARCHAR(10) INVISIBLE, n INT NOT NULL DEFAULT 3 INVISIBLE)",
    "ALTER TABLE inv ADD COLUMN h INT INVISIBLE, MODIFY secret VARCHAR(12)",
    "CREATE TABLE ver (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING",
    "CREATE TABLE ver2 (id INT PRIMARY KEY, v INT, rs TIMESTAMP(6) GENERATED ALWAYS AS ROW START INVISIBLE, "
    "re TIMESTAMP(6) GENERATED ALWAYS AS ROW END INVISIBLE, PERIOD FOR SYSTEM_TIME(rs, re)) WITH SYSTEM VERSIONING",
    "CREATE TABLE ver3 (id INT PRIMARY KEY, v INT WITHOUT SYSTEM VERSIONING, w INT) WITH SYSTEM VERSIONING",
    "ALTER TABLE ver DROP SYSTEM VERSIONING",
    "ALTER TABLE ver ADD SYSTEM VERSIONING",
    "CREATE TABLE IF NOT EXISTS ine (id INT PRIMARY KEY, v INT)",
    "CREATE OR REPLACE TABLE ine (id INT PRIMARY KEY, v INT, w INT)",
    "ALTER TABLE ine ADD COLUMN IF NOT EXISTS c INT NOT NULL",
    "ALTER TABLE ine MODIFY COLUMN IF EXISTS c BIGINT",
    "ALTER TABLE ine CHANGE COLUMN IF EXISTS c d INT",
    "ALTER TABLE ine DROP COLUMN IF EXISTS w",
    "ALTER TABLE IF EXISTS ine ADD COLUMN x INT",
    "CREATE INDEX IF NOT EXISTS i ON ine (v)",
    "DROP INDEX IF EXISTS i ON ine",
    "CREATE TABLE types (id INT PRIMARY KEY, u UUID, a INET6, b INET4)",
    "ALTER TABLE types RENAME COLUMN u TO uu",
    "DROP TABLE IF EXISTS ver3, nothing_here",
)


def _fragment(text: str) -> bool:
    """A piece of a statement the test completes (``"CREATE TABLE t (" + ...``, or the leading words alone,
    ``"CREATE TABLE IF NOT EXISTS"`` as a replacement), not a statement."""
    return (text != text.rstrip() or text.endswith(("(", ",", "`", '"', "."))
            or re.search(r"\b(?:TABLES?|EXISTS|INDEX|SEQUENCE)$", text, re.I) is not None
            or text.count("(") != text.count(")") or text.count("`") % 2 == 1 or len(text.split()) < 3)


@functools.cache
def used_statements() -> tuple[str, ...]:
    """Every literal string in the tests' source that starts as a table, index or sequence DDL; not
    docstrings, str.format templates, expected PostgreSQL translations or pieces of a statement."""
    found: set[str] = set()
    for path in sorted(_TESTS.rglob("*.py")):
        if path.name in ("test_ddl_corpus.py", "ddl_corpus.py"):
            continue  # its own expectations and messages
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and _DDL.match(node.value) and not _TEMPLATE.search(node.value)
                    and not _POSTGRESQL.match(node.value) and not _fragment(node.value)):
                found.add(node.value)
    return tuple(sorted(found))


def corpus() -> tuple[str, ...]:
    """The test statements and the MariaDB-only forms."""
    return tuple(sorted(set(used_statements()) | set(MARIADB_ONLY)))
