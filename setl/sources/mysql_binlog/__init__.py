"""A MySQL or MariaDB binary log as a Select: whole transactions of full-image row changes and DDL.

This package and its adapter (`setl.adapters.replication`, the library's internals) are the only
importers of pymysqlreplication, which only parses the bodies of events that are not rows (setl opens
the stream, asks for the dump, frames the packets, decodes every rows event, and reads setl's own
event values, `setl.binlog_events`); nothing the package returns holds a library object.
A background thread reads the binlog with a blocking stream, reconnects when the server goes away,
and hands assembled transactions to `poll` through a bounded queue, so `poll` honours its timeout
and `close` interrupts the read.

The package: `source` (the Select, wiring the parts below), `opening` (settings judgment and where
an open starts), `reader` (the reading thread of one open and its failures), `handoff` (the queue
bounded by rows between that thread and `poll`, and the reader's figures), `server` (connecting to
the server, its settings checks and plain queries, `describe`), `start` (the configured start,
resolved to a checked position), `stream` (setl's binlog stream: the dump asked for, packets framed,
the library a parser of event bodies), `connector` (the stream's connections: one, cut on close),
`lookups` (the kept connection and the reader's table questions), `xa` (prepared XA transactions
read again), `assembler` (events into transactions), `fast` (the compiled rows decoder's stream),
`rowcodec` (setl's row-image decoder in Python, the compiled `_rows`' twin), `decoding` (row images
as setl hands them on), `statements` (SQL text).
"""

from setl.sources.mysql_binlog.assembler import gtid_flavor
from setl.sources.mysql_binlog.ddl_events import KnownTables
from setl.sources.mysql_binlog.decoding import TableKind
from setl.sources.mysql_binlog.server import REQUIRED_SETTINGS
from setl.sources.mysql_binlog.source import MysqlBinlogSource, MysqlSourceConfig
from setl.sources.mysql_binlog.statements import ddl_target, dml_target

__all__ = ["REQUIRED_SETTINGS", "KnownTables", "MysqlBinlogSource", "MysqlSourceConfig",
           "TableKind", "ddl_target", "dml_target", "gtid_flavor"]
