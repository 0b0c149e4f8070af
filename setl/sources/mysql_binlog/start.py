"""Where the binlog source starts reading: the configured `source.start` parsed (`parse_start`),
and a start resolved on the server to a checked file and position and the GTIDs executed there
(`resolve`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import attrs
import pymysql

from setl.errors import ConfigError, PositionPurged
from setl.model import Position
from setl.sources.mysql_binlog.assembler import _GtidState, gtid_flavor
from setl.sources.mysql_binlog.server import SourceServer


@attrs.frozen
class _GtidStart:
    """A configured start by GTID set: the server positions the stream (auto_position)."""

    gtid: str
    flavor: str


#: A start: "earliest", "latest" or "snapshot" (the head), a file and position, or a GTID set.
Start = str | Position | _GtidStart


def parse_start(start: Any, pipeline: str) -> Start:
    """The configured `source.start` as a `Start`; raises `ConfigError` for anything else."""
    if start is None or start in ("earliest", "latest", "snapshot"):
        return start or "earliest"
    if isinstance(start, Position):
        return start
    if isinstance(start, Mapping) and set(start) == {"gtid"} and isinstance(start["gtid"], str):
        flavor = gtid_flavor(start["gtid"])
        if flavor is not None:
            return _GtidStart(start["gtid"].strip(), flavor)
        raise ConfigError(f"source.start.gtid {start['gtid']!r} is neither a MariaDB GTID list "
                          "(DOMAIN-SERVER-SEQ[,...]) nor a MySQL GTID set (UUID:N[-M][,...])",
                          pipeline=pipeline)
    if isinstance(start, Mapping) and set(start) <= {"file", "log", "pos", "offset"}:
        file = start.get("file", start.get("log"))
        pos = start.get("pos", start.get("offset", 4))
        if isinstance(file, str) and isinstance(pos, int) and not isinstance(pos, bool) and pos >= 4:
            return Position(file, pos)
    if isinstance(start, str):
        with contextlib.suppress(ValueError):
            return Position.parse(start)
    raise ConfigError(f"source.start {start!r} is not earliest, latest, snapshot, {{file: NAME, pos: OFFSET}} "
                      "(OFFSET at least 4) or {gtid: GTID_SET}", pipeline=pipeline)


def resolve(server: SourceServer, conn: pymysql.connections.Connection, target: Start, detected: str | None
            ) -> tuple[Position | None, _GtidState | None]:
    """Where to read from `target` on a server of flavor `detected`: a checked file+pos
    (or None for a GTID start the server positions), and the GTIDs executed there."""
    logs = [(row[0], int(row[1])) for row in server.query(conn, "SHOW BINARY LOGS")]
    if not logs:
        raise server.error(f"server {server.host}:{server.port} lists no binary logs")
    if target == "earliest":
        target = Position(logs[0][0], 4)
    elif target in ("latest", "snapshot") or isinstance(target, _GtidStart):  # a snapshot starts at the head
        status = server.status(conn)
        if status is None:
            raise server.error(f"server {server.host}:{server.port} shows no binlog status")
        head, executed = status
        if not isinstance(target, _GtidStart):  # "latest" or "snapshot"
            gtids = server.gtids_at(conn, head, detected, executed)
            return attrs.evolve(head, gtid=gtids.text or None if gtids else None), gtids
        return _resolve_gtid(server, conn, target, head, executed, detected)
    assert isinstance(target, Position)
    sizes = dict(logs)
    if target.log not in sizes:
        oldest = Position(logs[0][0], 4)
        if _log_number(target.log) > _log_number(logs[-1][0]):
            raise server.error(f"position {target} is ahead of the server's last binlog {logs[-1][0]} "
                               "(was the server reset?)", target)
        raise server.error(f"position {target} was purged from the server; the oldest available is "
                           f"{oldest}: reset the pipeline's position and reload its tables",
                           target, cls=PositionPurged)
    if target.offset > sizes[target.log]:
        raise server.error(f"position {target} is past the end of {target.log} "
                           f"({sizes[target.log]} bytes)", target)
    position = Position(target.log, max(4, target.offset))
    gtids = server.gtids_at(conn, position, detected)
    saved = target.gtid
    flavor = gtid_flavor(saved) if saved else None
    if gtids is None and saved and flavor is not None and flavor == detected:
        gtids = _GtidState(flavor, saved)
    # A checkpoint inside a split transaction (row > 0) reads it again from its start.
    return attrs.evolve(position, gtid=gtids.text or None if gtids else None, row=target.row), gtids


def _resolve_gtid(server: SourceServer, conn: pymysql.connections.Connection, target: _GtidStart, head: Position,
                  executed: str | None, detected: str | None) -> tuple[Position | None, _GtidState]:
    if target.flavor != detected:
        raise server.error(f"source.start.gtid {target.gtid!r} is a {target.flavor} GTID but "
                           f"{server.host}:{server.port} is {detected}")
    wanted = _GtidState(target.flavor, target.gtid)
    if target.flavor == "mariadb":
        executed = server.query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    if executed is not None and wanted.covers(_GtidState(target.flavor, executed)):
        # Nothing after it yet: start at the head by position, so caught-up is known at once.
        return attrs.evolve(head, gtid=wanted.text), wanted
    return None, wanted


def _log_number(name: str) -> int:
    """The number a binlog file name ends in (-1: none), to tell an older file from a newer one."""
    suffix = name.rpartition(".")[2]
    return int(suffix) if suffix.isdigit() else -1
