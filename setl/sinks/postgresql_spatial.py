"""Spatial values on a PostgreSQL target: the form the target's ``spatial`` option gives them, and
how a connection sends a `setl.values.Geometry` in that form.

- ``postgis``: PostGIS ``geometry`` columns, values sent as hex EWKB (the SRID kept);
- ``wkb``: ``bytea`` columns holding the OGC WKB (the SRID is not kept);
- ``wkt``: ``text`` columns holding the OGC WKT (`Geometry.wkt`: exact doubles; no SRID);
- ``auto`` (the default): ``postgis`` when the extension is installed in the target database
  (``pg_extension``), else ``wkb``; decided when a connection opens.

The value type says which values are spatial, so loads need no look at the target's column types;
the option decides both the columns setl creates (`setl.sinks.postgresql_ddl.pg_type`) and the form
sent, so a target keeps one form as long as the option (and, under ``auto``, the extension) stays.
"""

from __future__ import annotations

from typing import Any, Literal

import psycopg
from psycopg.adapt import Dumper
from psycopg.types import TypeInfo

from setl.values import Geometry

#: The option's values; `resolve` turns ``auto`` into one of the others.
SpatialOption = Literal["auto", "postgis", "wkb", "wkt"]
SpatialForm = Literal["postgis", "wkb", "wkt"]


class NoPostgis(ValueError):
    """``spatial: postgis`` on a database without the PostGIS extension."""


def resolve(conn: psycopg.Connection, option: str) -> SpatialForm:
    """The form `option` means on `conn`'s database (ends the transaction it reads in)."""
    if option not in ("auto", "postgis"):
        return "wkt" if option == "wkt" else "wkb"
    try:
        found = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'postgis'").fetchone()
    finally:
        conn.rollback()
    if found:
        return "postgis"
    if option == "postgis":
        raise NoPostgis("target.spatial is postgis but the target database has no PostGIS extension "
                        "(CREATE EXTENSION postgis, or set spatial: wkb or wkt)")
    return "wkb"


class _EwkbDumper(Dumper):
    """A `Geometry` as PostGIS's hex EWKB text, typed ``geometry`` (the oid is set per connection)."""

    def dump(self, obj: Any) -> bytes:
        return obj.ewkb.hex().encode()


class _WkbDumper(Dumper):
    """A `Geometry` as ``bytea`` (hex text input): its WKB."""

    oid = psycopg.postgres.types["bytea"].oid

    def dump(self, obj: Any) -> bytes:
        return b"\\x" + obj.wkb.hex().encode()


class _WktDumper(Dumper):
    """A `Geometry` as ``text``: its WKT."""

    oid = psycopg.postgres.types["text"].oid

    def dump(self, obj: Any) -> bytes:
        return str(obj.wkt).encode()


def register(conn: psycopg.Connection, form: SpatialForm) -> None:
    """Make `conn` send `Geometry` values (parameters and ``COPY`` rows) in `form`."""
    if form == "postgis":
        info = TypeInfo.fetch(conn, "geometry")
        conn.rollback()
        if info is None:
            raise NoPostgis("the target database has no geometry type (is PostGIS in the search_path?)")
        dumper: type[Dumper] = type("GeometryDumper", (_EwkbDumper,), {"oid": info.oid})
    else:
        dumper = _WkbDumper if form == "wkb" else _WktDumper
    conn.adapters.register_dumper(Geometry, dumper)


__all__ = ["NoPostgis", "SpatialForm", "SpatialOption", "register", "resolve"]
