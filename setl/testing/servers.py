"""Throwaway MariaDB, PostgreSQL, ZooKeeper and Spark standalone servers in their own directories
on free loopback ports.

Tests start them through `setl.testing.fixtures`; operators and the demo start long-lived ones
with ``tools/devservers.py``. Nothing here is meant for production.

Every server lives in a *base directory* (a fresh temp dir unless one is given) holding its data,
its log (`log_path`) and a small ``server.json`` with its kind, port and pid, so that a later
process can find, stop or restart a server it did not start. A server started by this process is
stopped when the process exits (an ``atexit`` safety net), unless it was `detach`-ed; when it was
started from the main thread it also dies if the process is SIGKILL-ed (Linux parent-death
signal), so a crashed test run leaves no JVM or mariadbd behind.

Conventions:

A handle made for a base dir holding a server started elsewhere (`open_server`) does not stop
it at exit.

* MariaDB: root user, empty password unless ``password=`` is given; binlog on, ROW format, full
  row images and full metadata, as setl's binlog source requires. ``options={...}`` overrides or
  adds ``[mysqld]`` settings (``{"binlog_format": "STATEMENT"}``); a value of None removes one.
* PostgreSQL: superuser ``postgres``, trust authentication on loopback, no password. Runs as the
  ``postgres`` OS user when this process is root.
* ZooKeeper: standalone, ``tickTime=500`` (sessions of 1 to 10 s), four-letter words enabled.
* Spark: a standalone master and one worker from pyspark's own scripts; ``master_url`` is what
  ``spark.master`` takes.

Programs are found at Debian's paths; ``SETL_MARIADBD``, ``SETL_MARIADB_INSTALL_DB``,
``SETL_PG_BIN`` (a directory with initdb and pg_ctl), ``SETL_ZK_SERVER_SH`` and
``SETL_JAVA_SHARE`` (ZooKeeper's jars) name others.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

HOST = "127.0.0.1"



def _postgres_bin() -> Path:
    """Debian's PostgreSQL binaries: the newest /usr/lib/postgresql/N/bin (15 on these machines)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


# Where the servers' programs are: Debian's paths unless the environment names others (for
# another distribution, or a server built from source).
MARIADB_INSTALL_DB = os.environ.get("SETL_MARIADB_INSTALL_DB", "mariadb-install-db")
MARIADBD = os.environ.get("SETL_MARIADBD", "/usr/sbin/mariadbd")
PG_BIN = Path(os.environ.get("SETL_PG_BIN") or _postgres_bin())
ZK_SERVER_SH = Path(os.environ.get("SETL_ZK_SERVER_SH", "/usr/share/zookeeper/bin/zkServer.sh"))
_JAVA_SHARE = Path(os.environ.get("SETL_JAVA_SHARE", "/usr/share/java"))

T = TypeVar("T")


class ServerError(RuntimeError):
    """A throwaway server failed to initialise, start or stop. The message ends with its log tail."""


def free_port(host: str = HOST) -> int:
    """A TCP port that is free on `host` right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_until(
    condition: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll `condition` until it returns a truthy value, and return that value.

    Raises TimeoutError naming `message` (a string or a callable that builds one) once `timeout`
    seconds pass. Exceptions raised by `condition` propagate.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {text}")
        time.sleep(interval)


# --- processes ------------------------------------------------------------------------------


def pid_alive(pid: int | None) -> bool:
    """Whether `pid` runs (a zombie counts as dead: nobody may reap it in a container)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    state = stat.rpartition(")")[2].split()[0]
    return state not in ("Z", "X")


def _children(pid: int) -> list[int]:
    """Every descendant of `pid`, found through /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect `pid`'s exit status if it is our (possibly adopted) child."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


_libc: Any = None


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = False
    return _libc


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec
    if _libc:  # loaded by the parent: no dlopen between fork and exec
        _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_subreaper = False


def _become_subreaper() -> None:
    """Adopt orphaned descendants (pg_ctl's postmaster), so they can be reaped here.

    In a container whose init never reaps, a daemon that exits stays a zombie and keeps its
    pid "alive" to kill(pid, 0), which makes PostgreSQL refuse to restart on that data dir.
    """
    global _subreaper
    if not _subreaper:
        libc = _load_libc()
        if libc:
            libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
        _subreaper = True


_registry: list["Server"] = []
_registry_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _registry_lock:
        servers = list(_registry)
    for server in servers:
        with contextlib.suppress(Exception):
            server.cleanup(timeout=10)


def running_servers() -> list["Server"]:
    """Servers started by this process that run now (for dumping logs on a test failure)."""
    with _registry_lock:
        return [s for s in _registry if s.running]


# --- the common part ------------------------------------------------------------------------


class Server:
    """One throwaway server process. Subclasses say how to initialise, launch and probe it.

    `start()` initialises the base directory on first use, launches the server and returns once a
    client can connect (or raises `ServerError` with the log tail after `startup_timeout`).
    `stop()` shuts it down cleanly, `kill()` sends SIGKILL (a crash: data survives as it would
    on a real server), `restart()` is stop then start on the same port. `cleanup()` stops it and
    removes the base directory if it was a temp dir made here. As a context manager it starts on
    entry and cleans up on exit. `options` are server settings written over `DEFAULT_OPTIONS`.
    """

    kind = "server"
    host = HOST
    DEFAULT_OPTIONS: Mapping[str, Any] = {}

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.options = dict(options or {})
        self._own_dir = base_dir is None
        if base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix=f"setl-{self.kind}-"))
        else:
            self.base_dir = Path(base_dir).absolute()
        state = self._read_state()
        self._port_fixed = port is not None or "port" in state
        self.port: int = int(port or state.get("port") or free_port())
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._detached = False
        self._log_offset = 0
        self._lock = threading.RLock()
        if self._own_dir:  # remove the temp dir at exit even if never started
            self._register()

    def _register(self) -> None:
        with _registry_lock:
            if self not in _registry and not self._detached:
                _registry.append(self)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.host}:{self.port} {state} in {self.base_dir}>"

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    # -- what subclasses provide

    @property
    def log_path(self) -> Path:
        """The server's log file (its error log or console output)."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """Create the data directory on first start; write config files."""

    def _launch(self) -> None:
        """Start the server process; may return before it accepts clients."""
        raise NotImplementedError

    def _probe(self) -> None:
        """Raise unless a client can connect and run a trivial request."""
        raise NotImplementedError

    def _after_first_start(self) -> None:
        """One-off setup once a freshly initialised server answers."""

    def _graceful_stop(self, timeout: float) -> None:
        pid = self.pid
        if pid:
            _signal(pid, signal.SIGTERM)

    def _read_pid(self) -> int | None:
        return self._read_state().get("pid")

    # -- state file

    @property
    def state_path(self) -> Path:
        return self.base_dir / "server.json"

    def _read_state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}

    def _write_state(self, **extra: Any) -> None:
        state = {"kind": self.kind, "host": self.host, "port": self.port, **extra}
        self.state_path.write_text(json.dumps(state))

    # -- public API

    @property
    def pid(self) -> int | None:
        """The server's main process id, if it is running."""
        if self._proc is not None:
            self._proc.poll()  # reap, so a dead child does not linger as a zombie
        pid = self._read_pid()
        if pid_alive(pid):
            return pid
        if pid:
            _reap(pid)
        return None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def start(self):
        """Start the server and wait until it accepts clients. A no-op if it already runs."""
        with self._lock:
            if self.running:
                self._wait_ready()
                return self
            self._register()  # started here: stopped at exit unless detached
            self.base_dir.mkdir(parents=True, exist_ok=True)
            self._log_offset = self._log_size()
            fresh = self._prepare_fresh()
            for attempt in range(3):
                self._log_offset = self._log_size()
                self._launch()
                try:
                    self._wait_ready()
                    break
                except ServerError:
                    if self._port_fixed or attempt == 2 or not self._port_taken():
                        raise
                    self.port = free_port()  # lost a race for the port: take another
            if fresh:
                self._after_first_start()
            return self

    def _prepare_fresh(self) -> bool:
        before = self._initialised()
        self._prepare()
        return not before

    def _initialised(self) -> bool:
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """Shut the server down cleanly; SIGKILL it if it has not exited after `timeout`."""
        with self._lock:
            pid = self.pid
            if pid is None:
                return
            self._graceful_stop(timeout)
            if not self._wait_gone(pid, timeout):
                self.kill()
            _reap(pid)

    def kill(self) -> None:
        """SIGKILL the server and its child processes, as a crash would, and wait until gone."""
        with self._lock:
            pid = self.pid
            if pid is None:
                return
            family = _children(pid)
            _signal(pid, signal.SIGKILL)
            for child in family:
                _signal(child, signal.SIGKILL)
            for one in [pid, *family]:
                _reap(one)
                if not self._wait_gone(one, 10):
                    raise ServerError(f"{self.kind} process {one} survived SIGKILL")

    def restart(self, timeout: float = 30.0):
        """Stop (cleanly) and start again on the same port, keeping the data."""
        with self._lock:
            self.stop(timeout)
            self._port_fixed = True
            return self.start()

    def cleanup(self, timeout: float = 30.0) -> None:
        """Stop the server and delete its base directory if it is a temp dir made here."""
        with self._lock:
            try:
                self.stop(timeout)
            except Exception:  # noqa: BLE001 - a server that does not stop cleanly is killed
                self.kill()
            with _registry_lock:
                if self in _registry:
                    _registry.remove(self)
            if self._own_dir:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    def detach(self):
        """Let the server outlive this process: no stop at exit, and (called before `start`) no
        death with it. Find and stop it later through its base dir (`open_server`)."""
        self._detached = True
        with _registry_lock:
            if self in _registry:
                _registry.remove(self)
        return self

    def tail_log(self, lines: int = 50) -> str:
        """The last `lines` lines of the server's log ('' when there is none yet)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 256 * lines))
                data = f.read()
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    # -- helpers

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _log_since_launch(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _port_taken(self) -> bool:
        text = self._log_since_launch().lower()
        return "address already in use" in text or "already have another" in text

    def _failure(self, what: str) -> ServerError:
        errors = [line for line in self._log_since_launch().splitlines()
                  if any(word in line for word in ("ERROR", "FATAL", "Exception", "error:"))]
        text = f"{self.kind} on {self.host}:{self.port} ({self.base_dir}) {what}"
        if errors:
            text += "\nerrors logged:\n" + "\n".join(errors[:10])
        return ServerError(f"{text}\nlog {self.log_path} ends with:\n{self.tail_log(40)}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last: BaseException | None = None
        while True:
            if not self.running:
                raise self._failure(f"exited during startup (last probe error: {last})")
            try:
                self._probe()
                return
            except Exception as exc:  # noqa: BLE001 - anything the client library raises while the server boots
                last = exc
            if time.monotonic() >= deadline:
                error = self._failure(f"did not accept clients within {self.startup_timeout:.0f}s "
                                      f"(last probe error: {last})")
                self.kill()
                raise error
            time.sleep(0.05)

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while pid_alive(pid):
            if self._proc is not None:
                self._proc.poll()
            _reap(pid)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        _reap(pid)  # it may have become our zombie only now
        return True

    def _popen(self, argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Launch `argv` in its own session, output appended to the log; record its pid."""
        # The parent-death signal fires when the *thread* that forked exits, so only use it
        # from the main thread, and never for a server meant to outlive us.
        die_with_us = not self._detached and threading.current_thread() is threading.main_thread()
        if die_with_us:
            _load_libc()
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=_set_parent_death_signal if die_with_us else None,
            )
        self._proc = proc
        self._write_state(pid=proc.pid)
        return proc

    def _run(self, argv: list[str], what: str, timeout: float = 120.0) -> str:
        """Run a setup command to completion; raise ServerError with its output if it fails."""
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout, cwd=self.base_dir)
        except subprocess.TimeoutExpired as exc:
            raise ServerError(f"{self.kind}: {what} timed out after {timeout:.0f}s") from exc
        output = (done.stdout + done.stderr).decode("utf-8", "replace")
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(output)
        if done.returncode != 0:
            raise self._failure(f"{what} failed with exit code {done.returncode}")
        return output


def _is_root() -> bool:
    return os.geteuid() == 0


# --- MariaDB --------------------------------------------------------------------------------


class MariaDBServer(Server):
    """A MariaDB server with a ROW-format binlog, root user on 127.0.0.1.

    `options` adds to or overrides the ``[mysqld]`` settings below (keys may use ``-`` or
    ``_``; a None value drops a setting). `password` is root's password (empty by default).
    `tls` (``{"ca": ..., "cert": ..., "key": ...}``, PEM files) serves TLS with that server
    certificate; `require_tls` refuses clients without it (``require_secure_transport``). The
    server's own clients (`connect`, `query`) then use TLS, trusting `tls["ca"]`.
    """

    kind = "mariadb"
    user = "root"

    DEFAULT_OPTIONS: Mapping[str, Any] = {
        "bind_address": HOST,
        "log_bin": "mysql-bin",
        "binlog_format": "ROW",
        "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL",
        "character_set_server": "utf8mb4",
        "collation_server": "utf8mb4_general_ci",
        "skip_name_resolve": True,
        "innodb_buffer_pool_size": "64M",
        "innodb_log_file_size": "16M",
        "innodb_flush_log_at_trx_commit": 2,  # survives a process kill, not a power cut
        "sync_binlog": 0,
        "max_connections": 200,
        "performance_schema": "OFF",
    }

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        *,
        server_id: int = 1,
        password: str = "",
        options: Mapping[str, Any] | None = None,
        startup_timeout: float = 60.0,
        tls: Mapping[str, str] | None = None,
        require_tls: bool = False,
    ) -> None:
        if tls is not None:
            options = {"ssl_ca": tls["ca"], "ssl_cert": tls["cert"], "ssl_key": tls["key"],
                       "require_secure_transport": "ON" if require_tls else "OFF", **(options or {})}
        super().__init__(base_dir, port, options=options, startup_timeout=startup_timeout)
        self.server_id = server_id
        self.password = password
        self.tls = dict(tls) if tls is not None else None

    @property
    def datadir(self) -> Path:
        return self.base_dir / "data"

    @property
    def defaults_file(self) -> Path:
        return self.base_dir / "my.cnf"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "mariadb.err"

    @property
    def socket_path(self) -> Path:
        path = self.base_dir / "mysqld.sock"
        if len(str(path)) < 100:
            return path
        return Path(tempfile.gettempdir()) / f"setl-mariadb-{self.port}.sock"  # AF_UNIX path limit

    def settings(self) -> dict[str, Any]:
        """The ``[mysqld]`` settings the server runs with."""
        merged: dict[str, Any] = {
            "datadir": str(self.datadir),
            "socket": str(self.socket_path),
            "port": self.port,
            "pid_file": str(self.base_dir / "mariadbd.pid"),
            "log_error": str(self.log_path),
            "server_id": self.server_id,
            # Its own tmpdir: a starting mariadbd deletes every #sql* file in its tmpdir, which
            # breaks another server's mariadb-install-db running at the same time in a shared /tmp.
            "tmpdir": str(self.base_dir / "tmp"),
        }
        if _is_root():
            merged["user"] = "root"
        for source in (self.DEFAULT_OPTIONS, self.options):
            for key, value in source.items():
                merged[key.replace("-", "_")] = value
        return {k: v for k, v in merged.items() if v is not None and v is not False}

    def _write_defaults_file(self) -> None:
        (self.base_dir / "tmp").mkdir(exist_ok=True)
        lines = ["[mysqld]"]
        for key, value in self.settings().items():
            lines.append(key if value is True else f"{key}={value}")
        lines += ["", "[client]", f"socket={self.socket_path}", f"port={self.port}", "user=root", ""]
        self.defaults_file.write_text("\n".join(lines))

    def _initialised(self) -> bool:
        return (self.datadir / "mysql").is_dir()

    def _prepare(self) -> None:
        self._write_defaults_file()
        if self._initialised():
            return
        self._run([MARIADB_INSTALL_DB, f"--defaults-file={self.defaults_file}",
                   "--auth-root-authentication-method=normal", "--skip-test-db"],
                  "mariadb-install-db")

    def _launch(self) -> None:
        self._write_defaults_file()
        self._popen([MARIADBD, f"--defaults-file={self.defaults_file}"])

    def _probe(self) -> None:
        with contextlib.closing(self.connect(connect_timeout=2, password=self._probe_password())) as conn, \
                conn.cursor() as cur:
            cur.execute("SELECT @@datadir")
            (datadir,) = cur.fetchone()
        if Path(datadir).resolve() != self.datadir.resolve():
            # another server holds the port; ours will fail to bind and exit with that in its log
            raise ServerError(f"{self.host}:{self.port} is answered by another server (datadir {datadir})")

    def _probe_password(self) -> str:
        return self.password if self._read_state().get("password_set") else ""

    def _after_first_start(self) -> None:
        with contextlib.closing(self.connect(password="")) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")  # a binlog reader sees none of this
            # anonymous users, and host-name accounts that skip-name-resolve ignores
            local = "('localhost', '127.0.0.1', '::1')"
            cur.execute(f"DELETE FROM mysql.global_priv WHERE User = '' OR Host NOT IN {local}")
            cur.execute(f"DELETE FROM mysql.proxies_priv WHERE Host NOT IN {local}")
            cur.execute("FLUSH PRIVILEGES")
            if self.password:
                cur.execute("SELECT User, Host FROM mysql.global_priv WHERE User = 'root'")
                for user, host in cur.fetchall():
                    cur.execute("ALTER USER %s@%s IDENTIFIED BY %s", (user, host, self.password))
        self._write_state(pid=self._read_pid(), password_set=bool(self.password))

    def _write_state(self, **extra: Any) -> None:
        extra.setdefault("password_set", self._read_state().get("password_set", False))
        super()._write_state(**extra)

    # -- clients

    def connect_args(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` (root over TCP)."""
        args: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user,
                                "password": self.password}
        if self.tls is not None:
            args["ssl"] = {"ca": self.tls["ca"]}
        args.update(overrides)
        return args

    def dsn(self, database: str = "") -> str:
        """A ``mysql://`` URL for this server."""
        auth = f"{self.user}:{self.password}" if self.password else self.user
        return f"mysql://{auth}@{self.host}:{self.port}/{database}"

    def connect(self, **overrides: Any):
        """A new PyMySQL connection, in autocommit mode unless `autocommit=False` is given."""
        import pymysql

        return pymysql.connect(**self.connect_args(**{"autocommit": True, **overrides}))

    def query(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement on a fresh connection and return its rows."""
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def target_config(self, database: str | None = None):
        """A `MysqlTargetConfig` pointing at this server."""
        from setl.sinks.mysql import MysqlTargetConfig

        return MysqlTargetConfig(type="mysql", host=self.host, port=self.port, user=self.user,
                                 password=self.password, database=database)

    def source_config(self, server_id: int = 1001, start: Any = "earliest"):
        """A `MysqlSourceConfig` reading this server's binlog."""
        from setl.sources.mysql_binlog import MysqlSourceConfig

        return MysqlSourceConfig(type="mysql", host=self.host, port=self.port, user=self.user,
                                 password=self.password, server_id=server_id, flavor="mariadb",
                                 start=start)


# --- PostgreSQL -----------------------------------------------------------------------------


class PostgresServer(Server):
    """A PostgreSQL 15 server, superuser ``postgres`` with trust auth on loopback.

    `options` are ``postgresql.conf`` settings added to the defaults below. `tls`
    (``{"ca": ..., "cert": ..., "key": ...}``, PEM files, copied into the base directory for the
    server's OS user) turns ``ssl`` on with that server certificate. `hba`, when given, replaces
    ``pg_hba.conf`` (for instance ``hostssl`` lines only, to refuse clients without TLS).
    """

    kind = "postgres"
    user = "postgres"
    os_user = "postgres"

    DEFAULT_OPTIONS: Mapping[str, Any] = {
        "fsync": "off",  # a process kill loses nothing; only a power cut would
        "full_page_writes": "off",
        "shared_buffers": "32MB",
        "max_connections": 100,
        "log_min_messages": "warning",
        "log_line_prefix": "'%m [%p] %q%u@%d '",
    }

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        startup_timeout: float = 60.0,
        tls: Mapping[str, str] | None = None,
        hba: Sequence[str] | None = None,
    ) -> None:
        super().__init__(base_dir, port, options=options, startup_timeout=startup_timeout)
        self.tls = dict(tls) if tls is not None else None
        self.hba = list(hba) if hba is not None else None

    @property
    def datadir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir

    @property
    def log_path(self) -> Path:
        return self.base_dir / "postgres.log"

    def _as_os_user(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", self.os_user, "--", *argv] if _is_root() else argv

    def _chown(self) -> None:
        if not _is_root():
            return
        entry = pwd.getpwnam(self.os_user)
        for root, dirs, files in os.walk(self.base_dir):
            for name in [root, *(os.path.join(root, d) for d in dirs),
                         *(os.path.join(root, f) for f in files)]:
                os.chown(name, entry.pw_uid, entry.pw_gid)

    def _initialised(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def _prepare(self) -> None:
        if not self._initialised():
            self.log_path.touch()
            self._chown()
            if _is_root() and subprocess.run(self._as_os_user(["test", "-w", str(self.base_dir)]),
                                             check=False).returncode != 0:
                raise ServerError(f"postgres: the {self.os_user} OS user cannot write to "
                                  f"{self.base_dir}; give it search permission (o+x) on "
                                  f"every parent directory")
            self._run(self._as_os_user([str(PG_BIN / "initdb"), "-D", str(self.datadir),
                                        "-U", self.user, "--auth=trust", "-E", "UTF8",
                                        "--locale=C", "--no-sync"]), "initdb")
            with open(self.datadir / "postgresql.conf", "a") as conf:
                conf.write("\ninclude_if_exists = 'setl-server.conf'\n")
        settings = {**self.DEFAULT_OPTIONS, **self._tls_options(), **self.options}
        lines = [f"{k} = {v}" for k, v in settings.items() if v is not None]
        (self.datadir / "setl-server.conf").write_text("\n".join(lines) + "\n")
        if self.hba is not None:
            (self.datadir / "pg_hba.conf").write_text("\n".join(self.hba) + "\n")
        self._chown()

    def _tls_options(self) -> dict[str, Any]:
        """``ssl = on`` with copies of the `tls` files the server's OS user can read (key 0600)."""
        if self.tls is None:
            return {}
        folder = self.base_dir / "tls"
        folder.mkdir(exist_ok=True)
        options: dict[str, Any] = {"ssl": "on"}
        for key, setting in (("ca", "ssl_ca_file"), ("cert", "ssl_cert_file"), ("key", "ssl_key_file")):
            copy = folder / f"server-{key}.pem"
            shutil.copyfile(self.tls[key], copy)
            copy.chmod(0o600)
            options[setting] = f"'{copy}'"
        return options

    def _read_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def _launch(self) -> None:
        self._write_state()
        lock = self.datadir / "postmaster.pid"
        if lock.exists() and not pid_alive(self._read_pid()):
            lock.unlink()  # left by a killed postmaster; a zombie pid would block the start
        _become_subreaper()
        server_opts = f"-p {self.port} -k {self.socket_dir} -c listen_addresses={self.host}"
        argv = [str(PG_BIN / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.log_path),
                "-w", "-t", str(int(self.startup_timeout)), "-o", server_opts, "start"]
        self._run(self._as_os_user(argv), "pg_ctl start", timeout=self.startup_timeout + 10)

    def _graceful_stop(self, timeout: float) -> None:
        argv = [str(PG_BIN / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w",
                "-t", str(int(timeout)), "stop"]
        with contextlib.suppress(ServerError):
            self._run(self._as_os_user(argv), "pg_ctl stop", timeout=timeout + 10)

    def _probe(self) -> None:
        self.connect(connect_timeout=2).close()

    # -- clients

    def connect_args(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``psycopg.connect``."""
        args: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user,
                                "dbname": "postgres"}
        args.update(overrides)
        return args

    def dsn(self, database: str = "postgres") -> str:
        """A libpq connection string for this server."""
        return f"host={self.host} port={self.port} user={self.user} dbname={database}"

    def connect(self, **overrides: Any):
        """A new psycopg connection, in autocommit mode unless `autocommit=False` is given."""
        import psycopg

        return psycopg.connect(**self.connect_args(**{"autocommit": True, **overrides}))

    def query(self, sql: str, args: Any = None, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement on a fresh connection and return its rows (if any)."""
        with self.connect(dbname=dbname) as conn:
            cur = conn.execute(sql, args)
            return list(cur.fetchall()) if cur.description else []

    def target_config(self, database: str = "postgres"):
        """A `PostgresqlTargetConfig` pointing at this server."""
        from setl.sinks.postgresql import PostgresqlTargetConfig

        return PostgresqlTargetConfig(type="postgresql", host=self.host, port=self.port,
                                      user=self.user, password="", database=database)


# --- ZooKeeper ------------------------------------------------------------------------------

_LOG4J = """\
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
"""


def _zk_session_handshake(host: str, port: int, timeout: float) -> int:
    """Open and close a ZooKeeper session over the wire protocol; return its session id."""

    def read_exactly(sock: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("zookeeper closed the connection")
            data += chunk
        return data

    with socket.create_connection((host, port), timeout=timeout) as sock:
        # ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd, readOnly
        body = struct.pack(">iqiqi", 0, 0, 2000, 0, 16) + b"\0" * 16 + b"\0"
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", read_exactly(sock, 4))
        _, _, session_id = struct.unpack(">iiq", read_exactly(sock, size)[:16])
        if not session_id:
            raise ConnectionError("zookeeper refused the session")
        sock.sendall(struct.pack(">iii", 8, 1, -11))  # closeSession, so it does not linger
        with contextlib.suppress(OSError):
            read_exactly(sock, 4)
        return session_id


class ZooKeeperServer(Server):
    """A standalone ZooKeeper 3.8 server.

    Runs ``zkServer.sh start-foreground`` as a child process (the script execs the JVM, so the
    pid is the JVM's). Debian's zkEnv.sh forces ``ZOOCFGDIR`` and ``ZOO_LOG_DIR`` to system
    paths and its daemon mode writes one shared ``.out`` file for every instance, so the
    foreground mode with our own output file is what keeps instances apart. `options` are
    zoo.cfg settings added to the defaults below.
    """

    kind = "zookeeper"

    DEFAULT_OPTIONS: Mapping[str, Any] = {
        "tickTime": 500,
        "initLimit": 10,
        "syncLimit": 5,
        "maxClientCnxns": 0,
        "admin.enableServer": "false",
        "4lw.commands.whitelist": "*",
    }

    @property
    def config_path(self) -> Path:
        return self.base_dir / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "zookeeper.log"

    @property
    def hosts(self) -> str:
        """The connection string for kazoo (``host:port``)."""
        return f"{self.host}:{self.port}"

    def dsn(self) -> str:
        return self.hosts

    def connect_args(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``kazoo.client.KazooClient``."""
        return {"hosts": self.hosts, **overrides}

    def _prepare(self) -> None:
        settings = {**self.DEFAULT_OPTIONS, "dataDir": str(self.base_dir / "data"),
                    "clientPort": self.port, "clientPortAddress": self.host, **self.options}
        lines = [f"{k}={v}" for k, v in settings.items() if v is not None]
        self.config_path.write_text("\n".join(lines) + "\n")
        (self.base_dir / "log4j.properties").write_text(_LOG4J)

    def _launch(self) -> None:
        self._prepare()  # the port may have changed since the first attempt
        flags = ["-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
        jars = [_JAVA_SHARE / "zookeeper.jar", _JAVA_SHARE / "slf4j-log4j12.jar",
                _JAVA_SHARE / "log4j-1.2.jar"]
        if all(j.exists() for j in jars):
            # The script's CLASSPATH has no slf4j binding, so ZooKeeper would log nothing;
            # a second -cp (JVMFLAGS comes after the script's) adds log4j.
            classpath = ":".join([str(self.base_dir), *map(str, jars)])
            flags += ["-cp", classpath,
                      f"-Dlog4j.configuration=file:{self.base_dir / 'log4j.properties'}"]
        env = dict(os.environ, ZOOCFGDIR=str(self.base_dir), ZOO_LOG_DIR=str(self.base_dir),
                   ZOOPIDFILE=str(self.base_dir / "zookeeper_server.pid"), JMXDISABLE="true",
                   JVMFLAGS=" ".join(flags))
        self._popen([str(ZK_SERVER_SH), "start-foreground", str(self.config_path)], env=env)

    def _probe(self) -> None:
        _zk_session_handshake(self.host, self.port, timeout=2)

    def four_letter_word(self, word: str = "srvr") -> str:
        """Send a four-letter command (``ruok``, ``srvr``, ``mntr``...) and return the answer."""
        with socket.create_connection((self.host, self.port), timeout=5) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")


# --- Spark standalone -----------------------------------------------------------------------


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class _SparkDaemon(Server):
    """One Spark standalone daemon (master or worker) run by pyspark's bundled ``spark-class``.

    The script execs the JVM, so the pid is the JVM's. Besides its RPC `port` a daemon serves a
    web UI on `webui_port` (kept in server.json). `options` are Spark settings written to the
    ``spark-defaults.conf`` of its own ``SPARK_CONF_DIR``; the port retries are off, so a daemon
    that loses a race for its port exits ("Address already in use") and is launched on another
    instead of silently taking the next port.
    """

    main_class = ""
    DEFAULT_OPTIONS: Mapping[str, Any] = {"spark.port.maxRetries": 0}

    def __init__(self, base_dir: str | os.PathLike[str] | None = None, port: int | None = None,
                 *, options: Mapping[str, Any] | None = None, startup_timeout: float = 60.0) -> None:
        super().__init__(base_dir, port, options=options, startup_timeout=startup_timeout)
        self.webui_port: int = int(self._read_state().get("webui_port") or free_port())

    @property
    def log_path(self) -> Path:
        return self.base_dir / f"{self.kind}.log"

    def _write_state(self, **extra: Any) -> None:
        super()._write_state(webui_port=self.webui_port, **extra)

    def _prepare(self) -> None:
        settings = {**self.DEFAULT_OPTIONS, **self.options}
        lines = [f"{k} {v}" for k, v in settings.items() if v is not None]
        (self.base_dir / "spark-defaults.conf").write_text("\n".join(lines) + "\n")

    def _arguments(self) -> list[str]:
        return ["--host", self.host, "--port", str(self.port), "--webui-port", str(self.webui_port)]

    def _launch(self) -> None:
        if not self._port_fixed:  # a relaunch after a lost port race takes a fresh UI port too
            self.webui_port = free_port()
        home = _spark_home()
        env = dict(os.environ, SPARK_HOME=str(home), SPARK_CONF_DIR=str(self.base_dir),
                   SPARK_LOCAL_IP=self.host, SPARK_LOCAL_HOSTNAME=self.host,
                   SPARK_LOG_DIR=str(self.base_dir), SPARK_PID_DIR=str(self.base_dir),
                   SPARK_WORKER_DIR=str(self.base_dir / "work"), SPARK_DAEMON_MEMORY="256m")
        self._popen([str(home / "bin" / "spark-class"), self.main_class, *self._arguments()], env=env)

    def status(self) -> dict[str, Any]:
        """The daemon's state as its web UI serves it at ``/json/``."""
        import urllib.request

        with urllib.request.urlopen(f"http://{self.host}:{self.webui_port}/json/", timeout=2) as reply:
            return json.load(reply)


class SparkWorker(_SparkDaemon):
    """A Spark standalone worker of `master`, 1 core and 1 GB for executors by default.

    It is ready once `master` lists it ALIVE. Executors run in `work_dir` (one ``app-*``
    directory per application, holding each executor's stdout and stderr).
    """

    kind = "spark-worker"
    main_class = "org.apache.spark.deploy.worker.Worker"

    def __init__(self, master: "SparkStandalone", base_dir: str | os.PathLike[str] | None = None,
                 port: int | None = None, *, cores: int = 1, memory: str = "1g",
                 options: Mapping[str, Any] | None = None, startup_timeout: float = 60.0) -> None:
        super().__init__(base_dir, port, options=options, startup_timeout=startup_timeout)
        self.master = master
        self.cores = cores
        self.memory = memory

    @property
    def work_dir(self) -> Path:
        return self.base_dir / "work"

    def _arguments(self) -> list[str]:
        return [*super()._arguments(), "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(self.work_dir), self.master.master_url]

    def _probe(self) -> None:
        workers = self.master.status()["workers"]
        if not any(w["port"] == self.port and w["state"] == "ALIVE" for w in workers):
            raise ConnectionError(f"the master lists no ALIVE worker on port {self.port} yet")


class SparkStandalone(_SparkDaemon):
    """A Spark standalone cluster on loopback: this master and one `worker` (in ``base_dir/worker``).

    Applications connect to `master_url`. `start()` returns once the worker has registered;
    stop, kill, cleanup and detach act on both daemons (the worker first). `status()` is the
    master's JSON: its ``workers``, ``activeapps`` and ``completedapps``.
    """

    kind = "spark"
    main_class = "org.apache.spark.deploy.master.Master"
    #: the master's REST submission server listens on a fixed port (6066) when on: off, so that two
    #: clusters on one machine (two test runs) do not race for it
    DEFAULT_OPTIONS: Mapping[str, Any] = {**_SparkDaemon.DEFAULT_OPTIONS, "spark.master.rest.enabled": "false"}

    def __init__(self, base_dir: str | os.PathLike[str] | None = None, port: int | None = None,
                 *, worker_cores: int = 1, worker_memory: str = "1g",
                 options: Mapping[str, Any] | None = None, startup_timeout: float = 60.0) -> None:
        super().__init__(base_dir, port, options=options, startup_timeout=startup_timeout)
        self.worker = SparkWorker(self, self.base_dir / "worker", cores=worker_cores,
                                  memory=worker_memory, options=options,
                                  startup_timeout=startup_timeout)

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def servers(self) -> list[Server]:
        """The worker, whose log a failing test also shows."""
        return [self.worker]

    def _probe(self) -> None:
        if self.status().get("status") != "ALIVE":
            raise ConnectionError("the master is not ALIVE yet")

    def start(self):
        with self._lock:
            super().start()
            self.worker.start()
            return self

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self.worker.stop(timeout)
            super().stop(timeout)

    def kill(self) -> None:
        with self._lock:
            self.worker.kill()
            super().kill()

    def cleanup(self, timeout: float = 30.0) -> None:
        with self._lock:
            self.worker.cleanup(timeout)
            super().cleanup(timeout)

    def detach(self):
        self.worker.detach()
        return super().detach()


SERVER_CLASSES: Mapping[str, type[Server]] = {
    "mariadb": MariaDBServer,
    "postgres": PostgresServer,
    "zookeeper": ZooKeeperServer,
    "spark": SparkStandalone,
}


def open_server(base_dir: str | os.PathLike[str], kind: str | None = None, **kwargs: Any) -> Server:
    """The server kept in `base_dir` (kind read from its server.json unless given)."""
    path = Path(base_dir)
    if kind is None:
        try:
            kind = json.loads((path / "server.json").read_text())["kind"]
        except (OSError, ValueError, KeyError) as exc:
            raise ServerError(f"{path} holds no server (no readable server.json)") from exc
    try:
        cls = SERVER_CLASSES[kind]
    except KeyError:
        raise ServerError(f"unknown server kind {kind!r} (known: {', '.join(SERVER_CLASSES)})") from None
    return cls(path, **kwargs)


__all__ = [
    "HOST",
    "MariaDBServer",
    "PostgresServer",
    "Server",
    "ServerError",
    "SparkStandalone",
    "SparkWorker",
    "ZooKeeperServer",
    "free_port",
    "open_server",
    "pid_alive",
    "running_servers",
    "wait_until",
]
