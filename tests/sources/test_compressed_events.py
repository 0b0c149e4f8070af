"""MariaDB's compressed binlog events (`log_bin_compress=ON`) and every other event kind a server
writes: each is read exactly as its plain form, or stops the reader naming it; none is skipped."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pymysql
import pytest
from pymysql.protocol import MysqlPacket
from pymysqlreplication.packet import BinLogPacketWrapper

from setl.adapters.replication import event_classes, event_value
from setl.binlog_events import Unknown
from setl.errors import UnreadableEvent
from setl.model import DdlChange, Position, RowChange, Transaction
from setl.sources.mysql_binlog import compressed
from setl.sources.mysql_binlog.assembler import _EVENTS, _IGNORED_TYPES, IGNORED_EVENTS, _Assembler
from setl.testing.servers import MariaDBServer
from tests.helpers.wait import wait_until
from tests.sources.binlog import execute, head, make_source

pytestmark = pytest.mark.timeout(240)

#: one table of every shape a compressed rows event carries: a key, text long enough to compress, NULLs
_TABLE = ("CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(300), body TEXT, n DECIMAL(12,3), d DATETIME(6), "
          "e ENUM('x','y','z')) ENGINE=InnoDB")


def _workload(table: str) -> list[str]:
    """Statements whose rows and DDL the server writes as compressed events (when compression is on)."""
    rows = ", ".join(f"({i}, '{'name-' * 20}{i}', {'NULL' if i % 3 == 0 else repr('body ' * (i % 40))}, "
                     f"{i}.125, '2024-01-0{1 + i % 9} 10:00:00.{i:06d}', '{'xyz'[i % 3]}')" for i in range(1, 121))
    return [
        _TABLE.format(t=table),
        f"INSERT INTO {table} VALUES {rows}",
        f"UPDATE {table} SET name = CONCAT(name, '-updated'), n = n * 2 WHERE id % 4 = 0",
        f"DELETE FROM {table} WHERE id % 7 = 0",
        f"ALTER TABLE {table} ADD COLUMN extra VARCHAR(100) DEFAULT 'a default long enough to compress well'",
        f"INSERT INTO {table} (id, name, extra) VALUES (1000, 'after the alter', 'x')",
        f"UPDATE {table} SET extra = REPEAT('e', 90) WHERE id < 50",
    ]


def _changes(transactions: list[Transaction], table: str) -> list[tuple[Any, ...]]:
    """The changes to `table`, as comparable tuples (the table's name left out of DDL)."""
    out: list[tuple[Any, ...]] = []
    for tx in transactions:
        for change in tx.changes:
            if isinstance(change, RowChange) and change.table == table:
                out.append((change.op, change.before and dict(change.before), change.after and dict(change.after)))
            elif isinstance(change, DdlChange) and change.table == table:
                out.append(("ddl", change.statement.replace(table, "T")))
    return out


def _read_all(server: MariaDBServer, start: Any, stop_at: Any, **kwargs: Any) -> list[Transaction]:
    """Every transaction from `start` up to the binlog position `stop_at`."""
    src = make_source(server, "earliest", **kwargs)
    src.open(start)
    got: list[Transaction] = []
    try:
        def done() -> bool:
            tx = src.poll(0.2)
            if tx is not None:
                got.append(tx)
            return bool(got) and (got[-1].end.log, got[-1].end.offset) >= (stop_at.log, stop_at.offset)

        wait_until(done, timeout=60, interval=0, message="the reader reaches the binlog's end")
    finally:
        src.close()
    return got


def _binlog_text(server: MariaDBServer, start: Position | None = None) -> str:
    """What `mariadb-binlog` shows of the server's binlogs (event type names included), from `start`
    (a position of its first file to read) or from the first one."""
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    assert tool is not None, "mariadb-binlog is installed with mariadb-client"
    names = [row[0] for row in server.query("SHOW BINARY LOGS")]
    if start is not None:
        names = names[names.index(start.log):]
    where = [f"--start-position={start.offset}"] if start is not None else []
    out = subprocess.run([tool, "--read-from-remote-server", f"--host={server.host}", f"--port={server.port}",
                          "--user=root", *where, *names], capture_output=True, text=True, timeout=60)
    return out.stdout


@pytest.mark.parametrize("checksum", ["CRC32", "NONE"])
@pytest.mark.parametrize("fast_decoder", [True, False], ids=["compiled", "python"])
def test_compressed_events_read_as_their_plain_forms(compressing_mariadb: MariaDBServer, fast_decoder: bool,
                                                   checksum: str) -> None:
    """Rows and DDL written as compressed events give exactly the changes of the same statements
    written uncompressed, with both row decoders (compiled and Python), with and without binlog checksums."""
    db = f"cmp_{'fast' if fast_decoder else 'py'}_{checksum.lower()}"
    compressing_mariadb.query(f"SET GLOBAL binlog_checksum = {checksum}")
    compressing_mariadb.query(f"CREATE DATABASE {db}")
    start = head(compressing_mariadb)
    compressing_mariadb.query("SET GLOBAL log_bin_compress = OFF")
    execute(compressing_mariadb, db, *_workload("plain"))
    compressing_mariadb.query("SET GLOBAL log_bin_compress = ON")
    execute(compressing_mariadb, db, *_workload("packed"))
    end = head(compressing_mariadb)
    got = _read_all(compressing_mariadb, start, end, fast_decoder=fast_decoder)
    plain, packed = _changes(got, "plain"), _changes(got, "packed")
    assert len(plain) == 1 + 120 + 30 + 17 + 1 + 1 + 42, plain[:3]  # the last UPDATE: ids below 50 not deleted
    assert packed == plain
    assert ("ddl", "ALTER TABLE T ADD COLUMN extra VARCHAR(100) DEFAULT 'a default long enough to compress well'") \
        in packed
    text = _binlog_text(compressing_mariadb, start)
    assert "Write_compressed_rows" in text and "Query_compressed" in text, "the server wrote compressed events"


def _file_packets(server: MariaDBServer) -> list[bytes]:
    """Every event of the server's last binlog file, as the stream packet a replica receives (OK byte first)."""
    packets = []
    for name in [server.query("SHOW BINARY LOGS")[-1][0]]:
        data = (server.datadir / name).read_bytes()
        at = 4  # after the file's magic number
        while at + 19 <= len(data):
            size = int.from_bytes(data[at + 9:at + 13], "little")
            if size < 19 or at + size > len(data):
                break  # an event still being written
            packets.append(b"\0" + data[at:at + size])
            at += size
    return packets


def test_corrupt_compressed_event_is_a_clean_error(compressing_mariadb: MariaDBServer) -> None:
    """A compressed event whose bytes are damaged raises CorruptEvent (never a crash, never a skip)."""
    compressing_mariadb.query("SET GLOBAL binlog_checksum = NONE")
    compressing_mariadb.query("FLUSH BINARY LOGS")  # a file of events without checksums
    compressing_mariadb.query("CREATE DATABASE IF NOT EXISTS cmp_corrupt")
    execute(compressing_mariadb, "cmp_corrupt", *_workload("damaged"))
    packets = [p for p in _file_packets(compressing_mariadb) if compressed.is_compressed(p)]
    assert len(packets) >= 5
    for packet in packets:
        compressed.inflate(packet, checksum=False)  # the real ones inflate
        for cut in (21, 30, len(packet) // 2, len(packet) - 1):
            with pytest.raises(compressed.InflateError):
                damaged = bytearray(packet[:cut])
                damaged[10:14] = (len(damaged) - 1).to_bytes(4, "little")
                compressed.inflate(bytes(damaged), checksum=False)
        flipped = bytearray(packet)
        flipped[-3] ^= 0xFF  # inside the zlib stream's checksum
        with pytest.raises(compressed.InflateError):
            compressed.inflate(bytes(flipped), checksum=False)


def _wrapper(packet: bytes, conn: Any) -> Any:
    """The library's packet wrapper (and event) for `packet`, with setl's allowed events."""
    return BinLogPacketWrapper(MysqlPacket(packet, "utf8"), {}, conn, None, False, frozenset(_EVENTS), None,
                               None, None, None, False, False, False, True, False, False, None)


@pytest.mark.parametrize("kind", sorted(set(range(0x01, 0x2D)) | set(range(0xA0, 0xAC)) | {0xB0, 0xFE}))
def test_every_event_type_is_read_or_refused(mariadb_source: MariaDBServer, kind: int) -> None:
    """Every event type a server can write (and unknown ones) is one setl reads, one it knows to
    pass over, or one that stops the reader naming its type and position: never silently skipped."""
    known = event_classes().get(kind)
    if known is not None and known.__name__ != "NotImplementedEvent":
        # a kind the library parses: setl reads it, or passes it over for a stated reason
        # (PARTIAL_UPDATE_ROWS is asked for so that the assembler refuses it: `_REFUSED_TYPES`)
        assert known in _EVENTS or known.__name__ in IGNORED_EVENTS, known
        assert kind not in _IGNORED_TYPES
        return
    conn = pymysql.connect(**mariadb_source.connect_args())
    try:
        conn._get_dbms = lambda: "mariadb"  # what the library's reader gives its control connection
        body = b"\0" * 40
        header = (b"\0" + (1700000000).to_bytes(4, "little") + bytes([kind]) + (1).to_bytes(4, "little")
                  + (19 + len(body)).to_bytes(4, "little") + (12345).to_bytes(4, "little") + b"\0\0")
        if kind in compressed.PLAIN_TYPE:  # read as its plain form: these zero bytes do not inflate
            with pytest.raises(UnreadableEvent, match=f"type {kind}, written with log_bin_compress=ON"):
                compressed.plain_packet(header + body, False, None)  # what setl's stream does before parsing
            return
        wrapper = _wrapper(header + body, conn)
        assert type(wrapper.event).__name__ == "NotImplementedEvent", "the reader asks for unknown kinds too"
        event = event_value(wrapper)
        assert isinstance(event, Unknown) and event.name is None and event.header.event_type == kind
        assembler = _Assembler(Position("mysql-bin.000009", 4), 100, None)
        assembler.log_file = "mysql-bin.000009"
        if kind in _IGNORED_TYPES:
            assert assembler.feed(event) == []
        else:
            with pytest.raises(UnreadableEvent, match=r"ending at mysql-bin\.000009:12345") as raised:
                assembler.feed(event)
            assert f"{kind:#04x}" in str(raised.value)
    finally:
        conn.close()


@pytest.mark.parametrize("fast_decoder", [True, False], ids=["compiled", "library"])
def test_statement_logged_load_data_stops_for_a_selected_table(mariadb_source: MariaDBServer, source_db: str,
                                                                 tmp_path: Any, fast_decoder: bool) -> None:
    """A LOAD DATA a session logged as a statement (BEGIN_LOAD_QUERY, EXECUTE_LOAD_QUERY; once dropped
    unseen) stops the reader for a selected table, and passes for a skipped one, with the statement
    logged rows around it (INTVAR, RAND, USER_VAR) on skipped tables passed over too."""
    data = tmp_path / "rows.tsv"
    data.write_text("".join(f"{i}\tname {i}\n" for i in range(1, 51)))
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, name TEXT)",
            "CREATE TABLE skipped (id INT AUTO_INCREMENT PRIMARY KEY, name TEXT)")
    start = head(mariadb_source)
    conn = pymysql.connect(**mariadb_source.connect_args(database=source_db, local_infile=True, autocommit=True))
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION binlog_format = STATEMENT")
            cur.execute(f"LOAD DATA LOCAL INFILE '{data}' INTO TABLE skipped (id, name)")
            cur.execute("SET @v = 'user variable'")
            cur.execute("INSERT INTO skipped (name) VALUES (@v), (CONCAT('r', RAND(7)))")
            cur.execute("SET SESSION binlog_format = ROW")
            cur.execute("INSERT INTO t VALUES (100, 'row logged')")
            cur.execute("SET SESSION binlog_format = STATEMENT")
            cur.execute(f"LOAD DATA LOCAL INFILE '{data}' INTO TABLE t (id, name)")
    finally:
        conn.close()
    text = _binlog_text(mariadb_source, start)
    assert "Execute_load_query" in text, "the server logged the LOAD DATA as a statement"
    src = make_source(mariadb_source, "earliest", fast_decoder=fast_decoder,
                      selects=lambda schema, table: table != "skipped")
    src.open(start)
    got: list[Transaction] = []
    try:
        def stopped() -> bool:
            tx = src.poll(0.2)
            if tx is not None:
                got.append(tx)
            return False

        with pytest.raises(UnreadableEvent) as raised:
            wait_until(stopped, timeout=30, interval=0, message="the reader stops at the LOAD DATA")
    finally:
        src.close()
    assert [(c.table, c.after["id"]) for tx in got for c in tx.changes if c.schema == source_db] == [("t", 100)]
    message = str(raised.value)
    assert f"{source_db}.t " in message and "LOAD DATA" in message and "mysql-bin." in message
    assert "binlog_format STATEMENT or MIXED" in message
