"""`setl verify --engine spark`: the chunk aggregates hashed as Spark tasks (local Spark), each task
with its own connections to the source and the target, give the same report and exit code as the
local engine, equal tables and injected drift alike."""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.setl_process import postgres_target
from tests.verify.test_verify import POSTGRES_DRIFT, check_drift, fill, make_setl, running, verify

pytestmark = pytest.mark.timeout(300)


def _timeless(value):
    """The report without its durations (they differ from run to run)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def test_spark_engine_finds_what_the_local_engine_finds(tmp_path, mariadb_source, postgres_server, source_db,
                                                        postgres_db):
    """Equal tables: exit 0 with both engines; after drift of every kind written into the PostgreSQL target,
    the Spark engine reports exactly the local engine's differences (exit 1)."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                     f"{source_db}.{{table}}", server_id=2251)
    with running(setl, mariadb_source):
        code, report = verify(setl, "--chunk-rows", "15", "--engine", "spark")
        assert code == 0 and report["equal"], report
        assert {t["source"].split(".", 1)[1]: t["chunks"] for t in report["tables"]}["types"] == 3
        for statement in POSTGRES_DRIFT:
            postgres_server.query(statement.format(t=f'"{source_db}".'), dbname=postgres_db)
        local_code, local = verify(setl, "--chunk-rows", "15")
        result = setl.run("verify", "--pipeline", setl.name, "--json", "--wait-timeout", "30", "--chunk-rows", "15",
                          "--engine", "spark", timeout=120)
        spark_code, spark = result.returncode, json.loads(result.stdout)
    assert local_code == spark_code == 1
    check_drift(spark, postgres=True)
    assert _timeless(spark) == _timeless(local)
    # the key-ranged table's chunks went through Spark tasks; the keyless, the python-mode and the one-chunk
    # (string key into PostgreSQL) ones did not
    hashed = re.findall(r"table=\S+\.(\w+) (\d+) chunk\(s\) hashed on the (source|target) by \d+ Spark task",
                        result.stderr)
    assert {(t, side) for t, _, side in hashed} == {("types", "source"), ("types", "target")}, result.stderr[-3000:]
    assert sum(int(n) for t, n, side in hashed if t == "types" and side == "source") == 3


def test_task_connections_follow_the_target_config_and_refuse_tls():
    """A task's target connection takes the pipeline's target settings (password included); with TLS there
    is none (the engine is refused)."""
    from setl.config import SslConfig
    from setl.sinks.mysql import MysqlTargetConfig
    from setl.sinks.postgresql import PostgresqlTargetConfig
    from setl.verify.spark_engine import EndSpec, target_connect

    mysql = target_connect(MysqlTargetConfig("mysql", host="h", port=3307, user="u", password="pw"), "mysql")
    assert mysql is not None and (mysql["host"], mysql["port"], mysql["user"], mysql["password"]) == ("h", 3307, "u",
                                                                                                      "pw")
    postgres = target_connect(PostgresqlTargetConfig("postgresql", host="h", port=5433, user="u", password="pw",
                                                     database="d"), "postgresql")
    assert postgres is not None and (postgres["dbname"], postgres["password"]) == ("d", "pw")
    assert "pw" not in repr(EndSpec("target", "postgresql", postgres))
    assert target_connect(MysqlTargetConfig("mysql", ssl=SslConfig(verify=False)), "mysql") is None
