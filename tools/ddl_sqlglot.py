"""Measure sqlglot against setl's own DDL parser (`setl.ddl`) on the DDL corpus of the tests
(`tests/helpers/ddl_corpus.py`: every literal DDL the tests use, and the MariaDB-only forms).

Run from the repository root with sqlglot importable (it is not a dependency of setl), e.g.
``pip install --target /tmp/sqlglot sqlglot && PYTHONPATH=.:/tmp/sqlglot python3 tools/ddl_sqlglot.py``.
For each parser it prints how many statements it reads into a structure (sqlglot: not its
``Command`` fallback, which keeps the text unparsed), how many it gives back byte for byte in the
MySQL dialect (what a MariaDB target must run), how many first table names agree with setl's,
and the MariaDB-only forms each one fails.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlglot
from sqlglot import exp

from setl.ddl import parse
from tests.helpers.ddl_corpus import MARIADB_ONLY, corpus


def _sqlglot(statement: str) -> tuple[str, str | None, str | None]:
    """(outcome, first table name, MySQL rendering): outcome is parsed, command (unparsed
    fallback) or error."""
    try:
        tree = sqlglot.parse_one(statement, read="mysql")
    except Exception:  # noqa: BLE001 - any parse failure counts as one
        return "error", None, None
    if isinstance(tree, exp.Command) or tree is None:
        return "command", None, None
    table = next(tree.find_all(exp.Table), None)
    try:
        text = tree.sql(dialect="mysql")
    except Exception:  # noqa: BLE001
        text = None
    return "parsed", table.name if table is not None else None, text


def main() -> int:
    statements = corpus()
    figures = {"setl": dict(parsed=0, exact=0, failed_mariadb=[]), "sqlglot": dict(
        parsed=0, exact=0, agree=0, command=0, error=0, failed_mariadb=[], postgres=0)}
    started = time.perf_counter()
    models = {s: parse(s) for s in statements}
    setl_time = time.perf_counter() - started
    for statement, model in models.items():
        ours = figures["setl"]
        ours["parsed"] += model.kind != "other" and model.unparsed is None
        ours["exact"] += model.text == statement
        if statement in MARIADB_ONLY and (model.kind == "other" or model.unparsed):
            ours["failed_mariadb"].append(statement)
    started = time.perf_counter()
    for statement, model in models.items():
        outcome, table, text = _sqlglot(statement)
        theirs = figures["sqlglot"]
        theirs[outcome if outcome != "parsed" else "parsed"] += 1
        if outcome == "parsed":
            theirs["exact"] += text == statement
            theirs["agree"] += bool(model.tables) and table == model.tables[0].table
            try:
                sqlglot.transpile(statement, read="mysql", write="postgres")
                theirs["postgres"] += 1
            except Exception:  # noqa: BLE001
                pass
        if statement in MARIADB_ONLY and (outcome != "parsed" or text != statement):
            theirs["failed_mariadb"].append(f"{outcome:8} {statement}" + (f"\n           -> {text}" if text else ""))
    sqlglot_time = time.perf_counter() - started
    n = len(statements)
    print(f"corpus: {n} statements ({len(MARIADB_ONLY)} MariaDB-only forms); sqlglot {sqlglot.__version__}")
    ours, theirs = figures["setl"], figures["sqlglot"]
    print(f"setl.ddl : structured {ours['parsed']}/{n}, MySQL text exact {ours['exact']}/{n}, "
          f"MariaDB-only forms failed {len(ours['failed_mariadb'])}, {setl_time * 1000:.0f} ms")
    print(f"sqlglot  : structured {theirs['parsed']}/{n} (Command fallback {theirs['command']}, error "
          f"{theirs['error']}), MySQL text exact {theirs['exact']}/{n}, first table agrees "
          f"{theirs['agree']}/{theirs['parsed']}, transpiles to postgres {theirs['postgres']}, MariaDB-only forms "
          f"failed {len(theirs['failed_mariadb'])}, {sqlglot_time * 1000:.0f} ms (transpile included)")
    for line in theirs["failed_mariadb"]:
        print("  sqlglot:", line)
    for line in ours["failed_mariadb"]:
        print("  setl:", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
