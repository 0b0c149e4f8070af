"""A two-way channel whose sites' user may not set its session's server_id (no BINLOG REPLAY, no
SUPER): `loop_guard: auto` falls back to the marker row (docs/bidirectional.md). Rows, DDL both
ways (a DROP TABLE, whose text MariaDB rewrites, included) and a transaction split in pieces cross
once each; both sites end equal and both binlogs stop growing once the writers stop."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from setl.testing.servers import MariaDBServer, wait_until
from tests.e2e.test_bidirectional import SPLIT, Channel, columns, equal_sites, head, rows, stop, two_primaries

pytestmark = pytest.mark.timeout(300)

USER, PASSWORD = "plain", "pw"


@pytest.fixture(scope="module")
def unprivileged_sites(tmp_path_factory: pytest.TempPathFactory):
    """Two primaries as `test_bidirectional`'s, each with a user that may not set its session's server_id."""
    def unprivileged_user(server: MariaDBServer) -> None:
        server.query(f"CREATE USER {USER}@'%' IDENTIFIED BY '{PASSWORD}'")
        server.query(f"GRANT ALL ON *.* TO {USER}@'%'")
        server.query(f"REVOKE SUPER, BINLOG REPLAY, BINLOG ADMIN ON *.* FROM {USER}@'%'")

    with two_primaries(tmp_path_factory, "msite", 20, domains=10, setup=unprivileged_user) as servers:
        yield servers


def unprivileged(channel: Channel, **extra: Any) -> Channel:
    """The channel's sites reached as the user without the privilege."""
    for site in channel.config["sites"].values():
        site.update(user=USER, password=PASSWORD)
    channel.config.update(extra)
    channel.write()
    return channel


def still(channel: Channel, east: MariaDBServer, west: MariaDBServer, tables: list[str], proc: Any,
          timeout: float = 90) -> tuple[Any, Any]:
    """Wait until both sites hold the same rows of `tables` and both binlog heads stood still for 3 s; the heads."""
    seen: list[tuple] = []

    def settled() -> bool:
        assert proc.poll() is None, channel.logs()
        seen.append((head(east), head(west), all(rows(east, t) == rows(west, t) for t in tables)))
        return len(seen) >= 7 and seen[-1][2] and all(s == seen[-1] for s in seen[-7:])

    wait_until(settled, timeout=timeout, interval=0.5, message=lambda: f"not still: {seen[-3:]}\n{channel.logs()}")
    return seen[-1][0], seen[-1][1]


def test_without_the_privilege_the_marker_keeps_every_change_from_returning(tmp_path, unprivileged_sites):
    """Rows, DDL each way (DROP TABLE too) and a split transaction cross once; then both binlogs stand still."""
    east, west = unprivileged_sites
    schema = "app_marker"
    channel = unprivileged(equal_sites(tmp_path, "mk", east, west, schema,
                                       "t (id INT AUTO_INCREMENT PRIMARY KEY, site VARCHAR(8), n INT)"))
    check = channel.run("check", "--channel", channel.name)
    assert "loop_guard auto: east marker, west marker" in check.stdout, check.stdout + check.stderr
    proc = channel.spawn()
    try:
        for i in range(10):  # auto-increment hands out odd keys on east, even on west
            east.query(f"INSERT INTO {schema}.t (site, n) VALUES ('east', {i})")
            west.query(f"INSERT INTO {schema}.t (site, n) VALUES ('west', {i})")
        east.query(f"UPDATE {schema}.t SET n = n + 100 WHERE site = 'east' AND n < 5")
        west.query(f"DELETE FROM {schema}.t WHERE site = 'west' AND n >= 8")
        # Both directions past their start before any DDL: a table first met after its source was
        # altered is judged by its current shape, which the target does not have yet (a start-up race
        # of the target-table check, not of the loop guard).
        wait_until(lambda: proc.poll() is None and len(rows(west, f"{schema}.t")) == 18
                   and rows(east, f"{schema}.t") == rows(west, f"{schema}.t"), timeout=60, message=channel.logs)
        east.query(f"ALTER TABLE {schema}.t ADD COLUMN note VARCHAR(20) NULL")  # DDL on east ...
        west.query(f"CREATE TABLE {schema}.u (id INT PRIMARY KEY, v VARCHAR(10))")  # ... and on west
        west.query(f"CREATE TABLE {schema}.gone (id INT PRIMARY KEY)")
        wait_until(lambda: proc.poll() is None and "note" in columns(west, schema, "t")
                   and columns(east, schema, "u") == ["id", "v"] and columns(east, schema, "gone") == ["id"],
                   timeout=60, message=channel.logs)
        east.query(f"DROP TABLE {schema}.gone")  # logged as the server rewrote it: no comment survives
        west.query(f"INSERT INTO {schema}.t (site, n, note) VALUES ('west', 99, 'after ddl')")
        big = ", ".join(f"({k}, 'v{k % 10}')" for k in range(1, 3 * SPLIT + 51))
        east.query(f"INSERT INTO {schema}.u (id, v) VALUES {big}")  # one transaction of 650 rows: 4 pieces
        heads = still(channel, east, west, [f"{schema}.t", f"{schema}.u"], proc)
        assert len(rows(west, f"{schema}.u")) == 3 * SPLIT + 50
        assert len(rows(west, f"{schema}.t")) == 10 + 8 + 1
        assert columns(east, schema, "t") == columns(west, schema, "t") == ["id", "site", "n", "note"]
        assert columns(west, schema, "gone") == [] == columns(east, schema, "gone")
        time.sleep(2)  # several heartbeats and batch waits more: a returning change would move a head
        assert (head(east), head(west)) == heads, channel.logs()
        assert proc.poll() is None, channel.logs()
        for server, mark in ((west, "mk:east-to-west"), (east, "mk:west-to-east")):  # the marker did the work
            marked = server.query("SELECT COUNT(*), COALESCE(SUM(seq), 0) FROM setl.setl_channel_mark WHERE mark = %s",
                                  (mark,))[0]
            assert marked[0] >= 1 and marked[1] >= 4, (mark, marked)
        assert channel.logs().count("loop guard marker") >= 2, channel.logs()
    finally:
        assert stop(proc) == 0, channel.logs()


def test_marker_mode_refuses_a_site_logging_statements(tmp_path, unprivileged_sites):
    """`setl check --channel` with loop_guard marker refuses a site whose binlog_format is not ROW, naming the fix."""
    east, west = unprivileged_sites
    channel = Channel(tmp_path, "mr", east, west, "app_refused", loop_guard="marker")
    east.query("SET GLOBAL binlog_format = 'STATEMENT'")
    try:
        result = channel.run("check", "--channel", channel.name)
    finally:
        east.query("SET GLOBAL binlog_format = 'ROW'")
    lines = [line for line in result.stdout.splitlines() if line.startswith("error") and "channel:mr" in line]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and "site east logs with binlog_format STATEMENT: the marker loop guard needs ROW" \
        in lines[0] and "SET GLOBAL binlog_format = ROW" in lines[0], lines


def no_loader_sessions(*servers: MariaDBServer) -> bool:
    """Whether no session of the channel's user is left on `servers` (a killed node's are closed)."""
    return all(not s.query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (USER,)) for s in servers)


def dead_marks(server: MariaDBServer, mark: str) -> list[tuple]:
    """The rows of `mark` in `server`'s mark table whose session is gone."""
    return [tuple(r) for r in server.query(
        "SELECT session, seq FROM setl.setl_channel_mark WHERE mark = %s AND session NOT IN "
        "(SELECT ID FROM information_schema.PROCESSLIST)", (mark,))]


def checksums(server: MariaDBServer, schema: str, tables: list[str]) -> list[int]:
    return [int(r[1]) for r in server.query(f"CHECKSUM TABLE {', '.join(f'{schema}.{t}' for t in tables)} EXTENDED")]


def test_kill_9_mid_piece_and_between_a_ddls_mark_and_the_ddl_restarts_equal_and_still(tmp_path, unprivileged_sites):
    """kill -9 in a split transaction's uncommitted piece, then between a DDL's mark and the DDL: equal, then still."""
    east, west = unprivileged_sites
    schema, tables = "app_mkill", ["t", "u"]
    channel = unprivileged(equal_sites(tmp_path, "mkk", east, west, schema,
                                       "t (id INT AUTO_INCREMENT PRIMARY KEY, site VARCHAR(8), n INT)",
                                       "u (id INT PRIMARY KEY, v VARCHAR(10))", "gone (id INT PRIMARY KEY)"),
                           loop_guard="marker")
    mark = "mkk:east-to-west"
    # every marked commit of east-to-west waits 0.3 s: a piece's rows sit written and uncommitted on west
    proc = channel.spawn(faults=[{"stage": "loop_mark_commit", "action": "slow", "seconds": 0.3, "times": None,
                                  "task": mark}])
    try:
        for i in range(5):
            east.query(f"INSERT INTO {schema}.t (site, n) VALUES ('east', {i})")
            west.query(f"INSERT INTO {schema}.t (site, n) VALUES ('west', {i})")
        big = ", ".join(f"({k}, 'v{k % 10}')" for k in range(1, 10 * SPLIT + 1))
        east.query(f"INSERT INTO {schema}.u (id, v) VALUES {big}")  # one transaction: 10 pieces of SPLIT rows
        for i in range(5, 10):  # both sites keep writing while the pieces cross
            east.query(f"INSERT INTO {schema}.t (site, n) VALUES ('east', {i})")
            west.query(f"INSERT INTO {schema}.t (site, n) VALUES ('west', {i})")

        def mid_piece() -> bool:
            assert proc.poll() is None, channel.logs()
            count = west.query(f"SELECT COUNT(*) FROM {schema}.u")[0][0]
            open_rows = [r[0] for r in west.query(
                "SELECT trx_rows_modified FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id IN "
                "(SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s)", (USER,))]
            seen.append((count, open_rows))
            return SPLIT <= count < 8 * SPLIT and any(n > SPLIT for n in open_rows)

        seen: list[tuple] = []
        # every 0.15 s: InnoDB refreshes INNODB_TRX only once it was not read for 100 ms (a piece stays
        # open at least 0.3 s, its marked commit slowed)
        wait_until(mid_piece, timeout=90, interval=0.15, message=lambda: f"{seen[-5:]}\n{channel.logs()}")
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    ack = channel.acked(channel.pipelines[0])
    assert ack is not None and ack.row > 0, ack  # the kill struck inside the source transaction
    assert west.query(f"SELECT COUNT(*) FROM {schema}.u")[0][0] < 10 * SPLIT  # the open piece was rolled back
    wait_until(lambda: no_loader_sessions(east, west), timeout=10, message="a killed node's sessions linger")

    proc = channel.spawn(faults=[{"stage": "loop_mark_ddl", "action": "crash", "task": f"{mark} DROP"}])
    try:
        east.query(f"UPDATE {schema}.u SET v = 'after' WHERE id = 1")
        west.query(f"INSERT INTO {schema}.t (site, n) VALUES ('west', 10)")
        wait_until(lambda: proc.poll() is None and rows(west, f"{schema}.u")[:1] == [(1, "after")]
                   and len(rows(east, f"{schema}.t")) == 10 + 11,  # alive until the DROP comes
                   timeout=90, message=channel.logs)
        east.query(f"DROP TABLE {schema}.gone")  # logged rewritten, without the comment
        assert proc.wait(120) == -9, channel.logs()  # crashed between the DROP's marked commit and the DROP
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert columns(west, schema, "gone") == ["id"]  # the DROP was never sent
    wait_until(lambda: no_loader_sessions(east, west), timeout=10, message="a killed node's sessions linger")

    proc = channel.spawn()
    try:
        west.query(f"INSERT INTO {schema}.t (site, n) VALUES ('west', 11)")
        heads = still(channel, east, west, [f"{schema}.{t}" for t in tables], proc)
        assert len(rows(west, f"{schema}.u")) == 10 * SPLIT
        assert rows(west, f"{schema}.u")[0] == (1, "after")
        assert len(rows(east, f"{schema}.t")) == 10 + 12
        assert checksums(east, schema, tables) == checksums(west, schema, tables)
        assert columns(west, schema, "gone") == [] == columns(east, schema, "gone")
        time.sleep(2)  # several heartbeats and batch waits more: a returning change would move a head
        assert (head(east), head(west)) == heads, channel.logs()
        # three starts, several connections each: only live sessions keep a mark row
        assert dead_marks(west, mark) == [] and dead_marks(east, "mkk:west-to-east") == []
    finally:
        assert stop(proc) == 0, channel.logs()


def app_rows_events(server: MariaDBServer, since: Any, schema: str) -> list[str]:
    """The table maps of `schema`'s tables in `server`'s binlog after `since` (a row change written there)."""
    return [str(e[5]) for e in server.query("SHOW BINLOG EVENTS IN %s FROM %s", (since.log, since.offset))
            if e[2] == "Table_map" and f"`{schema}`." in str(e[5])]


def test_the_trailing_echo_after_an_idle_ack_is_dropped_again_and_shows_no_lag(tmp_path, unprivileged_sites):
    """An idle marker channel's acks rest before its echoes: a restart drops them again, applies nothing, no lag."""
    east, west = unprivileged_sites
    schema = "app_trail"
    channel = unprivileged(equal_sites(tmp_path, "mtr", east, west, schema, "t (id INT PRIMARY KEY, site VARCHAR(8))"),
                           loop_guard="marker")
    proc = channel.spawn()
    try:
        east.query(f"INSERT INTO {schema}.t VALUES (1, 'east')")
        west.query(f"INSERT INTO {schema}.t VALUES (2, 'west')")
        before = still(channel, east, west, [f"{schema}.t"], proc)
        acks = [channel.acked(p) for p in channel.pipelines]
        # each ack rests before the other direction's trailing echoes (its position writes), never past the head
        assert all(a is not None and a.log == h.log and a.offset <= h.offset
                   for a, h in zip(acks, before, strict=True)), (acks, before)
    finally:
        assert stop(proc) == 0, channel.logs()
    proc = channel.spawn()
    try:
        still(channel, east, west, [f"{schema}.t"], proc)
        # the restart read the echoes after each ack again and dropped them: no row of the schema written anywhere
        assert app_rows_events(east, before[0], schema) == [] == app_rows_events(west, before[1], schema)
        status = channel.run("status", "--channel", channel.name, "--json")
        figures = json.loads(status.stdout)
        assert [r["status"] for r in figures] == ["running", "running"]
        # still() waited 3 s after the last change: a lag counted from it (the ack behind the echoes) is more
        assert all(r["lag_seconds"] is not None and r["lag_seconds"] < 2 for r in figures), status.stdout
    finally:
        assert stop(proc) == 0, channel.logs()


def echoes(channel: Channel, east: MariaDBServer, west: MariaDBServer, n: int) -> None:
    """`n` echoes on each site: transactions writing only setl's mark row, under the other direction's mark."""
    for server, mark in ((east, f"{channel.name}:west-to-east"), (west, f"{channel.name}:east-to-west")):
        for _ in range(n):
            server.query("INSERT INTO setl.setl_channel_mark (mark, session, seq) VALUES (%s, CONNECTION_ID(), 1) "
                         "ON DUPLICATE KEY UPDATE seq = seq + 1", (mark,))


#: How each direction reads its site: a reader thread, a reader process, or the node's shared reader
#: (`sources.shared_reader_server_id`, one stream per site) whose subscription carries `passed`.
READERS = {"reader_thread": {"reader_process": False}, "reader_process": {"reader_process": True},
           "shared_reader": {"shared_reader_server_id": 4_000_021}}


def idle_marker_channel(tmp_path: Any, name: str, east: MariaDBServer, west: MariaDBServer, schema: str,
                        reader: str) -> tuple[Channel, tuple[Any, Any], list[Any]]:
    """A marker channel (its readers as `READERS[reader]`) run until idle after a row each way, then
    stopped: the channel, both heads, and both acks (each strictly before the other direction's trailing echoes)."""
    settings = {"meta": {"store": "sqlite", "path": str(tmp_path / "meta.db")}, "sources": READERS[reader]}
    channel = unprivileged(equal_sites(tmp_path, name, east, west, schema, "t (id INT PRIMARY KEY, site VARCHAR(8))",
                                       settings=settings), loop_guard="marker")
    proc = channel.spawn()
    try:
        east.query(f"INSERT INTO {schema}.t VALUES (1, 'east')")
        west.query(f"INSERT INTO {schema}.t VALUES (2, 'west')")
        still(channel, east, west, [f"{schema}.t"], proc)
        acks = [channel.acked(p) for p in channel.pipelines]
    finally:
        assert stop(proc) == 0, channel.logs()
    # the last batch each way may have carried rows (then no echo follows its ack): echoes as a loader writes them
    echoes(channel, east, west, 3)
    heads = (head(east), head(west))
    # the bug's ground: each ack rests strictly before echoes at the end of its source's binlog
    assert all(a is not None and a.log == h.log and a.offset < h.offset for a, h in zip(acks, heads, strict=True)), \
        (acks, heads)
    return channel, heads, acks


def only_echoes_after(server: MariaDBServer, ack: Any) -> bool:
    """Whether `server`'s binlog after `ack` holds transactions (at least one) writing only setl's own tables."""
    events = server.query("SHOW BINLOG EVENTS IN %s FROM %s", (ack.log, ack.offset))
    maps = [str(e[5]) for e in events if e[2] == "Table_map"]
    queries = [str(e[5]) for e in events if e[2] == "Query"]
    return bool(maps) and all("(setl." in m for m in maps) and all(q in ("BEGIN", "COMMIT") for q in queries)


def until_caught_up(channel: Channel) -> tuple[Any, float]:
    """`setl start --until-caught-up` of both directions: the finished process and its seconds."""
    began = time.monotonic()
    done = channel.run("start", *(a for p in channel.pipelines for a in ("--pipeline", p)), "--until-caught-up",
                       timeout=60)
    return done, time.monotonic() - began


@pytest.mark.parametrize("reader", list(READERS))
def test_until_caught_up_ends_on_an_idle_marker_channel_whose_binlogs_end_in_echoes(tmp_path, unprivileged_sites,
                                                                                    reader):
    """--until-caught-up exits 0 within seconds on both directions when only echoes follow each ack, acking none."""
    east, west = unprivileged_sites
    n = list(READERS).index(reader)
    schema = f"app_idle_{n}"
    channel, heads, acks = idle_marker_channel(tmp_path, f"mid{n}", east, west, schema, reader)
    for _ in range(2):  # and again: the saved positions are still before the echoes, which are dropped again
        done, seconds = until_caught_up(channel)
        assert done.returncode == 0, (done.stdout, done.stderr, channel.logs())
        assert seconds < 20, seconds
        # each saved position rests before echoes only (a position is handed on for no echo), still behind the head
        for server, ack in zip((east, west), [channel.acked(p) for p in channel.pipelines], strict=True):
            assert only_echoes_after(server, ack), (ack, server.query("SHOW BINLOG EVENTS IN %s FROM %s",
                                                                       (ack.log, ack.offset)))
        assert rows(east, f"{schema}.t") == [(1, "east"), (2, "west")] == rows(west, f"{schema}.t")
        assert app_rows_events(east, heads[0], schema) == [] == app_rows_events(west, heads[1], schema)


@pytest.mark.parametrize("reader", list(READERS))
def test_until_caught_up_applies_a_change_written_after_the_echoes_before_it_ends(tmp_path, unprivileged_sites,
                                                                                 reader):
    """A user transaction after an idle channel's echoes, before --until-caught-up's target, is applied first."""
    east, west = unprivileged_sites
    n = list(READERS).index(reader)
    schema = f"app_late_{n}"
    channel, heads, acks = idle_marker_channel(tmp_path, f"mlt{n}", east, west, schema, reader)
    # after the echoes: 400 rows in one transaction on east (a batch that takes a while), one row on west ...
    east.query(f"INSERT INTO {schema}.t SELECT seq, 'late' FROM {schema}.seq_10_to_409")
    west.query(f"INSERT INTO {schema}.t VALUES (3, 'west')")
    ends = (head(east), head(west))
    echoes(channel, east, west, 20)  # and echoes again after them, before the target
    assert all(a < e for a, e in zip(acks, ends, strict=True)) and heads[0] < ends[0] and heads[1] < ends[1]
    done, seconds = until_caught_up(channel)
    assert done.returncode == 0, (done.stdout, done.stderr, channel.logs())
    assert seconds < 20, seconds
    expected = [(1, "east"), (2, "west"), (3, "west"), *((i, "late") for i in range(10, 410))]
    assert rows(east, f"{schema}.t") == expected == rows(west, f"{schema}.t")
    # no early end: each direction acked past its source's late transaction
    assert all(channel.acked(p) >= e for p, e in zip(channel.pipelines, ends, strict=True))
