"""The questions the binlog source asks its server before it reads: `SourceChecks` judges the
settings and grants (`setl check`, `setl start`) and finds where an open starts (`Opening`)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pymysql

from setl.model import Position
from setl.sources.mysql_binlog.assembler import _GtidState
from setl.sources.mysql_binlog.server import Selects, SourceServer
from setl.sources.mysql_binlog.settings import SettingsReport
from setl.sources.mysql_binlog.start import Start, resolve


@attrs.frozen
class Opening:
    """What an open learnt from the server: its flavor, where to read (None: the server positions a
    GTID start), the GTIDs executed there, and the base tables it has (schema, table)."""

    flavor: str
    position: Position | None
    gtids: _GtidState | None
    tables: tuple[tuple[str, str], ...]


@attrs.frozen
class SourceChecks:
    """Settings judgment and start resolution for one source's `server`, its table selection
    `selects` and configured `start`; stateless: each call opens a connection and closes it."""

    server: SourceServer
    selects: Selects
    start: Start

    def _failed(self, exc: pymysql.MySQLError) -> Exception:
        return self.server.error(f"cannot read the binlog settings of {self.server.host}:{self.server.port}: {exc}")

    def check(self) -> str:
        """The connection (and TLS), the settings and grants a reader needs, and no selected table with
        a cascading foreign key: ``mariadb 10.11.19 at HOST:PORT``, else a `SourceError` naming the first
        problem."""
        conn = self.server.connect()
        try:
            flavor = self.server.check_settings(conn, self.selects)
            self.server.refuse_cascades(conn, self.selects)
            version = str(self.server.query(conn, "SELECT VERSION()")[0][0])
        except pymysql.MySQLError as exc:
            raise self._failed(exc) from exc
        finally:
            conn.close()
        return f"{flavor} {version} at {self.server.host}:{self.server.port}"

    def judge(self, position: Position | None, also: Sequence[str]) -> SettingsReport:
        """Every verdict on the settings, the binlog filters and whether the binlog of `position` (else of
        a configured start by file) is still there; raises only when the server cannot be asked."""
        at = position if position is not None else self.start if isinstance(self.start, Position) else None
        gtid_start = position is None and not isinstance(self.start, (str, Position))
        conn = self.server.connect()
        try:
            return self.server.judge_settings(conn, self.selects, at, gtid_start, also)[1]
        except pymysql.MySQLError as exc:
            raise self._failed(exc) from exc
        finally:
            conn.close()

    def opening(self, start: Position | None) -> Opening:
        """Refuse settings that lose data, then resolve `start` (None: the configured start)."""
        conn = self.server.connect()
        try:
            flavor = self.server.check_settings(conn, self.selects)
            self.server.refuse_cascades(conn, self.selects)
            position, gtids = resolve(self.server, conn, start if start is not None else self.start, flavor)
            tables = tuple((str(schema), str(table)) for schema, table in self.server.query(
                conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE <> 'VIEW' "
                      "AND TABLE_SCHEMA NOT IN ('information_schema', 'performance_schema', 'sys', 'mysql')"))
        except pymysql.MySQLError as exc:
            raise self._failed(exc) from exc
        finally:
            conn.close()
        return Opening(flavor, position, gtids, tables)
