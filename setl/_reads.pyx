# cython: language_level=3
"""Compiled constructors of snapshot reads (`setl.reads`): each `RowChange`'s ten slots set in C,
as attrs' generated ``__init__`` sets them one Python call at a time (about half the cost)."""

from cpython.object cimport PyObject_GenericSetAttr

from setl.model import Op, RowChange

_new = object.__new__


cdef inline object _read(object cls, object read, object schema, object table, object key, object after,
                         object position, object commit_time, object source):
    cdef object change = _new(cls)
    PyObject_GenericSetAttr(change, "op", read)
    PyObject_GenericSetAttr(change, "schema", schema)
    PyObject_GenericSetAttr(change, "table", table)
    PyObject_GenericSetAttr(change, "primary_key", key)
    PyObject_GenericSetAttr(change, "before", None)
    PyObject_GenericSetAttr(change, "after", after)
    PyObject_GenericSetAttr(change, "position", position)
    PyObject_GenericSetAttr(change, "commit_time", commit_time)
    PyObject_GenericSetAttr(change, "source", source)
    PyObject_GenericSetAttr(change, "sequence", None)
    return change


def new_reads(schema, table, key, rows, position):
    cdef list out = []
    cls, read = RowChange, Op.READ
    for after in rows:
        out.append(_read(cls, read, schema, table, key, after, position, None, None))
    return out


def mapped_reads(schema, table, key, reads, source):
    cdef list out = []
    cls, read = RowChange, Op.READ
    for change in reads:
        out.append(_read(cls, read, schema, table, key, change.after, change.position, change.commit_time, source))
    return out
