"""The MySQL-to-PostgreSQL DDL translation, statement by statement (no server needed)."""

from __future__ import annotations

import pytest

from setl.ddl import parse
from setl.sinks.postgresql_ddl import Translator, UnsupportedDdl, is_sequence_ddl, pg_name


def translate(statement: str) -> list[str]:
    return Translator("app").translate(parse(statement))


@pytest.mark.parametrize("statement, expected", [
    ("CREATE TABLE `s`.`t` (id INT UNSIGNED NOT NULL AUTO_INCREMENT, n VARCHAR(9) CHARACTER SET utf8mb4 "
     "DEFAULT 'x' COMMENT 'c', ts TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), "
     "b BIT(1) DEFAULT b'0', PRIMARY KEY (`id`), UNIQUE KEY u (n(5)), KEY k (ts), "
     "CONSTRAINT fk FOREIGN KEY (id) REFERENCES o (id)) ENGINE=InnoDB",
     ['CREATE TABLE "s"."t" ("id" bigint NOT NULL, "n" varchar(9) DEFAULT \'x\', '
      '"ts" timestamptz(6) NOT NULL DEFAULT CURRENT_TIMESTAMP, "b" bigint DEFAULT 0, PRIMARY KEY ("id"), '
      'UNIQUE ("n"))']),
    ("CREATE OR REPLACE TABLE t (a int)", ['DROP TABLE IF EXISTS "app"."t"', 'CREATE TABLE "app"."t" ("a" integer)']),
    ("CREATE TABLE x LIKE y", ['CREATE TABLE "app"."x" (LIKE "app"."y" INCLUDING ALL)']),
    ("ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT -1 AFTER id, DROP COLUMN x, ADD INDEX (c)",
     ['ALTER TABLE "app"."t" ADD COLUMN "c" integer NOT NULL DEFAULT -1, DROP COLUMN "x"']),
    ("ALTER TABLE t CHANGE a b BIGINT UNSIGNED NOT NULL, ALGORITHM=INPLACE",
     ['ALTER TABLE "app"."t" ALTER COLUMN "a" TYPE numeric(20,0) USING "a"::numeric(20,0), '
      'ALTER COLUMN "a" SET NOT NULL, ALTER COLUMN "a" DROP DEFAULT',
      'ALTER TABLE "app"."t" RENAME COLUMN "a" TO "b"']),
    ("ALTER TABLE t RENAME TO s2.u, RENAME COLUMN z TO y",
     ['ALTER TABLE "app"."t" SET SCHEMA "s2"', 'ALTER TABLE "s2"."t" RENAME TO "u"',
      'ALTER TABLE "s2"."u" RENAME COLUMN "z" TO "y"']),
    ("RENAME TABLE a TO b, s.c TO s2.c",
     ['ALTER TABLE "app"."a" RENAME TO "b"', 'ALTER TABLE "s"."c" SET SCHEMA "s2"']),
    ("TRUNCATE t", ['TRUNCATE TABLE "app"."t"']),
    ("DROP TABLE IF EXISTS `a`, b", ['DROP TABLE IF EXISTS "app"."a", "app"."b"']),
    ("CREATE INDEX i ON t (a)", []),
    ("CREATE TABLE t (a INT, b INT AS (a + 1) VIRTUAL, c VARCHAR(9) GENERATED ALWAYS AS (concat(a, 'x')) STORED)",
     ['CREATE TABLE "app"."t" ("a" integer, "b" integer, "c" varchar(9))']),
    ("ALTER TABLE t ADD COLUMN n INT NOT NULL, ADD (e ENUM('p','q') NOT NULL, b BINARY(2) NOT NULL, d DATE NOT NULL)",
     ['ALTER TABLE "app"."t" ADD COLUMN "n" integer NOT NULL DEFAULT 0, ADD COLUMN "e" text NOT NULL DEFAULT \'p\', '
      'ADD COLUMN "b" bytea NOT NULL DEFAULT \'\\x0000\'::bytea, ADD COLUMN "d" date NOT NULL',
      'ALTER TABLE "app"."t" ALTER COLUMN "b" DROP DEFAULT', 'ALTER TABLE "app"."t" ALTER COLUMN "e" DROP DEFAULT',
      'ALTER TABLE "app"."t" ALTER COLUMN "n" DROP DEFAULT']),
    # partitioning: PostgreSQL gets a plain table with the same rows; reshaping partitions changes no row
    ("CREATE TABLE t (a INT PRIMARY KEY, d DATE) ENGINE=InnoDB PARTITION BY RANGE (year(d)) "
     "(PARTITION p0 VALUES LESS THAN (2000), PARTITION p1 VALUES LESS THAN MAXVALUE)",
     ['CREATE TABLE "app"."t" ("a" integer PRIMARY KEY, "d" date)']),
    ("ALTER TABLE t PARTITION BY HASH (a) PARTITIONS 4", []),
    ("ALTER TABLE t ADD PARTITION (PARTITION p9 VALUES LESS THAN (100))", []),
    ("ALTER TABLE t REORGANIZE PARTITION p0 INTO (PARTITION a VALUES LESS THAN (5), PARTITION b VALUES "
     "LESS THAN (10))", []),
    ("ALTER TABLE t COALESCE PARTITION 2", []),
    ("ALTER TABLE t REMOVE PARTITIONING", []),
    # MariaDB's UUID and INET types: both readers hand them on as text (setl/values.py)
    ("CREATE TABLE t (u UUID NOT NULL, a INET6, b INET4, PRIMARY KEY (u))",
     ['CREATE TABLE "app"."t" ("u" uuid NOT NULL, "a" inet, "b" inet, PRIMARY KEY ("u"))']),
])
def test_translation(statement, expected):
    """Each supported MySQL statement becomes the PostgreSQL statements that do the same."""
    assert translate(statement) == expected


@pytest.mark.parametrize("spatial, expected", [
    ("postgis", ['CREATE TABLE "app"."t" ("g" geometry NOT NULL, "p" geometry(Point), "l" geometry(LineString), '
                 '"a" geometry(Polygon), "mp" geometry(MultiPoint), "ml" geometry(MultiLineString), '
                 '"ma" geometry(MultiPolygon), "c" geometry(GeometryCollection), "s" geometry(Point), '
                 'PRIMARY KEY ("p"))',
                 'ALTER TABLE "app"."t" ADD COLUMN "x" geometry(Point)']),
    ("wkb", ['CREATE TABLE "app"."t" ("g" bytea NOT NULL, "p" bytea, "l" bytea, "a" bytea, "mp" bytea, "ml" bytea, '
             '"ma" bytea, "c" bytea, "s" bytea, PRIMARY KEY ("p"))', 'ALTER TABLE "app"."t" ADD COLUMN "x" bytea']),
    ("wkt", ['CREATE TABLE "app"."t" ("g" text NOT NULL, "p" text, "l" text, "a" text, "mp" text, "ml" text, '
             '"ma" text, "c" text, "s" text, PRIMARY KEY ("p"))', 'ALTER TABLE "app"."t" ADD COLUMN "x" text']),
])
def test_spatial_columns_take_the_targets_spatial_form(spatial, expected):
    """Every spatial type becomes PostGIS geometry (typed), bytea or text by the target's form; an
    SRID attribute (MariaDB's REF_SYSTEM_ID=n, MySQL's SRID n) is carried by the values instead."""
    translator = Translator("app", spatial=spatial)
    create = ("CREATE TABLE t (g GEOMETRY NOT NULL, p POINT, l LINESTRING, a POLYGON, mp MULTIPOINT, "
              "ml MULTILINESTRING, ma MULTIPOLYGON, c GEOMETRYCOLLECTION, s POINT REF_SYSTEM_ID=4326, "
              "PRIMARY KEY (p), SPATIAL INDEX (g))")
    alter = "ALTER TABLE t ADD COLUMN x POINT SRID 4326 AFTER g"
    assert translator.translate(parse(create)) + translator.translate(parse(alter)) == expected


@pytest.mark.parametrize("statement", [
    "CREATE TABLE t (v VECTOR(3))",
    "CREATE TABLE t (a INT) AS SELECT 1 AS a",
    # the server drops, empties or swaps a partition's rows without row events
    "ALTER TABLE t DROP PARTITION p0",
    "ALTER TABLE t TRUNCATE PARTITION p0, p1",
    "ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE t2",
    "ALTER TABLE t CONVERT PARTITION p0 TO TABLE t2",
    "ALTER TABLE t CONVERT TABLE t2 TO PARTITION p9 VALUES LESS THAN (300)",
    "ALTER TABLE t IMPORT PARTITION p0 TABLESPACE",
    "ALTER TABLE t DISCARD PARTITION p0 TABLESPACE",
    # statements cut short: their model says so, and nothing is rendered
    "CREATE TABLE x LIKE ",
    "CREATE TABLE t (a INT, b INT",
    "ALTER TABLE t ADD (a INT",
])
def test_untranslatable_statements_are_refused(statement):
    """A part the translation does not know is refused, never half translated; so is a partition
    statement that changes rows the binlog holds no row events for (a plain table would keep them)."""
    with pytest.raises(UnsupportedDdl):
        translate(statement)


@pytest.mark.parametrize("definition, expected", [
    ("CHAR(10) BINARY NOT NULL", 'varchar(10) COLLATE "C" NOT NULL'),
    ("VARCHAR(20) BINARY CHARACTER SET utf8mb4", 'varchar(20) COLLATE "C"'),
    ("VARCHAR(5) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", 'varchar(5) COLLATE "C"'),
    ("TEXT COLLATE binary", 'text COLLATE "C"'),
    ("TEXT CHARACTER SET latin1 COLLATE latin1_swedish_ci", "text"),
    ("VARCHAR(3) CHARSET ascii", "varchar(3)"),
    ("CHAR(4) CHARACTER SET binary", "bytea"),
    ("NATIONAL VARCHAR(4)", "varchar(4)"),
    ("NCHAR VARYING(2)", "varchar(2)"),
    ("CHAR(2) ASCII", "varchar(2)"),
])
def test_charsets_and_collations(definition, expected):
    """Binary collations become COLLATE "C", CHARACTER SET binary makes bytes, other charsets drop."""
    assert translate(f"CREATE TABLE t (c {definition})") == [f'CREATE TABLE "app"."t" ("c" {expected})']


@pytest.mark.parametrize("clause, expected, needs_empty", [
    ("ADD COLUMN a INT DEFAULT (1+1)", '"a" integer', "column a DEFAULT (1+1) has no PostgreSQL translation"),
    ("ADD b BIT(1) NOT NULL DEFAULT b'1'", '"b" bigint NOT NULL DEFAULT 1', None),
    ("ADD c DATETIME DEFAULT CURRENT_TIMESTAMP", '"c" timestamp DEFAULT CURRENT_TIMESTAMP',
     "column c DEFAULT CURRENT_TIMESTAMP gives existing rows the time of the DDL on the source"),
    ("ADD d VARBINARY(3) DEFAULT x'0aff'", '"d" bytea DEFAULT \'\\x0aff\'::bytea', None),
    ("ADD e VARCHAR(3) DEFAULT _utf8mb4'x'", '"e" varchar(3) DEFAULT \'x\'', None),
    ("ADD f INT DEFAULT 0x1F", '"f" integer DEFAULT 31', None),
    ("ADD g DATE DEFAULT '0000-00-00'", '"g" date', "column g DEFAULT '0000-00-00' has no PostgreSQL translation"),
    # MariaDB takes an expression default without parentheses
    ("ADD h VARCHAR(9) DEFAULT concat('a','b')", '"h" varchar(9)',
     "column h DEFAULT concat('a','b') has no PostgreSQL translation"),
    ("ADD u UUID NOT NULL DEFAULT uuid()", '"u" uuid NOT NULL',
     "column u DEFAULT uuid() has no PostgreSQL translation"),
])
def test_add_column_defaults(clause, expected, needs_empty):
    """ADD COLUMN defaults are translated exactly, or named as exact only on an empty table."""
    translator = Translator("app")
    assert translator.translate(parse(f"ALTER TABLE t {clause}")) == [f'ALTER TABLE "app"."t" ADD COLUMN {expected}']
    assert translator.needs_empty == ([('"app"."t"', needs_empty)] if needs_empty else [])


@pytest.mark.parametrize("statement, expected", [
    ("CREATE TABLE t (id INT, v INT WITHOUT SYSTEM VERSIONING, rs TIMESTAMP(6) GENERATED ALWAYS AS ROW START, "
     "re TIMESTAMP(6) GENERATED ALWAYS AS ROW END, PERIOD FOR SYSTEM_TIME(rs, re)) WITH SYSTEM VERSIONING",
     ['CREATE TABLE "app"."t" ("id" integer, "v" integer)']),
    ("ALTER TABLE t ADD SYSTEM VERSIONING", []),
    ("ALTER TABLE t DROP SYSTEM VERSIONING", []),
    ("ALTER TABLE t ADD COLUMN rs TIMESTAMP(6) AS ROW START, ADD re TIMESTAMP(6) AS ROW END, "
     "ADD PERIOD FOR SYSTEM_TIME(rs, re), ADD z INT", ['ALTER TABLE "app"."t" ADD COLUMN "z" integer']),
    ("ALTER TABLE t DROP PERIOD FOR SYSTEM_TIME", []),
])
def test_system_versioning_is_left_out(statement, expected):
    """Versioning clauses and period columns translate to nothing; the other columns stay."""
    assert translate(statement) == expected


@pytest.mark.parametrize("statement, sequence", [
    ("CREATE SEQUENCE s", True), ("CREATE OR REPLACE SEQUENCE s START 5", True), ("ALTER SEQUENCE s RESTART", True),
    ("/* c */ DROP SEQUENCE IF EXISTS s", True), ("CREATE TABLE s (a bigint) SEQUENCE=1", True),
    ("CREATE TABLE s (sequence INT)", False), ("DROP TABLE sequence", False),
])
def test_sequence_ddl_is_told(statement, sequence):
    """Sequence DDL is recognised, and tables or columns named sequence are not mistaken for it."""
    assert is_sequence_ddl(parse(statement)) is sequence


def test_modify_into_a_generated_column_needs_an_empty_table():
    """MODIFY/CHANGE into a generated column is a plain column, exact only on an empty table."""
    translator = Translator("app")
    assert translator.translate(parse("ALTER TABLE t MODIFY b INT AS (a * 3) STORED")) == [
        'ALTER TABLE "app"."t" ALTER COLUMN "b" TYPE integer USING "b"::integer, ALTER COLUMN "b" DROP NOT NULL, '
        'ALTER COLUMN "b" DROP DEFAULT']
    assert translator.needs_empty == [('"app"."t"', "column b becomes a generated column, whose values the "
                                                    "source computes without row events")]


def test_names_over_63_bytes_are_mapped_in_every_statement():
    """Every name over 63 bytes (table, column, renamed and dropped ones, the primary key's
    constraint) is emitted as `pg_name` maps it; shorter ones as they are."""
    table, a, b = "t" * 64, "a" * 63 + "1", "a" * 63 + "2"
    t, ma, mb = pg_name(table), pg_name(a), pg_name(b)
    assert ma != mb and ma[:54] == mb[:54] and len(ma.encode()) == 63 and t.startswith("t" * 54 + "_")
    assert pg_name("x" * 63) == "x" * 63 and pg_name(ma) == ma
    assert translate(f"CREATE TABLE `{table}` (`{a}` INT PRIMARY KEY, `{b}` INT, UNIQUE KEY (`{b}`))") == [
        f'CREATE TABLE "app"."{t}" ("{ma}" integer PRIMARY KEY, "{mb}" integer, UNIQUE ("{mb}"))']
    assert translate(f"ALTER TABLE `{table}` ADD COLUMN `{b}x` INT, DROP COLUMN `{a}`, DROP PRIMARY KEY") == [
        f'ALTER TABLE "app"."{t}" ADD COLUMN "{pg_name(b + "x")}" integer, DROP COLUMN "{ma}", '
        f'DROP CONSTRAINT IF EXISTS "{t[:58]}_pkey"']
    assert translate(f"ALTER TABLE `{table}` RENAME COLUMN `{b}` TO c") == [
        f'ALTER TABLE "app"."{t}" RENAME COLUMN "{mb}" TO "c"']
    assert translate(f"RENAME TABLE `{table}` TO `{table}2`") == [
        f'ALTER TABLE "app"."{t}" RENAME TO "{pg_name(table + "2")}"']


@pytest.mark.parametrize("statement", [
    "CREATE TABLE t (a INT PRIMARY KEY) PARTITION BY HASH (a) PARTITIONS 4",
    "ALTER TABLE t PARTITION BY HASH (a) PARTITIONS 4",
])
def test_partition_by_is_refused_under_partitions_refuse(statement):
    """``partitions: refuse``: PARTITION BY stops (the default, plain, drops the clause: above);
    a plain CREATE still translates."""
    translator = Translator("app", partitions="refuse")
    with pytest.raises(UnsupportedDdl, match="partitions option is refuse"):
        translator.translate(parse(statement))
    assert translator.translate(parse("CREATE TABLE t (a INT PRIMARY KEY)")) == [
        'CREATE TABLE "app"."t" ("a" integer PRIMARY KEY)']
