"""The DDL corpus (every literal DDL the tests use, and the MariaDB-only forms) through setl's one DDL
model: parsed once, rendered for MariaDB (its text) and PostgreSQL, and applied on real servers."""

from __future__ import annotations

import re

import pytest

from setl.ddl import parse, rewrite, without_sequence_defaults
from setl.sinks.postgresql_ddl import Translator, UnsupportedDdl, is_sequence_ddl
from tests.helpers.ddl_corpus import MARIADB_ONLY, corpus, used_statements

#: leading words -> the model's kind (TEMPORARY objects are never a target's business: other)
_KINDS = [
    (r"CREATE\s+(?:OR\s+REPLACE\s+)?TEMPORARY\b|DROP\s+TEMPORARY\b", "other"),
    (r"CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\b", "create_table"),
    (r"CREATE\s+(?:OR\s+REPLACE\s+)?SEQUENCE\b", "create_sequence"),
    (r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+|OFFLINE\s+)?(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?INDEX\b",
     "create_index"),
    (r"ALTER\s+(?:ONLINE\s+|OFFLINE\s+)?(?:IGNORE\s+)?TABLE\b", "alter_table"),
    (r"ALTER\s+SEQUENCE\b", "alter_sequence"),
    (r"RENAME\s+TABLES?\b", "rename_table"),
    (r"TRUNCATE\b", "truncate_table"),
    (r"DROP\s+TABLES?\b", "drop_table"),
    (r"DROP\s+SEQUENCE\b", "drop_sequence"),
    (r"DROP\s+(?:ONLINE\s+|OFFLINE\s+)?INDEX\b", "drop_index"),
]


def _expected_kind(statement: str) -> str:
    return next(kind for pattern, kind in _KINDS if re.match(r"\s*" + pattern, statement, re.I))


def test_the_corpus_holds_the_tests_ddl_and_the_mariadb_only_forms():
    """The corpus is every DDL the tests use (hundreds, across all test packages) plus each MariaDB-only form."""
    statements = corpus()
    assert len(used_statements()) > 250
    assert set(MARIADB_ONLY) <= set(statements)
    kinds = {_expected_kind(s) for s in statements}
    assert kinds == {"other", "create_table", "create_sequence", "create_index", "alter_table", "alter_sequence",
                     "rename_table", "truncate_table", "drop_table", "drop_sequence", "drop_index"}


def test_every_corpus_statement_is_modelled_exactly():
    """Each statement parses to its kind and tables, reads every column attribute, and renders for MariaDB exactly."""
    wrong = []
    for statement in corpus():
        model = parse(statement)
        problems = []
        if model.text != statement:
            problems.append("text differs")
        if model.kind != _expected_kind(statement):
            problems.append(f"kind {model.kind}")
        if model.kind != "other" and not model.tables:
            problems.append("no table")
        if model.unparsed is not None:
            problems.append(f"unparsed: {model.unparsed}")
        problems += [f"column {c.name}: {c.unknown}" for c in model.definitions if c.unknown is not None]
        if model.kind == "create_table" and not model.like and model.elements:
            # each element is a key/constraint or exactly one column definition
            problems += [f"element {e.tokens[0].text}" for e in model.elements if bool(e.word) == bool(e.columns)]
        if problems:
            wrong.append((statement, problems))
    assert wrong == []


def test_the_routed_model_is_the_model_of_its_text():
    """The routing's rewrite of each model equals the model its own text parses to: one reading of one statement."""
    differing = []
    for statement in corpus():
        routed = rewrite(parse(statement), "src", lambda schema, table: ("dst", f"t_{table}"), {"id": "ident"})
        if routed is not None and parse(routed.text) != routed:
            differing.append(statement)
    assert differing == []


def test_every_corpus_statement_renders_for_postgresql_or_is_refused_by_name():
    """The PostgreSQL rendering gives statements, or UnsupportedDdl for a known cause (never another error)."""
    refused = {}
    for statement in corpus():
        try:
            out = Translator("app").translate(parse(statement))
        except UnsupportedDdl as exc:
            refused[statement] = str(exc)
            continue
        assert all(isinstance(s, str) and s for s in out), statement
    causes = {re.sub(r"\b(ALTER TABLE \.\.\. |CREATE TABLE \.\.\. )\w+", r"\1X", why) for why in refused.values()}
    assert causes == {
        "alter_sequence statements are not translated", "create_sequence statements are not translated",
        "drop_sequence statements are not translated", "other statements are not translated",
        "ALTER TABLE ... X PARTITION changes rows the binlog holds no row events for; apply it to the PostgreSQL "
        "table by hand, then resume", "CREATE TABLE ... X is not translated",
        "CREATE TABLE without a column list is not translated", "MySQL type VECTOR has no PostgreSQL mapping"}
    assert all(is_sequence_ddl(parse(s)) for s, why in refused.items() if "sequence statements" in why)


def test_statements_cut_short_are_modelled_and_refused_cleanly():
    """Each corpus statement cut short or missing a character is modelled exactly and rendered or refused cleanly."""
    for statement in corpus():
        for text in {statement[:i] for i in range(0, len(statement), 11)} | {
                statement[:i] + statement[i + 1:] for i in range(0, len(statement), 13)}:
            model = parse(text)
            assert model.text == text
            rewrite(model, "src", lambda schema, table: ("dst", table), {"id": "ident"}, lambda column: column != "v")
            try:
                rendered = Translator("app").translate(model)
            except UnsupportedDdl:
                continue
            assert all(isinstance(s, str) for s in rendered)


#: MariaDB-only forms: (statement, the model's (name, invisible, period) per column definition,
#: the PostgreSQL rendering (None: a sequence's DDL, which PostgreSQL targets skip))
_MARIADB_ONLY_EXPECTED = {
    "CREATE SEQUENCE s1 START WITH 100 INCREMENT BY 10": ((), None),
    "CREATE SEQUENCE IF NOT EXISTS s2 MAXVALUE 1000 CYCLE": ((), None),
    "CREATE OR REPLACE SEQUENCE s1 NOCACHE": ((), None),
    "ALTER SEQUENCE s1 RESTART WITH 5": ((), None),
    "ALTER SEQUENCE IF EXISTS s2 INCREMENT BY 3": ((), None),
    "CREATE TABLE seq_t (id INT NOT NULL DEFAULT NEXT VALUE FOR s1 PRIMARY KEY, v INT DEFAULT (NEXTVAL(s2)))": (
        (("id", False, False), ("v", False, False)),
        ['CREATE TABLE "app"."seq_t" ("id" integer PRIMARY KEY NOT NULL, "v" integer)']),
    "DROP SEQUENCE IF EXISTS s1, s2": ((), None),
    "CREATE TABLE inv (id INT PRIMARY KEY, secret VARCHAR(10) INVISIBLE, n INT NOT NULL DEFAULT 3 INVISIBLE)": (
        (("id", False, False), ("secret", True, False), ("n", True, False)),
        ['CREATE TABLE "app"."inv" ("id" integer PRIMARY KEY, "secret" varchar(10), "n" integer NOT NULL DEFAULT 3)']),
    "ALTER TABLE inv ADD COLUMN h INT INVISIBLE, MODIFY secret VARCHAR(12)": (
        (("h", True, False), ("secret", False, False)),
        ['ALTER TABLE "app"."inv" ADD COLUMN "h" integer, ALTER COLUMN "secret" TYPE varchar(12) USING '
         '"secret"::varchar(12), ALTER COLUMN "secret" DROP NOT NULL, ALTER COLUMN "secret" DROP DEFAULT']),
    "CREATE TABLE ver (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING": (
        (("id", False, False), ("v", False, False)),
        ['CREATE TABLE "app"."ver" ("id" integer PRIMARY KEY, "v" integer)']),
    "CREATE TABLE ver2 (id INT PRIMARY KEY, v INT, rs TIMESTAMP(6) GENERATED ALWAYS AS ROW START INVISIBLE, "
    "re TIMESTAMP(6) GENERATED ALWAYS AS ROW END INVISIBLE, PERIOD FOR SYSTEM_TIME(rs, re)) WITH SYSTEM VERSIONING": (
        (("id", False, False), ("v", False, False), ("rs", True, True), ("re", True, True)),
        ['CREATE TABLE "app"."ver2" ("id" integer PRIMARY KEY, "v" integer)']),
    "CREATE TABLE ver3 (id INT PRIMARY KEY, v INT WITHOUT SYSTEM VERSIONING, w INT) WITH SYSTEM VERSIONING": (
        (("id", False, False), ("v", False, False), ("w", False, False)),
        ['CREATE TABLE "app"."ver3" ("id" integer PRIMARY KEY, "v" integer, "w" integer)']),
    "ALTER TABLE ver DROP SYSTEM VERSIONING": ((), []),
    "ALTER TABLE ver ADD SYSTEM VERSIONING": ((), []),
    "CREATE TABLE IF NOT EXISTS ine (id INT PRIMARY KEY, v INT)": (
        (("id", False, False), ("v", False, False)),
        ['CREATE TABLE IF NOT EXISTS "app"."ine" ("id" integer PRIMARY KEY, "v" integer)']),
    "CREATE OR REPLACE TABLE ine (id INT PRIMARY KEY, v INT, w INT)": (
        (("id", False, False), ("v", False, False), ("w", False, False)),
        ['DROP TABLE IF EXISTS "app"."ine"', 'CREATE TABLE "app"."ine" ("id" integer PRIMARY KEY, "v" integer, '
         '"w" integer)']),
    "ALTER TABLE ine ADD COLUMN IF NOT EXISTS c INT NOT NULL": (
        (("c", False, False),),
        ['ALTER TABLE "app"."ine" ADD COLUMN IF NOT EXISTS "c" integer NOT NULL DEFAULT 0',
         'ALTER TABLE "app"."ine" ALTER COLUMN "c" DROP DEFAULT']),
    "ALTER TABLE ine MODIFY COLUMN IF EXISTS c BIGINT": (
        (("c", False, False),),
        ['ALTER TABLE "app"."ine" ALTER COLUMN "c" TYPE bigint USING "c"::bigint, ALTER COLUMN "c" DROP NOT NULL, '
         'ALTER COLUMN "c" DROP DEFAULT']),
    "ALTER TABLE ine CHANGE COLUMN IF EXISTS c d INT": (
        (("d", False, False),),
        ['ALTER TABLE "app"."ine" ALTER COLUMN "c" TYPE integer USING "c"::integer, ALTER COLUMN "c" DROP NOT NULL, '
         'ALTER COLUMN "c" DROP DEFAULT', 'ALTER TABLE "app"."ine" RENAME COLUMN "c" TO "d"']),
    "ALTER TABLE ine DROP COLUMN IF EXISTS w": ((), ['ALTER TABLE "app"."ine" DROP COLUMN IF EXISTS "w"']),
    "ALTER TABLE IF EXISTS ine ADD COLUMN x INT": (
        (("x", False, False),), ['ALTER TABLE "app"."ine" ADD COLUMN "x" integer']),
    "CREATE INDEX IF NOT EXISTS i ON ine (v)": ((), []),
    "DROP INDEX IF EXISTS i ON ine": ((), []),
    "CREATE TABLE types (id INT PRIMARY KEY, u UUID, a INET6, b INET4)": (
        (("id", False, False), ("u", False, False), ("a", False, False), ("b", False, False)),
        ['CREATE TABLE "app"."types" ("id" integer PRIMARY KEY, "u" uuid, "a" inet, "b" inet)']),
    "ALTER TABLE types RENAME COLUMN u TO uu": ((), ['ALTER TABLE "app"."types" RENAME COLUMN "u" TO "uu"']),
    "DROP TABLE IF EXISTS ver3, nothing_here": ((), ['DROP TABLE IF EXISTS "app"."ver3", "app"."nothing_here"']),
}


@pytest.mark.parametrize("statement", MARIADB_ONLY)
def test_mariadb_only_forms(statement):
    """Each MariaDB-only form has the expected column model (INVISIBLE, ROW START/END) and PostgreSQL rendering."""
    columns, postgresql = _MARIADB_ONLY_EXPECTED[statement]
    model = parse(statement)
    assert tuple((c.name, c.invisible, c.period) for c in model.definitions) == columns
    assert is_sequence_ddl(model) is (postgresql is None)
    if postgresql is not None:
        assert Translator("app").translate(model) == postgresql


def _mariadb_columns(server, schema):
    rows = server.query("SELECT TABLE_NAME, COLUMN_NAME, IS_NULLABLE, CONCAT(EXTRA, ' ', "
                        "COALESCE(GENERATION_EXPRESSION, '')) FROM information_schema.COLUMNS "
                        "JOIN information_schema.TABLES USING (TABLE_SCHEMA, TABLE_NAME) WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_TYPE <> 'SEQUENCE' ORDER BY TABLE_NAME, ORDINAL_POSITION", (schema,))
    return [(t, c, n) for t, c, n, extra in rows if "ROW START" not in extra and "ROW END" not in extra]


def test_mariadb_only_forms_apply_alike_on_mariadb_and_postgresql(mariadb_target, mysql_db, postgres_server,
                                                                  postgres_db):
    """Run as the sinks run them, the MariaDB-only forms leave equal tables and columns on MariaDB and PostgreSQL."""
    postgres_server.query('CREATE SCHEMA "app"', dbname=postgres_db)
    for statement in MARIADB_ONLY:
        model = without_sequence_defaults(parse(statement))
        routed = rewrite(model, mysql_db, lambda schema, table: (mysql_db, table))
        assert routed is not None
        mariadb_target.query(routed.text)
        if not is_sequence_ddl(model):
            for translated in Translator("app").translate(model):
                postgres_server.query(translated, dbname=postgres_db)
    on_postgresql = postgres_server.query(
        "SELECT table_name, column_name, is_nullable FROM information_schema.columns WHERE table_schema = 'app' "
        "ORDER BY table_name, ordinal_position", dbname=postgres_db)
    on_mariadb = _mariadb_columns(mariadb_target, mysql_db)
    assert {t for t, _, _ in on_mariadb} == {"inv", "ine", "seq_t", "types", "ver", "ver2"}
    assert on_postgresql == on_mariadb
