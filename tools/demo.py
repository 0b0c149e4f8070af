#!/usr/bin/env python3
"""The demo behind pipeline p1: two throwaway MariaDB servers, a ``demo`` schema with data and
changes on the source, and a check that the target equals the source.

    python3 tools/demo.py up                       # servers + schema + initial data (idempotent)
    python3 tools/demo.py load [--seconds 30] [--rate 20]    # ongoing changes on the source
    python3 tools/demo.py verify [--pipeline p1]   # row counts and a checksum of every source column
    python3 tools/demo.py down                     # stop both servers (data kept)

The servers live in ``var/dev/p1-source`` and ``var/dev/p1-target`` (so ``tools/devservers.py
status|stop`` sees them; ``--servers DIR`` puts them elsewhere), on ``$SETL_P1_SOURCE_PORT`` (default 13306) and
``$SETL_P1_TARGET_PORT`` (default 13307), the ports ``conf/pipelines/p1.yaml`` reads. `up` reuses
running servers. When the source holds no ``demo`` schema yet it creates it there (its DDL kept
out of the binlog), a replication account ``repl`` for p1, some data and a stream of updates and
deletes; it empties the target (p1 creates its tables and copies the data: ``start: snapshot``)
and forgets p1's old position (meta store and target), which pointed into a binlog that is gone.
Exit codes: 0 ok, 1 failure or (verify) a difference, 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from setl.testing.servers import MariaDBServer, ServerError  # noqa: E402  (after the path tweak)

SERVERS = ROOT / "var" / "dev"
PIPELINE = "p1"
SCHEMA = "demo"
REPL_USER = "repl"
COUNTRIES = ["DE", "FR", "JP", "BR", "NG", "IN", "US"]
TITLES = ["Kaffeemühle ☕", "Crème brûlée torch 🔥", "Tatami mat 畳", "Açaí bowl 🥣", "Desk lamp 💡",
          "Notebook 📓", "Rain jacket 🌧", "Sourdough starter 🍞"]

# The demo schema, on the source; `audit_log` is not replicated (p1 excludes `demo.audit_*`).
TABLES = {
    "customers": """CREATE TABLE IF NOT EXISTS demo.customers (
        id INT NOT NULL PRIMARY KEY,
        name VARCHAR(100) NOT NULL,
        email VARCHAR(200) NULL,
        country CHAR(2) NOT NULL,
        created_at DATETIME(6) NOT NULL
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    "products": """CREATE TABLE IF NOT EXISTS demo.products (
        id INT NOT NULL PRIMARY KEY,
        sku VARCHAR(32) NOT NULL,
        title VARCHAR(200) NOT NULL,
        price DECIMAL(10,2) NOT NULL,
        attributes JSON NULL
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    "orders": """CREATE TABLE IF NOT EXISTS demo.orders (
        id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
        customer_id INT NOT NULL,
        product_id INT NOT NULL,
        quantity SMALLINT UNSIGNED NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        status ENUM('new','paid','shipped','returned') NOT NULL DEFAULT 'new',
        note TEXT NULL,
        updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        KEY by_customer (customer_id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
}
SOURCE_ONLY = {
    "audit_log": """CREATE TABLE IF NOT EXISTS demo.audit_log (
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        note VARCHAR(200) NOT NULL
    ) ENGINE=InnoDB""",
}


def source_port() -> int:
    return int(os.environ.get("SETL_P1_SOURCE_PORT") or 13306)


def target_port() -> int:
    return int(os.environ.get("SETL_P1_TARGET_PORT") or 13307)


def repl_password() -> str:
    return os.environ.get("SETL_P1_REPL_PASSWORD", "setl-demo")


def servers(root: Path = SERVERS) -> tuple[MariaDBServer, MariaDBServer]:
    """Handles on the demo's two servers under `root` (not started; they outlive this process)."""
    source = MariaDBServer(root / "p1-source", port=source_port(), server_id=1).detach()
    target = MariaDBServer(root / "p1-target", port=target_port(), server_id=2).detach()
    return source, target


# --- writing changes ------------------------------------------------------------------------


class Changes:
    """Random business transactions on the source's demo schema (customers, products, orders)."""

    def __init__(self, conn, seed: int | None = None) -> None:
        self.conn = conn
        self.rng = random.Random(seed)
        with conn.cursor() as cur:
            cur.execute("SELECT COALESCE(MAX(id), 0) FROM demo.customers")
            self.customers = cur.fetchone()[0]
            cur.execute("SELECT COALESCE(MAX(id), 0) FROM demo.orders")
            self.orders = cur.fetchone()[0]

    def products(self, count: int = 40) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT IGNORE INTO demo.products VALUES (%s, %s, %s, %s, %s)",
                [(i, f"SKU-{i:05d}", f"{self.rng.choice(TITLES)} #{i}",
                  round(self.rng.uniform(2, 400), 2), f'{{"color": "c{i % 7}", "tags": ["t{i % 3}"]}}')
                 for i in range(1, count + 1)])
        self.conn.commit()

    def transaction(self) -> None:
        """One transaction of one to four changes."""
        rng = self.rng
        with self.conn.cursor() as cur:
            for _ in range(rng.randint(1, 4)):
                roll = rng.random()
                if roll < 0.15 or self.customers < 5:
                    self.customers += 1
                    cid = self.customers
                    cur.execute("INSERT INTO demo.customers VALUES (%s, %s, %s, %s, NOW(6))",
                                (cid, f"Customer {cid}", f"c{cid}@example.com" if cid % 4 else None,
                                 rng.choice(COUNTRIES)))
                elif roll < 0.2:
                    cur.execute("UPDATE demo.customers SET email = %s, country = %s WHERE id = %s",
                                (f"new{rng.randint(1, 99)}@example.com", rng.choice(COUNTRIES),
                                 rng.randint(1, self.customers)))
                elif roll < 0.6 or self.orders < 5:
                    quantity = rng.randint(1, 5)
                    cur.execute("INSERT INTO demo.orders (customer_id, product_id, quantity, amount, note)"
                                " SELECT %s, id, %s, price * %s, %s FROM demo.products WHERE id = %s",
                                (rng.randint(1, self.customers), quantity, quantity,
                                 rng.choice([None, "gift wrap 🎁", "leave at the door"]), rng.randint(1, 40)))
                    self.orders = cur.lastrowid or self.orders
                elif roll < 0.85:
                    cur.execute("UPDATE demo.orders SET status = %s WHERE id = %s",
                                (rng.choice(["paid", "shipped", "returned"]), rng.randint(1, self.orders)))
                elif roll < 0.95:
                    cur.execute("DELETE FROM demo.orders WHERE id = %s", (rng.randint(1, self.orders),))
                else:
                    cur.execute("UPDATE demo.products SET price = price * 1.05 WHERE id = %s",
                                (rng.randint(1, 40),))
                if rng.random() < 0.05:
                    cur.execute("INSERT INTO demo.audit_log (note) VALUES ('not replicated')")
        self.conn.commit()


def _connect(server: MariaDBServer):
    import pymysql

    return pymysql.connect(**server.connect_args(autocommit=False, charset="utf8mb4"))


# --- commands -------------------------------------------------------------------------------


def _forget_position(conf: Path, target: MariaDBServer) -> None:
    """p1's acked position points into a binlog that no longer exists: drop it everywhere."""
    from setl.config import load_node
    from setl.meta import open_meta_store

    meta = open_meta_store(load_node(conf))
    try:
        if PIPELINE in meta.pipelines():
            meta.reset_position(PIPELINE, None)
    finally:
        meta.close()
    with contextlib.closing(target.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.tables"
                    " WHERE table_schema = 'setl' AND table_name = 'setl_position'")
        if cur.fetchone()[0]:
            cur.execute("DELETE FROM setl.setl_position WHERE pipeline = %s", (PIPELINE,))


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def cmd_up(args: argparse.Namespace) -> int:
    source, target = servers(args.servers)
    for role, server in (("source", source), ("target", target)):
        was_running = server.running
        if not was_running and _port_taken(server.port):
            print(f"demo: port {server.port} for the {role} is taken by another process; stop it or set "
                  f"SETL_P1_{role.upper()}_PORT to a free port", file=sys.stderr)
            return 1
        server.start()
        print(f"{role}: MariaDB on {server.host}:{server.port} ({'reused' if was_running else 'started'},"
              f" data in {server.base_dir})")
    if not source.query("SHOW DATABASES LIKE %s", (SCHEMA,)):
        _create_schema(args.conf, source, target)
        print(f"created the {SCHEMA} schema and the {REPL_USER} account on the source; the target is empty")
    if source.query(f"SELECT 1 FROM {SCHEMA}.customers LIMIT 1"):
        print(f"the source's {SCHEMA} schema holds data already: nothing to add")
        return 0
    with contextlib.closing(_connect(source)) as conn:
        changes = Changes(conn, seed=7)
        changes.products()
        for _ in range(args.transactions):
            changes.transaction()
    print(f"wrote {args.transactions} transactions on the source")
    return 0


def _create_schema(conf: Path, source: MariaDBServer, target: MariaDBServer) -> None:
    with contextlib.closing(source.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")  # p1 sees rows only; the target gets the DDL below
        cur.execute(f"CREATE DATABASE {SCHEMA}")
        for ddl in [*TABLES.values(), *SOURCE_ONLY.values()]:
            cur.execute(ddl)
        cur.execute(f"CREATE USER IF NOT EXISTS '{REPL_USER}'@'127.0.0.1' IDENTIFIED BY %s", (repl_password(),))
        cur.execute(f"GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO '{REPL_USER}'@'127.0.0.1'")
    with contextlib.closing(target.connect()) as conn, conn.cursor() as cur:
        # The target starts empty: p1 creates its tables (pipeline.create_tables) and copies the data.
        cur.execute(f"DROP DATABASE IF EXISTS {SCHEMA}")
    _forget_position(conf, target)


def cmd_load(args: argparse.Namespace) -> int:
    source, _ = servers(args.servers)
    if not source.running:
        print("demo: the source server is not running; run `python3 tools/demo.py up`", file=sys.stderr)
        return 1
    written = 0
    started = time.monotonic()
    with contextlib.closing(_connect(source)) as conn:
        changes = Changes(conn)
        while (elapsed := time.monotonic() - started) < args.seconds:
            changes.transaction()
            written += 1
            ahead = written / args.rate - elapsed
            if ahead > 0:
                time.sleep(ahead)
    print(f"wrote {written} transactions in {time.monotonic() - started:.1f}s")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Compare every source table the pipeline replicates with its target table."""
    from setl.config import load_pipeline
    from setl.connectors import registry
    from setl.errors import SetlError
    from setl.routing import RoutingPlan

    try:
        config = load_pipeline(args.conf, args.pipeline, registry())
    except SetlError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    if config.source.type != "mysql" or config.target.type != "mysql":
        print(f"demo: verify compares MySQL/MariaDB source and target; {args.pipeline} is "
              f"{config.source.type} -> {config.target.type}", file=sys.stderr)
        return 2
    plan = RoutingPlan.compile(config.tables, pipeline=config.name)
    import pymysql

    def connect(cfg):
        return pymysql.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                               autocommit=True, charset="utf8mb4")

    def count_and_checksum(cur, name: str, columns: list[str]) -> tuple[int, int | None] | None:
        """Rows and a checksum of `columns` (in that order), the same on both sides whatever other
        columns the target has (a transform's added ones): CRC32 of each row's QUOTE()d values,
        summed and XORed, so that neither order nor a pair of equal rows hides a difference."""
        row = "CONCAT_WS(',', " + ", ".join(f"QUOTE(`{c.replace('`', '``')}`)" for c in columns) + ")"
        try:
            cur.execute(f"SELECT COUNT(*), COALESCE(SUM(CRC32({row})), 0) * 4294967296"
                        f" + COALESCE(BIT_XOR(CRC32(CONCAT('x', {row}))), 0) FROM {name}")
            count, checksum = cur.fetchone()
            return int(count), int(checksum)
        except pymysql.MySQLError:
            return None

    def source_columns(cur, schema: str, table: str) -> list[str]:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
                    " AND table_name = %s ORDER BY ordinal_position", (schema, table))
        return [r[0] for r in cur.fetchall()]

    try:
        src, dst = connect(config.source), connect(config.target)
    except pymysql.MySQLError as exc:
        print(f"demo: cannot connect: {exc}", file=sys.stderr)
        return 1
    differ = compared = 0
    with contextlib.closing(src), contextlib.closing(dst), src.cursor() as scur, dst.cursor() as dcur:
        scur.execute("SELECT table_schema, table_name FROM information_schema.tables"
                     " WHERE table_type = 'BASE TABLE' AND table_schema NOT IN"
                     " ('mysql', 'information_schema', 'performance_schema', 'sys', 'setl')"
                     " ORDER BY 1, 2")
        for schema, table in scur.fetchall():
            route = plan.route(schema, table)
            if route is None:
                continue
            compared += 1
            source_name = f"`{schema}`.`{table}`"
            target = route.target
            target_name = f"`{target.schema}`.`{target.table}`"
            columns = [c for c in source_columns(scur, schema, table) if route.keeps(c)]
            mine = count_and_checksum(scur, source_name, columns)
            theirs = count_and_checksum(dcur, target_name, [route.rename.get(c, c) for c in columns])
            label = f"{schema}.{table}" + ("" if (schema, table) == (target.schema, target.table)
                                           else f" -> {target.schema}.{target.table}")
            if theirs is None:
                differ += 1
                print(f"{label}: missing in the target")
            elif mine != theirs:
                differ += 1
                print(f"{label}: DIFFERENT: source {mine[0]} rows (checksum {mine[1]}), "
                      f"target {theirs[0]} rows (checksum {theirs[1]})")
            else:
                print(f"{label}: {mine[0]} rows, {len(columns)} columns, checksum {mine[1]}: equal")
    if not compared:
        print(f"demo: the source has no table that {args.pipeline} replicates", file=sys.stderr)
        return 1
    print(f"{compared - differ} of {compared} tables equal" + ("" if not differ else "; the target is behind or wrong"))
    return 1 if differ else 0


def cmd_down(args: argparse.Namespace) -> int:
    for server in servers(args.servers):
        if server.running:
            server.stop()
            print(f"stopped: MariaDB on port {server.port} ({server.base_dir})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", type=Path, default=Path(os.environ.get("SETL_CONF") or ROOT / "conf"),
                        help="setl's configuration directory (default: $SETL_CONF or conf/)")
    parser.add_argument("--servers", type=Path, default=SERVERS,
                        help="where the two servers live (default: var/dev, as for tools/devservers.py)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the servers, create the schema and initial data")
    up.add_argument("--transactions", type=int, default=3000, help="initial transactions (default 3000)")
    up.set_defaults(func=cmd_up)
    load = commands.add_parser("load", help="write ongoing changes on the source")
    load.add_argument("--seconds", type=float, default=30)
    load.add_argument("--rate", type=float, default=20, help="transactions per second (default 20)")
    load.set_defaults(func=cmd_load)
    verify = commands.add_parser("verify", help="compare the source's tables with the target's")
    verify.add_argument("--pipeline", default=PIPELINE)
    verify.set_defaults(func=cmd_verify)
    down = commands.add_parser("down", help="stop both servers (data is kept)")
    down.set_defaults(func=cmd_down)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ServerError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
