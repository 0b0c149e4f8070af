"""The source server's settings judged before the first row (issue 33): `setl check` lists every
setting that is not fine with its exact fix, `setl start` refuses them all in one line, and what
each refused setting does to the binlog is shown on a real server."""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path
from typing import Any

import pymysql
import pytest

from setl.config import load_node, load_pipeline
from setl.connectors import registry
from setl.errors import PositionPurged, SourceError
from setl.model import Position
from setl.pipeline.build import build_select
from setl.pipeline.checks import check_source
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.sources.mysql_binlog.settings import REFUSED, WARNING, ServerFacts, evaluate, set_global
from setl.testing.servers import MariaDBServer, wait_until
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target
from tests.sources.binlog import execute, head, make_source, read

pytestmark = pytest.mark.timeout(180)

#: MariaDB as Debian packages it: none of the binlog lines the test servers add.
PACKAGED = {"binlog_format": None, "binlog_row_image": None, "binlog_row_metadata": None}


@pytest.fixture(scope="module")
def server():
    """A MariaDB of this module's own (its global settings are changed and restored by the tests)."""
    started = MariaDBServer(server_id=31)
    try:
        yield started.start()
    finally:
        started.cleanup()


@contextlib.contextmanager
def global_set(server: Any, **values: Any):
    """SET GLOBAL each of `values` for the block, then back to what it was."""
    before = {name: server.query(f"SELECT @@GLOBAL.{name}")[0][0] for name in values}
    try:
        for name, value in values.items():
            server.query(f"SET GLOBAL {name} = %s", (value,))
        yield
    finally:
        for name, value in before.items():
            server.query(f"SET GLOBAL {name} = %s", (value,))


def pipeline(tmp_path: Path, source: Any, schema: str, target: Any, target_db: str, start: Any) -> SetlProcess:
    return SetlProcess(tmp_path, source=mysql_source(source, start=start, server_id=3101), target=mysql_target(target),
                       tables=[{"source": rf"{schema}\..*", "target": f"{target_db}.{{table}}"}],
                       pipeline={"batch": {"max_wait_ms": 50},
                                 "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20}})


def source_lines(result: subprocess.CompletedProcess, level: str) -> list[str]:
    """The `setl check` lines of `level` about the source."""
    return [line for line in result.stdout.splitlines() if line.split()[:1] == [level] and " source: " in line]


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one `setl: error:` line of a refused start (exit 1, no traceback)."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("setl: error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def binlog_tables(server: Any, log: str) -> set[str]:
    """The tables whose rows the binlog file `log` holds (its table-map events)."""
    events = server.query(f"SHOW BINLOG EVENTS IN '{log}'")
    return {match[1] for row in events if row[2] == "Table_map" and (match := re.search(r"table_id: \d+ \((.+)\)",
                                                                                        str(row[5])))}


def test_packaged_defaults_are_listed_with_their_fixes_and_replicate_once_applied(
        tmp_path, mariadb_factory, mariadb_target, mysql_db):
    """MariaDB's packaged defaults: check lists each wrong setting with its SET GLOBAL fix (exit 1), start
    refuses them all in one line; the printed fixes applied, check passes and a start copies the rows."""
    source = mariadb_factory(server_id=32, options=PACKAGED)
    assert source.query("SELECT @@binlog_format, @@binlog_row_metadata") == [("MIXED", "NO_LOG")]
    execute(source, "mysql", "CREATE DATABASE shop", "CREATE TABLE shop.items (id INT PRIMARY KEY, v VARCHAR(20))")
    start = binlog_head(source)
    setl = pipeline(tmp_path, source, "shop", mariadb_target, mysql_db, {"file": start.log, "pos": start.offset})

    check = setl.run("check", "--pipeline", setl.name)
    assert check.returncode == 1, check.stdout + check.stderr
    errors = source_lines(check, "error")
    assert len(errors) == 3, check.stdout  # two settings, then the summary
    assert "binlog_format=MIXED" in errors[0] and "SET GLOBAL binlog_format=ROW" in errors[0]
    assert "binlog_row_metadata=NO_LOG" in errors[1] and "SET GLOBAL binlog_row_metadata=FULL" in errors[1]
    assert "in [mysqld] of the server's config" in errors[0] and "2 of " in errors[2]
    assert "ok      pipeline=" + setl.name + " rules: 1 source table(s) selected" in check.stdout  # checked on

    line = error_line(setl.start_until_caught_up())
    assert "(1) binlog_format=MIXED" in line and "(2) binlog_row_metadata=NO_LOG" in line
    assert f"pipeline={setl.name}" in line and f"{source.host}:{source.port}" in line
    assert mariadb_target.query(f"SHOW TABLES FROM `{mysql_db}`") == []  # nothing moved
    assert setl.acked() is None

    fixes = re.findall(r"SET GLOBAL (\w+)=(\w+)", "\n".join(errors))
    assert sorted(fixes) == [("binlog_format", "ROW"), ("binlog_row_metadata", "FULL")]
    for name, value in fixes:
        source.query(f"SET GLOBAL {name}={value}")
    check = setl.run("check", "--pipeline", setl.name)
    assert check.returncode == 0, check.stdout + check.stderr
    assert source_lines(check, "error") == [] and "source settings ok (" in check.stdout

    rows = [(i, f"row {i}") for i in range(1, 21)]
    execute(source, "shop", *[("INSERT INTO items VALUES (%s, %s)", row) for row in rows],
            "UPDATE items SET v = 'changed' WHERE id = 7")
    source.query("SET GLOBAL binlog_expire_logs_seconds = 3600")  # a warning does not stop a start
    started = setl.start_until_caught_up()
    assert started.returncode == 0, started.stderr[-3000:]
    assert f"WARNING setl.node: pipeline={setl.name} source setting binlog_expire_logs_seconds=3600" in started.stderr
    expected = [(i, "changed" if i == 7 else v) for i, v in rows]
    assert mariadb_target.query(f"SELECT id, v FROM `{mysql_db}`.items ORDER BY id") == expected


def test_a_filtered_out_selected_schema_is_refused(mariadb_factory):
    """binlog-ignore-db on a selected schema: its rows never reach the binlog, so the source is refused
    naming the schema; a pipeline selecting only logged schemas opens, with a warning about DDL."""
    source = mariadb_factory(server_id=33, options={"binlog_ignore_db": "shop"})
    execute(source, "mysql", "CREATE DATABASE shop", "CREATE DATABASE other",
            "CREATE TABLE shop.t (id INT PRIMARY KEY)", "CREATE TABLE other.t (id INT PRIMARY KEY)")
    log = head(source).log
    execute(source, "mysql", "INSERT INTO shop.t VALUES (1)", "INSERT INTO other.t VALUES (1)")
    assert binlog_tables(source, log) == {"other.t"}  # why it is refused: shop's rows are not there

    everything = make_source(source)
    (verdict,) = [v for v in everything.judge_settings().verdicts if v.level != "ok"]
    assert (verdict.setting, verdict.value, verdict.level) == ("binlog_ignore_db", "shop", REFUSED)
    assert "schema shop" in verdict.text and "binlog-ignore-db" in verdict.fix
    with pytest.raises(SourceError) as caught:
        everything.open(None)
    assert "binlog_ignore_db=shop" in str(caught.value) and "pipeline=t" in str(caught.value)

    other = make_source(source, selects=lambda schema, table: schema == "other")
    assert [(v.setting, v.level) for v in other.judge_settings().verdicts if v.level != "ok"] == [
        ("binlog_ignore_db", WARNING)]
    other.open(None)
    other.close()
    (signal,) = other.judge_settings(None, ("shop",)).refused  # a ddl_tasks signal table in shop: never logged
    assert (signal.setting, signal.level) == ("binlog_ignore_db", REFUSED) and "schema shop" in signal.text


@pytest.mark.parametrize("checksum", ["NONE", "CRC32"])
def test_checksum_none_and_crc32_both_replicate(server, checksum):
    """binlog_checksum NONE and CRC32 are both judged fine, and rows read back equal under each."""
    table = f"sums.t_{checksum.lower()}"
    execute(server, "mysql", "CREATE DATABASE IF NOT EXISTS sums", f"CREATE TABLE {table} (id INT PRIMARY KEY, v TEXT)")
    with global_set(server, binlog_checksum=checksum):  # the server starts a new binlog file
        start = head(server)
        rows = [{"id": i, "v": f"{checksum} {'x' * i}"} for i in range(1, 6)]
        execute(server, "sums", *[(f"INSERT INTO {table} VALUES (%s, %s)", (r["id"], r["v"])) for r in rows])
        src = make_source(server)
        try:
            verdicts = {v.setting: v for v in src.judge_settings().verdicts}
            assert (verdicts["binlog_checksum"].value, verdicts["binlog_checksum"].level) == (checksum, "ok")
            src.open(start)
            got = read(src, len(rows), "sums")
        finally:
            src.close()
    assert [c.after for tx in got for c in tx.changes] == rows


def test_two_phase_alter_is_refused_after_logging_the_alter_twice(server):
    """binlog_alter_two_phase=ON logs an ALTER as START ALTER and COMMIT (or ROLLBACK) ALTER, both with
    the statement: the source is refused with the exact fix."""
    execute(server, "mysql", "CREATE DATABASE alters", "CREATE TABLE alters.t (id INT PRIMARY KEY, v INT)",
            "INSERT INTO alters.t VALUES (1, 1), (2, 1)")
    with global_set(server, binlog_alter_two_phase="ON"):
        at = head(server)
        execute(server, "alters", "ALTER TABLE t ADD COLUMN w INT")
        with pytest.raises(pymysql.err.IntegrityError):
            execute(server, "alters", "ALTER TABLE t ADD UNIQUE KEY (v)")  # START ALTER, then ROLLBACK ALTER
        events = server.query(f"SHOW BINLOG EVENTS IN '{at.log}' FROM {at.offset}")
        statements = [str(row[5]) for row in events if row[2] == "Query"]
        assert sum("ADD COLUMN w" in text for text in statements) == 2, statements
        assert sum("ADD UNIQUE KEY" in text for text in statements) == 2, statements  # it was rolled back
        src = make_source(server)
        with pytest.raises(SourceError) as caught:
            src.open(None)
    assert "binlog_alter_two_phase=ON" in str(caught.value)
    assert "SET GLOBAL binlog_alter_two_phase=OFF" in str(caught.value)


def test_short_retention_and_compression_are_judged(server):
    """Binlogs purged within a day warn with the fix; log_bin_compress is handled (ok); the rest is ok."""
    with global_set(server, binlog_expire_logs_seconds=3600, log_bin_compress="ON"):
        report = make_source(server).judge_settings()
    verdicts = {v.setting: v for v in report.verdicts}
    assert verdicts["binlog_expire_logs_seconds"].level == WARNING
    assert "after 1 hour(s)" in verdicts["binlog_expire_logs_seconds"].text
    assert "SET GLOBAL binlog_expire_logs_seconds=" in verdicts["binlog_expire_logs_seconds"].fix
    assert (verdicts["log_bin_compress"].value, verdicts["log_bin_compress"].level) == ("ON", "ok")
    assert [v.setting for v in report.verdicts if v.level != "ok"] == ["binlog_expire_logs_seconds"]
    assert report.summary().startswith("source settings ok (")


def test_a_purged_position_is_refused_with_the_recopy_fix(tmp_path, mariadb_factory, mariadb_target, mysql_db):
    """A saved position whose binlog was purged: check names it with the re-copy command, start refuses it."""
    source = mariadb_factory(server_id=34)
    execute(source, "mysql", "CREATE DATABASE shop", "CREATE TABLE shop.items (id INT PRIMARY KEY, v VARCHAR(20))",
            "INSERT INTO shop.items VALUES (1, 'a')")
    setl = pipeline(tmp_path, source, "shop", mariadb_target, mysql_db, "earliest")
    assert setl.start_until_caught_up().returncode == 0
    saved = setl.acked()
    assert saved is not None
    source.query("FLUSH BINARY LOGS")
    execute(source, "shop", "INSERT INTO items VALUES (2, 'b')")
    newest = head(source).log

    def purged() -> bool:
        source.query(f"PURGE BINARY LOGS TO '{newest}'")
        return source.query("SHOW BINARY LOGS")[0][0] == newest

    wait_until(purged, timeout=10, interval=0.1, message=f"binlogs before {newest} to be purged")
    check = setl.run("check", "--pipeline", setl.name)
    assert check.returncode == 1, check.stdout + check.stderr
    (line, _summary) = source_lines(check, "error")
    assert f"position={saved.position.log}:{saved.position.offset}" in line and "purged" in line
    assert f"{newest}:4" in line and f"setl position reset --pipeline {setl.name} --start" in line

    line = error_line(setl.start_until_caught_up())
    assert "purged" in line and f"setl position reset --pipeline {setl.name} --start" in line
    node = load_node(setl.conf)
    config = load_pipeline(setl.conf, setl.name, registry())
    with pytest.raises(PositionPurged) as caught:  # what the start raised: the public error for it
        check_source(config, build_select(node, config), saved.position, print)
    assert "purged" in str(caught.value) and f"pipeline={setl.name}" in str(caught.value)
    assert mariadb_target.query(f"SELECT id FROM `{mysql_db}`.items") == [(1,)]


def test_encrypted_binlog_is_read_through_the_server(tmp_path, mariadb_factory):
    """encrypt_binlog=ON (file_key_management): the file holds no plain text, and the rows arrive equal."""
    keys = tmp_path / "keys.txt"
    keys.write_text("1;" + "ab" * 32 + "\n")
    source = mariadb_factory(server_id=35, options={"plugin_load_add": "file_key_management",
                                                    "file_key_management_filename": str(keys),
                                                    "encrypt_binlog": "ON"})
    execute(source, "mysql", "CREATE DATABASE vault", "CREATE TABLE vault.t (id INT PRIMARY KEY, v VARCHAR(40))")
    start = head(source)
    execute(source, "vault", "INSERT INTO t VALUES (1, 'plain-text-marker-1'), (2, 'plain-text-marker-2')")
    assert b"plain-text-marker" not in (source.datadir / start.log).read_bytes()
    src = make_source(source)
    try:
        verdicts = {v.setting: v for v in src.judge_settings().verdicts}
        assert (verdicts["encrypt_binlog"].value, verdicts["encrypt_binlog"].level) == ("ON", "ok")
        src.open(start)
        (tx,) = read(src, 1, "vault")
    finally:
        src.close()
    assert [c.after for c in tx.changes] == [{"id": 1, "v": "plain-text-marker-1"},
                                             {"id": 2, "v": "plain-text-marker-2"}]


def test_a_replica_without_log_slave_updates_is_refused(server, mariadb_factory):
    """A replica with log_slave_updates=OFF applies its primary's rows without logging them: refused."""
    replica = mariadb_factory(server_id=36)
    execute(server, "mysql", "CREATE DATABASE relay", "CREATE TABLE relay.t (id INT PRIMARY KEY)")
    primary_at = head(server)
    replica.query("CREATE DATABASE relay")
    replica.query("CREATE TABLE relay.t (id INT PRIMARY KEY)")
    replica.query(f"CHANGE MASTER TO MASTER_HOST='{server.host}', MASTER_PORT={server.port}, MASTER_USER='root', "
                  f"MASTER_PASSWORD='', MASTER_LOG_FILE='{primary_at.log}', MASTER_LOG_POS={primary_at.offset}, "
                  "MASTER_USE_GTID=no")
    replica.query("START SLAVE")
    try:
        replica_at = head(replica)
        execute(server, "relay", "INSERT INTO t VALUES (1)")
        wait_until(lambda: replica.query("SELECT id FROM relay.t") == [(1,)], timeout=20, interval=0.1,
                   message="the replica to apply the row")
        assert "relay.t" not in binlog_tables(replica, replica_at.log)  # why it is refused
        report = make_source(replica).judge_settings()
        # the least-privileged account of docs/grants.md cannot SHOW SLAVE STATUS, and still sees it
        for grant in ("CREATE USER 'repl'@'%' IDENTIFIED BY 'pw'", "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* "
                      "TO 'repl'@'%'", "GRANT SELECT ON relay.* TO 'repl'@'%'"):
            replica.query(grant)
        least = MysqlBinlogSource(host=replica.host, port=replica.port, user="repl", password="pw", server_id=3102)
        with contextlib.closing(replica.connect(user="repl", password="pw")) as conn, \
                pytest.raises(pymysql.err.OperationalError):
            conn.cursor().execute("SHOW ALL SLAVES STATUS")
        least_report = least.judge_settings()
    finally:
        replica.query("STOP SLAVE")
    for found in (report, least_report):
        (verdict,) = found.refused
        assert (verdict.setting, verdict.value) == ("log_slave_updates", "OFF") and "replica" in verdict.text
        assert verdict.fix == "log_slave_updates=ON in [mysqld] of the server's config, then restart the server"


def test_mysql_settings_are_judged_all_at_once():
    """On MySQL 8's variables: compression, partial JSON, a GTID start without GTIDs and a binlog_do_db
    leaving out a selected schema are each refused, with their fixes, in one evaluation."""
    variables = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL",
                 "binlog_checksum": "CRC32", "binlog_transaction_compression": "ON",
                 "binlog_row_value_options": "PARTIAL_JSON", "gtid_mode": "OFF", "log_slave_updates": "ON",
                 "binlog_expire_logs_seconds": "2592000", "binlog_rows_query_log_events": "OFF",
                 "binlog_error_action": "IGNORE_ERROR"}
    facts = ServerFacts("8.0.36", "mysql", variables, do_db=("app",), logs=(("binlog.000003", 157),),
                        schemas=("app", "shop"), position=Position("binlog.000001", 4), gtid_start=True, pipeline="p")
    refused = {v.setting: v for v in evaluate(facts) if v.level == REFUSED}
    assert sorted(refused) == ["binlog_do_db", "binlog_row_value_options", "binlog_transaction_compression",
                               "gtid_mode", "position"]
    assert refused["binlog_transaction_compression"].fix.startswith("SET GLOBAL binlog_transaction_compression=OFF")
    assert "schema shop" in refused["binlog_do_db"].text
    assert "setl position reset --pipeline p --start" in refused["position"].fix
    (warned,) = [v for v in evaluate(facts) if v.level == WARNING]
    assert (warned.setting, warned.fix) == ("binlog_error_action", set_global("binlog_error_action", "ABORT_SERVER"))
    assert all(v.level == "ok" for v in evaluate(ServerFacts("8.0.36", "mysql", {
        **variables, "binlog_transaction_compression": "OFF", "binlog_row_value_options": "", "gtid_mode": "ON",
        "binlog_error_action": "ABORT_SERVER"})))


def test_galera_and_newer_mariadb_settings_are_judged():
    """A Galera node forcing STATEMENT, without log_slave_updates, with a binlog in InnoDB: each refused."""
    variables = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL",
                 "wsrep_on": "ON", "wsrep_forced_binlog_format": "STATEMENT", "log_slave_updates": "OFF",
                 "binlog_storage_engine": "innodb", "binlog_legacy_event_pos": "OFF"}
    verdicts = {v.setting: v for v in evaluate(ServerFacts("12.3.1-MariaDB", "mariadb", variables))}
    assert {name for name, v in verdicts.items() if v.level == REFUSED} == {
        "wsrep_forced_binlog_format", "log_slave_updates", "binlog_storage_engine"}
    assert "Galera node" in verdicts["log_slave_updates"].text
    assert verdicts["wsrep_forced_binlog_format"].fix.startswith("SET GLOBAL wsrep_forced_binlog_format=ROW")
    assert verdicts["binlog_legacy_event_pos"].level == WARNING
    galera_ok = {**variables, "wsrep_forced_binlog_format": "NONE", "log_slave_updates": "ON",
                 "binlog_storage_engine": ""}
    galera_ok.pop("binlog_legacy_event_pos")
    assert all(v.level == "ok" for v in evaluate(ServerFacts("10.11.19-MariaDB", "mariadb", galera_ok)))


def test_mysql_8_4_replica_names_are_read():
    """MySQL 8.4 has only log_replica_updates: a replica with it OFF is refused under that name."""
    variables = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL",
                 "log_replica_updates": "OFF", "binlog_expire_logs_seconds": "2592000"}
    (verdict,) = [v for v in evaluate(ServerFacts("8.4.3", "mysql", variables, replica=True)) if v.level != "ok"]
    assert (verdict.setting, verdict.value, verdict.level) == ("log_replica_updates", "OFF", REFUSED)
    assert verdict.fix.startswith("log_replica_updates=ON in [mysqld]")
    assert all(v.level == "ok" for v in evaluate(ServerFacts("8.4.3", "mysql", variables, replica=False)))
    hourly = {**variables, "binlog_expire_logs_seconds": "3600"}  # retention: warned, unless auto purge is off
    assert [v.setting for v in evaluate(ServerFacts("8.4.3", "mysql", hourly)) if v.level == WARNING] == [
        "binlog_expire_logs_seconds"]
    assert all(v.level == "ok" for v in evaluate(ServerFacts("8.4.3", "mysql", {
        **hourly, "binlog_expire_logs_auto_purge": "OFF"})))


def test_a_server_without_binlog_is_refused_with_the_fix(mariadb_factory):
    """A server started without log_bin: the check names it with the [mysqld] line and a restart."""
    source = mariadb_factory(server_id=37, options={"log_bin": None})
    report = make_source(source).judge_settings()
    (verdict,) = report.refused
    assert (verdict.setting, verdict.value) == ("log_bin", "OFF")
    assert verdict.fix == "log_bin=mysql-bin in [mysqld] of the server's config, then restart the server"
    assert "1 of " in report.summary()
