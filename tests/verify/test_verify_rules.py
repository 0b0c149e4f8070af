"""`setl verify` follows the routing plan (renamed table and column, excluded column, row filter),
waits for the pipeline's acked position, and reports what it cannot decide as one line (exit 2)."""

from __future__ import annotations

import contextlib
import re

import pytest

from setl.config import load_node, load_pipeline
from setl.connectors import registry
from setl.meta import open_meta_store
from setl.model import TableName
from setl.verify.run import verify_pipeline
from tests.verify.test_verify import make_setl, running, verify

pytestmark = pytest.mark.timeout(120)


def test_rules_are_honoured_and_a_stopped_pipeline_must_be_caught_up(tmp_path, mariadb_source, mariadb_target,
                                                                    source_db, mysql_db):
    """A renamed table and column, an excluded column and a row filter verify equal; a changed renamed
    column and a target row the filter excludes are found; a stopped pipeline behind the source is an
    error naming pipeline, table and cause (exit 2)."""
    conn = mariadb_source.connect(database=source_db)
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("CREATE TABLE people (id INT NOT NULL PRIMARY KEY, name VARCHAR(20), secret VARCHAR(20), "
                    "age INT NOT NULL)")
        cur.executemany("INSERT INTO people VALUES (%s, %s, %s, %s)",
                        [(n, f"name{n}", f"secret{n}", n % 40) for n in range(1, 101)])
    rules = [{"source": rf"{re.escape(source_db)}\.people", "target": f"{mysql_db}.humans",
              "columns": {"exclude": ["secret"]}, "rename": {"name": "full_name"}, "filter": "age >= 18"}]
    setl = make_setl(tmp_path, mariadb_source, source_db, {"type": "mysql", "host": mariadb_target.host,
                                                           "port": mariadb_target.port, "user": mariadb_target.user,
                                                           "password": mariadb_target.password},
                     "", server_id=2203, tables=rules)
    with running(setl, mariadb_source):
        # an excluded column changes on the source only: still equal
        mariadb_source.query(f"UPDATE `{source_db}`.people SET secret = 'other' WHERE id = 20")
        code, report = verify(setl, "--chunk-rows", "30")
        assert code == 0, report
        (table,) = report["tables"]
        assert table["target"] == f"{mysql_db}.humans"
        assert table["mode"] == "python" and "row filter" in table["why"]
        assert table["rows"] == sum(1 for n in range(1, 101) if n % 40 >= 18)
        mariadb_target.query(f"UPDATE `{mysql_db}`.humans SET full_name = 'x' WHERE id = 19")
        mariadb_target.query(f"INSERT INTO `{mysql_db}`.humans (id, full_name, age) VALUES (2, 'name2', 2)")
        code, report = verify(setl, "--table", f"{source_db}.people", "--attempts", "2")
        assert code == 1
        (table,) = report["tables"]
        assert table["different"] == [{"key": {"id": "19"}, "columns": ["name"]}]
        assert table["extra"] == [{"key": {"id": "2"}}]
        assert table["missing"] == []
        # the same as text, paced
        text = setl.run("verify", "--pipeline", setl.name, "--max-rows-per-second", "500", timeout=90)
        assert text.returncode == 1, text.stderr
        assert f"{source_db}.people -> {mysql_db}.humans: DIFFERENT" in text.stdout
        assert "  different: id='19' columns: name" in text.stdout and "  extra: id='2'" in text.stdout
        assert text.stdout.rstrip().splitlines()[-1].startswith(f"{setl.name}: 1 table(s)"), text.stdout
        mariadb_target.query(f"DELETE FROM `{mysql_db}`.humans WHERE id = 2")
        mariadb_target.query(f"UPDATE `{mysql_db}`.humans SET full_name = 'name19' WHERE id = 19")
    # stopped and caught up: the acked position is the source's
    code, report = verify(setl)
    assert code == 0, report
    # stopped and behind: no verdict, one line
    mariadb_source.query(f"UPDATE `{source_db}`.people SET name = 'late' WHERE id = 30")
    result = setl.run("verify", "--pipeline", setl.name, "--wait-timeout", "1", timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"pipeline={setl.name}" in lines[0] and f"table={source_db}.people" in lines[0]
    assert "has not reached the source's position" in lines[0] and "Traceback" not in result.stderr
    # a table no rule selects is a usage error too
    result = setl.run("verify", "--pipeline", setl.name, "--table", "nowhere.none", timeout=60)
    assert result.returncode == 2 and "no table rule" in result.stderr, result.stderr
    # a target that refuses connections: one line too
    setl.config["target"]["port"] = 1
    setl.write_config()
    result = setl.run("verify", "--pipeline", setl.name, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and f"pipeline={setl.name}" in result.stderr, result.stderr


def test_differing_rows_in_large_chunks_are_found_by_bisection(tmp_path, mariadb_source, mariadb_target, source_db,
                                                               mysql_db):
    """Chunks of 4,000 rows whose aggregates differ are cut down to a few hundred rows: the changed,
    deleted and extra rows are found exactly, nothing else is reported; progress is reported per
    window of chunks."""
    conn = mariadb_source.connect(database=source_db)
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("CREATE TABLE wide (id BIGINT NOT NULL PRIMARY KEY, k INT NOT NULL, c CHAR(60) NOT NULL)")
        cur.executemany("INSERT INTO wide VALUES (%s, %s, %s)", [(n, n % 97, f"c{n}" * 5) for n in range(1, 10001)])
    setl = make_setl(tmp_path, mariadb_source, source_db, {"type": "mysql", "host": mariadb_target.host,
                                                           "port": mariadb_target.port, "user": mariadb_target.user,
                                                           "password": mariadb_target.password},
                     f"{mysql_db}.{{table}}", server_id=2205)
    with running(setl, mariadb_source):
        for statement in ("UPDATE {t}.wide SET k = k + 1 WHERE id IN (17, 4001, 9999)",
                          "DELETE FROM {t}.wide WHERE id = 5000", "INSERT INTO {t}.wide VALUES (10001, 1, 'x')"):
            mariadb_target.query(statement.format(t=f"`{mysql_db}`"))
        code, report = verify(setl, "--chunk-rows", "4000")
        calls: list[tuple] = []
        meta = open_meta_store(load_node(setl.conf))
        try:
            in_process = verify_pipeline(load_node(setl.conf), load_pipeline(setl.conf, setl.name, registry()), meta,
                                         [TableName(source_db, "wide")], chunk_rows=1000,
                                         progress=lambda *args: calls.append(args))
        finally:
            meta.close()
    assert not in_process.equal and in_process.tables[0].to_dict()["missing"] == [{"key": {"id": "5000"}}]
    # progress after each window of 8 chunks, then once done
    assert [c[1] for c in calls] == [8000, 10000, 10000] and [c[3] for c in calls] == [False, False, True]
    assert code == 1
    (table,) = report["tables"]
    assert table["chunks"] == 3 and table["rows"] == 10000, table
    assert table["different"] == [{"key": {"id": id_}, "columns": ["k"]} for id_ in ("17", "4001", "9999")], table
    assert table["missing"] == [{"key": {"id": "5000"}}]
    assert table["extra"] == [{"key": {"id": "10001"}}]
