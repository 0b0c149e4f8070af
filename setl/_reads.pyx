# cython: language_level=3
"""Compiled constructors of snapshot reads (`setl.reads`): each `RowChange`'s ten slots set in C,
as attrs' generated ``__init__`` sets them one Python call at a time (about half the cost).

Where each of the ten fields is a plain object slot of `RowChange` (a ``member_descriptor`` of
type ``T_OBJECT_EX``, checked once at import: `DIRECT`), a new change's slots are written at their
offsets, as the descriptor's own ``__set__`` writes them, without looking the descriptor up per
field; otherwise through ``PyObject_GenericSetAttr``, the descriptor's own path."""

from cpython.object cimport PyObject, PyObject_GenericSetAttr
from cpython.ref cimport Py_INCREF

from types import MemberDescriptorType

from setl.model import Op, RowChange


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

_new = object.__new__
#: the fields, in the order `_read` takes them (`setl.reads.FIELDS`)
_NAMES = ("op", "schema", "table", "primary_key", "before", "after", "position", "commit_time", "source", "sequence")
cdef int _T_OBJECT_EX = 16  # structmember.h: an object slot; AttributeError while unset
cdef Py_ssize_t _OFFSETS[10]
cdef bint _DIRECT = False


cdef bint _find_offsets():
    """Each field's slot offset in `RowChange`; False when one is not a plain object slot."""
    cdef PyMemberDescrObject* member
    for i, name in enumerate(_NAMES):
        found = None
        for klass in RowChange.__mro__:
            if name in klass.__dict__:
                found = klass.__dict__[name]
                break
        if type(found) is not MemberDescriptorType:
            return False
        member = <PyMemberDescrObject*><PyObject*>found
        if member.d_member == NULL or member.d_member.type != _T_OBJECT_EX or member.d_member.offset <= 0:
            return False
        _OFFSETS[i] = member.d_member.offset
    return True


_DIRECT = _find_offsets()
#: whether `_read` writes slots at their offsets (see the module docstring)
DIRECT = _DIRECT


cdef inline void _put(object change, int field, object value):
    """Store `value` in the unset slot `field` of the new `change` (the reference it takes)."""
    cdef PyObject** slot = <PyObject**>((<char*><PyObject*>change) + _OFFSETS[field])
    Py_INCREF(value)
    slot[0] = <PyObject*>value


cdef inline object _read(object cls, object read, object schema, object table, object key, object after,
                         object position, object commit_time, object source):
    cdef object change = _new(cls)
    if _DIRECT and cls is RowChange:
        _put(change, 0, read)
        _put(change, 1, schema)
        _put(change, 2, table)
        _put(change, 3, key)
        _put(change, 4, None)
        _put(change, 5, after)
        _put(change, 6, position)
        _put(change, 7, commit_time)
        _put(change, 8, source)
        _put(change, 9, None)
        return change
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


cdef inline PyObject* _get(object change, int field):
    """The slot `field` of a `RowChange` (NULL while unset); borrowed."""
    return (<PyObject**>((<char*><PyObject*>change) + _OFFSETS[field]))[0]


cdef inline bint _same(PyObject* value, object wanted):
    return value != NULL and (value == <PyObject*>wanted or <object>value == wanted)


def new_reads(schema, table, key, rows, position, source=None):
    cdef list out = []
    cls, read = RowChange, Op.READ
    for after in rows:
        out.append(_read(cls, read, schema, table, key, after, position, None, source))
    return out


def mapped_reads(schema, table, key, reads, source):
    """Each of `reads` as a read of `schema`.`table` (key `key`) from `source`: the read itself when
    it is one already (made so by `new_reads`: a route that changes nothing), else a new one."""
    cdef list out = []
    cdef PyObject* found
    cdef object alike = None  # a source object found equal to `source`: the same again is equal too
    cls, read = RowChange, Op.READ
    for change in reads:
        if _DIRECT and type(change) is RowChange:
            found = _get(change, 8)
            if (_get(change, 0) == <PyObject*>read and _get(change, 4) == <PyObject*>None
                    and _get(change, 9) == <PyObject*>None and found != NULL and found != <PyObject*>None
                    and _same(_get(change, 1), schema) and _same(_get(change, 2), table)
                    and _same(_get(change, 3), key)
                    and (found == <PyObject*>alike or found == <PyObject*>source or <object>found == source)):
                alike = <object>found
                out.append(change)
                continue
        out.append(_read(cls, read, schema, table, key, change.after, change.position, change.commit_time, source))
    return out


def read_run_end(object changes, Py_ssize_t start):
    """The index after the run of snapshot reads that begins at `changes[start]` (a `RowChange`
    read) and goes on while each change is a `RowChange` read of the same schema, table and key."""
    cdef Py_ssize_t end = start + 1, count = len(changes)
    first = changes[start]
    schema, table, key = first.schema, first.table, first.primary_key
    read = Op.READ
    while end < count:
        change = changes[end]
        if type(change) is not RowChange:
            break
        if _DIRECT:
            if not (_get(change, 0) == <PyObject*>read and _same(_get(change, 1), schema)
                    and _same(_get(change, 2), table) and _same(_get(change, 3), key)):
                break
        elif not (change.op is read and change.schema == schema and change.table == table
                  and change.primary_key == key):
            break
        end += 1
    return end
