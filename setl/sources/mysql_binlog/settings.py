"""The source server's settings that decide what its binlog holds, and setl's answer to each: one
table of `Setting`s judged on one read of the server (`ServerFacts`), every problem at once, each
with its exact fix (docs/mysql-source.md, "Server settings")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import pymysql

from setl.model import Position

OK, WARNING, REFUSED = "ok", "warning", "refused"

#: Settings a session may change for itself, beyond the server's reach: said in their fix.
_SESSION_NOTE = " (a session may still set its own: see docs/mysql-source.md)"


def set_global(name: str, value: str) -> str:
    """The exact fix of a dynamic setting: for now, and for the next restart."""
    return (f"SET GLOBAL {name}={value}, and {name}={value} in [mysqld] of the server's config so it survives "
            "a restart")


def in_config(name: str, value: str) -> str:
    """The exact fix of a setting the server reads only at its start."""
    return f"{name}={value} in [mysqld] of the server's config, then restart the server"


@attrs.frozen
class ServerFacts:
    """What one look at the server shows: its version and flavor, its global variables (lower-case
    names), its binlog filters (``SHOW MASTER STATUS``), whether it replicates from another server
    (None: the account may not ask), its binary logs, the schemas holding selected tables and
    where the pipeline would read from (None: the head)."""

    version: str
    flavor: str
    variables: Mapping[str, str]
    do_db: tuple[str, ...] = ()
    ignore_db: tuple[str, ...] = ()
    replica: bool | None = False
    logs: tuple[tuple[str, int], ...] = ()
    schemas: tuple[str, ...] = ()
    position: Position | None = None
    gtid_start: bool = False
    pipeline: str = ""

    @classmethod
    def read(cls, conn: pymysql.connections.Connection, flavor: str, *, schemas: Sequence[str] = (),
             position: Position | None = None, gtid_start: bool = False, pipeline: str = "") -> ServerFacts:
        """Read the facts on `conn` (``SHOW GLOBAL VARIABLES``, ``SHOW MASTER STATUS``, ``SHOW SLAVE
        STATUS``, ``SHOW BINARY LOGS``); raises pymysql's errors but for a replica status the account
        may not read."""
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            row = cur.fetchone()
            version = str(row[0]) if row else ""
            if flavor == "auto":
                flavor = "mariadb" if "mariadb" in version.lower() else "mysql"
            cur.execute("SHOW GLOBAL VARIABLES")
            variables = {str(name).lower(): str(value) for name, value in cur.fetchall()}
            do_db: tuple[str, ...] = ()
            ignore_db: tuple[str, ...] = ()
            logs: tuple[tuple[str, int], ...] = ()
            if variables.get("log_bin", "").upper() == "ON":
                try:
                    cur.execute("SHOW MASTER STATUS")
                except pymysql.err.ProgrammingError:  # MySQL 8.4 renamed it
                    cur.execute("SHOW BINARY LOG STATUS")
                status = cur.fetchone()
                if status is not None:
                    do_db, ignore_db = _names(status[2]), _names(status[3])
                cur.execute("SHOW BINARY LOGS")
                logs = tuple((str(row[0]), int(row[1])) for row in cur.fetchall())
            replica: bool | None
            try:
                cur.execute("SHOW ALL SLAVES STATUS" if flavor == "mariadb" else "SHOW SLAVE STATUS")
                replica = bool(cur.fetchall())
            except pymysql.MySQLError:  # SLAVE MONITOR / REPLICATION CLIENT not granted, or MySQL 8.4's name
                try:
                    cur.execute("SHOW REPLICA STATUS")
                    replica = bool(cur.fetchall())
                except pymysql.MySQLError:
                    replica = _replicates(cur, variables)
        return cls(version, flavor, variables, do_db, ignore_db, replica, logs, tuple(sorted(set(schemas))),
                   position, gtid_start, pipeline)


def _replicates(cur: Any, variables: Mapping[str, str]) -> bool | None:
    """Whether a server replicates, from what any account may read: replica threads running, or
    (MariaDB) GTIDs applied from a primary. None when even that cannot be read."""
    try:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Slaves_running'")
        running = dict(cur.fetchall()).get("Slaves_running", "0")
    except pymysql.MySQLError:
        return None
    return int(running or 0) > 0 or bool(variables.get("gtid_slave_pos"))


def _names(text: Any) -> tuple[str, ...]:
    return tuple(name.strip() for name in str(text or "").split(",") if name.strip())


@attrs.frozen
class Verdict:
    """setl's answer to one setting: `level` ok, warning or refused; `text` why; `fix` what to run."""

    setting: str
    value: str
    level: str
    text: str
    fix: str = ""

    def line(self) -> str:
        """One line: the setting, its value, why, and the fix."""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.setting}={self.value}: {self.text}{fix}"


#: A judge: the setting's name, its value and the facts -> (level, why, fix).
Judge = Callable[[str, str, ServerFacts], tuple[str, str, str]]


@attrs.frozen
class Setting:
    """One server setting that changes what the binlog holds: where it applies (`flavors`), what
    setl handles (`handles`, as the docs say it) and its `judge`. `required`: a server without the
    variable is refused (too old). `alias`: the variable's other name (MySQL 8.0.26 renamed the
    replica ones, 8.4 dropped the old names; MariaDB 10.5 has only expire_logs_days)."""

    name: str
    flavors: frozenset[str]
    handles: str
    judge: Judge
    required: bool = False
    alias: str | None = None

    def verdict(self, facts: ServerFacts) -> Verdict | None:
        """The verdict on `facts`; None where the setting does not apply (another flavor, or a
        server without it)."""
        if facts.flavor not in self.flavors:
            return None
        name = self.alias if self.alias is not None and self.name not in facts.variables else self.name
        value = facts.variables.get(name)
        if value is None and not self.required:
            return None
        if value is None:
            return Verdict(self.name, "missing", REFUSED, "the server is too old for setl (it needs MariaDB 10.5+ "
                           "or MySQL 8.0.14+)", "upgrade the server")
        level, text, fix = self.judge(name, value, facts)
        return Verdict(name, value, level, text, fix)


def _equals(wanted: str, why: str, *, note: str = "") -> Judge:
    """A judge refusing any value but `wanted` (a dynamic setting: its fix is a SET GLOBAL)."""
    def judge(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
        if value.upper() == wanted:
            return OK, "", ""
        return REFUSED, f"setl needs {name}={wanted}: {why}{note}", set_global(name, wanted)
    return judge


def _setting(name: str, flavors: str, handles: str, judge: Judge, *, required: bool = False,
             alias: str | None = None) -> Setting:
    return Setting(name, frozenset(flavors.split()), handles, judge, required, alias)


def _log_bin(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if value.upper() == "ON":
        return OK, "", ""
    return (REFUSED, "setl needs log_bin=ON: the server writes no binlog to read",
            in_config("log_bin", "mysql-bin"))


def _always(text: str) -> Judge:
    def judge(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
        return OK, text, ""
    return judge


def _checksum(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if value.upper() in ("NONE", "CRC32"):
        return OK, "events with or without their CRC32 are read alike", ""
    return REFUSED, "setl reads binlog_checksum NONE or CRC32 only", set_global("binlog_checksum", "CRC32")


def _transaction_compression(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if value.upper() != "ON":
        return OK, "", ""
    return (REFUSED, "MySQL writes each transaction as one compressed payload event setl cannot read"
            + _SESSION_NOTE, set_global("binlog_transaction_compression", "OFF"))


def _row_value_options(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if "PARTIAL_JSON" not in value.upper():
        return OK, "", ""
    return (REFUSED, "MySQL logs JSON updates as partial diffs (PARTIAL_UPDATE_ROWS events) setl cannot apply"
            + _SESSION_NOTE, set_global("binlog_row_value_options", "''"))


def _gtid_mode(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if facts.gtid_start and value.upper() != "ON":
        return (REFUSED, "the pipeline starts at a GTID set (source.start.gtid), which needs gtid_mode=ON",
                "start by file and position instead, or turn GTIDs on (gtid_mode steps OFF_PERMISSIVE, "
                "ON_PERMISSIVE, ON with enforce_gtid_consistency=ON)")
    return OK, "positions are by file and offset; GTIDs are kept along when the server logs them", ""


def _alter_two_phase(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if value.upper() != "ON":
        return OK, "", ""
    return (REFUSED, "MariaDB logs each ALTER twice (START ALTER, then COMMIT ALTER or ROLLBACK ALTER) with the "
            "same statement: setl would apply it twice, or apply an ALTER the server rolled back" + _SESSION_NOTE,
            set_global("binlog_alter_two_phase", "OFF"))


def _log_slave_updates(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if value.upper() == "ON":
        return OK, "", ""
    galera = facts.variables.get("wsrep_on", "").upper() == "ON"
    if facts.replica or galera:
        source = "a Galera node" if galera else "a replica"
        return (REFUSED, f"the server is {source}: the changes it receives from its primary never reach its own "
                "binlog, so setl would miss them", in_config(name, "ON"))
    if facts.replica is None:
        return (WARNING, "setl cannot tell whether the server is a replica (grant SLAVE MONITOR, or REPLICATION "
                "CLIENT on MySQL); if it is, the changes it replicates never reach its binlog",
                in_config(name, "ON") + " if it is a replica")
    return OK, "", ""


def _triggers_for_rbr(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if not facts.replica or value.upper() in ("NO", "LOGGING", "ENFORCE"):
        return OK, "", ""
    return (WARNING, "on this replica triggers run for replicated rows without logging what they change: a "
            "selected table a trigger writes would differ", set_global("slave_run_triggers_for_rbr", "LOGGING"))


def _forced_format(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if value.upper() in ("NONE", "ROW") or facts.variables.get("wsrep_on", "").upper() != "ON":
        return OK, "", ""
    return (REFUSED, f"Galera logs every change as {value.upper()} whatever binlog_format says",
            set_global(name, "ROW"))


def _error_action(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if value.upper() != "IGNORE_ERROR":
        return OK, "", ""
    return (WARNING, "after an error writing its binlog the server stops logging and goes on: every later change "
            "is missing from the binlog", set_global(name, "ABORT_SERVER"))


def _unverified(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    if value.upper() in ("", "OFF", "0", "NONE"):
        return OK, "", ""
    return (REFUSED, "setl is not verified with this binlog layout (MariaDB 12.x); refused rather than guessed",
            f"remove {name} from [mysqld] of the server's config, then restart the server")


def _not_on_10_11(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    return (WARNING, "a setting MariaDB 10.11 does not have, of how event positions are written: setl is not "
            "verified with it; compare the target with `setl verify` after a first run", "")


def _expire(name: str, value: str, facts: ServerFacts) -> tuple[str, str, str]:
    seconds = _retention(facts)
    if seconds is None or seconds >= 86400:
        return OK, "", ""
    shown = f"{seconds / 3600:g} hour(s)" if seconds >= 3600 else f"{seconds:g} second(s)"
    return (WARNING, f"binlogs are purged after {shown}: a pipeline stopped longer than that loses its position "
            "and must copy its tables again", set_global("binlog_expire_logs_seconds", "604800"))


def _retention(facts: ServerFacts) -> float | None:
    """The binlog retention in seconds (None: never purged by age)."""
    if facts.variables.get("binlog_expire_logs_auto_purge", "ON").upper() == "OFF":  # MySQL 8.0.29+
        return None
    seconds = float(facts.variables.get("binlog_expire_logs_seconds", "0") or 0)
    days = float(facts.variables.get("expire_logs_days", "0") or 0)
    chosen = seconds or days * 86400
    return chosen or None


_MARIADB, _MYSQL, _BOTH = "mariadb", "mysql", "mariadb mysql"

#: Every server setting that changes what the binlog holds and that a look at the server can
#: judge; docs/mysql-source.md lists these and the ones it cannot (session-only settings).
SETTINGS: tuple[Setting, ...] = (
    _setting("log_bin", _BOTH, "needed", _log_bin, required=True),
    _setting("binlog_format", _BOTH, "ROW only",
             _equals("ROW", "MIXED and STATEMENT log SQL statements, not the rows they change",
                     note=" (sessions opened before keep their own: reconnect them; a selected table's change "
                          "that still arrives as a statement stops the pipeline)"), required=True),
    _setting("binlog_row_image", _BOTH, "FULL only",
             _equals("FULL", "MINIMAL and NOBLOB log only some columns of an updated or deleted row",
                     note=_SESSION_NOTE), required=True),
    _setting("binlog_row_metadata", _BOTH, "FULL only",
             _equals("FULL", "the column names and primary keys come from the table-map events"), required=True),
    _setting("binlog_checksum", _BOTH, "NONE, CRC32", _checksum),
    _setting("log_bin_compress", _MARIADB, "handled",
             _always("compressed query and rows events are decompressed")),
    _setting("encrypt_binlog", _MARIADB, "handled",
             _always("the server decrypts the events it sends its readers")),
    _setting("binlog_annotate_row_events", _BOTH, "handled",
             _always("Annotate_rows events are skipped")),
    _setting("binlog_rows_query_log_events", _MYSQL, "handled", _always("Rows_query events are skipped")),
    _setting("binlog_alter_two_phase", _MARIADB, "OFF only", _alter_two_phase),
    _setting("binlog_transaction_compression", _MYSQL, "OFF only", _transaction_compression),
    _setting("binlog_row_value_options", _MYSQL, "empty only", _row_value_options),
    _setting("gtid_mode", _MYSQL, "handled", _gtid_mode),
    _setting("gtid_strict_mode", _MARIADB, "handled", _always("GTIDs are kept along either way")),
    _setting("log_slave_updates", _BOTH, "ON on a replica", _log_slave_updates, alias="log_replica_updates"),
    _setting("slave_run_triggers_for_rbr", _MARIADB, "NO or LOGGING on a replica", _triggers_for_rbr),
    _setting("wsrep_forced_binlog_format", _MARIADB, "NONE or ROW", _forced_format),
    _setting("binlog_error_action", _MYSQL, "ABORT_SERVER", _error_action),
    _setting("binlog_storage_engine", _MARIADB, "not verified", _unverified),
    _setting("binlog_legacy_event_pos", _MARIADB, "not verified", _not_on_10_11),
    _setting("binlog_expire_logs_seconds", _BOTH, "warned under a day", _expire, alias="expire_logs_days"),
)


def _filters(facts: ServerFacts) -> list[Verdict]:
    """The server's binlog filters (binlog-do-db, binlog-ignore-db) against the selected schemas."""
    if not facts.do_db and not facts.ignore_db:
        return []
    lost = [schema for schema in facts.schemas
            if (facts.do_db and schema not in facts.do_db) or schema in facts.ignore_db]
    setting, value = (("binlog_do_db", ",".join(facts.do_db)) if facts.do_db
                      else ("binlog_ignore_db", ",".join(facts.ignore_db)))
    fix = f"remove {setting.replace('_', '-')} from [mysqld] of the server's config, then restart the server"
    if lost:
        return [Verdict(setting, value, REFUSED, f"the server logs no change of schema {', '.join(lost)}, which "
                        "the pipeline reads (its table rules select it, or it holds the ddl_tasks signal table)",
                        fix)]
    return [Verdict(setting, value, WARNING, "the selected schemas are logged, but a DDL statement is filtered "
                    "by the session's default database (USE): one run from a filtered schema never reaches "
                    "the binlog", fix)]


def _position(facts: ServerFacts) -> list[Verdict]:
    """Whether the binlog the pipeline reads from is still on the server."""
    at = facts.position
    if at is None or not facts.logs or at.log in {name for name, _ in facts.logs}:
        return []
    oldest = Position(facts.logs[0][0], 4)
    if _number(at.log) > _number(facts.logs[-1][0]):
        return [Verdict("position", str(at), REFUSED, f"the pipeline reads from {at}, after the server's last "
                        f"binlog {facts.logs[-1][0]} (was the server reset?)",
                        f"setl position reset --pipeline {facts.pipeline or 'P'} --to {oldest} if nothing was "
                        "lost, else copy the tables again (docs/runbook.md, Purged binlog)")]
    return [Verdict("position", str(at), REFUSED, f"position {at} was purged from the server; the oldest available "
                    f"is {oldest}: the changes between are gone",
                    "copy the tables again: truncate them on the target, set source.start: snapshot, "
                    f"`setl position reset --pipeline {facts.pipeline or 'P'} --start`, then start "
                    "(docs/runbook.md, Purged binlog)")]


def _number(name: str) -> int:
    suffix = name.rpartition(".")[2]
    return int(suffix) if suffix.isdigit() else -1


def evaluate(facts: ServerFacts) -> list[Verdict]:
    """Every setting's verdict on `facts` (those that apply to the server), the binlog filters and
    the position last."""
    verdicts = [verdict for setting in SETTINGS if (verdict := setting.verdict(facts)) is not None]
    return verdicts + _filters(facts) + _position(facts)


def refusal(verdicts: Sequence[Verdict], server: str, version: str) -> str | None:
    """One line naming every refused setting and its fix, or None when none is refused."""
    refused = [verdict for verdict in verdicts if verdict.level == REFUSED]
    if not refused:
        return None
    listed = "; ".join(f"({i}) {verdict.line()}" for i, verdict in enumerate(refused, 1))
    many = f"{len(refused)} settings" if len(refused) > 1 else "a setting"
    return f"server {server} ({version}) has {many} setl cannot replicate exactly: {listed}"


@attrs.frozen
class SettingsReport:
    """Every verdict on one server (`server` is HOST:PORT): what `setl check` prints, one line each,
    and what `setl start` refuses in one line (`refusal`) or warns of before the first row."""

    server: str
    version: str
    verdicts: tuple[Verdict, ...]

    @property
    def refused(self) -> tuple[Verdict, ...]:
        return tuple(verdict for verdict in self.verdicts if verdict.level == REFUSED)

    @property
    def warnings(self) -> tuple[Verdict, ...]:
        return tuple(verdict for verdict in self.verdicts if verdict.level == WARNING)

    def refusal(self) -> str | None:
        """The one line of a start refused (None: nothing refused)."""
        return refusal(self.verdicts, self.server, self.version)

    def summary(self) -> str:
        """The closing line: how many settings were checked and how they came out."""
        checked = len(self.verdicts)
        if self.refused:
            return (f"source settings refused: {len(self.refused)} of {checked} checked on {self.server} "
                    f"({self.version}), each with its fix above")
        warned = f", {len(self.warnings)} to look at above" if self.warnings else ""
        return f"source settings ok ({checked} checked{warned})"


__all__ = ["OK", "REFUSED", "SETTINGS", "WARNING", "ServerFacts", "Setting", "SettingsReport", "Verdict",
           "evaluate", "in_config", "refusal", "set_global"]
