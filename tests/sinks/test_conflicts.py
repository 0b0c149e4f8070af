"""Conflicts detected, settled and recorded by the MySQL sink (`setl.sinks.conflicts`), on a real MariaDB."""

from __future__ import annotations

import datetime
import decimal
import json
import struct
from collections.abc import Iterator
from typing import Any

import attrs
import pymysql.cursors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from setl.config import ConfigError
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
from setl.testing.servers import MariaDBServer

DDL = ("CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20) COLLATE utf8mb4_general_ci, f {f}, "
       "d DECIMAL(8,3), ts DATETIME(3), c CHAR(4))")
LWW = TablePolicy(LAST_WRITER_WINS, "ts")
SITES = {"a": 1, "b": 2}


def f32(x: float) -> float:
    """`x` as the binlog gives a FLOAT column: the 4-byte float, widened."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def policy(site: str, table: TablePolicy = LWW) -> ConflictPolicy:
    other = "b" if site == "a" else "a"
    return ConflictPolicy(site, other, SITES, table)


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
                 f: str = "FLOAT") -> None:
        self.server, self.name, self.db, self.f = server, name, db, f
        self.conn = server.connect()
        other = "b" if name == "a" else "a"
        self.load = MysqlLoad(server.target_config(), pipeline=f"{other}_to_{name}", position_schema=db,
                              conflicts=policy(other, table_policy))
        self.log: list[RowChange] = []
        self.shipped: set[str] = set()  # versions (v) of this site's writes that left it
        self.batches = 0
        self.offset = 4

    def execute(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def row(self, key: int) -> dict[str, Any] | None:
        """The row of `key` as the binlog would image it."""
        found = self.execute(f"SELECT id, v, f, d, ts, c FROM {self.db}.t WHERE id = %s", (key,))
        if not found:
            return None
        id_, v, f, d, ts, c = found[0]
        if f is not None and self.f == "FLOAT":
            f = f32(f)
        return {"id": id_, "v": v, "f": f, "d": d, "ts": ts, "c": c}

    def write(self, key: int, after: dict[str, Any] | None) -> dict[str, Any] | None:
        """A user's write of `key` (None: delete), logged as the binlog would; returns the before-image."""
        before = self.row(key)
        if after is None:
            if before is None:
                return None
            self.execute(f"DELETE FROM {self.db}.t WHERE id = %s", (key,))
            self.log.append(RowChange(Op.DELETE, "?", "t", ("id",), before, None))
        else:
            if self.f != "FLOAT" and after["f"] is not None:
                after = {**after, "f": int(after["f"] * 10)}  # a BIGINT column: an exact value
            self.execute(f"REPLACE INTO {self.db}.t (id, v, f, d, ts, c) VALUES (%s, %s, %s, %s, %s, %s)",
                         tuple(after[c] for c in ("id", "v", "f", "d", "ts", "c")))
            op = Op.INSERT if before is None else Op.UPDATE
            self.log.append(RowChange(op, "?", "t", ("id",), before, dict(after)))
        return before

    def ship_to(self, other: Site, count: int | None = None) -> None:
        """The first `count` (all) logged changes applied to `other` in one batch, as its pipeline would."""
        take = self.log[:count] if count is not None else self.log
        self.log = self.log[len(take):]
        self.shipped.update(c.after["v"] for c in take if c.after is not None)
        if not take:
            return
        other.receive([RowChange(c.op, other.db, c.table, c.primary_key, c.before, c.after) for c in take])

    def receive(self, changes: list[Any]) -> Batch:
        """`changes` (row changes, DDL) loaded as one batch of this site's pipeline."""
        self.batches += 1
        start = Position("sim-bin.000001", self.offset)
        self.offset += 100
        end = Position("sim-bin.000001", self.offset)
        at = Position("sim-bin.000001", self.offset - 50, row=0)
        placed = [attrs.evolve(c, position=at) for c in changes]
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
        self.log.clear()
        self.shipped.clear()
        self.load.conflicts.policy = policy("b" if self.name == "a" else "a", table_policy)  # type: ignore[union-attr]

    def close(self) -> None:
        self.load.close()
        self.conn.close()


@pytest.fixture
def sites(request: pytest.FixtureRequest, mariadb_target: MariaDBServer, mysql_db: str) -> Iterator[tuple[Site, Site]]:
    """Sites a and b; ``f`` is a FLOAT column (rows compared by the server) unless the test asks for
    BIGINT (``indirect`` parameter: every column exact, rows compared by setl where it can)."""
    f = getattr(request, "param", "FLOAT")
    db_a, db_b = mysql_db, mysql_db + "_b"
    mariadb_target.query(f"CREATE DATABASE {db_b}")
    for db in (db_a, db_b):
        mariadb_target.query(DDL.format(db=db, f=f))
    a, b = Site(mariadb_target, "a", db_a, f=f), Site(mariadb_target, "b", db_b, f=f)
    a.load.open()
    b.load.open()
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


@pytest.mark.parametrize("deleter", ["a", "b"])
def test_update_racing_a_delete_converges(sites: tuple[Site, Site], deleter: str) -> None:
    """An update on one site racing a delete of the row on the other: the delete wins on both sides,
    and the lost update is recorded on each side it reached."""
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


# -- the property: any interleaving converges, and every lost write is recorded

#: (site, what, key, timestamp offset or batch size). Deletes are left out: a deleted row has no
#: version to tell it apart by, so a key deleted and inserted again on one side while the other's
#: insert of it is in flight can end different (docs/conflicts.md, "What is not settled");
#: an update racing a delete is checked by `test_update_racing_a_delete_converges`.
STEP = st.tuples(st.sampled_from("ab"), st.sampled_from(["write", "write", "ship"]), st.integers(0, 3),
                 st.integers(0, 2))


@pytest.mark.parametrize("sites", ["FLOAT", "BIGINT"], indirect=True)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, max_size=30), table_policy=st.sampled_from([LWW, TablePolicy(SITE_WINS, site="b")]))
def test_random_concurrent_writes_converge(sites: tuple[Site, Site], steps: list[tuple[str, str, int, int]],
                                           table_policy: TablePolicy) -> None:
    """Random writes on both sites (each stamped no earlier than the row it replaces, often the same
    time), shipped each way in random batches: both end equal, and every
    site's last write of a key that did not survive, and that the other site did not overwrite
    after seeing it, is in a conflicts table as the losing version (a site deleting its own write
    that never left it wrote nothing the other saw)."""
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
            # a write's timestamp never goes back from the row's it replaces (docs/conflicts.md): 0 s later ties
            now = (site.row(key) or {}).get("ts") or T0
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
