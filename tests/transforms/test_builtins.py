"""Every built-in transform on a real local Spark."""

from __future__ import annotations

import csv
import decimal
import hashlib
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from setl.errors import PluginError, TransformError
from setl.model import Op
from setl.testing.spark import run_transform
from setl.transforms.builtins import substitute_batch

ROWS = [
    {"id": 1, "name": "alice", "card": "4111111111111111", "amount": decimal.Decimal("10.50"), "country": "FR"},
    {"id": 2, "name": "bob", "card": "5500000000000004", "amount": decimal.Decimal("3.25"), "country": "DE"},
    {"id": 3, "name": None, "card": None, "amount": None, "country": "XX"},
]


def run(name, params, rows=ROWS, **kwargs):
    return run_transform(name, rows, params, primary_key=["id"], spark=kwargs.pop("spark"), **kwargs)


def test_rename_renames_columns_and_keeps_values(spark):
    """rename maps old column names to new ones and keeps the values."""
    out = run("rename", {"columns": {"name": "full_name", "id": "customer_id"}}, spark=spark)
    assert [r["full_name"] for r in out] == ["alice", "bob", None]
    assert [r["customer_id"] for r in out] == [1, 2, 3]
    assert "name" not in out[0] and "id" not in out[0]


def test_rename_of_missing_column_is_a_transform_error(spark):
    """rename of a column the table lacks fails the batch, naming the plugin."""
    with pytest.raises(TransformError, match="rename") as info:
        run("rename", {"columns": {"nope": "x"}}, spark=spark)
    assert info.value.context["plugin"] == "rename"


def test_drop_columns_removes_columns(spark):
    """drop_columns removes the listed columns only."""
    out = run("drop_columns", {"columns": ["card", "country"]}, spark=spark)
    assert list(out[0]) == ["id", "name", "amount"]


def test_drop_columns_ignore_missing(spark):
    """drop_columns with ignore_missing tolerates absent columns."""
    out = run("drop_columns", {"columns": ["card", "absent"], "ignore_missing": True}, spark=spark)
    assert "card" not in out[0]


def test_keep_columns_keeps_listed_columns_in_order(spark):
    """keep_columns keeps exactly the listed columns, in the listed order."""
    out = run("keep_columns", {"columns": ["name", "id"]}, spark=spark)
    assert [list(r) for r in out] == [["name", "id"]] * 3


def test_cast_changes_spark_types(spark):
    """cast converts columns to the given Spark SQL types."""
    out = run("cast", {"columns": {"id": "string", "amount": "decimal(12,4)"}}, spark=spark)
    assert out[0]["id"] == "1"
    assert out[0]["amount"] == decimal.Decimal("10.5000")
    assert out[0]["amount"].as_tuple().exponent == -4
    assert out[2]["amount"] is None


def test_filter_keeps_matching_rows(spark):
    """filter keeps the inserts for which the condition is true (NULL counts as false)."""
    out = run("filter", {"condition": "amount > 5"}, spark=spark)
    assert [r["id"] for r in out] == [1]


def test_add_column_computes_an_expression(spark):
    """add_column adds a column computed by a Spark SQL expression."""
    out = run("add_column", {"name": "label", "expr": "concat(country, '-', cast(id as string))"}, spark=spark)
    assert [r["label"] for r in out] == ["FR-1", "DE-2", "XX-3"]


def test_mask_keeps_last_characters(spark):
    """mask hides all but the last N characters and leaves NULL alone."""
    out = run("mask", {"columns": ["card", "name"], "keep_last": 4}, spark=spark)
    assert out[0]["card"] == "************1111"
    assert out[1]["name"] == "bob"  # shorter than keep_last: nothing hidden
    assert out[2]["card"] is None


def test_mask_with_other_char_and_zero_kept(spark):
    """mask with keep_last 0 and a custom char masks everything."""
    out = run("mask", {"columns": ["name"], "keep_last": 0, "char": "#"}, spark=spark)
    assert out[0]["name"] == "#####"


def test_hash_is_salted_sha256_hex(spark):
    """hash replaces values with the hex SHA-256 of salt + text, NULL stays NULL."""
    out = run("hash", {"columns": ["name", "id"], "salt": "pepper"}, spark=spark)
    assert out[0]["name"] == hashlib.sha256(b"pepperalice").hexdigest()
    assert out[0]["id"] == hashlib.sha256(b"pepper1").hexdigest()
    assert out[2]["name"] is None


def test_hash_of_binary_hashes_raw_bytes(spark):
    """hash of a binary column hashes the raw bytes, without a salt by default."""
    out = run_transform("hash", [{"id": 1, "blob": b"\x00\xffabc"}], {"columns": ["blob"]},
                        primary_key=["id"], spark=spark)
    assert out[0]["blob"] == hashlib.sha256(b"\x00\xffabc").hexdigest()


def test_sql_runs_over_the_batch_view(spark):
    """sql runs a query over the rows registered as the view `batch`."""
    out = run("sql", {"query": "SELECT *, upper(country) AS cc, 'from batch' AS note FROM batch WHERE id <> 2"},
              spark=spark)
    assert [r["id"] for r in out] == [1, 3]
    assert out[0]["note"] == "from batch"


def test_sql_must_keep_setl_columns(spark):
    """sql that selects away setl's metadata columns fails with a clear error."""
    with pytest.raises(TransformError, match="_setl_seq"):
        run("sql", {"query": "SELECT id, name FROM batch"}, spark=spark)


def test_sql_without_batch_is_refused_at_validation():
    """sql whose query does not read FROM batch is a parameter error at startup."""
    with pytest.raises(PluginError, match="FROM batch") as info:
        run_transform("sql", ROWS, {"query": "SELECT 1"})
    assert info.value.context["param"] == "query"


def test_substitute_batch_leaves_literals_and_other_names():
    """The batch view substitution rewrites table references only."""
    query = "SELECT 'from batch' AS t, batch_no FROM batch b JOIN `batch` c ON b.id = c.id"
    assert substitute_batch(query, "v1") == (
        "SELECT 'from batch' AS t, batch_no FROM `v1` b JOIN `v1` c ON b.id = c.id"
    )


def test_sql_is_safe_from_concurrent_threads(spark):
    """Concurrent sql steps each see their own batch, never another thread's view."""
    results, errors = {}, []

    def worker(n):
        try:
            rows = [{"id": n * 100 + i, "name": f"t{n}"} for i in range(5)]
            out = run_transform("sql", rows, {"query": "SELECT * FROM batch"}, primary_key=["id"], spark=spark)
            results[n] = {r["name"] for r in out}
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,), name=f"sql-{n}") for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert results == {n: {f"t{n}"} for n in range(3)}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_lookup_left_joins_a_dimension(spark, tmp_path, fmt):
    """lookup adds dimension columns by key, NULL where the key is unknown."""
    path = tmp_path / f"countries.{fmt}"
    dim = [{"country": "FR", "country_name": "France", "zone": "EU"},
           {"country": "DE", "country_name": "Germany", "zone": "EU"}]
    if fmt == "csv":
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(dim[0]))
            writer.writeheader()
            writer.writerows(dim)
    else:
        pq.write_table(pa.Table.from_pylist(dim), path)
    out = run("lookup", {"path": str(path), "on": ["country"], "columns": ["country_name"]}, spark=spark)
    assert [(r["id"], r["country_name"]) for r in out] == [(1, "France"), (2, "Germany"), (3, None)]
    assert "zone" not in out[0]
    assert list(out[0])[:5] == ["id", "name", "card", "amount", "country"]


def test_lookup_loads_a_dimension_once(spark, tmp_path, monkeypatch):
    """lookup reads a dimension file once and reuses the cached frame."""
    from setl.transforms import builtins

    path = tmp_path / "dim.csv"
    path.write_text("country,zone\nFR,EU\n")
    reads = []
    real = builtins.load_dimension

    def counting(spark_, path_, fmt, keys):
        frame = real(spark_, path_, fmt, keys)
        reads.append(id(frame))
        return frame

    monkeypatch.setattr(builtins, "load_dimension", counting)
    for _ in range(2):
        out = run("lookup", {"path": str(path), "on": ["country"]}, spark=spark)
        assert out[0]["zone"] == "EU"
    assert len(reads) == 2 and reads[0] == reads[1]


def test_lookup_with_duplicate_keys_fails(spark, tmp_path):
    """lookup refuses a dimension whose keys repeat, since it would multiply rows."""
    path = tmp_path / "dup.csv"
    path.write_text("country,zone\nFR,EU\nFR,XX\n")
    with pytest.raises(TransformError, match="duplicate keys"):
        run("lookup", {"path": str(path), "on": ["country"]}, spark=spark)


def test_lookup_missing_file_is_a_startup_error(tmp_path):
    """lookup of a file that does not exist fails validation, naming the parameter."""
    with pytest.raises(PluginError, match="does not exist") as info:
        run_transform("lookup", ROWS, {"path": str(tmp_path / "none.csv"), "on": ["country"]})
    assert info.value.context["param"] == "path"


def test_builtins_keep_deletes_and_transform_their_keys(spark):
    """A delete passes a rename+hash chain with its key columns renamed and hashed too."""
    out = run_transform("rename", [{"id": 7, "name": "x"}], {"columns": {"id": "key"}},
                        primary_key=["id"], op="delete", spark=spark, changes=True)
    assert len(out) == 1 and out[0].op is Op.DELETE
    assert out[0].primary_key == ("key",) and out[0].before == {"key": 7, "name": "x"}
