"""Conflicts detected, settled and recorded by the MySQL sink (`setl.sinks.conflicts`), on a real MariaDB."""

from __future__ import annotations

import datetime
import decimal
import json
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pymysql.cursors
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from setl.config import ConfigError, NodeSettings, load_pipeline
from setl.connectors import BuildContext, registry
from setl.errors import RefusedLoadError
from setl.model import Batch, DdlChange, Op, PartialImage, Position, RowChange
from setl.sinks import conflicts as conflicts_module
from setl.sinks.conflicts import (
    ABSENT,
    KEEP_TARGET,
    LAST_WRITER_WINS,
    SITE_WINS,
    SOURCE_WON,
    TARGET_WON,
    ConflictPolicy,
    TablePolicy,
    decide,
)
from setl.sinks.mysql import MysqlLoad
from setl.testing.servers import MariaDBServer, wait_until

DDL = ("CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20) COLLATE utf8mb4_general_ci, f {f}, "
       "d DECIMAL(8,3), ts DATETIME(3), c CHAR(4))")
LWW = TablePolicy(LAST_WRITER_WINS, "ts")
SITES = {"a": 1, "b": 2}


def f32(x: float) -> float:
    """`x` as the binlog gives a FLOAT column: the 4-byte float, widened."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def policy(site: str, table: TablePolicy = LWW, tombstones: bool = True, **source: Any) -> ConflictPolicy:
    """Site `site`'s pipeline's policy; `source`: how it reaches the source site (`source_dial`, `source_schema`)."""
    other = "b" if site == "a" else "a"
    return ConflictPolicy(site, other, SITES, table, tombstones=tombstones, **source)


# -- the decision, on its own


def test_last_writer_wins_by_timestamp_then_site_priority() -> None:
    """A later timestamp wins; a tie goes to the site with the smaller priority number, the same on both sides."""
    row = {"id": 1}
    assert decide(LWW, "a", "b", SITES, row, row, 1)[0] == SOURCE_WON
    assert decide(LWW, "a", "b", SITES, row, row, -1)[0] == TARGET_WON
    assert decide(LWW, "a", "b", SITES, row, row, 0)[0] == SOURCE_WON  # a (1) beats b (2) on b
    assert decide(LWW, "b", "a", SITES, row, row, 0)[0] == TARGET_WON  # and a keeps its row on a


def test_a_delete_wins_over_an_update_on_both_sides() -> None:
    """Last writer wins settles a delete against an update for the delete, whichever side deleted."""
    row = {"id": 1}
    assert decide(LWW, "a", "b", SITES, ABSENT, row, None)[0] == SOURCE_WON
    assert decide(LWW, "b", "a", SITES, row, ABSENT, None)[0] == TARGET_WON


def test_a_delete_ranks_as_the_row_it_deleted() -> None:
    """With the deleted row's timestamp compared, a delete (or a tombstone) wins or loses by it, ties
    by site priority, the same decision on both sides."""
    row = {"id": 1}
    assert decide(LWW, "a", "b", SITES, ABSENT, row, 1)[0] == SOURCE_WON  # a's delete of a later row, on b
    assert decide(LWW, "b", "a", SITES, row, ABSENT, -1)[0] == TARGET_WON  # the same pair on a: the tombstone
    assert decide(LWW, "a", "b", SITES, ABSENT, row, -1)[0] == TARGET_WON  # a later update beats the delete
    assert decide(LWW, "b", "a", SITES, row, ABSENT, 1)[0] == SOURCE_WON  # on both sides
    assert decide(LWW, "b", "a", SITES, ABSENT, row, 0)[0] == TARGET_WON  # a tie: site a's row, on a
    assert decide(LWW, "a", "b", SITES, row, ABSENT, 0)[0] == SOURCE_WON  # and a's row over b's tombstone, on b


def test_site_wins_and_keep_target() -> None:
    """Site wins takes the named site's version on either side; keep_target always keeps the target's row."""
    row = {"id": 1}
    wins_a = TablePolicy(SITE_WINS, site="a")
    assert decide(wins_a, "a", "b", SITES, row, row, None)[0] == SOURCE_WON
    assert decide(wins_a, "b", "a", SITES, row, row, None)[0] == TARGET_WON
    assert decide(TablePolicy(KEEP_TARGET), "a", "b", SITES, row, row, None)[0] == TARGET_WON


# -- on a real target


class Site:
    """One site of a simulated two-way channel: a database on the test server, the sink that writes
    the other site's changes into it, and the log of its own users' changes not yet shipped."""

    def __init__(self, server: MariaDBServer, name: str, db: str, table_policy: TablePolicy = LWW,
                 f: str = "FLOAT", tombstones: bool = True, other_db: str = "") -> None:
        self.server, self.name, self.db, self.f = server, name, db, f
        self.tombstones, self.other_db = tombstones, other_db
        self.conn = server.connect()
        other = "b" if name == "a" else "a"
        self.load = MysqlLoad(server.target_config(), pipeline=f"{other}_to_{name}", position_schema=db,
                              conflicts=self.policy(table_policy))
        self.log: list[RowChange] = []
        self.shipped: set[str] = set()  # versions (v) of this site's writes that left it
        self.batches = 0
        self.offset = 4

    def execute(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def policy(self, table_policy: TablePolicy) -> ConflictPolicy:
        """The policy of the pipeline into this site: its source is the other site's schema on the same server."""
        return policy("b" if self.name == "a" else "a", table_policy, self.tombstones,
                      source_dial=self.server.connect, source_schema=self.other_db or None)

    def guard(self) -> None:
        """The tombstone triggers of table t, as a channel makes them at start (tombstones on)."""
        assert self.load.conflicts is not None
        if self.tombstones:
            self.load.conflicts.guard(self.conn, self.db, "t")

    def tombstone(self, key: int) -> tuple[str, str | None] | None:
        """(site, stamp) of the tombstone this site holds for `key`, if any."""
        found = self.execute(f"SELECT site, stamp FROM {self.db}.setl_tombstones WHERE table_name = %s AND "
                             "row_key = JSON_ARRAY(%s)", (f"{self.db}.t", key))
        return (found[0][0], found[0][1]) if found else None

    def row(self, key: int) -> dict[str, Any] | None:
        """The row of `key` as the binlog would image it."""
        found = self.execute(f"SELECT id, v, f, d, ts, c FROM {self.db}.t WHERE id = %s", (key,))
        if not found:
            return None
        id_, v, f, d, ts, c = found[0]
        if f is not None and self.f == "FLOAT":
            f = f32(f)
        return {"id": id_, "v": v, "f": f, "d": d, "ts": ts, "c": c}

    def binlog(self) -> Position:
        """Where the server's binlog ends now, with its GTID set (both sites share the server's binlog)."""
        (file, offset, *_), = self.execute("SHOW MASTER STATUS")
        (gtid,), = self.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        return Position(file, int(offset), gtid)

    def write(self, key: int, after: dict[str, Any] | None, piece: bool = False) -> dict[str, Any] | None:
        """A user's write of `key` (None: delete), logged as the binlog would, at its real position in the
        binlog (after it; `piece`: as a change of a transaction delivered in pieces, its start with row 1
        and the GTID set before it); returns the before-image."""
        before = self.row(key)
        start = self.binlog() if piece else None
        if after is None:
            if before is None:
                return None
            self.execute(f"DELETE FROM {self.db}.t WHERE id = %s", (key,))
            change = RowChange(Op.DELETE, "?", "t", ("id",), before, None)
        else:
            if self.f != "FLOAT" and after["f"] is not None:
                after = {**after, "f": int(after["f"] * 10)}  # a BIGINT column: an exact value
            self.execute(f"INSERT INTO {self.db}.t (id, v, f, d, ts, c) VALUES (%s, %s, %s, %s, %s, %s) ON DUPLICATE "
                         "KEY UPDATE v = VALUES(v), f = VALUES(f), d = VALUES(d), ts = VALUES(ts), c = VALUES(c)",
                         tuple(after[c] for c in ("id", "v", "f", "d", "ts", "c")))
            op = Op.INSERT if before is None else Op.UPDATE
            change = RowChange(op, "?", "t", ("id",), before, dict(after))
        at = attrs.evolve(start, row=1) if start is not None else self.binlog()
        self.log.append(attrs.evolve(change, position=at))
        return before

    def ship_to(self, other: Site, count: int | None = None) -> None:
        """The first `count` (all) logged changes applied to `other` in one batch, as its pipeline would."""
        take = self.log[:count] if count is not None else self.log
        self.log = self.log[len(take):]
        self.shipped.update(c.after["v"] for c in take if c.after is not None)
        if not take:
            return
        other.receive([RowChange(c.op, other.db, c.table, c.primary_key, c.before, c.after, c.position)
                       for c in take])

    def receive(self, changes: list[Any]) -> Batch:
        """`changes` (row changes, DDL) loaded as one batch of this site's pipeline; a change without a
        position (a test's own) is placed at a synthetic one, as is the batch."""
        self.batches += 1
        start = Position("sim-bin.000001", self.offset)
        self.offset += 100
        end = Position("sim-bin.000001", self.offset)
        at = Position("sim-bin.000001", self.offset - 50, row=0)
        placed = [c if getattr(c, "position", None) is not None else attrs.evolve(c, position=at) for c in changes]
        batch = Batch(self.load.pipeline, self.batches, 1, start, end, tuple(placed))
        self.load.load(batch)
        return batch

    def conflicts(self) -> list[dict[str, Any]]:
        """The conflicts table's rows (none before the first batch made it)."""
        if not self.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = "
                            "'setl_conflicts'", (self.db,)):
            return []
        with self.conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(f"SELECT * FROM {self.db}.setl_conflicts ORDER BY id")
            return list(cur.fetchall())

    def reset(self, table_policy: TablePolicy) -> None:
        """Empty tables and log, and `table_policy` for what comes next (between hypothesis examples)."""
        self.execute(f"DELETE FROM {self.db}.t")
        if self.conflicts():
            self.execute(f"DELETE FROM {self.db}.setl_conflicts")
        if self.tombstones:
            self.execute(f"DELETE FROM {self.db}.setl_tombstones")
        self.log.clear()
        self.shipped.clear()
        self.load.conflicts.policy = self.policy(table_policy)  # type: ignore[union-attr]
        self.guard()

    def close(self) -> None:
        self.load.close()
        self.conn.close()


@pytest.fixture
def tombstones() -> bool:
    """Whether the sites' pipelines run with ``conflicts.tombstones`` (a test parametrizes it to say otherwise)."""
    return True


@pytest.fixture
def sites(request: pytest.FixtureRequest, mariadb_target: MariaDBServer, mysql_db: str,
          tombstones: bool) -> Iterator[tuple[Site, Site]]:
    """Sites a and b; ``f`` is a FLOAT column (rows compared by the server) unless the test asks for
    BIGINT (``indirect`` parameter: every column exact, rows compared by setl where it can)."""
    f = getattr(request, "param", "FLOAT")
    db_a, db_b = mysql_db, mysql_db + "_b"
    mariadb_target.query(f"CREATE DATABASE {db_b}")
    for db in (db_a, db_b):
        mariadb_target.query(DDL.format(db=db, f=f))
    a = Site(mariadb_target, "a", db_a, f=f, tombstones=tombstones, other_db=db_b)
    b = Site(mariadb_target, "b", db_b, f=f, tombstones=tombstones, other_db=db_a)
    a.load.open()
    b.load.open()
    a.guard()
    b.guard()
    try:
        yield a, b
    finally:
        a.close()
        b.close()
        mariadb_target.query(f"DROP DATABASE IF EXISTS {db_b}")


def image(key: int, v: str, ts: datetime.datetime, f: float = 1.1, d: str = "1.500", c: str = "x") -> dict[str, Any]:
    return {"id": key, "v": v, "f": f32(f), "d": decimal.Decimal(d), "ts": ts, "c": c}


T0 = datetime.datetime(2024, 5, 1, 12, 0, 0, 123000)


@pytest.mark.parametrize("sites", ["FLOAT", "BIGINT"], indirect=True)
def test_exact_values_are_no_conflict(sites: tuple[Site, Site]) -> None:
    """A FLOAT, a DATETIME(3) with fractional seconds, a DECIMAL, NULLs and case-insensitive text
    equal to the before-image are no conflict: the update applies and nothing is recorded."""
    a, b = sites
    row = image(1, "MiXed", T0, f=0.1, d="12.345", c="ab")
    nulls = {"id": 2, "v": None, "f": None, "d": None, "ts": None, "c": None}
    for r in (row, nulls):
        a.write(r["id"], r)
        b.write(r["id"], r)  # b holds the same rows (as if copied)
    a.log.clear()
    b.log.clear()
    a.write(1, {**row, "v": "next", "ts": T0 + datetime.timedelta(seconds=1)})
    a.write(2, {**nulls, "v": "set"})
    a.ship_to(b)
    assert b.conflicts() == []
    assert b.row(1) == a.row(1) and b.row(2) == a.row(2)


@pytest.mark.parametrize("sites", ["FLOAT", "BIGINT"], indirect=True)
def test_case_and_trailing_space_changes_are_conflicts(sites: tuple[Site, Site]) -> None:
    """A target row that differs from the before-image only in letter case or a trailing space
    (equal under the column's case-insensitive, pad-space collation) is a conflict, recorded."""
    a, b = sites
    a.write(1, image(1, "abc", T0))
    a.write(2, image(2, "abc", T0))
    a.ship_to(b)
    b.write(1, image(1, "ABC", T0))  # same timestamp: site a's priority settles it
    b.write(2, image(2, "abc ", T0))
    a.write(1, image(1, "new", T0))
    a.write(2, image(2, "new", T0))
    a.ship_to(b)
    found = b.conflicts()
    assert [(json.loads(r["row_key"]), r["decision"]) for r in found] == [([1], SOURCE_WON), ([2], SOURCE_WON)]
    assert [json.loads(r["target_row"])["v"] for r in found] == ["ABC", "abc "]
    assert b.row(1)["v"] == "new" and b.row(2)["v"] == "new"  # type: ignore[index]


@pytest.mark.parametrize("sites", ["FLOAT", "BIGINT"], indirect=True)
def test_insert_meets_an_existing_key(sites: tuple[Site, Site]) -> None:
    """An insert whose key the target holds already is a conflict; the later timestamp wins and
    the loser's row is in the conflicts table with both versions and the position."""
    a, b = sites
    b.write(7, image(7, "b-late", T0 + datetime.timedelta(seconds=5)))
    a.write(7, image(7, "a-early", T0))
    a.ship_to(b)
    (found,) = b.conflicts()
    assert found["decision"] == TARGET_WON and found["policy"] == LAST_WRITER_WINS
    assert json.loads(found["source_row"])["v"] == "a-early" and json.loads(found["target_row"])["v"] == "b-late"
    assert found["source_before"] is None and found["position"] == "sim-bin.000001:104"
    assert b.row(7)["v"] == "b-late"  # type: ignore[index]
    assert conflicts_module.counts()[(b.load.pipeline, f"{b.db}.t", TARGET_WON)] >= 1


def test_conflicts_are_published_after_commit(sites: tuple[Site, Site]) -> None:
    """A listener gets each conflict once its batch commits, and the counts grow by decision."""
    a, b = sites
    seen: list[Any] = []
    unsubscribe = conflicts_module.subscribe(seen.append)
    try:
        before = conflicts_module.counts().get((b.load.pipeline, f"{b.db}.t", SOURCE_WON), 0)
        b.write(3, image(3, "b", T0))
        a.write(3, image(3, "a", T0 + datetime.timedelta(seconds=1)))
        a.ship_to(b)
    finally:
        unsubscribe()
    assert [(c.table, c.key, c.decision) for c in seen] == [(f"{b.db}.t", (3,), SOURCE_WON)]
    assert conflicts_module.counts()[(b.load.pipeline, f"{b.db}.t", SOURCE_WON)] == before + 1


def test_a_ddl_between_changes_of_a_key_raises_no_false_conflict(sites: tuple[Site, Site]) -> None:
    """Changes of one key before and after a DDL in one batch are compared segment by segment: the
    second with the state the first left, no conflict; a target change before the batch still is one."""
    a, b = sites
    a.write(1, image(1, "v0", T0))
    a.write(2, image(2, "v0", T0))
    a.ship_to(b)
    b.write(2, image(2, "b-edit", T0))  # the target changes key 2 only
    a.write(1, image(1, "v1", T0))
    a.write(2, image(2, "v1", T0))
    first = list(a.log)
    a.log.clear()
    a.write(1, image(1, "v2", T0))
    second = list(a.log)
    a.log.clear()
    alter = DdlChange(b.db, "t", f"ALTER TABLE `{b.db}`.`t` ADD COLUMN extra INT NULL")
    b.receive([RowChange(c.op, b.db, c.table, c.primary_key, c.before, c.after) for c in first] + [alter]
              + [RowChange(c.op, b.db, c.table, c.primary_key, c.before, c.after) for c in second])
    assert [(json.loads(r["row_key"]), r["decision"]) for r in b.conflicts()] == [([2], SOURCE_WON)]
    assert b.row(1)["v"] == "v2" and b.row(2)["v"] == "v1"  # type: ignore[index]


def test_a_partial_image_is_refused(sites: tuple[Site, Site]) -> None:
    """A change with a partial row image stops the load with one line naming the table, position and fix."""
    a, b = sites
    change = RowChange(Op.UPDATE, b.db, "t", ("id",), PartialImage({"id": 1, "v": "x"}),
                       PartialImage({"id": 1, "v": "y"}))
    with pytest.raises(RefusedLoadError, match=r"table=.*\.t .*binlog_row_image=FULL"):
        b.receive([change])


def test_conflicts_need_a_mysql_target() -> None:
    """A conflicts policy on another SQL target is a configuration error, not a silent one-way load."""
    from setl.sinks.postgresql import PostgresqlLoad, PostgresqlTargetConfig

    with pytest.raises(ConfigError, match="needs a mysql target"):
        PostgresqlLoad(PostgresqlTargetConfig(type="postgresql", host="127.0.0.1", port=1), pipeline="p",
                       conflicts=policy("a"))


@pytest.mark.parametrize("tombstones", [False])
@pytest.mark.parametrize("deleter", ["a", "b"])
def test_without_tombstones_a_delete_wins_over_a_racing_update(sites: tuple[Site, Site], deleter: str) -> None:
    """Tombstones off (main's conflicts): an update racing a delete of the row loses to the delete on
    both sides, however late it is stamped, the lost update is recorded on each side it reached, and no
    trigger or tombstones table is made."""
    a, b = sites
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    by_name = {"a": a, "b": b}
    deleting, updating = by_name[deleter], by_name["b" if deleter == "a" else "a"]
    deleting.write(5, None)
    updating.write(5, image(5, "late-update", T0 + datetime.timedelta(seconds=9)))
    a.ship_to(b)
    b.ship_to(a)
    assert a.row(5) is None and b.row(5) is None
    lost = [json.loads(r["target_row"] if r["decision"] == SOURCE_WON else r["source_row"])["v"]
            for site in sites for r in site.conflicts()]
    assert lost == ["late-update", "late-update"]
    assert a.execute("SELECT COUNT(*) FROM information_schema.triggers WHERE event_object_schema IN (%s, %s)",
                     (a.db, b.db)) == [(0,)]
    assert a.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema IN (%s, %s) AND "
                     "table_name = 'setl_tombstones'", (a.db, b.db)) == [(0,)]


@pytest.mark.parametrize("later", [9, 0])
@pytest.mark.parametrize("deleter", ["a", "b"])
def test_update_racing_a_delete_converges(sites: tuple[Site, Site], deleter: str, later: int) -> None:
    """An update on one site racing a delete of the row on the other: a delete is as late as the row it
    deleted, so an update stamped later wins on both sides (a tie: site a's priority), and the lost
    write is recorded on each side it reached."""
    a, b = sites
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    by_name = {"a": a, "b": b}
    deleting, updating = by_name[deleter], by_name["b" if deleter == "a" else "a"]
    deleting.write(5, None)
    updating.write(5, image(5, "late-update", T0 + datetime.timedelta(seconds=later)))
    a.ship_to(b)
    b.ship_to(a)
    update_wins = later > 0 or updating is a
    assert a.row(5) == b.row(5)
    assert (a.row(5) or {}).get("v") == ("late-update" if update_wins else None)
    lost = [r["target_row"] if r["decision"] == SOURCE_WON else r["source_row"] for site in sites
            for r in site.conflicts()]
    assert [None if x is None else json.loads(x)["v"] for x in lost] == [None if update_wins else "late-update"] * 2


def test_an_update_meeting_a_delete_committed_during_its_batch_is_ranked_not_stopped(sites: tuple[Site, Site]
                                                                                     ) -> None:
    """A user's delete on the target that commits while the batch waits for its row lock, after the batch
    read tombstones of another table: the update ranks against the delete's tombstone (the latest, read
    locked as the row is), never "meets no row and no tombstone", and both sites end equal."""
    a, b = sites
    b.execute(f"CREATE TABLE {b.db}.u (id INT PRIMARY KEY, v VARCHAR(20), ts DATETIME(3))")
    assert b.load.conflicts is not None
    b.load.conflicts.guard(b.conn, b.db, "u")  # its triggers made before the user's transaction opens
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    orig = b.row(5)
    a.write(5, image(5, "late-update", T0 + datetime.timedelta(seconds=9)))
    user = b.server.connect()
    failed: list[BaseException] = []
    try:
        with user.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"DELETE FROM {b.db}.t WHERE id = 5")  # its tombstone written, not committed yet
        # The batch: a new key of u first (its tombstone lookup opens the transaction's snapshot), then
        # a's update of key 5, whose locked read waits for the user's delete.
        new_u = RowChange(Op.INSERT, b.db, "u", ("id",), None, {"id": 1, "v": "u1", "ts": T0})

        def load() -> None:
            try:
                b.receive([new_u, *(attrs.evolve(c, schema=b.db) for c in a.log)])
            except BaseException as exc:  # asserted below
                failed.append(exc)

        loader = threading.Thread(target=load, name="test-loader")
        loader.start()
        # The loader's locked read of the row sent, and blocked by the user's delete. Not asked of
        # INNODB_TRX: InnoDB refreshes it only once it was not read for 100 ms, so a poll every 50 ms
        # saw the same stale rows for ever (tests/helpers/locks.py).
        wait_until(lambda: not loader.is_alive() or b.execute(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND COMMAND = 'Query'"
            " AND INFO LIKE '%FOR UPDATE%'")[0][0] >= 1, timeout=30,
            message=lambda: str(b.execute("SHOW FULL PROCESSLIST")))
        with user.cursor() as cur:
            cur.execute("COMMIT")
        loader.join(60)
    finally:
        user.close()
    a.log.clear()
    assert not loader.is_alive() and not failed, failed
    assert (b.row(5) or {}).get("v") == "late-update"  # stamped later than the row the delete removed
    assert [(r["decision"], r["target_row"]) for r in b.conflicts()] == [(SOURCE_WON, None)]  # the delete lost
    b.log.append(RowChange(Op.DELETE, "?", "t", ("id",), orig, None))
    b.ship_to(a)
    assert a.row(5) == b.row(5)
    assert [r["decision"] for r in a.conflicts()] == [TARGET_WON]


@pytest.mark.parametrize("order", ["update-first", "delete-first"])
def test_site_wins_an_update_racing_the_winners_delete_is_settled_not_unsettled(sites: tuple[Site, Site],
                                                                               order: str) -> None:
    """Site wins (a): b's update racing a's delete meets no row and a's tombstone on a: the delete wins
    there as it does on b, both sites end without the row, the lost update recorded, none unsettled."""
    a, b = sites
    wins_a = TablePolicy(SITE_WINS, None, "a")
    a.reset(wins_a)
    b.reset(wins_a)
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    a.write(5, None)
    b.write(5, image(5, "b-update", T0 + datetime.timedelta(seconds=9)))
    for source, target in ((b, a), (a, b)) if order == "update-first" else ((a, b), (b, a)):
        source.ship_to(target)
    assert a.row(5) is None and b.row(5) is None
    found = [(site.name, r["decision"], r["reason"]) for site in sites for r in site.conflicts()]
    assert not [f for f in found if f[2].startswith(conflicts_module.UNSETTLED)], found
    lost = [r["source_row"] if r["decision"] == TARGET_WON else r["target_row"] for site in sites
            for r in site.conflicts()]
    assert any(x is not None and json.loads(x)["v"] == "b-update" for x in lost), found


@pytest.mark.parametrize("order", ["delete-first", "insert-first"])
@pytest.mark.parametrize("winner", ["a", "b"])
def test_an_insert_racing_the_winners_delete_converges(sites: tuple[Site, Site], winner: str, order: str) -> None:
    """A key inserted on both sites at once, the winner (later stamp) deleting it before the loser's
    insert reaches it: the winner's tombstone beats the losing insert there, so both end without the
    row, and the loser's insert is recorded as lost on the winner's side."""
    a, b = sites
    by_name = {"a": a, "b": b}
    win, lose = by_name[winner], by_name["b" if winner == "a" else "a"]
    win.write(3, image(3, "winner", T0 + datetime.timedelta(seconds=5)))
    lose.write(3, image(3, "loser", T0))
    win.ship_to(lose)  # the loser's site: the winner's insert beats its own
    assert lose.row(3)["v"] == "winner"  # type: ignore[index]
    win.write(3, None)
    assert win.tombstone(3) == (win.name, str(T0 + datetime.timedelta(seconds=5)).replace("000", "", 1)) or \
        win.tombstone(3) is not None
    if order == "delete-first":
        win.ship_to(lose)
        lose.ship_to(win)
    else:
        lose.ship_to(win)
        win.ship_to(lose)
    assert a.row(3) is None and b.row(3) is None
    (found,) = win.conflicts()
    assert found["decision"] == TARGET_WON and "tombstone" in found["reason"]
    assert json.loads(found["source_row"])["v"] == "loser" and found["target_row"] is None


def test_an_insert_after_the_delete_arrived_wins_over_the_tombstone(sites: tuple[Site, Site]) -> None:
    """A site that saw the other's delete and inserts the key again, stamped later, is no conflict
    the tombstone wins: the row arrives on the deleting site too."""
    a, b = sites
    a.write(4, image(4, "first", T0))
    a.ship_to(b)
    a.write(4, None)
    a.ship_to(b)
    assert b.row(4) is None and b.tombstone(4) is not None and b.tombstone(4)[0] == "a"  # type: ignore[index]
    b.write(4, image(4, "again", T0 + datetime.timedelta(seconds=1)))
    b.ship_to(a)
    assert a.row(4) == b.row(4) and a.row(4)["v"] == "again"  # type: ignore[index]
    assert a.conflicts() == [] or all(r["decision"] == SOURCE_WON for r in a.conflicts())


@pytest.mark.parametrize("table_policy", [LWW, TablePolicy(SITE_WINS, site="a"), TablePolicy(SITE_WINS, site="b")])
def test_a_key_deleted_on_both_sites_then_written_again_converges(sites: tuple[Site, Site],
                                                                   table_policy: TablePolicy) -> None:
    """Both sites delete a key at once, each delete then reaches the other; a write of the key made
    afterwards on either site is no conflict with the tombstones, and arrives on the other side."""
    a, b = sites
    for site in sites:
        site.reset(table_policy)
    a.write(8, image(8, "orig", T0))
    a.ship_to(b)
    a.write(8, None)
    b.write(8, None)
    a.ship_to(b)
    b.ship_to(a)
    for writer, other in ((a, b), (b, a)):
        writer.write(8, image(8, f"again-{writer.name}", T0 + datetime.timedelta(seconds=5 if writer is a else 9)))
        writer.ship_to(other)
        assert a.row(8) == b.row(8) and a.row(8)["v"] == f"again-{writer.name}"  # type: ignore[index]
        writer.write(8, None)
        writer.ship_to(other)
        assert a.row(8) is None and b.row(8) is None
    # a write after a delete that arrived loses nothing: recorded at most as a conflict it won
    assert all(r["decision"] == SOURCE_WON for site in sites for r in site.conflicts())


def test_old_tombstones_are_pruned(sites: tuple[Site, Site]) -> None:
    """Tombstones older than the policy's retention are dropped at a batch's start."""
    a, b = sites
    a.write(6, image(6, "x", T0))
    a.ship_to(b)
    a.write(6, None)
    a.ship_to(b)
    assert b.tombstone(6) is not None
    step = b.load.conflicts
    assert step is not None
    step.policy = attrs.evolve(step.policy, tombstone_seconds=0.0)
    step._pruned = 0.0
    a.write(7, image(7, "y", T0))
    a.ship_to(b)
    assert b.tombstone(6) is None and b.row(7) is not None


# -- the property: any interleaving converges, and every lost write is recorded

#: (site, what, key, timestamp offset or batch size): writes, deletes racing them, and shipments.
STEP = st.tuples(st.sampled_from("ab"), st.sampled_from(["write", "write", "delete", "ship"]), st.integers(0, 3),
                 st.integers(0, 2))


@pytest.mark.parametrize("tombstones", [True, False])
@pytest.mark.parametrize("sites", ["FLOAT", "BIGINT"], indirect=True)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, max_size=30), table_policy=st.sampled_from([LWW, TablePolicy(SITE_WINS, site="b")]))
def test_random_concurrent_writes_converge(sites: tuple[Site, Site], steps: list[tuple[str, str, int, int]],
                                           table_policy: TablePolicy) -> None:
    """Random writes and deletes on both sites (each write stamped no earlier than the row it replaces,
    often the same time, and later than the row a delete this site knows of removed), shipped each
    way in random batches: both end equal, and every site's last write or delete of a key that did not
    survive, and that the other site did not overwrite after seeing it, is in a conflicts table as
    the losing version (a site deleting its own write that never left it wrote nothing the other saw).
    Tombstones off, writes only: a delete racing an insert is what only tombstones settle."""
    a, b = sites
    for site in sites:
        site.reset(table_policy)
    if True:
        by_name = {"a": a, "b": b}
        last: dict[tuple[str, int], list[Any]] = {}  # (site, key) -> [its last version, superseded]
        for n, (name, what, key, arg) in enumerate(steps):
            site, other = by_name[name], by_name["b" if name == "a" else "a"]
            if what == "ship":
                site.ship_to(other, arg + 1)
                continue
            what = what if site.tombstones else "write"
            # a write's timestamp never goes back from the row's it replaces (docs/conflicts.md): 0 s later ties;
            # over a key this site knows deleted, it is later than the deleted row (ties there are not settled)
            now, grave = (site.row(key) or {}).get("ts"), site.tombstone(key) if site.tombstones else None
            if now is None and grave is not None and grave[1] is not None:
                now = datetime.datetime.fromisoformat(grave[1]) + datetime.timedelta(seconds=1)
            now = now or T0
            after = None if what == "delete" else image(key, f"{name}{n}", now + datetime.timedelta(seconds=arg))
            before = site.write(key, after)
            if what == "delete" and before is None:
                continue
            if after is None and before is not None and before["v"] not in other.shipped | site.shipped and \
                    before["v"].startswith(name):
                last.pop((name, key), None)  # deleted its own write that never left: the key is as it was
                continue
            mine = None if after is None else after["v"]
            theirs = last.get((other.name, key))
            if theirs is not None and theirs[0] == (None if before is None else before["v"]):
                theirs[1] = True  # this site saw the other's last write and overwrote it
            last[(name, key)] = [mine, False]
        a.ship_to(b)
        b.ship_to(a)
        # every write is ranked exactly: site wins too, by when the winner's delete reached the loser
        # (issue 36), so no key is recorded unsettled and none may differ
        unsettled = {json.loads(r["row_key"])[0] for site in sites for r in site.conflicts()
                     if r["reason"].startswith(conflicts_module.UNSETTLED)}
        assert not unsettled
        rows_a = a.execute(f"SELECT * FROM {a.db}.t ORDER BY id")
        rows_b = b.execute(f"SELECT * FROM {b.db}.t ORDER BY id")
        assert rows_a == rows_b
        final = {row[0]: row[1] for row in rows_a}
        recorded = set()
        for site in (a, b):
            for r in site.conflicts():
                lost = r["target_row"] if r["decision"] == SOURCE_WON else r["source_row"]
                recorded.add((json.loads(r["row_key"])[0], None if lost is None else json.loads(lost)["v"]))
        for (name, key), (version, superseded) in last.items():
            if final.get(key) == version or superseded:
                continue
            assert (key, version) in recorded, f"site {name}'s last write {version!r} of key {key} lost unrecorded"


def test_a_loader_that_may_not_make_triggers_is_refused(mariadb_target: MariaDBServer, mysql_db: str) -> None:
    """A conflicts load whose user lacks TRIGGER stops at the table's first batch with one line naming
    the table, the position and the GRANT, before anything is written."""
    mariadb_target.query(DDL.format(db=mysql_db, f="FLOAT"))
    user = f"nt_{mysql_db[-6:]}"
    mariadb_target.query(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
    try:
        mariadb_target.query(f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX ON *.* TO '{user}'@'%'")
        config = attrs.evolve(mariadb_target.target_config(), user=user, password="pw")
        load = MysqlLoad(config, pipeline="b_to_a", position_schema=mysql_db, conflicts=policy("b"))
        load.open()
        try:
            change = RowChange(Op.INSERT, mysql_db, "t", ("id",), None, image(1, "x", T0))
            batch = Batch("b_to_a", 1, 1, Position("sim-bin.000001", 4), Position("sim-bin.000001", 104),
                          (attrs.evolve(change, position=Position("sim-bin.000001", 50)),))
            with pytest.raises(RefusedLoadError, match=r"table=.*\.t position=sim-bin.000001:104: .*GRANT TRIGGER"):
                load.load(batch)
        finally:
            load.close()
        assert mariadb_target.query(f"SELECT COUNT(*) FROM {mysql_db}.t") == [(0,)]
    finally:
        mariadb_target.query(f"DROP USER '{user}'@'%'")



@pytest.mark.parametrize("deleter", ["a", "b"])
def test_an_update_racing_a_delete_that_left_no_tombstone_stops_until_decided(sites: tuple[Site, Site],
                                                                              deleter: str) -> None:
    """A delete made before the site's triggers existed leaves no tombstone: an update racing it, stamped
    later, wins on the updating site, and on the deleting site stops the load with one line (key, table,
    position, fix) instead of keeping the delete; once the key is written there by hand, both are equal."""
    a, b = sites
    by_name = {"a": a, "b": b}
    deleting, updating = by_name[deleter], by_name["b" if deleter == "a" else "a"]
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    for (trigger,) in deleting.execute("SELECT trigger_name FROM information_schema.triggers WHERE "
                                       "event_object_schema = %s", (deleting.db,)):
        deleting.execute(f"DROP TRIGGER {deleting.db}.{trigger}")  # as on a table made after the channel opened
    deleting.write(5, None)
    assert deleting.tombstone(5) is None
    updating.write(5, image(5, "late-update", T0 + datetime.timedelta(seconds=9)))
    deleting.ship_to(updating)  # ranked there by the deleted row's stamp: the update stays
    assert updating.row(5)["v"] == "late-update"  # type: ignore[index]
    racing = [RowChange(c.op, deleting.db, c.table, c.primary_key, c.before, c.after) for c in updating.log]
    updating.log.clear()
    with pytest.raises(RefusedLoadError) as refused:
        deleting.receive(racing)
    line = str(refused.value)
    assert "\n" not in line and f"{deleting.db}.t" in line and "key [5]" in line and "no tombstone" in line
    assert "sim-bin.000001" in line and "fix:" in line, line
    assert deleting.row(5) is None and deleting.conflicts() == []  # nothing of the batch written
    deleting.execute(f"INSERT INTO {deleting.db}.t (id, v, f, d, ts, c) VALUES (5, 'late-update', %s, 1.5, %s, 'x')",
                     (1.1, T0 + datetime.timedelta(seconds=9)))  # the fix: the update's row, by hand
    deleting.receive(racing)
    assert deleting.row(5) == updating.row(5) and deleting.row(5)["v"] == "late-update"  # type: ignore[index]


@pytest.mark.parametrize("order", ["insert-first", "delete-first"])
def test_an_insert_racing_a_delete_that_left_no_tombstone_stops_until_decided(sites: tuple[Site, Site],
                                                                              order: str) -> None:
    """A key inserted and deleted on site a before a's triggers existed (a table created while the channel
    runs) races site b's insert of it: a's delete, later and winning on b, stops a's direction with one
    line (table, key, position, fix) instead of leaving b without the row that reaches a; once b's row is
    deleted there by hand (the fix), both sites end without it."""
    a, b = sites
    a.execute(f"DROP TRIGGER {a.db}.{conflicts_module._trigger('t', 'd')}")  # as on a table made after the start
    a.write(3, image(3, "a-row", T0 + datetime.timedelta(seconds=5)))
    a.write(3, None)
    assert a.tombstone(3) is None
    b.write(3, image(3, "b-row", T0))
    if order == "insert-first":
        b.ship_to(a)  # no row, no tombstone on a: an insert as any
        assert (a.row(3) or {}).get("v") == "b-row"
    racing = [RowChange(c.op, b.db, c.table, c.primary_key, c.before, c.after) for c in a.log]
    a.log.clear()
    with pytest.raises(RefusedLoadError) as refused:
        b.receive(racing)
    line = str(refused.value)
    assert "\n" not in line and f"{b.db}.t" in line and "key [3]" in line and "no tombstone" in line, line
    assert "sim-bin.000001" in line and "fix:" in line, line
    assert (b.row(3) or {}).get("v") == "b-row" and b.conflicts() == []  # nothing of the batch written
    b.write(3, None)  # the fix: the delete's outcome, by hand on b (its triggers leave b's tombstone)
    b.receive(racing)
    b.ship_to(a)
    assert a.row(3) is None and b.row(3) is None


def test_a_delete_that_left_its_tombstone_wins_over_a_racing_insert_on_both_sides(sites: tuple[Site, Site]) -> None:
    """The same race with a's triggers in place: a's later delete wins on b (its tombstone found on a) and
    on a (b's insert meets that tombstone), with no stop, and b's lost insert is recorded on both sides."""
    a, b = sites
    a.write(3, image(3, "a-row", T0 + datetime.timedelta(seconds=5)))
    a.write(3, None)
    b.write(3, image(3, "b-row", T0))
    a.ship_to(b)
    b.ship_to(a)
    assert a.row(3) is None and b.row(3) is None
    lost = [json.loads(r["target_row"] if r["decision"] == SOURCE_WON else r["source_row"])["v"]
            for site in sites for r in site.conflicts()]
    assert lost == ["b-row", "b-row"]


def test_without_tombstones_a_load_needs_no_trigger_privilege(mariadb_target: MariaDBServer, mysql_db: str) -> None:
    """Tombstones off: a conflicts load whose user lacks TRIGGER (and SUPER) loads as before, making no trigger."""
    mariadb_target.query(DDL.format(db=mysql_db, f="FLOAT"))
    user = f"nu_{mysql_db[-6:]}"
    mariadb_target.query(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
    try:
        mariadb_target.query(f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX ON *.* TO '{user}'@'%'")
        config = attrs.evolve(mariadb_target.target_config(), user=user, password="pw")
        load = MysqlLoad(config, pipeline="b_to_a", position_schema=mysql_db, conflicts=policy("b", tombstones=False))
        load.open()
        try:
            change = RowChange(Op.INSERT, mysql_db, "t", ("id",), None, image(1, "x", T0))
            load.load(Batch("b_to_a", 1, 1, Position("sim-bin.000001", 4), Position("sim-bin.000001", 104),
                            (attrs.evolve(change, position=Position("sim-bin.000001", 50)),)))
        finally:
            load.close()
        assert mariadb_target.query(f"SELECT COUNT(*) FROM {mysql_db}.t") == [(1,)]
        assert mariadb_target.query("SELECT COUNT(*) FROM information_schema.triggers WHERE event_object_schema = %s",
                                    (mysql_db,)) == [(0,)]
    finally:
        mariadb_target.query(f"DROP USER '{user}'@'%'")


def test_the_tombstones_key_reaches_the_policy_with_a_way_to_the_source(tmp_path: Path) -> None:
    """Tombstones (set, or left out: the default) are on in the target's policy, which can then reach the
    pipeline's MySQL source; ``tombstones: false`` turns them off and the source is never asked."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    block = {"policy": "last_writer_wins", "column": "ts", "sites": {"a": 1, "b": 2}}
    for name, extra in (("on", {"tombstones": True}), ("default", {}), ("off", {"tombstones": False})):
        (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump({
            "source": {"type": "mysql", "ignore_server_ids": [4001]}, "target": {"type": "mysql"}, "site": "a",
            "conflicts": {**block, **extra}}))
    on = BuildContext.of(load_pipeline(conf, "on", registry()), NodeSettings()).conflicts
    off = BuildContext.of(load_pipeline(conf, "off", registry()), NodeSettings()).conflicts
    default = BuildContext.of(load_pipeline(conf, "default", registry()), NodeSettings()).conflicts
    assert on is not None and on.tombstones and on.source_dial is not None
    assert default is not None and default.tombstones and default.source_dial is not None
    assert off is not None and not off.tombstones and off.source_dial is None


# -- site wins: an insert of the losing site meeting the winner's tombstone (issue 36)

WINS_A = TablePolicy(SITE_WINS, None, "a")


def _unsettled(sites: tuple[Site, Site]) -> set[int]:
    """The keys some site recorded as applied but not settled exactly (reason ``unsettled:``)."""
    return {json.loads(r["row_key"])[0] for site in sites for r in site.conflicts()
            if r["reason"].startswith(conflicts_module.UNSETTLED)}


def _differing(sites: tuple[Site, Site], keys: range = range(10)) -> set[int]:
    """The keys whose rows the two sites hold differently (one without it included)."""
    a, b = sites
    return {key for key in keys if a.row(key) != b.row(key)}


def _arrival(site: Site, key: int) -> tuple[str | None, int, str, int] | None:
    """(origin_gtid, origin_piece, arrived_log, arrived_offset) of `site`'s record of the other site's
    delete of `key` arriving, if any."""
    found = site.execute(f"SELECT origin_gtid, origin_piece, arrived_log, arrived_offset FROM "
                         f"{site.db}.setl_delete_arrivals WHERE table_name = %s AND row_key = JSON_ARRAY(%s)",
                         (f"{site.db}.t", key))
    return (found[0][0], int(found[0][1]), found[0][2], int(found[0][3])) if found else None


@pytest.mark.parametrize("piece", [False, True])
def test_site_wins_an_insert_made_after_the_winners_delete_arrived_ends_equal(sites: tuple[Site, Site],
                                                                              piece: bool) -> None:
    """Site wins (a), history 1 of issue 36: b inserts a key again after a's delete of it was applied on
    b (whole, or a change of a transaction delivered in pieces); b recorded where its binlog stood when
    the delete arrived, the insert comes after that, so on a it is applied over a's tombstone: both
    sites end with b's row, and nothing is recorded as a conflict."""
    a, b = sites
    for site in sites:
        site.reset(WINS_A)
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    a.write(5, None, piece=piece)
    d = a.log[-1].position
    a.ship_to(b)
    assert b.row(5) is None and b.tombstone(5) is not None and b.tombstone(5)[0] == "a"  # type: ignore[index]
    record = _arrival(b, 5)
    assert record is not None and record[0] == d.gtid and record[1] == int(piece)  # type: ignore[union-attr]
    b.write(5, image(5, "b-after", T0 + datetime.timedelta(seconds=3)))
    assert b.log[-1].position > Position(record[2], record[3])  # type: ignore[operator]
    b.ship_to(a)
    assert a.row(5) == b.row(5) and (a.row(5) or {}).get("v") == "b-after"
    assert a.conflicts() == [] and b.conflicts() == []


@pytest.mark.parametrize("history", ["written-again-after-the-delete-arrived", "written-again-racing-it"])
def test_site_wins_a_losers_delete_and_insert_again_in_one_batch_is_ranked_as_the_insert(sites: tuple[Site, Site],
                                                                                       history: str) -> None:
    """Site wins (a): b deletes a key a wrote and writes it again, and both reach a in one batch, merged
    into a change from a's old row to b's new one. On a it meets no row but a's own tombstone (a deleted
    the key too): not an update of the row a's delete met, but an insert made after b's delete, ranked by
    when a's delete reached b. Made after it arrived: applied on a, both sites keep b's row; made before:
    it loses on a, and a's delete removes it on b. (Taken for an update, it lost on a in both histories,
    and the sites differed: tests/e2e/test_bidirectional_site_wins_field.py's random writes found it.)"""
    a, b = sites
    for site in sites:
        site.reset(WINS_A)
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    b.write(5, None)  # b's own delete: shipped later, with b's insert, in one batch
    a.write(5, None)  # a's delete
    if history.startswith("written-again-after"):
        a.ship_to(b)  # reaches b, where it meets no row (recorded as arrived)
        b.write(5, image(5, "b-again", T0 + datetime.timedelta(seconds=3)))
    else:
        b.write(5, image(5, "b-again", T0 + datetime.timedelta(seconds=3)))
    b.write(5, image(5, "b-again-2", T0 + datetime.timedelta(seconds=4)))  # and updates it
    b.ship_to(a)  # b's delete, insert and update: one batch
    a.ship_to(b)  # a's delete, if it had not reached b yet
    assert a.row(5) == b.row(5)
    found = [(c["decision"], c["reason"]) for c in a.conflicts()]
    if history.startswith("written-again-after"):
        assert (a.row(5) or {}).get("v") == "b-again-2" and found == [], found
    else:
        assert a.row(5) is None and [d for d, _ in found] == ["target_won"], found
        assert "before site a's latest delete" in found[0][1], found
    assert not [r for _, r in found if r.startswith(conflicts_module.UNSETTLED)]


@pytest.mark.parametrize("piece", [False, True])
@pytest.mark.parametrize("order", ["insert-first", "delete-first"])
def test_site_wins_an_insert_racing_the_winners_delete_loses_on_both_sides(sites: tuple[Site, Site], order: str,
                                                                           piece: bool) -> None:
    """Site wins (a), history 2 of issue 36: b inserts a key a has inserted and deleted, before a's delete
    reaches b. Whichever direction ships first, the insert loses on a (recorded target_won: with no
    record on b of the delete arriving, or one made at or after the insert in b's binlog) as it does on b
    (the delete removes its row there): both sites end without the row, nothing unsettled."""
    a, b = sites
    for site in sites:
        site.reset(WINS_A)
    a.write(5, image(5, "a-row", T0))
    a.write(5, None, piece=piece)
    b.write(5, image(5, "b-race", T0 + datetime.timedelta(seconds=3)))
    for source, target in ((b, a), (a, b)) if order == "insert-first" else ((a, b), (b, a)):
        source.ship_to(target)
    assert a.row(5) is None and b.row(5) is None, (a.row(5), b.row(5), [s.conflicts() for s in sites])
    assert _unsettled(sites) == set()
    assert a.tombstone(5) is not None and a.tombstone(5)[0] == "a"  # type: ignore[index]
    ((decision, reason, lost),) = [(r["decision"], r["reason"], json.loads(r["source_row"])["v"])
                                   for r in a.conflicts()]
    assert decision == TARGET_WON and lost == "b-race", reason
    assert ("raced" if order == "delete-first" else "before site a's latest delete") in reason, reason
    assert [(r["decision"], json.loads(r["target_row"])["v"]) for r in b.conflicts()] == [(SOURCE_WON, "b-race")]
    assert _arrival(b, 5) is not None


@pytest.mark.parametrize("piece", [False, True])
def test_site_wins_an_insert_after_one_delete_racing_the_next_is_settled(sites: tuple[Site, Site],
                                                                         piece: bool) -> None:
    """Site wins (a), the counterexample to a per-key flag: b inserts a key after a's first delete of it
    arrived, while a inserts and deletes it again before b's insert arrives. b's record of the first
    delete must not be taken for a's tombstone of the second (the GTID sets tell them apart, whole or in
    pieces): b's insert loses on a as it did on b, and both sites end without the row."""
    a, b = sites
    for site in sites:
        site.reset(WINS_A)
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    a.write(5, None, piece=piece)
    a.ship_to(b)  # b records a's first delete arriving
    first = _arrival(b, 5)
    b.write(5, image(5, "b-after-first", T0 + datetime.timedelta(seconds=3)))
    a.write(5, image(5, "a-again", T0 + datetime.timedelta(seconds=4)))
    a.write(5, None, piece=piece)  # a's second delete: b's insert races it
    (p,), = a.execute(f"SELECT deleted_gtid FROM {a.db}.setl_tombstones WHERE table_name = %s", (f"{a.db}.t",))
    assert conflicts_module._names_current(first[0], bool(first[1]), p) is False  # type: ignore[index]
    b.ship_to(a)  # b's record is of the first delete: the insert was made before the second arrived
    assert a.row(5) is None
    a.ship_to(b)  # a's insert beats b's row on b (a wins), a's delete removes it
    assert b.row(5) is None and _unsettled(sites) == set()
    second = _arrival(b, 5)
    assert conflicts_module._names_current(second[0], bool(second[1]), p) is True  # type: ignore[index]
    assert [(r["decision"], json.loads(r["target_row"])["v"]) for r in b.conflicts()] == [
        (SOURCE_WON, "b-after-first")]  # a's insert beat b's row on b, recorded there
    assert [(r["decision"], json.loads(r["source_row"])["v"]) for r in a.conflicts()] == [
        (TARGET_WON, "b-after-first")]


def test_site_wins_a_tombstone_of_an_older_setl_is_still_recorded_unsettled(sites: tuple[Site, Site]) -> None:
    """A tombstone written before its delete's GTID was kept (an older setl's trigger: deleted_gtid NULL)
    names no delete: b's insert meeting it is applied and recorded unsettled, with that cause."""
    a, b = sites
    for site in sites:
        site.reset(WINS_A)
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    a.write(5, None)
    a.ship_to(b)
    a.execute(f"UPDATE {a.db}.setl_tombstones SET deleted_gtid = NULL")
    b.write(5, image(5, "b-after", T0 + datetime.timedelta(seconds=3)))
    b.ship_to(a)
    assert a.row(5) == b.row(5)
    ((decision, reason),) = [(r["decision"], r["reason"]) for r in a.conflicts()]
    assert decision == SOURCE_WON and reason.startswith(conflicts_module.UNSETTLED) and "older setl" in reason


def test_site_wins_a_rolled_back_batch_leaves_no_arrival(sites: tuple[Site, Site],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The record of a delete's arrival is written in the batch's transaction: a batch that fails after
    writing it leaves none, and its replay records the delete with where the binlog stands then."""
    a, b = sites
    for site in sites:
        site.reset(WINS_A)
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    a.write(5, None)
    changes = [RowChange(c.op, b.db, c.table, c.primary_key, c.before, c.after, c.position) for c in a.log]
    a.log.clear()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")

    with monkeypatch.context() as patched:
        patched.setattr(conflicts_module.Tombstones, "bury", broken)
        with pytest.raises(Exception):
            b.receive(changes)
    assert _arrival(b, 5) is None and b.row(5) is not None
    before = b.binlog()
    b.receive(changes)
    record = _arrival(b, 5)
    assert record is not None and Position(record[2], record[3]) >= Position(before.log, before.offset)
    assert b.row(5) is None


@pytest.mark.parametrize("order", ["insert-raced-the-delete", "insert-after-the-delete-arrived"])
def test_site_wins_a_losers_delete_racing_the_winners_leaves_the_winners_tombstone(sites: tuple[Site, Site],
                                                                                  order: str) -> None:
    """Site wins (a): b deletes a key a deletes too, b's delete reaching a alone first (nothing to delete
    there), then b inserts the key again, before a's delete reaches b (raced) or after (after). a keeps
    its own tombstone (b's delete does not replace it), so b's insert is ranked against a's delete as
    any: raced, it loses on both sites (on b a's delete removes it, its tombstone found on a: no stop);
    after, it stands on both. Found by tests/e2e/test_bidirectional_site_wins_field.py's random writes:
    before, b's delete replaced a's tombstone on a and the direction into b stopped ("replaced by site b's
    delete")."""
    a, b = sites
    for site in sites:
        site.reset(WINS_A)
    a.write(5, image(5, "orig", T0))
    a.ship_to(b)
    a.write(5, None)  # a's delete, in flight to b
    b.write(5, None)
    b.ship_to(a, 1)  # b's delete alone: a deleted the key too
    assert a.tombstone(5) is not None and a.tombstone(5)[0] == "a"  # type: ignore[index]
    assert [tuple(r) for r in a.execute(f"SELECT deleted_gtid IS NOT NULL FROM {a.db}.setl_tombstones")] == [(1,)]
    if order.startswith("insert-after"):
        a.ship_to(b)
    b.write(5, image(5, "b-again", T0 + datetime.timedelta(seconds=3)))
    for source, target in ((b, a), (a, b)):
        source.ship_to(target)
    assert a.row(5) == b.row(5) and _unsettled(sites) == set(), (a.row(5), b.row(5), a.conflicts(), b.conflicts())
    if order.startswith("insert-raced"):
        assert a.row(5) is None
        assert [(r["decision"], json.loads(r["source_row"])["v"]) for r in a.conflicts()] == [(TARGET_WON, "b-again")]
        assert [(r["decision"], json.loads(r["target_row"])["v"]) for r in b.conflicts()] == [(SOURCE_WON, "b-again")]
    else:
        assert (a.row(5) or {}).get("v") == "b-again" and a.conflicts() == [] and b.conflicts() == []


def test_site_wins_a_loader_that_may_not_read_its_binlog_position_is_refused(mariadb_target: MariaDBServer,
                                                                             mysql_db: str) -> None:
    """Site wins (a), the loader of a's changes into b, whose user lacks BINLOG MONITOR: a's delete cannot be
    recorded with b's binlog position, so the load stops with one line naming the table, the position,
    the privilege and the fix, nothing written."""
    mariadb_target.query(DDL.format(db=mysql_db, f="FLOAT"))
    mariadb_target.query(f"INSERT INTO {mysql_db}.t (id, v) VALUES (1, 'x')")
    user = f"nm_{mysql_db[-6:]}"
    mariadb_target.query(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
    (trusted,), = mariadb_target.query("SELECT @@GLOBAL.log_bin_trust_function_creators")
    try:
        mariadb_target.query(f"GRANT ALL ON *.* TO '{user}'@'%'")
        mariadb_target.query(f"REVOKE SUPER, BINLOG MONITOR ON *.* FROM '{user}'@'%'")
        mariadb_target.query("SET GLOBAL log_bin_trust_function_creators = 1")  # the triggers: made without SUPER
        config = attrs.evolve(mariadb_target.target_config(), user=user, password="pw")
        load = MysqlLoad(config, pipeline="a_to_b", position_schema=mysql_db, conflicts=policy("a", WINS_A))
        load.open()
        try:
            row, = mariadb_target.query(f"SELECT id, v, f, d, ts, c FROM {mysql_db}.t")
            before = dict(zip(("id", "v", "f", "d", "ts", "c"), row))
            change = RowChange(Op.DELETE, mysql_db, "t", ("id",), before, None, Position("sim-bin.000001", 50))
            with pytest.raises(RefusedLoadError, match=r"table=.*\.t position=sim-bin.000001:104: .*GRANT BINLOG "
                                                       r"MONITOR.*docs/grants.md") as refused:
                load.load(Batch("a_to_b", 1, 1, Position("sim-bin.000001", 4), Position("sim-bin.000001", 104),
                                (change,)))
            assert "\n" not in str(refused.value)
        finally:
            load.close()
        assert mariadb_target.query(f"SELECT COUNT(*) FROM {mysql_db}.t") == [(1,)]
    finally:
        mariadb_target.query(f"SET GLOBAL log_bin_trust_function_creators = {int(trusted)}")
        mariadb_target.query(f"DROP USER '{user}'@'%'")


def test_an_older_tombstones_table_gets_the_delete_gtid_column_once(sites: tuple[Site, Site]) -> None:
    """A tombstones table an older setl made (no deleted_gtid) gets the column when a load opens, which the
    triggers fill; opening once more writes no DDL into the binlog."""
    a, _ = sites
    a.execute(f"ALTER TABLE {a.db}.setl_tombstones DROP COLUMN deleted_gtid")
    written = []
    for _ in range(2):
        start = a.binlog()
        again = Site(a.server, "a", a.db, other_db=a.other_db)
        try:
            again.load.open()
            again.guard()
        finally:
            again.close()
        columns = a.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
                            "table_name = 'setl_tombstones'", (a.db,))
        assert ("deleted_gtid",) in columns
        written.append([str(e[5]) for e in a.execute(f"SHOW BINLOG EVENTS IN '{start.log}' FROM {start.offset}")
                        if e[2] == "Query" and ("TRIGGER" in str(e[5]) or "ALTER TABLE" in str(e[5]))])
    assert any("ADD COLUMN deleted_gtid" in q for q in written[0]), written
    assert written[1] == []  # the second open: no DDL, no trigger made again
    a.write(1, image(1, "x", T0))
    a.write(1, None)
    (gtid,), = a.execute(f"SELECT deleted_gtid FROM {a.db}.setl_tombstones")
    assert gtid is not None and conflicts_module._gtid_seqs(gtid) is not None
