"""The one place a SparkSession is built: one lazily started, shared session per process.

Everything else asks `get_session()` for it, so a node pays Spark's start-up
cost (about 6 s) once, and only when some table actually has a transform.
The Arrow conversions in and out of Spark live here too, so the rest of setl
never depends on how a PySpark version spells them.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from setl.config import SparkConfig
from setl.errors import SetlError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Settings every setl session gets unless `spark.conf` overrides them.
#:
#: The two Arrow settings make a batch's rows cheap to get in: with a local-relation
#: threshold of 0, `createDataFrame` ships the Arrow batches to the tasks as bytes
#: instead of turning them into a driver-side LocalRelation (whose transforms Spark
#: then evaluates row by row, interpreted, on the driver, and whose rows it
#: Java-serializes into every collect); and up to 100k rows make one Arrow batch,
#: so a typical batch is one partition, one task.
#:
#: A batch is small and every batch is its own query, so per-query overhead is what
#: counts: adaptive query execution re-plans each query around its stages (about a
#: third of a simple transform's time, measured with tools/bench/bench_transform.py)
#: and is off; a shuffle (a join or GROUP BY in a transform) of a batch needs a few
#: partitions, not Spark's default 200. On a cluster, raise both in `spark.conf`.
DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.log.level": "WARN",
}


class SparkStartError(SetlError):
    """Spark could not be started (no Java, bad master, bad conf). The stage that needed it adds itself."""

    exit_code = 2


class JavaNotFound(SparkStartError):
    """No Java runtime for Spark: neither `$JAVA_HOME/bin/java` nor `java` on PATH."""


def find_java(environ: Mapping[str, str] | None = None) -> str:
    """The java executable Spark will run; raise `JavaNotFound` if there is none."""
    environ = os.environ if environ is None else environ
    home = environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if java.is_file() and os.access(java, os.X_OK):
            return str(java)
        raise JavaNotFound(
            f"JAVA_HOME is {home!r} but {java} is not an executable; "
            "point JAVA_HOME at a Java 17 runtime (e.g. apt-get install openjdk-17-jre-headless)",
        )
    found = shutil.which("java", path=environ.get("PATH", os.defpath))
    if found:
        return found
    raise JavaNotFound(
        "Spark needs Java, but JAVA_HOME is not set and no 'java' is on PATH; "
        "install a Java 17 runtime (e.g. apt-get install openjdk-17-jre-headless)",
    )


#: Spark's JVM log configuration (warnings only, in setl's format), shipped with setl.
LOG4J2_CONF = Path(__file__).with_name("log4j2.properties")


def session_conf(settings: SparkConfig) -> dict[str, str]:
    """The full `spark.*` conf a session is built with: defaults, then the config's.

    The driver's JVM gets `LOG4J2_CONF` (``-Dlog4j2.configurationFile``) unless the config's
    ``spark.driver.extraJavaOptions`` names a log4j2 configuration of its own.
    """
    conf = dict(DEFAULT_CONF)
    for key, value in settings.conf.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        conf[str(key)] = str(value)
    options = conf.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" not in options:
        conf["spark.driver.extraJavaOptions"] = f"{options} -Dlog4j2.configurationFile=file:{LOG4J2_CONF}".strip()
    return conf


def _build(settings: SparkConfig) -> "SparkSession":
    find_java()
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - pyspark is a hard dependency
        raise SparkStartError(f"pyspark is not installed: {exc}") from exc
    builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
    conf = session_conf(settings)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:
        raise SparkStartError(
            f"cannot start Spark (master {settings.master}): {exc}".splitlines()[0],
        ) from exc
    session.sparkContext.setLogLevel(conf.get("spark.log.level", "WARN"))
    _quiet_task_size_warning(session)
    if not log.isEnabledFor(logging.DEBUG):
        # PySpark logs every AnalysisException with its Java stack to these loggers; setl reports it in
        # one line (StepAnalysisError), and `--debug` keeps the stack.
        for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
            logging.getLogger(name).disabled = True
    return session


def _quiet_task_size_warning(session: Any) -> None:
    """Batches reach Spark as Arrow data inside their tasks, so most batches are "a task of very
    large size" to Spark's scheduler, which would log a warning per batch. Only that logger is
    raised to ERROR; best effort (a Spark Connect session has no JVM to reach)."""
    try:
        jvm = session._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.scheduler.TaskSetManager", jvm.org.apache.logging.log4j.Level.ERROR)
    except Exception as exc:  # noqa: BLE001 - quieting a Spark warning is cosmetic
        log.debug("cannot quiet Spark's task size warning: %s", exc)


class SessionHolder:
    """Builds a session on first use, exactly once, whichever thread asks first."""

    def __init__(self, factory: Callable[[SparkConfig], Any] = _build) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._session: Any = None
        self._settings: SparkConfig | None = None

    @property
    def started(self) -> bool:
        return self._session is not None

    def get(self, settings: SparkConfig | None = None) -> Any:
        session = self._session
        if session is not None:
            self._warn_if_different(settings)
            return session
        with self._lock:
            if self._session is None:
                settings = settings or SparkConfig()
                log.info("starting Spark session (master %s)", settings.master)
                self._session = self._factory(settings)
                self._settings = settings
            else:
                self._warn_if_different(settings)
            return self._session

    def stop(self) -> None:
        with self._lock:
            session, self._session, self._settings = self._session, None, None
        if session is not None:
            try:
                session.stop()
            except Exception:  # stopping during interpreter shutdown may fail halfway
                log.exception("error while stopping the Spark session")

    def _warn_if_different(self, settings: SparkConfig | None) -> None:
        if settings is not None and self._settings is not None and settings != self._settings:
            log.warning("a Spark session is already running; ignoring different settings %r", settings)


_holder = SessionHolder()
atexit.register(_holder.stop)


def get_session(settings: SparkConfig | None = None) -> "SparkSession":
    """The process's SparkSession, built from `settings` on first call.

    Thread-safe. Later calls return the same session; settings that differ from
    the first call's are ignored with a warning (one session per node).
    Raises `JavaNotFound` or `SparkStartError` when Spark cannot start.
    """
    return _holder.get(settings)


def session_started() -> bool:
    """Whether this process has built its SparkSession (tests check it stays unbuilt)."""
    return _holder.started


def jvm_pid() -> int | None:
    """The process id of this process's Spark JVM (PySpark's gateway), None while none runs
    (no session, or a gateway this process did not start)."""
    if not _holder.started:
        return None
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    gateway = getattr(SparkContext, "_gateway", None)
    pid = getattr(getattr(gateway, "proc", None), "pid", None)
    return pid if isinstance(pid, int) else None


def brief(exc: BaseException) -> str:
    """One line for an exception from Spark, without its JVM stack trace."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:500]


# --- Arrow in and out -----------------------------------------------------------------------


def from_arrow(session: "SparkSession", table: "pa.Table") -> "DataFrame":
    """A DataFrame of an Arrow table; naive timestamps stay naive (TimestampNTZ)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(table.schema, prefer_timestamp_ntz=True)
    if hasattr(session, "createDataFrame") and _arrow_input_supported():
        return session.createDataFrame(table, schema=schema)
    return session.createDataFrame(table.to_pandas(), schema=schema)  # pragma: no cover - pyspark 3.5


def to_arrow(df: "DataFrame") -> "pa.Table":
    """Collect a DataFrame as an Arrow table."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    import pyarrow as pa  # pragma: no cover - pyspark 3.5

    return pa.Table.from_pandas(df.toPandas(), preserve_index=False)  # pragma: no cover


def _arrow_input_supported() -> bool:
    import pyspark

    return int(pyspark.__version__.split(".")[0]) >= 4
