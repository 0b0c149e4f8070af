"""`setl check` of a two-way channel (docs/bidirectional.md): what would make its two directions
loop, lose writes or hand out the same key, each refused in one line with its fix. The checks of
each direction as a pipeline (`setl.pipeline.preflight`) run besides."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pymysql

from setl.config import ChannelConfig, ChannelSite, channel_tombstones, selecting_rule
from setl.dial import mysql_connection
from setl.errors import RefusedLoadError
from setl.pipeline.preflight import Finding
from setl.sinks.mysql import MysqlTargetConfig, mark_session
from setl.tls import mysql_context

#: the schema of setl's own tables on a SQL target (positions, DDL marks): a filter must not hide it
SETL_SCHEMA = "setl"


@attrs.frozen
class SiteFacts:
    """What the checks read of one site's server."""

    server_id: int
    gtid_domain_id: int
    do_db: tuple[str, ...]
    ignore_db: tuple[str, ...]
    increment: int
    offset: int
    tables: tuple[tuple[str, str, bool, bool], ...]  # (schema, table, has a primary key, has AUTO_INCREMENT)
    binlog_format: str = "ROW"


def read_site(site: ChannelSite) -> SiteFacts:
    """`site`'s server settings and tables (a `pymysql.MySQLError` when it cannot be read)."""
    conn = _connect(site)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@global.server_id, @@global.gtid_domain_id, @@global.auto_increment_increment, "
                        "@@global.auto_increment_offset, @@global.binlog_format")
            server_id, domain, increment, offset, binlog_format = cur.fetchone() or (0, 0, 1, 1, "")
            cur.execute("SHOW MASTER STATUS")
            status = cur.fetchone() or ("", 0, "", "")
            cur.execute(
                "SELECT t.TABLE_SCHEMA, t.TABLE_NAME, "
                "EXISTS (SELECT 1 FROM information_schema.TABLE_CONSTRAINTS c WHERE c.TABLE_SCHEMA = t.TABLE_SCHEMA "
                "AND c.TABLE_NAME = t.TABLE_NAME AND c.CONSTRAINT_TYPE = 'PRIMARY KEY'), "
                "EXISTS (SELECT 1 FROM information_schema.COLUMNS k WHERE k.TABLE_SCHEMA = t.TABLE_SCHEMA AND "
                "k.TABLE_NAME = t.TABLE_NAME AND k.EXTRA LIKE '%auto_increment%') "
                "FROM information_schema.TABLES t WHERE t.TABLE_TYPE = 'BASE TABLE' AND t.TABLE_SCHEMA NOT IN "
                "('mysql', 'information_schema', 'performance_schema', 'sys')")
            tables = tuple((str(s), str(t), bool(pk), bool(auto)) for s, t, pk, auto in cur.fetchall())
    finally:
        conn.close()

    def names(text: Any) -> tuple[str, ...]:
        return tuple(n.strip() for n in str(text or "").split(",") if n.strip())

    return SiteFacts(int(server_id), int(domain), names(status[2]), names(status[3]), int(increment), int(offset),
                     tables, str(binlog_format).upper())


def _connect(site: ChannelSite) -> pymysql.connections.Connection:
    context = mysql_context(site.ssl, where="sites.ssl") if site.ssl is not None else None
    return mysql_connection(host=site.host, port=site.port, user=site.user, password=site.password,
                            connect_timeout=10.0, read_timeout=30.0, ssl=context)


def check_channel(channel: ChannelConfig) -> Iterator[Finding]:
    """The channel's findings: an error line, with its fix, for each thing that forbids running it."""
    def found(level: str, text: str, code: int = 1) -> Finding:
        return Finding(f"channel:{channel.name}", level, "channel", " ".join(text.split()), code)

    facts: dict[str, SiteFacts] = {}
    for name, site in channel.sites.items():
        try:
            facts[name] = read_site(site)
        except pymysql.MySQLError as exc:
            yield found("error", f"cannot read site {name} ({site.host}:{site.port}): {exc}")
    if len(facts) < 2:
        return
    yield from (found("error", line, 2) for line in refusals(channel, facts))
    guards: list[str] = []
    tombstones = channel_tombstones(channel.conflicts) is True
    for name, site in channel.sites.items():
        guard, line = _guard(channel, name, site)
        if line is None and guard == "marker" and facts[name].binlog_format != "ROW":
            line = (f"site {name} logs with binlog_format {facts[name].binlog_format}: the marker loop guard needs ROW "
                    "(the mark rows and the rows they mark must be row events). Fix: SET GLOBAL binlog_format = ROW "
                    "(and in my.cnf), or grant the user BINLOG REPLAY, BINLOG ADMIN and set loop_guard: server_id")
        if line is not None:
            yield found("error", line, 2)
        else:
            guards.append(f"{name} {guard}")
        trigger_line = _trigger_privilege(channel, name, site, facts[name]) if tombstones else None
        if trigger_line is not None:
            yield found("error", trigger_line, 2)
    if isinstance(channel.conflicts, dict):
        if tombstones:
            yield found("ok", "conflicts: tombstones on: a delete racing an insert or update of its key is settled "
                              "alike on both sites (docs/conflicts.md)")
        else:
            yield found("warning", "conflicts: the channel runs WITHOUT tombstones (conflicts.tombstones: false, or "
                                "every table keep_target): an insert racing a delete of its key can leave the sites "
                                "different, found only by setl verify --channel (docs/conflicts.md)")
    sites = ", ".join(f"{n} (server_id {f.server_id}, gtid_domain_id {f.gtid_domain_id})" for n, f in facts.items())
    yield found("ok", f"sites {sites}: each direction's writes are marked and dropped by the other's reader "
                      f"(loop_guard {channel.loop_guard}: {', '.join(guards)})")


def refusals(channel: ChannelConfig, facts: dict[str, SiteFacts]) -> list[str]:
    """One line, with its fix, for each setting of the two sites that forbids the channel."""
    (a, fa), (b, fb) = facts.items()
    lines = []
    if fa.server_id == fb.server_id:
        lines.append(f"sites {a} and {b} both have server_id {fa.server_id}: their writes could not be told "
                     f"apart. Fix: give each server its own server_id (SET GLOBAL server_id = N, and in my.cnf)")
    if fa.gtid_domain_id == fb.gtid_domain_id:
        lines.append(f"sites {a} and {b} both have gtid_domain_id {fa.gtid_domain_id}: two primaries writing one "
                     "GTID domain break GTID positions and replicas of either. Fix: SET GLOBAL gtid_domain_id = N "
                     "(and in my.cnf) with N different on each site")
    servers = {fa.server_id: a, fb.server_id: b}
    domains = {fa.gtid_domain_id: a, fb.gtid_domain_id: b}
    for name, site in channel.sites.items():
        if site.setl_server_id in servers:
            lines.append(f"sites.{name}.setl_server_id {site.setl_server_id} is the server_id of site "
                         f"{servers[site.setl_server_id]}: the users' own writes would be dropped as setl's. Fix: "
                         "choose a server_id no server or session of the topology uses")
        if site.setl_gtid_domain_id is not None and site.setl_gtid_domain_id in domains:
            lines.append(f"sites.{name}.setl_gtid_domain_id {site.setl_gtid_domain_id} is the gtid_domain_id of "
                         f"site {domains[site.setl_gtid_domain_id]}. Fix: choose a domain no server uses")
    for name, fact in facts.items():
        hidden = _hidden(channel, fact)
        if hidden:
            lines.append(f"site {name} filters its binlog (binlog_do_db={','.join(fact.do_db) or '-'}, "
                         f"binlog_ignore_db={','.join(fact.ignore_db) or '-'}), which hides the writes to "
                         f"{', '.join(hidden)} from the channel: they would never reach the other site. Fix: remove "
                         "binlog_do_db and binlog_ignore_db from its my.cnf and restart it")
    for name, fact in facts.items():
        keyless = [f"{s}.{t}" for s, t, pk, _ in fact.tables if not pk and _selected(channel, s, t)]
        if keyless:
            lines.append(f"site {name}: table(s) {', '.join(keyless)} have no primary key: a row changed on both "
                         "sides cannot be matched, so a channel could duplicate or lose it. Fix: add a primary key "
                         "(ALTER TABLE ... ADD PRIMARY KEY), or exclude the table from the channel's rules")
    counters = [f"{s}.{t}" for s, t, _, auto in (*fa.tables, *fb.tables) if auto and _selected(channel, s, t)]
    if counters and _same_keys(fa, fb):
        lines.append(f"sites {a} (auto_increment_increment={fa.increment}, auto_increment_offset={fa.offset}) and "
                     f"{b} ({fb.increment}, {fb.offset}) hand out the same AUTO_INCREMENT keys to "
                     f"{', '.join(sorted(set(counters)))}: both sides' inserts would take one key. Fix: SET GLOBAL "
                     f"auto_increment_increment = 2 on both, auto_increment_offset = 1 on {a} and 2 on {b} (and in "
                     "my.cnf)")
    return lines


def _selected(channel: ChannelConfig, schema: str, table: str) -> bool:
    index = selecting_rule(channel.tables, f"{schema}.{table}")
    return index is not None and not channel.tables[index].exclude


def _hidden(channel: ChannelConfig, fact: SiteFacts) -> list[str]:
    """The schemas of the channel's tables (and setl's own) that the site's binlog filters leave out."""
    schemas = sorted({s for s, t, _, _ in fact.tables if _selected(channel, s, t)} | {SETL_SCHEMA})
    return [s for s in schemas if (fact.do_db and s not in fact.do_db) or s in fact.ignore_db]


def _same_keys(a: SiteFacts, b: SiteFacts) -> bool:
    """Whether the two sites' AUTO_INCREMENT series (offset + k * increment) can meet."""
    if a.increment != b.increment or a.increment < 2:
        return True  # different strides meet sooner or later; a stride of 1 takes every key
    return a.offset % a.increment == b.offset % b.increment


def _guard(channel: ChannelConfig, name: str, site: ChannelSite) -> tuple[str, str | None]:
    """The loop guard the loader writing `site` would use (`MysqlTargetConfig.loop_guard`; `auto`:
    server_id when the site's user may set its session's, else marker), and a line when it cannot
    mark its writes that way (else None). Nothing is written: the session's settings are only tried."""
    if channel.loop_guard == "marker":
        return "marker", None
    config = MysqlTargetConfig(type="mysql", host=site.host, port=site.port, user=site.user, password=site.password,
                               session_server_id=site.setl_server_id,
                               session_gtid_domain_id=site.setl_gtid_domain_id)
    try:
        conn = _connect(site)
    except pymysql.MySQLError as exc:
        return "server_id", f"cannot connect to site {name} as {site.user!r}: {exc}"
    try:
        mark_session(conn, config, f"channel {name}")
    except RefusedLoadError as exc:  # it names the GRANT
        if channel.loop_guard == "auto":
            return "marker", None
        return "server_id", f"site {name}: {exc.message}"
    except pymysql.MySQLError as exc:
        return "server_id", f"site {name}: cannot mark setl's session: {exc}"
    finally:
        conn.close()
    return "server_id", None


def _trigger_privilege(channel: ChannelConfig, name: str, site: ChannelSite, fact: SiteFacts) -> str | None:
    """Tombstones on: a line when the site's user could not make setl's tombstone triggers on the
    channel's tables, else None: it needs TRIGGER on them (globally, on their schemas or on each), and
    with the binlog on SUPER or log_bin_trust_function_creators=1 (else MariaDB refuses CREATE TRIGGER
    with error 1419, TRIGGER or not)."""
    try:
        conn = _connect(site)
    except pymysql.MySQLError as exc:
        return f"cannot connect to site {name} as {site.user!r}: {exc}"
    tables = sorted({(s, t) for s, t, pk, _ in fact.tables if pk and _selected(channel, s, t)})
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@global.log_bin, @@global.log_bin_trust_function_creators, CURRENT_USER()")
            log_bin, trusted, user = cur.fetchone() or (0, 0, "")
            account, _, host = str(user).rpartition("@")
            grantee = f"'{account}'@'{host}'"
            cur.execute("SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = %s AND "
                        "PRIVILEGE_TYPE IN ('SUPER', 'TRIGGER')", (grantee,))
            global_privileges = {str(row[0]) for row in cur.fetchall()}
            cur.execute("SELECT TABLE_SCHEMA FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE = %s AND "
                        "PRIVILEGE_TYPE = 'TRIGGER'", (grantee,))
            schemas = {str(row[0]) for row in cur.fetchall()}
            cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLE_PRIVILEGES WHERE GRANTEE = %s "
                        "AND PRIVILEGE_TYPE = 'TRIGGER'", (grantee,))
            granted = {(str(row[0]), str(row[1])) for row in cur.fetchall()}
    except pymysql.MySQLError as exc:
        return f"site {name}: cannot read whether {site.user!r} may make triggers: {exc}"
    finally:
        conn.close()
    off = ("or set conflicts.tombstones: false, accepting that an insert racing a delete of its key is then found "
           "only by setl verify --channel (docs/conflicts.md)")
    if "TRIGGER" not in global_privileges:
        missing = [f"{s}.{t}" for s, t in tables if s not in schemas and (s, t) not in granted]
        if missing:
            return (f"site {name}: conflicts.tombstones needs setl's tombstone triggers on every table of the "
                    f"channel, and user {site.user!r} lacks the TRIGGER privilege on {', '.join(missing[:5])}"
                    f"{' ...' if len(missing) > 5 else ''}. Fix: GRANT TRIGGER ON <schema>.* TO {grantee}; {off}")
    if not int(log_bin or 0) or int(trusted or 0) or "SUPER" in global_privileges:
        return None
    return (f"site {name}: conflicts.tombstones needs setl's tombstone triggers on every table of the channel, and "
            f"user {site.user!r} may not make them there (binlog on, no SUPER, log_bin_trust_function_creators=0: "
            "error 1419). Fix: SET GLOBAL log_bin_trust_function_creators = 1 (and in my.cnf), or GRANT SUPER "
            f"ON *.* TO {grantee}; {off}")


__all__ = ["SiteFacts", "check_channel", "read_site", "refusals"]
