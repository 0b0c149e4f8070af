"""A table's ``schema_changes`` policy end to end, from a real MariaDB binlog into MariaDB and
PostgreSQL: what the target holds after ``ignore_drops``, ``additive_only`` and ``refuse``, and the
one line a refused statement stops the pipeline with (docs/schema-changes.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from setl.errors import LoadError, TableRefused
from setl.model import Position
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(120)


@attrs.frozen
class Target:
    """One SQL target of a test: where tables go, a fresh Load, and a query."""

    kind: str
    schema: str
    load: Callable[..., Any]  # (pipeline name, **Load options)
    query: Callable[..., list[tuple[Any, ...]]]

    def columns(self, table: str) -> list[str]:
        return [r[0] for r in self.query(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s"
            " ORDER BY ordinal_position", (self.schema, table))]

    def rows(self, table: str, columns: str) -> list[tuple[Any, ...]]:
        quote = "`" if self.kind == "mariadb" else '"'
        return self.query(f"SELECT {columns} FROM {quote}{self.schema}{quote}.{table} ORDER BY 1")


@pytest.fixture(params=["mariadb", "postgresql"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "mariadb":
        server, db = request.getfixturevalue("mariadb_target"), request.getfixturevalue("mysql_db")
        return Target("mariadb", db, lambda name, **options: MysqlLoad(server.target_config(), pipeline=name,
                                                                       position_schema=db, **options),
                      lambda sql, args=None: server.query(sql, args))
    server, db = request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db")
    return Target("postgresql", "app", lambda name, **options: PostgresqlLoad(server.target_config(db), pipeline=name,
                                                                              **options),
                  lambda sql, args=None: server.query(sql, args, dbname=db))


def run(server: Any, schema: str, statements: list[str]) -> Position:
    """Run `statements` on the source; the binlog position after them."""
    with contextlib.closing(server.connect(database=schema)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    return binlog_head(server)


def prepared(mariadb_source: Any, source_db: str, target: Target, tmp_path: Any, statements: list[str]) -> Position:
    """`statements` (the tables and their first rows) replicated under ``apply``; where the test's own part starts."""
    start = binlog_head(mariadb_source)
    after = run(mariadb_source, source_db, statements)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\..*", f"{target.schema}.{{table}}")],
              target.load("setup"), tmp_path, name="setup")
    return after


def policy_rules(source_db: str, target: Target, policy: str) -> list:
    return [table_rule(rf"{source_db}\.t", f"{target.schema}.t", schema_changes=policy),
            table_rule(rf"{source_db}\..*", f"{target.schema}.{{table}}")]


BASE = ["CREATE TABLE t (id INT PRIMARY KEY, a INT, gone VARCHAR(10) DEFAULT 'dflt', v INT)",
        "INSERT INTO t VALUES (1, 1, 'x1', 1), (2, 2, 'x2', 2), (3, 3, 'x3', 3)",
        "CREATE TABLE other (id INT PRIMARY KEY, v INT)"]


def test_ignore_drops_keeps_the_column_new_rows_take_its_default(mariadb_source, source_db, target, tmp_path):
    """Under ignore_drops a DROP COLUMN is not applied: the target keeps the column, rows inserted
    afterwards (one by one and 300 in one statement, the bulk path) hold its default, an update leaves
    it untouched, an update of the key (a delete and an insert) gives it the default, a delete removes
    the row; the rest of the same ALTER (an added column) applies."""
    start = prepared(mariadb_source, source_db, target, tmp_path, BASE)
    run(mariadb_source, source_db, [
        "ALTER TABLE t DROP COLUMN gone, ADD COLUMN w INT NULL",
        "INSERT INTO t VALUES (4, 4, 4, 40)",
        "UPDATE t SET v = 20, w = 2 WHERE id = 2",
        "DELETE FROM t WHERE id = 3",
        "UPDATE t SET id = 10 WHERE id = 1",
        "INSERT INTO t SELECT seq, seq, seq, NULL FROM seq_100_to_399",
        "INSERT INTO other VALUES (1, 1)",
    ])
    replicate(mariadb_source, start, policy_rules(source_db, target, "ignore_drops"), target.load("keep"), tmp_path,
              name="keep")
    assert target.columns("t") == ["id", "a", "gone", "v", "w"]
    source = {r[0]: r for r in mariadb_source.query(f"SELECT id, a, v, w FROM `{source_db}`.t")}
    kept_before = {2: "x2"}  # rows there before the drop keep their value; others take the default
    expected = [(*source[k][:2], kept_before.get(k, "dflt"), *source[k][2:]) for k in sorted(source)]
    assert target.rows("t", "id, a, gone, v, w") == expected
    assert len(expected) == 303
    assert target.rows("other", "id, v") == [(1, 1)]


def test_additive_only_applies_additions_and_refuses_the_first_other_change(mariadb_source, source_db, target,
                                                                           tmp_path):
    """Under additive_only an ADD COLUMN (nullable, or with a DEFAULT) and an ADD INDEX apply; a MODIFY
    stops the pipeline with one line naming pipeline, table, position, policy and statement, and
    nothing from it on reaches the target (its rows, another table's rows); with the policy set to
    apply, the pipeline run again applies it and goes on."""
    start = prepared(mariadb_source, source_db, target, tmp_path, BASE)
    before_modify = run(mariadb_source, source_db, [
        "ALTER TABLE t ADD COLUMN w INT NULL, ADD COLUMN d INT NOT NULL DEFAULT 7, ADD INDEX by_a (a)",
        "INSERT INTO t (id, a, v, w) VALUES (4, 4, 4, 40)",
    ])
    run(mariadb_source, source_db, ["ALTER TABLE t MODIFY a BIGINT", "INSERT INTO t (id, a) VALUES (5, 5)",
                                    "INSERT INTO other VALUES (1, 1)"])
    scheduler = replicate(mariadb_source, start, policy_rules(source_db, target, "additive_only"),
                          target.load("adds"), tmp_path, name="adds", outcome=Outcome.PAUSED)
    error = scheduler.error
    assert isinstance(error, TableRefused) and not error.retryable
    text = str(error)
    assert "\n" not in text and "schema_changes is additive_only: MODIFY is not an addition" in text
    assert "MODIFY a BIGINT" in text and "rule tables[0]" in text
    assert error.context["pipeline"] == "adds" and error.context["stage"] == "load"
    assert error.context["table"] == f"{target.schema}.t" and error.context["position"] > before_modify
    assert target.columns("t") == ["id", "a", "gone", "v", "w", "d"]
    assert target.rows("t", "id, a, v, w, d") == [(1, 1, 1, None, 7), (2, 2, 2, None, 7), (3, 3, 3, None, 7),
                                                  (4, 4, 4, 40, 7)]
    type_of_a = target.query("SELECT data_type FROM information_schema.columns WHERE table_schema = %s"
                             " AND table_name = 't' AND column_name = 'a'", (target.schema,))
    assert type_of_a == ([("int",)] if target.kind == "mariadb" else [("integer",)])
    assert target.rows("other", "id, v") == []

    # the fix the line names: a policy that takes it, and the same pipeline run again from its acked position
    replicate(mariadb_source, start, policy_rules(source_db, target, "apply"), target.load("adds"), tmp_path,
              name="adds")
    assert target.rows("t", "id, a, v, w, d")[-1] == (5, 5, None, None, 7)
    assert target.rows("other", "id, v") == [(1, 1)]
    type_of_a = target.query("SELECT data_type FROM information_schema.columns WHERE table_schema = %s"
                             " AND table_name = 't' AND column_name = 'a'", (target.schema,))
    assert type_of_a == [("bigint",)]


def test_refuse_stops_at_any_schema_change_and_applies_truncate(mariadb_source, source_db, target, tmp_path):
    """Under refuse a TRUNCATE (data, not schema) applies; an ADD COLUMN stops the pipeline naming
    the policy; a DROP TABLE of a refused table and another one is refused whole (the strictest
    policy of the tables it names), so neither is dropped."""
    start = prepared(mariadb_source, source_db, target, tmp_path, BASE)
    run(mariadb_source, source_db, ["TRUNCATE TABLE t", "INSERT INTO t VALUES (9, 9, 'x9', 9)",
                                    "DROP TABLE other, t"])
    scheduler = replicate(mariadb_source, start, policy_rules(source_db, target, "refuse"), target.load("strict"),
                          tmp_path, name="strict", outcome=Outcome.PAUSED)
    assert isinstance(scheduler.error, TableRefused)
    assert "schema_changes is refuse: it refuses every schema change" in str(scheduler.error)
    assert "DROP TABLE" in str(scheduler.error)
    assert target.rows("t", "id, a, gone, v") == [(9, 9, "x9", 9)]
    assert target.rows("other", "id, v") == []  # still there

    again = binlog_head(mariadb_source)
    run(mariadb_source, source_db, ["CREATE TABLE t (id INT PRIMARY KEY)", "ALTER TABLE t ADD COLUMN n INT NULL"])
    scheduler = replicate(mariadb_source, again, policy_rules(source_db, target, "refuse"), target.load("strict2"),
                          tmp_path, name="strict2", outcome=Outcome.PAUSED)
    assert "CREATE TABLE" in str(scheduler.error) and isinstance(scheduler.error, TableRefused)


def test_a_kept_not_null_column_without_default_stops_at_the_first_insert(mariadb_source, source_db, target,
                                                                          tmp_path):
    """A column kept by ignore_drops that is NOT NULL without a DEFAULT on the target cannot take new
    rows: the first insert after the drop stops the pipeline with the target's error naming the
    column, and the target holds nothing of it."""
    start = prepared(mariadb_source, source_db, target, tmp_path, [
        "CREATE TABLE t (id INT PRIMARY KEY, must INT NOT NULL, v INT)", "INSERT INTO t VALUES (1, 10, 1)"])
    run(mariadb_source, source_db, ["ALTER TABLE t DROP COLUMN must", "INSERT INTO t VALUES (2, 2)"])
    scheduler = replicate(mariadb_source, start, policy_rules(source_db, target, "ignore_drops"),
                          target.load("nn"), tmp_path, name="nn", outcome=Outcome.PAUSED)
    assert isinstance(scheduler.error, LoadError) and "must" in str(scheduler.error), scheduler.error
    assert target.rows("t", "id, must, v") == [(1, 10, 1)]


def test_re_adding_a_kept_column_stops_instead_of_reusing_it(mariadb_source, source_db, target, tmp_path):
    """Under ignore_drops a later ADD COLUMN of a kept column's name is not taken as done: the target
    refuses it (the column exists), the pipeline stops there, and running it again (a resume) stops
    there again: the old values are never passed off as the new column's."""
    start = prepared(mariadb_source, source_db, target, tmp_path, BASE)
    run(mariadb_source, source_db, ["ALTER TABLE t DROP COLUMN gone", "ALTER TABLE t ADD COLUMN gone INT NULL",
                                    "INSERT INTO t VALUES (4, 4, 4, 44)"])
    for _ in range(2):  # the second run resumes from the acked position: the ADD is refused again, not taken as done
        scheduler = replicate(mariadb_source, start, policy_rules(source_db, target, "ignore_drops"),
                              target.load("again"), tmp_path, name="again", outcome=Outcome.PAUSED)
        assert isinstance(scheduler.error, LoadError) and "gone" in str(scheduler.error)
        assert target.rows("t", "id, gone") == [(1, "x1"), (2, "x2"), (3, "x3")]


def test_ignore_drops_refuses_a_statement_that_drops_and_re_adds_a_column(mariadb_source, source_db, target,
                                                                          tmp_path):
    """One ALTER that drops a column and adds it again is refused under ignore_drops (TableRefused):
    keeping the old column would hold old values where the source has new ones."""
    start = prepared(mariadb_source, source_db, target, tmp_path, BASE)
    run(mariadb_source, source_db, ["ALTER TABLE t DROP COLUMN gone, ADD COLUMN gone INT NULL"])
    scheduler = replicate(mariadb_source, start, policy_rules(source_db, target, "ignore_drops"),
                          target.load("both"), tmp_path, name="both", outcome=Outcome.PAUSED)
    assert isinstance(scheduler.error, TableRefused)
    assert "drops and names again column(s) gone" in str(scheduler.error)
    assert target.rows("t", "id, gone") == [(1, "x1"), (2, "x2"), (3, "x3")]


def test_ignore_drops_of_a_key_column_keeps_it_outside_the_new_key_or_stops(mariadb_source, source_db, target,
                                                                            tmp_path):
    """Under ignore_drops a key column dropped with the key redefined in the same ALTER stays as a
    plain column (the new key applies; an update reaches the old row, an insert fills the default);
    a table's only key column dropped (the source table becomes keyless) stops at the second new
    row's duplicate default key instead of overwriting a row."""
    start = prepared(mariadb_source, source_db, target, tmp_path, [
        "CREATE TABLE t (id INT, c INT NOT NULL DEFAULT 0, v INT, PRIMARY KEY (id, c))",
        "INSERT INTO t VALUES (1, 5, 1)",
        "CREATE TABLE u (id INT NOT NULL DEFAULT 0 PRIMARY KEY, v INT)", "INSERT INTO u VALUES (1, 1)"])
    run(mariadb_source, source_db, ["ALTER TABLE t DROP PRIMARY KEY, DROP COLUMN c, ADD PRIMARY KEY (id)",
                                    "UPDATE t SET v = 2 WHERE id = 1", "INSERT INTO t VALUES (2, 2)"])
    replicate(mariadb_source, start, policy_rules(source_db, target, "ignore_drops"), target.load("key"), tmp_path,
              name="key")
    assert target.rows("t", "id, c, v") == [(1, 5, 2), (2, 0, 2)]
    key = target.query("SELECT column_name FROM information_schema.key_column_usage WHERE table_schema = %s"
                       " AND table_name = 't'", (target.schema,))
    assert key == [("id",)]

    again = binlog_head(mariadb_source)
    run(mariadb_source, source_db, ["ALTER TABLE u DROP COLUMN id", "INSERT INTO u VALUES (2)",
                                    "INSERT INTO u VALUES (3)"])
    scheduler = replicate(mariadb_source, again, [table_rule(rf"{source_db}\..*", f"{target.schema}.{{table}}",
                                                             schema_changes="ignore_drops")],
                          target.load("keyless"), tmp_path, name="keyless", outcome=Outcome.PAUSED)
    assert isinstance(scheduler.error, LoadError) and "uplicate" in str(scheduler.error)
    # the first new row lands (default key 0) unless it shares the stopped batch; the second never overwrites it
    assert target.rows("u", "id, v") in ([(1, 1)], [(0, 2), (1, 1)])


def test_a_refused_schema_change_under_quarantine_stops_only_its_table(mariadb_source, source_db, target, tmp_path):
    """Under ``on_table_error: quarantine`` a statement the table's policy refuses (additive_only, a
    MODIFY) quarantines that table at it, its later rows kept, while another table goes on; the kept
    statement is refused again at replay (the policy decided it where it was read), so the table
    stays quarantined and its column keeps its type."""
    start = prepared(mariadb_source, source_db, target, tmp_path, BASE)
    before_modify = run(mariadb_source, source_db, ["INSERT INTO t VALUES (4, 4, 'x4', 4)"])
    run(mariadb_source, source_db, ["ALTER TABLE t MODIFY a BIGINT", "INSERT INTO t VALUES (5, 5, 'x5', 5)",
                                    "INSERT INTO other VALUES (1, 1)", "INSERT INTO other VALUES (2, 2)"])
    replicate(mariadb_source, start, policy_rules(source_db, target, "additive_only"),
              target.load("qadds", on_table_error="quarantine", initial_backoff=0.01), tmp_path, name="qadds")
    assert target.rows("other", "id, v") == [(1, 1), (2, 2)]
    assert target.rows("t", "id, a") == [(1, 1), (2, 2), (3, 3), (4, 4)]
    sink = target.load("qadds", on_table_error="quarantine")
    [found] = sink.quarantined()
    assert found.table == f"{target.schema}.t" and "schema_changes is additive_only" in found.cause, found
    assert found.first > before_modify and found.changes == 2, found
    with pytest.raises(TableRefused, match="additive_only: MODIFY is not an addition"):
        sink.replay(found.table)
    sink.close()
    assert target.load("qadds").quarantined() == [found]
    type_of_a = target.query("SELECT data_type FROM information_schema.columns WHERE table_schema = %s"
                             " AND table_name = 't' AND column_name = 'a'", (target.schema,))
    assert type_of_a == ([("int",)] if target.kind == "mariadb" else [("integer",)])
