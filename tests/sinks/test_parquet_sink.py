"""The Parquet target: per-table files named by start position, batch and epoch, replays replace, hive partitions.

The contract tests run with both writers (pyarrow and Spark, on the shared local session).
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from setl.config import load_node, load_pipeline
from setl.connectors import BuildContext, registry
from setl.errors import ConfigError, LoadError
from setl.model import Batch, DdlChange, Op, Position, RowChange
from setl.pipeline import build_load
from setl.sinks.parquet import SPARK_WRITER_CONF, ParquetLoad, ParquetTargetConfig, file_name, read_table
from setl.spark import JavaNotFound
from setl.testing.connectors import LoadContract, TargetProbe
from setl.testing.harness import parquet_rows, parquet_state
from setl.testing.spark import LOCAL_SETTINGS, local_spark


def change(op, table, image, offset, key=("id",), schema="shop"):
    before = image if op not in (Op.INSERT, Op.READ) else None
    after = image if op is not Op.DELETE else None
    return RowChange(op, schema, table, key, before, after, Position("bin.000001", offset))


def batch(changes, start, end, batch_id=1, epoch=1):
    return Batch("p1", batch_id, epoch, Position("bin.000001", start), Position("bin.000001", end), tuple(changes))


def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))


def rows(root, table="shop.orders"):
    return sorted(read_table(root, table).to_pylist(), key=lambda r: (r["_setl_batch"], r["_setl_seq"]))


@pytest.fixture(scope="session")
def spark():
    """The process's shared local SparkSession (the one the transform tests use)."""
    return local_spark()


@pytest.fixture(params=["arrow", "spark"])
def writer(request):
    """Each writer in turn; Spark's session is started (once) before a spark-writer test."""
    if request.param == "spark":
        request.getfixturevalue("spark")
    return request.param


@pytest.fixture
def make(writer):
    """Builds a ParquetLoad with the test's writer."""
    def build(path, **kwargs):
        return ParquetLoad(path, writer=writer, spark=LOCAL_SETTINGS, **kwargs)
    return build


@pytest.fixture
def sink(tmp_path, make):
    """A ParquetLoad on a fresh directory."""
    load = make(tmp_path / "out", pipeline="p1")
    load.open()
    yield load
    load.close()


@pytest.fixture
def arrow_sink(tmp_path):
    """A ParquetLoad with the pyarrow writer, for tests of what only it does."""
    load = ParquetLoad(tmp_path / "out", pipeline="p1")
    load.open()
    yield load
    load.close()


def test_writes_changes_with_metadata_readable_by_pyarrow(sink, tmp_path):
    """Each change is a row with its image and _setl_op/_batch/_position/_seq, readable with plain pyarrow."""
    b = batch([
        change(Op.INSERT, "orders", {"id": 1, "total": decimal.Decimal("9.99")}, 10),
        change(Op.INSERT, "customers", {"id": 7, "name": "ann"}, 10),
        change(Op.DELETE, "orders", {"id": 0, "total": decimal.Decimal("1.00")}, 20),
    ], 0, 20, batch_id=3)
    sink.load(b)
    root = tmp_path / "out"
    name = file_name(b.start, 3, 1)
    assert name == "part-bin.000001-00000000000000000000-b00000000000000000003-e0000000001.parquet"
    assert files(root) == [f"shop.customers/{name}", f"shop.orders/{name}"]
    table = pq.read_table(root / "shop.orders" / name)
    assert table.to_pylist() == [
        {"id": 1, "total": decimal.Decimal("9.99"), "_setl_op": "insert", "_setl_batch": 3,
         "_setl_position": "bin.000001:10", "_setl_log": "bin.000001", "_setl_offset": 10, "_setl_row": 0,
         "_setl_seq": 0, "_setl_before_id": None},
        {"id": 0, "total": decimal.Decimal("1.00"), "_setl_op": "delete", "_setl_batch": 3,
         "_setl_position": "bin.000001:20", "_setl_log": "bin.000001", "_setl_offset": 20, "_setl_row": 0,
         "_setl_seq": 2, "_setl_before_id": None},
    ]
    assert table.schema.field("_setl_before_id").type == table.schema.field("id").type
    assert sink.committed() is None


def test_snapshot_reads_are_logged_as_read(sink, tmp_path):
    """A snapshot read is a row with ``_setl_op`` read and its after image; applying the log puts it
    under its key, replacing what an earlier insert left there."""
    sink.load(batch([change(Op.INSERT, "orders", {"id": 1, "total": 1}, 10)], 0, 10, batch_id=1))
    sink.load(batch([change(Op.READ, "orders", {"id": 1, "total": 5}, 20),
                     change(Op.READ, "orders", {"id": 2, "total": 6}, 20)], 10, 20, batch_id=2))
    got = rows(tmp_path / "out")
    assert [(r["_setl_op"], r["id"], r["total"], r["_setl_before_id"]) for r in got] == [
        ("insert", 1, 1, None), ("read", 1, 5, None), ("read", 2, 6, None)]
    assert parquet_state(tmp_path / "out", "shop.orders") == {(1,): {"id": 1, "total": 5}, (2,): {"id": 2, "total": 6}}


def test_types_are_kept(arrow_sink, tmp_path):
    """Decimals, microsecond datetimes, bytes and JSON are stored with their types."""
    image = {"id": 1, "at": dt.datetime(2024, 1, 2, 3, 4, 5, 678901), "blob": b"\x00\xff",
             "wide": decimal.Decimal("1" * 50 + ".25"), "doc": {"a": [1]}}
    arrow_sink.load(batch([change(Op.INSERT, "orders", image, 5)], 0, 5))
    (row,) = rows(tmp_path / "out")
    assert row["at"] == image["at"] and row["blob"] == image["blob"] and row["wide"] == image["wide"]
    assert row["doc"] == '{"a": [1]}'


def test_replayed_batch_overwrites_its_own_output(sink, tmp_path):
    """A batch replayed in a later epoch replaces its earlier attempt's file, and the same attempt loaded
    twice overwrites its own file: no duplicates either way."""
    first = batch([change(Op.INSERT, "orders", {"id": 1, "v": "old"}, 10)], 0, 10, batch_id=1)
    sink.load(first)
    sink.load(first)
    replay = batch([change(Op.INSERT, "orders", {"id": 1, "v": "new"}, 10)], 0, 10, batch_id=1, epoch=2)
    sink.load(replay)
    assert [(r["id"], r["v"]) for r in rows(tmp_path / "out")] == [(1, "new")]
    assert files(tmp_path / "out") == [f"shop.orders/{file_name(replay.start, 1, 2)}"]


def test_replay_with_a_different_cut_leaves_no_stale_files(sink, tmp_path):
    """Files from an earlier cut of the replayed range (later starts, or tables no longer touched) are removed."""
    root = tmp_path / "out"
    sink.load(batch([change(Op.INSERT, "orders", {"id": 1}, 10), change(Op.INSERT, "items", {"id": 9}, 10)], 0, 10))
    sink.load(batch([change(Op.INSERT, "orders", {"id": 2}, 20)], 10, 20, batch_id=2))
    # after a rollback the same range comes back as one bigger batch without `items`
    sink.load(batch([change(Op.INSERT, "orders", {"id": 1}, 10), change(Op.INSERT, "orders", {"id": 2}, 20)],
                    0, 20, batch_id=1, epoch=2))
    assert files(root) == [f"shop.orders/{file_name(Position('bin.000001', 0), 1, 2)}"]
    assert [r["id"] for r in rows(root)] == [1, 2]


def test_a_reopened_sink_still_cleans_up_replays(tmp_path, make):
    """A new ParquetLoad (after a restart) finds existing files and cleans a replayed range."""
    root = tmp_path / "out"
    load = make(root, pipeline="p1")
    load.load(batch([change(Op.INSERT, "orders", {"id": 1}, 10)], 0, 10))
    load.load(batch([change(Op.INSERT, "orders", {"id": 2}, 20)], 10, 20, batch_id=2))
    restarted = make(root, pipeline="p1")
    restarted.open()
    restarted.load(batch([change(Op.INSERT, "orders", {"id": 1}, 10), change(Op.INSERT, "orders", {"id": 2}, 20)],
                         0, 20, epoch=2))
    assert len(files(root)) == 1 and [r["id"] for r in rows(root)] == [1, 2]


def test_partition_columns_become_hive_directories(tmp_path, writer):
    """partition_by columns become col=value directories and come back when reading the dataset."""
    root = tmp_path / "out"
    config = ParquetTargetConfig(type="parquet", path=str(root), partition_by=("country",), writer=writer)
    load = ParquetLoad.from_config(config, pipeline="p1", spark=LOCAL_SETTINGS)
    load.open()
    load.load(batch([
        change(Op.INSERT, "orders", {"id": 1, "country": "FR"}, 10),
        change(Op.INSERT, "orders", {"id": 2, "country": "DE"}, 10),
        change(Op.INSERT, "orders", {"id": 3, "country": None}, 10),
        change(Op.INSERT, "orders", {"id": 4, "country": "a/b c"}, 10),
    ], 0, 10))
    name = file_name(Position("bin.000001", 0), 1, 1)
    assert files(root) == sorted([
        f"shop.orders/country=DE/{name}", f"shop.orders/country=FR/{name}",
        f"shop.orders/country=__HIVE_DEFAULT_PARTITION__/{name}", f"shop.orders/country=a%2Fb%20c/{name}",
    ])
    back = {r["id"]: r["country"] for r in read_table(root, "shop.orders").to_pylist()}
    assert back == {1: "FR", 2: "DE", 3: None, 4: "a/b c"}
    assert "country" not in pq.read_table(root / "shop.orders" / "country=FR" / name).column_names


def test_missing_partition_column_is_a_load_error(tmp_path, make):
    """A table without the partition column fails the load, naming the table and batch."""
    load = make(tmp_path / "out", partition_by=("country",), pipeline="p1")
    with pytest.raises(LoadError, match="partition column country") as info:
        load.load(batch([change(Op.INSERT, "orders", {"id": 1}, 10)], 0, 10, batch_id=4))
    assert info.value.context["table"] == "shop.orders" and info.value.context["batch"] == 4


def test_writes_are_atomic_no_temp_files_remain(arrow_sink, tmp_path, monkeypatch):
    """A failed write leaves neither a partial file nor a temp file."""
    import setl.sinks.parquet as module

    def broken(table, where, **kwargs):
        where.write(b"PAR1 partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module.pq, "write_table", broken)
    with pytest.raises(LoadError, match="No space left"):
        arrow_sink.load(batch([change(Op.INSERT, "orders", {"id": 1}, 10)], 0, 10))
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file() and p.name != ".setl-pipeline"] == []


def test_column_types_stay_stable_across_batches(sink, tmp_path):
    """Later batches are written with the earlier files' column types (all-NULL or narrower), so the dataset reads."""
    sink.load(batch([change(Op.INSERT, "orders", {"id": 1, "qty": 5, "price": decimal.Decimal("1.50")}, 10)], 0, 10))
    sink.load(batch([change(Op.INSERT, "orders", {"id": 2, "qty": None, "price": decimal.Decimal("3")}, 20)],
                    10, 20, batch_id=2))
    assert [(r["qty"], r["price"]) for r in rows(tmp_path / "out")] == [
        (5, decimal.Decimal("1.50")), (None, decimal.Decimal("3.00"))]


def test_ddl_is_skipped(arrow_sink, tmp_path):
    """A DDL batch writes nothing."""
    arrow_sink.load(Batch("p1", 1, 1, Position("b", 0), Position("b", 1), (DdlChange("shop", "orders", "ALTER ..."),)))
    assert files(tmp_path / "out") == []


def test_a_directory_belongs_to_one_pipeline(tmp_path):
    """Another pipeline cannot write into a directory already used by one."""
    ParquetLoad(tmp_path / "out", pipeline="p1").open()
    with pytest.raises(LoadError, match="pipeline 'p1'"):
        ParquetLoad(tmp_path / "out", pipeline="p2").open()


def test_unwritable_root_is_a_load_error(tmp_path):
    """A root that cannot be created is a LoadError, not an OSError."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LoadError):
        ParquetLoad(blocker / "out", pipeline="p1").open()
    assert os.path.isfile(blocker)


def test_key_changing_updates_carry_the_old_key(tmp_path, make):
    """An update that changes the key (and its partition) records the old key; replaying the log is exact."""
    root = tmp_path / "out"
    load = make(root, partition_by=("country",), pipeline="p1")
    load.load(batch([
        change(Op.INSERT, "orders", {"id": 1, "country": "FR", "v": "a"}, 10),
        change(Op.INSERT, "orders", {"id": 2, "country": "DE", "v": "b"}, 10),
    ], 0, 10))
    moved = RowChange(Op.UPDATE, "shop", "orders", ("id",), {"id": 1, "country": "FR", "v": "a"},
                      {"id": 7, "country": "DE", "v": "a2"}, Position("bin.000001", 20))
    kept = RowChange(Op.UPDATE, "shop", "orders", ("id",), {"id": 2, "country": "DE", "v": "b"},
                     {"id": 2, "country": "DE", "v": "b2"}, Position("bin.000001", 20))
    load.load(batch([moved, kept], 10, 20, batch_id=2))
    rows = {(r["_setl_batch"], r["id"]): r for r in read_table(root, "shop.orders").to_pylist()}
    assert rows[(2, 7)]["_setl_before_id"] == 1 and rows[(2, 2)]["_setl_before_id"] == 2
    assert rows[(1, 1)]["_setl_before_id"] is None
    assert parquet_state(root, "shop.orders") == {(2,): {"id": 2, "country": "DE", "v": "b2"},
                                                  (7,): {"id": 7, "country": "DE", "v": "a2"}}


def test_tables_without_a_key_carry_the_whole_before_image(sink, tmp_path):
    """For a table without a primary key, an update row carries every before column, so a reader finds the row."""
    old, new = {"msg": "a", "n": 1}, {"msg": "a", "n": 2}
    sink.load(batch([change(Op.INSERT, "log", old, 10, key=())], 0, 10))
    sink.load(batch([RowChange(Op.UPDATE, "shop", "log", (), old, new, Position("bin.000001", 20))], 10, 20,
                    batch_id=2))
    last = pq.read_table(tmp_path / "out" / "shop.log" / file_name(Position("bin.000001", 10), 2, 1)).to_pylist()
    assert last == [{"msg": "a", "n": 2, "_setl_op": "update", "_setl_batch": 2, "_setl_position": "bin.000001:20",
                     "_setl_log": "bin.000001", "_setl_offset": 20, "_setl_row": 0, "_setl_seq": 0,
                     "_setl_before_msg": "a", "_setl_before_n": 1}]
    assert parquet_state(tmp_path / "out", "shop.log") == {("a", 2): new}


def test_a_batch_interrupted_between_files_is_exact_after_its_replay(arrow_sink, tmp_path, monkeypatch):
    """A crash after one table's file of a batch is replaced but before the next: the replay leaves no duplicates."""
    import setl.sinks.parquet as module

    root = tmp_path / "out"
    first = [change(Op.INSERT, "orders", {"id": 1}, 10), change(Op.INSERT, "items", {"id": 5}, 10)]
    arrow_sink.load(batch(first, 0, 10))
    real = module.pq.write_table
    calls = []

    def second_write_fails(table, where, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        real(table, where, **kwargs)

    monkeypatch.setattr(module.pq, "write_table", second_write_fails)
    replay = [change(Op.INSERT, "orders", {"id": 1}, 10), change(Op.UPDATE, "orders", {"id": 1}, 10),
              change(Op.INSERT, "items", {"id": 5}, 10)]
    with pytest.raises(LoadError, match="Input/output error"):
        arrow_sink.load(batch(replay, 0, 10, epoch=2))
    monkeypatch.setattr(module.pq, "write_table", real)
    arrow_sink.load(batch(replay, 0, 10, epoch=3))
    assert files(root) == [f"shop.{t}/{file_name(Position('bin.000001', 0), 1, 3)}" for t in ("items", "orders")]
    assert [(r["id"], r["_setl_op"]) for r in rows(root)] == [(1, "insert"), (1, "update")]
    assert [r["id"] for r in rows(root, "shop.items")] == [5]


# --- the Spark writer ---------------------------------------------------------------------------


def test_spark_writes_what_arrow_writes(tmp_path, spark):
    """Same batch, both writers: identical layout, and a plain pyarrow read gives equal types and values
    (naive and UTC timestamps, decimals, binary, unsigned BIGINT, dates, JSON, NULLs, all-NULL columns)."""
    images = [
        {"id": 1, "day": dt.date(2024, 1, 2), "at": dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
         "at_utc": dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc),
         "price": decimal.Decimal("12345.6789"), "blob": b"\x00\xff", "big": 2**64 - 1, "ok": True,
         "ratio": 0.5, "name": "é", "doc": {"a": [1]}, "nothing": None},
        {"id": 2, "day": dt.date(1970, 1, 1), "at": None, "at_utc": None, "price": None, "blob": None,
         "big": None, "ok": None, "ratio": None, "name": None, "doc": None, "nothing": None},
    ]
    changes = [change(Op.INSERT, "orders", images[0], 10), change(Op.UPDATE, "orders", images[1], 20)]
    out = {}
    for writer in ("arrow", "spark"):
        load = ParquetLoad(tmp_path / writer, pipeline="p1", writer=writer, partition_by=("day",),
                           session=lambda: spark)
        load.load(batch(changes, 0, 20))
        paths = files(tmp_path / writer)
        makers = {pq.ParquetFile(tmp_path / writer / path).metadata.created_by.split()[0] for path in paths}
        assert makers == {"parquet-cpp-arrow" if writer == "arrow" else "parquet-mr"}
        hidden = [p for p in (tmp_path / writer).rglob(".*") if p.name != ".setl-pipeline"]
        assert hidden == []
        out[writer] = [(path, [(f.name, f.type) for f in t.schema], t.to_pylist())
                       for path, t in ((path, pq.read_table(tmp_path / writer / path)) for path in paths)]
    assert [path for path, _, _ in out["spark"]] == [path for path, _, _ in out["arrow"]]
    assert out["spark"] == out["arrow"]
    assert len(out["arrow"]) == 2 and out["arrow"][1][2][0]["big"] == 2**64 - 1


def test_spark_writer_differences_are_the_documented_ones(tmp_path, spark):
    """Through Spark, decimals wider than 38 digits are text and durations int64 microseconds; values are kept."""
    wide = decimal.Decimal("1" * 50 + ".25")
    load = ParquetLoad(tmp_path / "out", pipeline="p1", writer="spark", session=lambda: spark)
    load.load(batch([change(Op.INSERT, "orders", {"id": 1, "wide": wide, "took": dt.timedelta(seconds=3)}, 5)],
                    0, 5))
    (row,) = rows(tmp_path / "out")
    assert decimal.Decimal(row["wide"]) == wide and row["took"] == 3_000_000


def test_spark_failure_is_a_one_line_load_error_and_leaves_nothing(tmp_path, spark):
    """A write Spark rejects (columns equal but for case) is a one-line LoadError with full context, no files left."""
    load = ParquetLoad(tmp_path / "out", pipeline="p1", writer="spark", session=lambda: spark)
    with pytest.raises(LoadError, match="COLUMN_ALREADY_EXISTS") as info:
        load.load(batch([change(Op.INSERT, "orders", {"id": 1, "ID": 2}, 10)], 0, 10, batch_id=6))
    assert "\n" not in str(info.value)
    assert {k: info.value.context.get(k) for k in ("pipeline", "stage", "table", "batch", "position")} == {
        "pipeline": "p1", "stage": "load", "table": "shop.orders", "batch": 6, "position": Position("bin.000001", 0)}
    assert [p.name for p in (tmp_path / "out").rglob("*") if p.name != ".setl-pipeline"] == ["shop.orders"]


def test_spark_writer_leaves_the_shared_session_settings_alone(tmp_path, spark):
    """The writer's Parquet settings live in its own child session, not in the node's shared one."""
    before = {key: spark.conf.get(key) for key in SPARK_WRITER_CONF}
    load = ParquetLoad(tmp_path / "out", pipeline="p1", writer="spark", session=lambda: spark)
    load.load(batch([change(Op.INSERT, "orders", {"id": 1}, 10)], 0, 10))
    assert {key: spark.conf.get(key) for key in SPARK_WRITER_CONF} == before != SPARK_WRITER_CONF
    assert [r["id"] for r in rows(tmp_path / "out")] == [1]


def write_conf(tmp_path, target):
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {tmp_path / 'meta.db'}}}\n"
                                    "spark: {master: 'local[1]'}\n")
    (conf / "pipelines" / "p.yaml").write_text(textwrap.dedent(f"""\
        source: {{type: file, path: in.jsonl}}
        target: {target}
        """))
    return conf


def test_writer_comes_from_the_target_config_with_the_node_spark_settings(tmp_path):
    """`target.writer: spark` builds a Spark-writing ParquetLoad that starts the node's Spark settings."""
    conf = write_conf(tmp_path, "{type: parquet, path: out, writer: spark}")
    load = build_load(load_node(conf), load_pipeline(conf, "p", registry()))
    assert isinstance(load, ParquetLoad) and load.writer == "spark"
    assert load.spark.master == "local[1]"
    default = write_conf(tmp_path / "d", "{type: parquet, path: out}")
    assert build_load(load_node(default), load_pipeline(default, "p", registry())).writer == "arrow"


def test_an_unknown_writer_is_a_one_line_config_error(tmp_path):
    """`target.writer: duckdb` is a ConfigError naming the key and the choices (a ValueError in code)."""
    conf = write_conf(tmp_path, "{type: parquet, path: out, writer: duckdb}")
    with pytest.raises(ConfigError, match=r"target\.writer: expected one of arrow, spark, got 'duckdb'") as info:
        load_pipeline(conf, "p", registry())
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="writer must be one of arrow, spark"):
        ParquetLoad(tmp_path / "out", writer="duckdb")


def test_the_spark_writer_without_java_is_refused_when_the_target_is_built(monkeypatch, tmp_path):
    """writer: spark checks for Java at startup (Spark itself starts with the first write); arrow needs none."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(JavaNotFound) as info:
        ParquetLoad.from_config(ParquetTargetConfig(type="parquet", path=str(tmp_path), writer="spark"), pipeline="p1")
    assert str(info.value).startswith("pipeline=p1 stage=load") and info.value.exit_code == 2
    assert ParquetLoad.from_config(ParquetTargetConfig(type="parquet", path=str(tmp_path)), pipeline="p1")


def test_open_removes_what_an_interrupted_write_left(tmp_path):
    """A kill -9 during a write leaves a hidden temp file or Spark staging directory; the next open removes them."""
    root = tmp_path / "out"
    sink = ParquetLoad(root, pipeline="p1")
    first = batch([RowChange(Op.INSERT, "shop", "orders", ("id",), None, {"id": 1}, Position("bin.000001", 10))],
                  0, 10)
    sink.load(first)
    folder = root / "shop.orders"
    kept = folder / file_name(first.start, 1, 1)
    temp = folder / f".{file_name(Position('bin.000001', 10), 2, 1)}.{'a' * 32}.tmp"
    staging = folder / f".{file_name(Position('bin.000001', 10), 2, 1)}.{'b' * 32}.spark"
    temp.write_bytes(b"half a file")
    staging.mkdir()
    (staging / "part-00000.snappy.parquet").write_bytes(b"half a file")
    other = folder / ".not-ours"
    other.write_text("someone else's")
    ParquetLoad(root, pipeline="p1").open()
    assert not temp.exists() and not staging.exists()
    assert kept.exists() and other.exists()


def test_batches_starting_inside_a_split_transaction_keep_their_own_files(tmp_path):
    """Two pieces of one split transaction (same start offset, rows 0 and 2) are two files, each change with its row."""
    sink = ParquetLoad(tmp_path / "out", pipeline="p")
    start = Position("bin.000001", 10)

    def change(row: int) -> RowChange:
        return RowChange(Op.INSERT, "s", "t", ("id",), None, {"id": row}, position=Position("bin.000001", 10, row=row))

    sink.load(Batch("p", 1, 1, start, Position("bin.000001", 10, row=2), (change(1), change(2))))
    sink.load(Batch("p", 2, 1, Position("bin.000001", 10, row=2), Position("bin.000001", 90), (change(3),)))
    names = sorted(p.name for p in (tmp_path / "out" / "s.t").glob("*.parquet"))
    assert names == ["part-bin.000001-00000000000000000010-b00000000000000000001-e0000000001.parquet",
                     "part-bin.000001-00000000000000000010_0000000002-b00000000000000000002-e0000000001.parquet"]
    rows = read_table(tmp_path / "out", "s.t").to_pylist()
    assert sorted((r["id"], r["_setl_row"], r["_setl_position"]) for r in rows) == [
        (1, 1, "bin.000001:10+1"), (2, 2, "bin.000001:10+2"), (3, 3, "bin.000001:10+3")]


def test_a_column_typed_after_all_null_batches_reads_as_one_dataset(sink, tmp_path):
    """A column all NULL in earlier batches (and the before key of insert-only ones) is typed once values come."""
    sink.load(batch([change(Op.INSERT, "orders", {"id": 0, "qty": None}, 10)], 0, 10))
    sink.load(batch([change(Op.INSERT, "orders", {"id": 1, "qty": None}, 20)], 10, 20, batch_id=2))
    update = RowChange(Op.UPDATE, "shop", "orders", ("id",), {"id": 0, "qty": None}, {"id": 0, "qty": 0},
                       Position("bin.000001", 30))
    sink.load(batch([update], 20, 30, batch_id=3))
    assert parquet_state(tmp_path / "out", "shop.orders") == {(0,): {"id": 0, "qty": 0}, (1,): {"id": 1, "qty": None}}
    for path in (tmp_path / "out").rglob("*.parquet"):
        schema = pq.read_schema(path)
        assert not any(pa.types.is_null(f.type) for f in schema), (path, schema)


def test_spark_reads_a_spark_written_table_after_a_column_is_typed(tmp_path, spark):
    """Spark reads the directory back after a column first written all NULL by the Spark writer gets a type."""
    load = ParquetLoad(tmp_path / "out", pipeline="p1", writer="spark", session=lambda: spark)
    load.load(batch([change(Op.INSERT, "orders", {"id": 0, "qty": None}, 10)], 0, 10))
    load.load(batch([change(Op.INSERT, "orders", {"id": 1, "qty": 4}, 20)], 10, 20, batch_id=2))
    read = spark.read.parquet(str(tmp_path / "out" / "shop.orders")).orderBy("_setl_offset")
    assert [(r["id"], r["qty"]) for r in read.collect()] == [(0, None), (1, 4)]


def test_a_column_a_later_batch_adds_is_seen_by_a_plain_reader(sink, tmp_path):
    """A column that appears in a later batch (ADD COLUMN) is added, all NULL, to the earlier files."""
    sink.load(batch([change(Op.INSERT, "orders", {"id": 0}, 10)], 0, 10))
    sink.load(batch([change(Op.INSERT, "orders", {"id": 1, "note": "x"}, 20)], 10, 20, batch_id=2))
    assert parquet_state(tmp_path / "out", "shop.orders") == {(0,): {"id": 0, "note": None},
                                                               (1,): {"id": 1, "note": "x"}}


def test_a_type_change_no_cast_keeps_is_a_load_error(arrow_sink, tmp_path):
    """A column whose values change type (int to text by DDL) stops the load naming column, table and position."""
    arrow_sink.load(batch([change(Op.INSERT, "orders", {"id": 0, "qty": 5}, 10)], 0, 10))
    with pytest.raises(LoadError, match=r"column qty changes type from int64 to string") as info:
        arrow_sink.load(batch([change(Op.INSERT, "orders", {"id": 1, "qty": "012"}, 20)], 10, 20, batch_id=2))
    assert "table=shop.orders" in str(info.value) and "bin.000001:10" in str(info.value)
    assert parquet_state(tmp_path / "out", "shop.orders") == {(0,): {"id": 0, "qty": 5}}


def test_a_backfill_a_crash_cut_short_is_finished_by_the_replay(tmp_path, monkeypatch):
    """Files a crash left with a NULL-typed column are typed when the batch is replayed after reopening."""
    root = tmp_path / "out"
    load = ParquetLoad(root, pipeline="p1")
    load.open()
    load.load(batch([change(Op.INSERT, "orders", {"id": 0, "qty": None}, 10)], 0, 10))
    load.load(batch([change(Op.INSERT, "orders", {"id": 1, "qty": None}, 20)], 10, 20, batch_id=2))
    writes = []
    real = ParquetLoad._write_arrow

    def crash_on_second(self, table, temp):
        writes.append(temp)
        if len(writes) == 2:
            raise OSError("simulated crash")
        real(self, table, temp)

    monkeypatch.setattr(ParquetLoad, "_write_arrow", crash_on_second)
    third = batch([change(Op.INSERT, "orders", {"id": 2, "qty": 7}, 30)], 20, 30, batch_id=3)
    with pytest.raises(LoadError, match="simulated crash"):
        load.load(third)
    monkeypatch.setattr(ParquetLoad, "_write_arrow", real)
    again = ParquetLoad(root, pipeline="p1")
    again.open()
    again.load(third)
    assert parquet_state(root, "shop.orders") == {(0,): {"id": 0, "qty": None}, (1,): {"id": 1, "qty": None},
                                                  (2,): {"id": 2, "qty": 7}}


class ParquetProbe(TargetProbe):
    """Fresh Parquet roots, one per pipeline (the target's rule), through the parquet connector."""

    def __init__(self, root):
        self.root = root

    def make_load(self, pipeline="p"):
        config = ParquetTargetConfig(type="parquet", path=str(self.root / pipeline))
        return registry().target("parquet").create(config, BuildContext(pipeline))

    def state(self, table):
        state = {}
        for root in sorted(self.root.glob(f"*/{table.qualified}")):
            state.update(parquet_state(root.parent, table.qualified))
        return state

    def rows(self, table):
        return [row for root in sorted(self.root.glob(f"*/{table.qualified}"))
                for row in parquet_rows(root.parent, table.qualified)]


class TestParquetLoadContract(LoadContract):
    """The connector kit's Load contract, on the Parquet target."""

    @pytest.fixture
    def probe(self, tmp_path):
        return ParquetProbe(tmp_path / "lake")


def test_a_truncate_row_is_written_by_either_writer(tmp_path, make):
    """A snapshot's TRUNCATE is a ``truncate`` row with NULL image columns, by either writer, and a
    reader applying the log empties the table there."""
    root = tmp_path / "out"
    load = make(root, pipeline="p1")
    load.load(batch([change(Op.INSERT, "orders", {"id": 1, "v": "a"}, 10)], 0, 10))
    ddl = DdlChange("shop", "orders", "TRUNCATE TABLE `shop`.`orders`", position=Position("bin.000001", 10),
                    snapshot=True)
    load.load(batch([ddl], 10, 10, batch_id=2))
    load.load(batch([change(Op.READ, "orders", {"id": 2, "v": "b"}, 10)], 10, 10, batch_id=3))
    assert [(r["_setl_op"], r["id"], r["v"]) for r in rows(root)] == [
        ("insert", 1, "a"), ("truncate", None, None), ("read", 2, "b")]
    assert parquet_state(root, "shop.orders") == {(2,): {"id": 2, "v": "b"}}
