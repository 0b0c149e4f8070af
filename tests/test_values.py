"""`setl.values.Geometry`: the forms of a spatial value other systems take (WKB, EWKB, WKT)."""

from __future__ import annotations

import struct

import pytest

from setl.values import FROM_TEXT, SPATIAL_TYPES, Geometry, geometry


def stored(srid: int, wkb: bytes) -> Geometry:
    """A spatial value as MariaDB stores it: the SRID little-endian, then the WKB."""
    return Geometry(struct.pack("<I", srid) + wkb)


def point(x: float, y: float, order: str = "<") -> bytes:
    return bytes([order == "<"]) + struct.pack(order + "Idd", 1, x, y)


def test_wkb_is_the_stored_bytes_after_the_srid_and_ewkb_carries_the_srid():
    """WKB drops the SRID; EWKB sets PostGIS's SRID flag and puts the SRID after the type."""
    g = stored(3857, point(1, 2))
    assert g.srid == 3857
    assert g.wkb == point(1, 2)
    assert g.ewkb == b"\x01" + struct.pack("<II", 0x20000001, 3857) + struct.pack("<dd", 1, 2)
    assert stored(0, point(1, 2)).ewkb == point(1, 2)  # SRID 0: plain WKB


def test_wkt_of_every_ogc_type_in_the_servers_spelling():
    """Each OGC 2D type writes as MariaDB's and PostGIS's ST_AsText do, integral coordinates without `.0`."""
    line = b"\x01" + struct.pack("<II", 2, 3) + struct.pack("<6d", 0, 0, 1, 1, 2, 0.1)
    ring = struct.pack("<I", 4) + struct.pack("<8d", 0, 0, 1, 0, 1, 1, 0, 0)
    polygon = b"\x01" + struct.pack("<II", 3, 2) + ring + ring
    cases = {
        point(1.5, -2.25): "POINT(1.5 -2.25)",
        line: "LINESTRING(0 0,1 1,2 0.1)",
        polygon: "POLYGON((0 0,1 0,1 1,0 0),(0 0,1 0,1 1,0 0))",
        b"\x01" + struct.pack("<II", 4, 2) + point(1, 1) + point(2, 2, ">"): "MULTIPOINT(1 1,2 2)",
        b"\x01" + struct.pack("<II", 5, 2) + line + line: "MULTILINESTRING((0 0,1 1,2 0.1),(0 0,1 1,2 0.1))",
        b"\x01" + struct.pack("<II", 6, 1) + polygon: "MULTIPOLYGON(((0 0,1 0,1 1,0 0),(0 0,1 0,1 1,0 0)))",
        b"\x01" + struct.pack("<II", 7, 2) + point(1, 1) + line:
            "GEOMETRYCOLLECTION(POINT(1 1),LINESTRING(0 0,1 1,2 0.1))",
        b"\x01" + struct.pack("<II", 7, 0): "GEOMETRYCOLLECTION EMPTY",
    }
    assert {wkt: stored(4326, wkb).wkt for wkb, wkt in cases.items()} == {wkt: wkt for wkt in cases.values()}


def test_wkt_coordinates_are_exact_doubles():
    """Every coordinate is Python's shortest exact text of its double: parsing it gives the same double."""
    values = [0.1, -0.30000000000000004, 1e20, 5e-324, 1.7976931348623157e308, 123456789.12345679]
    for x in values:
        text = stored(0, point(x, -x)).wkt
        parsed = text[len("POINT("):-1].split()
        assert [float(v) for v in parsed] == [x, -x]


def test_an_unknown_wkb_type_is_a_clear_error():
    """A WKB type beyond the OGC 2D ones is refused by name, not misread."""
    with pytest.raises(ValueError, match="WKB geometry type 1001"):
        _ = stored(0, b"\x01" + struct.pack("<Iddd", 1001, 1, 2, 3)).wkt


def test_both_readers_values_become_one_geometry():
    """A snapshot's bytes become the same `Geometry` as the binlog's, equal and hashed alike (keys)."""
    data = struct.pack("<I", 4326) + point(1, 2)
    assert SPATIAL_TYPES <= FROM_TEXT.keys()
    assert FROM_TEXT["point"](data) == geometry(bytearray(data)) == Geometry(data)
    assert len({Geometry(data), geometry(data)}) == 1
    assert geometry(None) is None
