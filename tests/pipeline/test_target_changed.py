"""Issue 34 point 1: a target that changed is never resumed into. With the meta store kept, a
target that lost tables whose copy had finished gets them copied again online; a target that holds
no position of the pipeline (a new database, a dropped position table) or an older one (a restore)
is refused at start and by `setl check`, with one line naming the target, the positions and the
commands on; following the line brings the target equal to the source."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.setl_process import mysql_target, postgres_target
from tests.schema.test_schema import make, q, run_source

pytestmark = pytest.mark.timeout(240)

QUERY = "SELECT * FROM {}.k ORDER BY id"
SEED = ["CREATE TABLE k (id INT PRIMARY KEY, v INT)", "INSERT INTO k SELECT seq, seq FROM seq_1_to_300",
        "CREATE TABLE other (id INT PRIMARY KEY)", "INSERT INTO other VALUES (1), (2)"]
MORE = ["INSERT INTO k VALUES (1001, 1)", "UPDATE k SET v = -2 WHERE id = 2", "DELETE FROM k WHERE id = 3"]


@pytest.fixture
def second_pg_db(postgres_server: Any, postgres_db: str) -> Iterator[str]:
    """Another fresh, empty database on `postgres_server`."""
    name = postgres_db + "_b"
    postgres_server.query(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            postgres_server.query(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def second_mysql_db(mariadb_target: Any, mysql_db: str) -> Iterator[str]:
    """Another fresh, empty database on `mariadb_target`."""
    name = mysql_db + "_b"
    mariadb_target.query(f"CREATE DATABASE {q(name)}")
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            mariadb_target.query(f"DROP DATABASE IF EXISTS {q(name)}")


def error_line(stderr: str) -> str:
    [line] = [line for line in stderr.splitlines() if line.startswith("setl: error")]
    return line


def pg_k(server: Any, db: str) -> list[tuple[Any, ...]]:
    return server.query("SELECT * FROM public.k ORDER BY id", dbname=db)


def started(setl: Any) -> str:
    """One `setl start --until-caught-up` that must succeed; its stderr."""
    result = setl.start_until_caught_up(timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def copies_done(setl: Any) -> dict[str, str]:
    return {c["table"]: c["status"] for c in setl.status()["snapshot"]}


def test_a_new_empty_mariadb_database_gets_its_tables_copied_again(
        tmp_path: Path, mariadb_source: Any, source_db: str, mariadb_target: Any, mysql_db: str,
        second_mysql_db: str) -> None:
    """The rules' target is changed to a new database (the meta store and the target's position
    kept) where one table was created empty beforehand: the next start copies both tables again
    online instead of streaming only the new changes, and the new database ends equal to the source."""
    run_source(mariadb_source, source_db, SEED)
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target, database=mysql_db),
                [{"source": rf"{source_db}\.(k|other)", "target": f"{mysql_db}.{{table}}"}], start="snapshot")
    started(setl)
    setl.config["tables"] = [{"source": rf"{source_db}\.(k|other)", "target": f"{second_mysql_db}.{{table}}"}]
    setl.config["target"]["database"] = second_mysql_db
    setl.write_config()
    run_source(mariadb_source, source_db, MORE)
    mariadb_target.query(f"CREATE TABLE {q(second_mysql_db)}.k (id INT PRIMARY KEY, v INT)")  # created since
    checked = setl.run("check", "--pipeline", setl.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "copies them again" in checked.stdout and f"{second_mysql_db}.k" in checked.stdout, checked.stdout

    stderr = started(setl)
    assert "copying them again" in stderr, stderr[-3000:]
    assert mariadb_target.query(QUERY.format(q(second_mysql_db))) == mariadb_source.query(QUERY.format(q(source_db)))
    assert mariadb_target.query(f"SELECT * FROM {q(second_mysql_db)}.other ORDER BY id") == [(1,), (2,)]
    assert copies_done(setl) == {f"{source_db}.k": "done", f"{source_db}.other": "done"}
    [(stored,)] = mariadb_target.query("SELECT identity FROM setl.setl_position_identity WHERE pipeline = %s",
                                       (setl.name,))
    assert json.loads(stored)["copied"] == [f"{second_mysql_db}.k", f"{second_mysql_db}.other"], stored
    again = started(setl)  # the copies are recorded on the target: the next start copies nothing
    assert "online, as" not in again and "snapshot of" not in again, again[-3000:]


def test_a_dropped_target_table_is_copied_again(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                postgres_server: Any, postgres_db: str) -> None:
    """One target table is dropped behind setl's back: the next start copies exactly that table
    again (the other is left alone) and both end equal to the source."""
    run_source(mariadb_source, source_db, SEED)
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.(k|other)", "target": "public.{table}"}], start="snapshot")
    started(setl)
    postgres_server.query("DROP TABLE public.k", dbname=postgres_db)
    postgres_server.query("INSERT INTO public.other VALUES (99)", dbname=postgres_db)  # a re-copy would drop it
    run_source(mariadb_source, source_db, MORE)
    stderr = started(setl)
    assert "copying it again" in stderr and "public.k (from" in stderr, stderr[-3000:]
    assert pg_k(postgres_server, postgres_db) == mariadb_source.query(QUERY.format(q(source_db)))
    assert postgres_server.query("SELECT id FROM public.other ORDER BY id", dbname=postgres_db) == [(1,), (2,), (99,)]
    assert copies_done(setl) == {f"{source_db}.k": "done", f"{source_db}.other": "done"}


def test_a_new_empty_postgresql_database_is_refused_then_started_afresh(
        tmp_path: Path, mariadb_source: Any, source_db: str, postgres_server: Any, postgres_db: str,
        second_pg_db: str) -> None:
    """``target.database`` is changed to a new, empty PostgreSQL database with the meta store kept:
    `setl check` and `setl start` refuse it with one line (no position there, the acked one, the
    command that starts afresh), nothing is streamed into it, status names the cause; after
    `setl position reset --start` the new database ends equal to the source."""
    run_source(mariadb_source, source_db, SEED)
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.k", "target": "public.{table}"}], start="snapshot")
    started(setl)
    acked = setl.acked()
    setl.config["target"]["database"] = second_pg_db
    setl.write_config()
    run_source(mariadb_source, source_db, MORE)

    checked = setl.run("check", "--pipeline", setl.name)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    [finding] = [line for line in checked.stdout.splitlines() if line.startswith("error")]
    assert "holds no position" in finding and f"setl position reset --pipeline {setl.name} --start" in finding, finding
    refused = setl.start_until_caught_up(timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = error_line(refused.stderr)
    assert f"database {second_pg_db}" in line and "holds no position" in line and str(acked.position.offset) in line
    assert f"`setl position reset --pipeline {setl.name} --start`" in line, line
    assert postgres_server.query("SELECT to_regclass('public.k') IS NULL", dbname=second_pg_db) == [(True,)]
    assert setl.acked() == acked
    assert "holds no position" in (setl.status()["error"] or ""), setl.status()

    assert setl.run("position", "reset", "--pipeline", setl.name, "--start").returncode == 0
    started(setl)
    assert pg_k(postgres_server, second_pg_db) == mariadb_source.query(QUERY.format(q(source_db)))
    assert setl.status()["error"] is None


def test_a_dropped_position_table_is_refused(tmp_path: Path, mariadb_source: Any, source_db: str,
                                             postgres_server: Any, postgres_db: str) -> None:
    """The target's position table is dropped (the tables kept): the start is refused with one line
    rather than trusting tables whose state nothing records."""
    run_source(mariadb_source, source_db, SEED)
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.k", "target": "public.{table}"}], start="snapshot")
    started(setl)
    postgres_server.query("DROP TABLE setl.setl_position", dbname=postgres_db)
    run_source(mariadb_source, source_db, MORE)
    refused = setl.start_until_caught_up(timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = error_line(refused.stderr)
    assert "holds no position" in line and "dropped position table" in line and "--start" in line, line
    assert (1001, 1) not in pg_k(postgres_server, postgres_db)


def test_a_target_restored_from_an_older_copy_is_refused_then_replayed(
        tmp_path: Path, mariadb_source: Any, source_db: str, mariadb_target: Any, mysql_db: str) -> None:
    """The target's position goes back to an older one (a restore): the start is refused with one
    line naming both positions; following its `--to` command replays from the target's own position
    and the target ends equal to the source."""
    run_source(mariadb_source, source_db, SEED)
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}], start="snapshot")
    started(setl)
    [old] = mariadb_target.query("SELECT log, `offset` FROM setl.setl_position WHERE pipeline = %s", (setl.name,))
    run_source(mariadb_source, source_db, MORE)
    started(setl)
    mariadb_target.query("UPDATE setl.setl_position SET log = %s, `offset` = %s WHERE pipeline = %s",
                         (old[0], old[1], setl.name))
    mariadb_target.query(f"DELETE FROM {q(mysql_db)}.k WHERE id = 1001")  # what the older copy lacked
    refused = setl.start_until_caught_up(timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = error_line(refused.stderr)
    assert f"holds position {old[0]}:{old[1]}" in line and "behind" in line, line
    command = f"setl position reset --pipeline {setl.name} --to {old[0]}:{old[1]}"
    assert f"`{command}`" in line, line
    assert setl.run(*command.split()[1:]).returncode == 0
    started(setl)
    assert mariadb_target.query(QUERY.format(q(mysql_db))) == mariadb_source.query(QUERY.format(q(source_db)))


def test_lapse_refuses_only_a_target_behind_the_acked_position() -> None:
    """`lapse`: no target position or one behind the acked one is a lapse naming both and the
    commands on; an equal or later one, an operator's reset or nothing acked is not."""
    from types import SimpleNamespace

    from setl.model import Position
    from setl.pipeline.identity import lapse

    config: Any = SimpleNamespace(name="p1", target=SimpleNamespace(type="postgresql", host="h", port=5432,
                                                                    database="shop2"))
    acked = Position("mysql-bin.000002", 400)
    none = lapse(config, acked, False, None)
    assert none is not None and "(postgresql h:5432 database shop2) holds no position of pipeline p1" in none
    assert "acked mysql-bin.000002:400" in none and "`setl position reset --pipeline p1 --start`" in none, none
    behind = lapse(config, acked, False, Position("mysql-bin.000001", 999, row=3))
    assert behind is not None and "holds position mysql-bin.000001:999+3" in behind, behind
    assert "`setl position reset --pipeline p1 --to mysql-bin.000001:999+3`" in behind, behind
    assert lapse(config, acked, False, Position("mysql-bin.000002", 400, row=1)) is None
    assert lapse(config, acked, False, Position("mysql-bin.000003", 4)) is None
    assert lapse(config, acked, True, None) is None
    assert lapse(config, None, False, None) is None


POSITION_TABLES = ("setl_position", "setl_position_fence", "setl_position_identity")


def _copy_table(source: Any, target: Any, schema: str, table: str, where: str = "", args: tuple = ()) -> None:
    """Copy `schema.table`'s definition (if `target` lacks it) and its rows matching `where` from one
    MariaDB server to another, as a dump and restore would."""
    [(_name, ddl)] = source.query(f"SHOW CREATE TABLE {q(schema)}.{q(table)}")
    target.query(f"CREATE DATABASE IF NOT EXISTS {q(schema)}")
    with contextlib.closing(target.connect(database=schema)) as conn, conn.cursor() as cur:
        cur.execute(ddl.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
        rows = source.query(f"SELECT * FROM {q(schema)}.{q(table)} {where}", args)
        if rows:
            marks = ", ".join(["%s"] * len(rows[0]))
            cur.executemany(f"REPLACE INTO {q(table)} VALUES ({marks})", rows)
        conn.commit()


def test_another_target_server_holding_a_copied_position_is_refused_then_copied_afresh(
        tmp_path: Path, mariadb_source: Any, source_db: str, mariadb_target: Any, mysql_db: str) -> None:
    """``target:`` is moved to another MariaDB server that holds a database of the same name and the
    pipeline's position and identity, copied there by an incomplete dump (a row missing): `setl check`
    and `setl start` refuse it with one line naming both servers and the commands on, nothing is
    loaded; after `setl position reset --start` the other server ends equal to the source."""
    run_source(mariadb_source, source_db, SEED)
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target, database=mysql_db),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}], start="snapshot")
    started(setl)
    other = mariadb_source  # the one other MariaDB server of the test session
    try:
        _copy_table(mariadb_target, other, mysql_db, "k", "WHERE id <> 7")  # the dump missed a row
        for table in POSITION_TABLES:
            _copy_table(mariadb_target, other, "setl", table, "WHERE pipeline = %s", (setl.name,))
        setl.config["target"]["port"] = other.port
        setl.write_config()
        run_source(mariadb_source, source_db, MORE)

        checked = setl.run("check", "--pipeline", setl.name)
        assert checked.returncode == 2, checked.stdout + checked.stderr
        [finding] = [line for line in checked.stdout.splitlines() if line.startswith("error")]
        assert "written on another mysql server" in finding and "datadir " in finding and "server_id 2 -> 1" in finding
        refused = setl.start_until_caught_up(timeout=120)
        assert refused.returncode == 2, refused.stderr[-3000:]
        line = error_line(refused.stderr)
        assert f"pipeline={setl.name} stage=load" in line and f"mysql {other.host}:{other.port}" in line, line
        assert "datadir " in line and "server_id 2 -> 1" in line, line
        assert f"`setl position reset --pipeline {setl.name} --start`" in line, line
        assert (1001, 1) not in other.query(QUERY.format(q(mysql_db)))

        assert setl.run("position", "reset", "--pipeline", setl.name, "--start").returncode == 0
        started(setl)
        assert other.query(QUERY.format(q(mysql_db))) == mariadb_source.query(QUERY.format(q(source_db)))
        assert started(setl)  # the identity now names this server: the next start takes it
    finally:
        other.query(f"DROP DATABASE IF EXISTS {q(mysql_db)}")
        for table in POSITION_TABLES:
            with contextlib.suppress(Exception):
                other.query(f"DELETE FROM setl.{table} WHERE pipeline = %s", (setl.name,))


def test_a_postgresql_position_restored_from_another_cluster_is_refused(
        tmp_path: Path, mariadb_source: Any, source_db: str, postgres_server: Any, postgres_db: str) -> None:
    """The PostgreSQL target's identity records its cluster's system identifier; one naming another
    cluster (a position table restored from that cluster's dump) is refused at start with one line
    naming both identifiers; `setl position reset --to` the position it names takes it."""
    run_source(mariadb_source, source_db, SEED)
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.k", "target": "public.{table}"}], start="snapshot")
    started(setl)
    [(text,)] = postgres_server.query("SELECT identity FROM setl.setl_position_identity WHERE pipeline = %s",
                                      (setl.name,), dbname=postgres_db)
    stored = json.loads(text)
    [(system,)] = postgres_server.query("SELECT system_identifier::text FROM pg_control_system()")
    assert stored["target"] == {"system_identifier": system}, stored
    stored["target"] = {"system_identifier": "7000000000000000001"}
    postgres_server.query("UPDATE setl.setl_position_identity SET identity = %s WHERE pipeline = %s",
                          (json.dumps(stored), setl.name), dbname=postgres_db)
    run_source(mariadb_source, source_db, MORE)
    refused = setl.start_until_caught_up(timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = error_line(refused.stderr)
    assert f"system_identifier 7000000000000000001 -> {system}" in line, line
    [command] = re.findall(r"`(setl position reset --pipeline \S+ --to \S+)`", line)
    assert setl.run(*command.split()[1:]).returncode == 0
    started(setl)
    assert pg_k(postgres_server, postgres_db) == mariadb_source.query(QUERY.format(q(source_db)))


def _replay(root: Path, table: str) -> list[tuple[Any, ...]]:
    """A Parquet change log replayed in position order: the table's rows, by key."""
    import pyarrow.parquet as pq

    rows = [r for f in sorted((root / table).rglob("part-*.parquet")) for r in pq.read_table(f).to_pylist()]
    rows.sort(key=lambda r: (r["_setl_log"], r["_setl_offset"], r["_setl_row"], r["_setl_batch"], r["_setl_seq"]))
    state: dict[Any, tuple[Any, ...]] = {}
    for row in rows:
        if row["_setl_op"] == "truncate":
            state.clear()
        elif row["_setl_op"] == "delete":
            state.pop(row["id"], None)
        else:
            state[row["id"]] = (row["id"], row["v"])
    return [state[key] for key in sorted(state)]


def test_a_parquet_target_whose_path_changed_is_refused_then_copied_afresh(
        tmp_path: Path, mariadb_source: Any, source_db: str) -> None:
    """``target.path`` is changed to an empty directory with the meta store kept: `setl check` and
    `setl start` refuse it with one line (no output there, the acked position, the `--start`
    command), nothing is written there, a second start refuses again; after `setl position reset
    --start` the new directory's log replays to the source's rows."""
    run_source(mariadb_source, source_db, SEED)
    first, second = tmp_path / "out1", tmp_path / "out2"
    setl = make(tmp_path, mariadb_source, {"type": "parquet", "path": str(first)},
                [{"source": rf"{source_db}\.k", "target": "shop.{table}"}], start="snapshot")
    started(setl)
    acked = setl.acked()
    setl.config["target"]["path"] = str(second)
    setl.write_config()
    run_source(mariadb_source, source_db, MORE)

    checked = setl.run("check", "--pipeline", setl.name)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    [finding] = [line for line in checked.stdout.splitlines() if line.startswith("error")]
    assert "holds no output" in finding and f"path {second}" in finding, finding
    for _ in range(2):  # a refused start leaves the directory as it found it: refused again
        refused = setl.start_until_caught_up(timeout=120)
        assert refused.returncode == 2, refused.stderr[-3000:]
        line = error_line(refused.stderr)
        assert f"(parquet path {second}) holds no output of pipeline {setl.name}" in line, line
        assert str(acked.position) in line and f"`setl position reset --pipeline {setl.name} --start`" in line, line
        assert not list(second.rglob("*.parquet")) and not (second / ".setl-pipeline").exists()
    assert setl.acked() == acked

    assert setl.run("position", "reset", "--pipeline", setl.name, "--start").returncode == 0
    started(setl)
    assert _replay(second, "shop.k") == mariadb_source.query(QUERY.format(q(source_db)))
    assert (second / ".setl-pipeline").read_text().strip() == setl.name
    started(setl)  # the new directory is the pipeline's own now: not refused again


def test_a_parquet_directory_holds_output_only_once_owned(tmp_path: Path) -> None:
    """`ParquetLoad.holds_output`: a fresh directory holds nothing (before and after the open that
    marks it), a refused start's `disown` removes the marker it wrote, `own` accepts the directory,
    and a marker left by an earlier run counts; a load without a pipeline name judges nothing."""
    from setl.sinks.parquet import OWNER_FILE, ParquetLoad

    fresh = ParquetLoad(tmp_path / "out", pipeline="p1")
    assert fresh.holds_output() is False
    fresh.open()
    assert fresh.holds_output() is False and (tmp_path / "out" / OWNER_FILE).is_file()
    fresh.disown()
    assert not (tmp_path / "out" / OWNER_FILE).exists()
    again = ParquetLoad(tmp_path / "out", pipeline="p1")
    again.open()
    assert again.holds_output() is False
    again.own()
    again.disown()  # an accepted directory keeps its marker
    assert again.holds_output() is True and (tmp_path / "out" / OWNER_FILE).is_file()
    later = ParquetLoad(tmp_path / "out2", pipeline="p1")
    (tmp_path / "out2").mkdir()
    (tmp_path / "out2" / OWNER_FILE).write_text("p1\n")
    assert later.holds_output() is True
    later.open()
    assert later.holds_output() is True
    assert ParquetLoad(tmp_path / "out3").holds_output() is True
